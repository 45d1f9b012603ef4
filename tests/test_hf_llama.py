"""The LLaMA-style decoder (`block=llama`) as transformers' `LlamaForCausalLM` (gated FFN),
`ArceeForCausalLM` (plain FFN) and `Qwen3ForCausalLM` (gated FFN, qk-norm), both ways and
offline: tiny random models (2 layers, d_model 64, 4 heads, vocabulary 300, 64 positions) give
transformers' float32 logits within 1e-4, its greedy continuation and its parameter count, exported
by actlab (`hf_checkpoint.write`) or written by `save_pretrained` and imported (`init_from=hf:`).
The traps, as tests: half-split against interleaved RoPE, Gemma's rewrite of "gelu", Qwen2's
forced q/k/v biases, RMSNorm's float32 statistic; and one line for what does not map."""

import json
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from actlab import config as config_lib, core, sample, tasks
from actlab.core import model as model_lib
from actlab.core.model import RMSNorm
from actlab.hf import checkpoint as hf_checkpoint
from actlab.hf import mapping
from actlab.infra import errors
from actlab.run import export, pretrained, train
from conftest import tiny
from test_export import RUN, perturbed_params, torch  # noqa: F401 -- torch: the fixture
from test_hf_import import imported

transformers = pytest.importorskip("transformers", reason="the hf extra is not installed")
pytest.importorskip("safetensors", reason="the hf extra is not installed")

V = 300  # the models' vocabulary; actlab pads it to 320 (the export drops, the import adds 20 rows)
SHAPE = {"model.d_model": 64, "model.num_heads": 4, "model.num_layers": 2, "model.max_len": 64,
         "model.d_ff": 192}  # gated: the parameter-matched width 128
# class -> (activation, the config's fields besides block=llama's, transformers' config fields).
CLASSES = {
    "LlamaForCausalLM": ("silu", {"model.rope_theta": 500000.0},
                         {"intermediate_size": 128, "rope_theta": 500000.0}),
    "ArceeForCausalLM": ("relu2", {"model.ffn": "plain"}, {"intermediate_size": 192}),
    "Qwen3ForCausalLM": ("silu", {"model.qk_norm": True},
                         {"intermediate_size": 128, "head_dim": 16, "num_key_value_heads": 4}),
}
FAMILY = {"LlamaForCausalLM": "llama", "ArceeForCausalLM": "arcee", "Qwen3ForCausalLM": "qwen3"}
NEW = 20  # greedy tokens


def llama_config(activation: str = "silu", **overrides):
  return tiny(activation, **{**config_lib.BLOCKS["llama"], **SHAPE, **overrides})


def tokens(shape=(2, 40), seed=0) -> np.ndarray:
  return np.random.default_rng(seed).integers(0, V, shape)


def hf_logits(torch, model, tokens_BL) -> np.ndarray:
  with torch.no_grad():
    return model(torch.tensor(tokens_BL)).logits.numpy()


def greedy_equal(torch, model, params, hf_model) -> list[int]:
  """actlab.sample's greedy continuation (temperature 0, the key/value cache) of a prompt, which
  must be transformers' `generate(do_sample=False)`; returns it."""
  prompt = tokens((1, 8), seed=1)
  ours = sample.make_generate(model, V, NEW, 0.0, 0)(params, jnp.asarray(prompt),
                                                     jax.random.PRNGKey(0))[0].tolist()
  with torch.no_grad():
    out = hf_model.generate(torch.tensor(prompt), attention_mask=torch.ones(1, 8, dtype=torch.long),
                            max_new_tokens=NEW, min_new_tokens=NEW, do_sample=False,
                            eos_token_id=None, pad_token_id=0)
  assert out[0, 8:].tolist() == ours
  return ours


def assert_same_model(torch, model, params, hf_model, what: str) -> None:
  """actlab's `model` with `params` and `hf_model` compute the same function: float32 logits
  within 1e-4 (the achieved error printed), the same greedy text, the same parameter count."""
  ours = np.asarray(model.apply({"params": params}, tokens()))[..., :V]
  theirs = hf_logits(torch, hf_model, tokens())
  print(f"{what}: max |logit error| {np.abs(ours - theirs).max():.2e}")
  np.testing.assert_allclose(ours, theirs, atol=1e-4, rtol=0)
  greedy_equal(torch, model, params, hf_model)
  assert hf_count(hf_model) == actlab_count(params)


def hf_count(hf_model) -> int:
  return sum(p.numel() for p in hf_model.parameters())


def actlab_count(params) -> int:
  """`core.count_params` less the rows actlab pads the vocabulary with (embedding and head)."""
  padded_rows = core.pad_vocab(V) - V
  return core.count_params(params)["total"] - 2 * padded_rows * SHAPE["model.d_model"]


@pytest.mark.slow
@pytest.mark.parametrize("cls", CLASSES)
def test_export_equals_transformers(tmp_path, torch, cls):
  """actlab → `hf_checkpoint.write` → `<cls>.from_pretrained`: logits, greedy text, count."""
  activation, overrides, _ = CLASSES[cls]
  c = llama_config(activation, **overrides)
  params = perturbed_params(c, V)
  model = tasks.get(c).objective(config_lib.typed(c), V).model
  hf_checkpoint.write(tmp_path, c, FAMILY[cls], "causal_lm", params, V, 256, RUN)
  assert json.loads((tmp_path / "config.json").read_text())["architectures"] == [cls]
  hf_model = getattr(transformers, cls).from_pretrained(tmp_path).eval()
  assert_same_model(torch, model, params, hf_model, f"{cls} export")


def hf_model_of(torch, cls: str, directory, **fields):
  """A `cls` (the sizes of `SHAPE`, 128 positions) with noise on every weight, so that no norm
  scale is 1, saved into `directory`."""
  config = getattr(transformers, cls.replace("ForCausalLM", "Config"))(
      vocab_size=V, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
      max_position_embeddings=128, rms_norm_eps=1e-6, tie_word_embeddings=False,
      bos_token_id=None, eos_token_id=None, **fields)
  torch.manual_seed(0)
  hf_model = getattr(transformers, cls)(config).eval()
  with torch.no_grad():
    for p in hf_model.parameters():
      p.add_(0.1 * torch.randn_like(p))
  hf_model.save_pretrained(directory)
  return hf_model


@pytest.mark.slow
@pytest.mark.parametrize("cls", CLASSES)
def test_import_equals_transformers(tmp_path, torch, cls):
  """transformers' `save_pretrained` → `train.init_from=hf:`: logits, greedy text, count."""
  activation, overrides, fields = CLASSES[cls]
  hf_model = hf_model_of(torch, cls, tmp_path, hidden_act=activation, **fields)
  c = llama_config(activation, **overrides, **{"train.init_from": f"hf:{tmp_path}"})
  model, params = imported(c, V)
  assert_same_model(torch, model, params, hf_model, f"{cls} import")


@pytest.mark.slow
@pytest.mark.parametrize("activation, ffn", [("gelu", "gated"), ("relu", "gated"),
                                             ("gelu_tanh", "plain"), ("tanh", "plain")])
def test_other_activations_equal_transformers(tmp_path, torch, activation, ffn):
  """Llama with exact GELU and ReLU, Arcee with the others transformers and actlab share."""
  c = llama_config(activation, **{"model.ffn": ffn})
  params = perturbed_params(c, V)
  cls = {"gated": "LlamaForCausalLM", "plain": "ArceeForCausalLM"}[ffn]
  hf_checkpoint.write(tmp_path, c, FAMILY[cls], "causal_lm", params, V, 256, RUN)
  hf_model = getattr(transformers, cls).from_pretrained(tmp_path).eval()
  ours = np.asarray(tasks.get(c).objective(config_lib.typed(c), V).model.apply({"params": params}, tokens()))[..., :V]
  np.testing.assert_allclose(hf_logits(torch, hf_model, tokens()), ours, atol=1e-4, rtol=0)


def interleaved_rope(x_BHLK, positions_L, theta):
  """RoPE in the interleaved layout (Meta's original, GPT-J): feature 2j pairs with 2j + 1."""
  K = x_BHLK.shape[-1]
  angles_LJ = positions_L.astype(jnp.float32)[:, None] / theta ** (jnp.arange(0, K, 2) / K)
  cos, sin = jnp.cos(angles_LJ), jnp.sin(angles_LJ)
  x1, x2 = x_BHLK[..., 0::2], x_BHLK[..., 1::2]
  return jnp.stack([x1 * cos - x2 * sin, x1 * sin + x2 * cos], -1).reshape(x_BHLK.shape)


@pytest.mark.slow
def test_interleaved_rope_weights_do_not_match(tmp_path, torch, monkeypatch):
  """The trap of porting RoPE: the same model with its query and key features in the interleaved
  layout (each head's pair (j, j + K/2) moved to (2j, 2j + 1)) computes the same logits under an
  interleaved rotation, but exported as they are, transformers' half-split rotation makes other
  logits: the parity test above would catch a port that skips the permutation."""
  c = llama_config()
  params = perturbed_params(c, V)
  K = SHAPE["model.d_model"] // SHAPE["model.num_heads"]
  to_interleaved = np.stack([np.arange(K // 2), np.arange(K // 2) + K // 2], -1).reshape(-1)
  permuted = jax.tree.map(np.array, params)
  for block in ("block_0", "block_1"):
    for name in ("query", "key"):
      kernel = permuted[block]["attn"][name]["kernel"]  # [D, D] = (D, H, K)
      permuted[block]["attn"][name]["kernel"] = kernel.reshape(64, 4, K)[..., to_interleaved] \
          .reshape(64, 64)
  model = tasks.get(c).objective(config_lib.typed(c), V).model
  ours = np.asarray(model.apply({"params": params}, tokens()))[..., :V]
  with monkeypatch.context() as patched:
    patched.setattr(model_lib, "rope", interleaved_rope)
    same = np.asarray(model.apply({"params": permuted}, tokens()))[..., :V]
  np.testing.assert_allclose(same, ours, atol=1e-5, rtol=0)  # the same model, other layout
  hf_checkpoint.write(tmp_path, c, "llama", "causal_lm", permuted, V, 256, RUN)
  hf_model = transformers.LlamaForCausalLM.from_pretrained(tmp_path).eval()
  assert np.abs(hf_logits(torch, hf_model, tokens()) - ours).max() > 1e-2


def test_gemma_rewrites_exact_gelu():
  """The trap that sends exact GELU through Llama: Gemma's config turns hidden_act="gelu" into
  the tanh form (transformers 5.24 does; 5.17 kept it)."""
  if not hasattr(transformers, "GemmaConfig"):
    pytest.skip("this transformers has no Gemma")
  hidden_act = transformers.GemmaConfig(hidden_act="gelu").hidden_act
  if hidden_act == "gelu":
    pytest.skip(f"transformers {transformers.__version__}'s Gemma keeps exact GELU")
  assert hidden_act == "gelu_pytorch_tanh"


def test_exact_gelu_is_exported_as_llama():
  """Llama keeps hidden_act="gelu" (exact, erf): an actlab model with exact GELU is exported as
  Llama."""
  assert transformers.LlamaConfig(hidden_act="gelu").hidden_act == "gelu"
  fields = hf_checkpoint.hf_config(llama_config("gelu"), "llama", "causal_lm", V, 256)
  assert (fields["architectures"], fields["hidden_act"]) == (["LlamaForCausalLM"], "gelu")


def save_config(directory, model_type: str, **fields):
  """A model directory's config.json alone (the checks refuse before reading weights)."""
  transformers.AutoConfig.for_model(model_type, vocab_size=V, hidden_size=64,
                                    num_hidden_layers=2, num_attention_heads=4,
                                    max_position_embeddings=64, **fields).save_pretrained(directory)
  return directory


def refused(config, directory) -> str:
  config.train.init_from = f"hf:{directory}"
  with pytest.raises(errors.UserError) as e:
    pretrained.init_from_config(config, V)
  assert "\n" not in str(e.value)
  return str(e.value)


def test_transformers_4_rope_fields_are_read(tmp_path, capsys):
  """A config.json of transformers 4 (`rope_theta` and `rope_scaling` at the top level) reads as
  5's `rope_parameters`: its theta is compared, and another than the model's said in the run's
  first line (`init_from="say"`, as a workdir's: tests/test_train.py), a scaled rope refused."""
  fields = json.loads((save_config(tmp_path, "llama", intermediate_size=128) / "config.json")
                      .read_text())
  del fields["rope_parameters"]
  for rope, match in [({"rope_theta": 5e5, "rope_scaling": None}, "no model.safetensors"),
                      ({"rope_theta": 1e4, "rope_scaling": {"type": "linear", "factor": 2.0}},
                       "rope_type='linear'")]:
    (tmp_path / "config.json").write_text(json.dumps(fields | rope))
    assert re.search(match, refused(llama_config(), tmp_path))
  assert capsys.readouterr().out.splitlines() == [
      f"actlab: train.init_from=hf:{tmp_path}: model.rope_theta: 500000.0 there, 10000.0 here "
      "(allowed: the parameters carry over)"]


def test_qwen2_is_refused_and_never_written(tmp_path):
  """Qwen2 forces biases on q/k/v (no config field turns them off): its import is one line, and
  every LLaMA-style block the export maps is one family's, written as Llama, Arcee or Qwen3;
  Qwen2 is no family."""
  assert "Qwen2 always has biases on q_proj, k_proj and v_proj" in refused(
      llama_config(), save_config(tmp_path, "qwen2", intermediate_size=128))
  written = set()
  for ffn, qk_norm in [("plain", False), ("gated", False), ("gated", True)]:
    c = llama_config(**{"model.ffn": ffn, "model.qk_norm": qk_norm})
    family, why = hf_checkpoint.model_family(c, "causal_lm", None)
    assert why is None
    written |= set(hf_checkpoint.hf_config(c, family, "causal_lm", V, 256)["architectures"])
  assert written == set(CLASSES) and "qwen2" not in mapping.FAMILIES


@pytest.mark.parametrize("fields, overrides, match", [
    ({"num_key_value_heads": 2, "intermediate_size": 128}, {}, "grouped-query attention"),
    ({"rope_scaling": {"rope_type": "linear", "factor": 2.0}, "intermediate_size": 128}, {},
     "rope_type='linear'.* default"),
    ({"intermediate_size": 256}, {},
     "set --config.model.d_ff=256 --config.model.gated_match_params=False$"),
    ({"intermediate_size": 128, "rope_theta": 5e5, "rms_norm_eps": 1e-5}, {},
     "set --config.model.norm_eps=1e-05$"),  # another rope_theta is said, not refused
    ({"intermediate_size": 128, "attention_bias": True}, {}, "attention_bias=True has no actlab"),
    ({"intermediate_size": 128}, {"model.ffn": "plain"},
     "'llama' model; this run starts from arcee .* set --config.model.ffn=gated"),
    ({"intermediate_size": 128}, {"model.norm_type": "layer", "model.position": "learned",
                                  "model.bias": True, "model.tie_head": True},
     r"this run starts from gpt2 \(GPT2LMHeadModel\): train the LLaMA-style block"),
])
def test_what_cannot_import_is_one_line(tmp_path, fields, overrides, match):
  assert re.search(match, refused(llama_config(**overrides), save_config(tmp_path, "llama",
                                                                         **fields)))


@pytest.mark.parametrize("overrides, match", [
    ({"model.norm_type": "rms"}, r"model.position='learned', model.bias=True, model.tie_head=True: "
     r"the LLaMA-style classes .* not either \(model.norm_type='rms'\)"),
    ({"model.ffn": "plain", "model.qk_norm": True}, "qk_norm=True with a plain FFN"),
    ({"model.norm": "post"}, "pre-norm .* model.norm='post'"),
    ({"model.activation": "elu"}, "no activation equal to actlab's 'elu'"),
])
def test_what_cannot_export_is_one_line(overrides, match):
  c = llama_config(**overrides) if "model.norm_type" not in overrides else tiny(**overrides)
  with pytest.raises(errors.UserError, match=match):
    hf_checkpoint.hf_config(c, "llama", "causal_lm", V, 256)


@pytest.mark.slow
def test_a_trained_run_exports_as_llama_and_a_run_starts_from_the_export(tmp_path, capsys):
  """`actlab.run.export` of a trained LLaMA-style run (`export.write`, the command's function) names
  the class; a run with `train.init_from=hf:` the export starts from every array of it."""
  c = llama_config(**{"train.steps": 2, "optim.warmup_steps": 1, "train.eval_every": 2,
                      "train.checkpoint_every": 2, "data.val_batches": 1,
                      "model.num_layers": 1})  # the layers' mapping: the tests above
  train.run(c, tmp_path / "run")
  line = export.write(tmp_path / "run", tmp_path / "hf", "llama")
  assert "wrote" in line and ": LlamaForCausalLM from " in line, line
  c.train.init_from = f"hf:{tmp_path / 'hf'}"
  train.run(c, tmp_path / "again")
  assert "initialised 12 of 12 parameter arrays from hf:" in capsys.readouterr().out


@pytest.mark.parametrize("scan", [False, True])
def test_a_tied_checkpoint_imports_its_embedding_as_the_head(tmp_path, scan):
  """A tied checkpoint (no lm_head.weight, as transformers saves one) gives actlab's own head the
  embedding's rows; the padded rows of both are the mean of the real ones."""
  from safetensors.numpy import load_file, save_file
  c = llama_config()
  hf_checkpoint.write(tmp_path, c, "llama", "causal_lm", perturbed_params(c, V), V, 256, RUN)
  state = load_file(str(tmp_path / "model.safetensors"))
  del state["lm_head.weight"]
  save_file(state, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
  cfg = json.loads((tmp_path / "config.json").read_text()) | {"tie_word_embeddings": True}
  (tmp_path / "config.json").write_text(json.dumps(cfg))
  _, params = imported(llama_config(**{"model.scan_layers": scan,
                                       "train.init_from": f"hf:{tmp_path}"}), V)
  embedding = np.asarray(params["wte"]["embedding"])
  np.testing.assert_array_equal(embedding[:V], state["model.embed_tokens.weight"])
  np.testing.assert_array_equal(np.asarray(params["lm_head"]), embedding)


def test_rmsnorm_upcasts_bfloat16_as_llama(torch):
  """Llama's RMSNorm of bfloat16 activations: the statistic in float32, the normalised value cast
  back to bfloat16, then the float32 scale. actlab's equals it bit for bit; a norm computed in
  bfloat16, or kept in float32 until the scale, does not."""
  from transformers.models.llama.modeling_llama import LlamaRMSNorm
  rng = np.random.default_rng(0)
  x = jnp.asarray(rng.standard_normal((8, 64)) * rng.uniform(0.5, 30, (8, 1)), jnp.bfloat16)
  scale = (1 + 0.1 * rng.standard_normal(64)).astype(np.float32)
  ours = np.asarray(RMSNorm(1e-6).apply({"params": {"scale": jnp.asarray(scale)}}, x))
  norm = LlamaRMSNorm(64, 1e-6)
  norm.weight.data = torch.tensor(scale)
  with torch.no_grad():
    theirs = norm(torch.tensor(np.asarray(x, np.float32)).to(torch.bfloat16)).numpy()
  np.testing.assert_array_equal(ours, theirs)
  in_bf16 = (x * jax.lax.rsqrt(jnp.mean(x * x, -1, keepdims=True) + 1e-6)
             * scale.astype(jnp.bfloat16))
  x32 = x.astype(jnp.float32)
  in_f32 = scale * x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, -1, keepdims=True) + 1e-6)
  for wrong in (in_bf16, in_f32):
    assert np.abs(np.asarray(wrong, np.float32) - theirs).max() > 1e-3
