"""The BERT-style encoder: shapes, parameter counts (BERT-base exactly), the BERT name mapping,
bidirectionality, padding invariance, post-LN vs pre-LN order, pooler activation."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax.traverse_util import flatten_dict, unflatten_dict

from actlab import core, tasks
from actlab.hf import mapping
from actlab import config as config_lib
from actlab.core.model import Attention, Block, FeedForward, Spec
from actlab.core.model import norm as layer_norm

SPEC = Spec("gelu", num_layers=2, d_model=32, num_heads=2, d_ff=64, max_len=32, vocab_size=128,
            norm="post", norm_eps=1e-12)
PAD = 0


def make(spec=SPEC, head="all", **kw):
  model = core.Encoder(spec, head=head, **kw)
  params = jax.jit(model.init)(jax.random.PRNGKey(0), jnp.zeros((1, 8), jnp.int32))["params"]
  return model, params


@pytest.fixture(scope="module")
def encoder():
  return make()


def tokens(shape, seed=0):
  return jnp.asarray(np.random.default_rng(seed).integers(5, SPEC.vocab_size, shape), jnp.int32)


@pytest.mark.slow
def test_shapes(encoder):
  model, params = encoder
  apply = jax.jit(model.apply)
  out = apply({"params": params}, tokens((3, 16)))
  assert out["mlm"].shape == (3, 16, 128) and out["mlm"].dtype == jnp.float32
  assert out["pooled"].shape == (3, 32)
  assert out["classify"].shape == (3, 2) and out["classify"].dtype == jnp.float32
  positions = jnp.array([[0, 5, 7]] * 3)
  gathered = apply({"params": params}, tokens((3, 16)), masked_positions_BP=positions)
  assert gathered["mlm"].shape == (3, 3, 128)
  np.testing.assert_allclose(gathered["mlm"], out["mlm"][:, [0, 5, 7]], rtol=1e-5, atol=1e-5)
  assert gathered["classify"].shape == (3, 2)


@pytest.mark.parametrize("activation, norm", [("gelu", "post"), ("swiglu", "post"),
                                              ("relu", "pre")])
@pytest.mark.parametrize("head", ["mlm", "classify", "all"])
def test_param_count_closed_form(activation, norm, head):
  spec = dataclasses.replace(SPEC, activation=activation, norm=norm)
  model = core.Encoder(spec, head=head, num_classes=3)
  shapes = jax.eval_shape(model.init, jax.random.PRNGKey(0), jnp.zeros((1, 8), jnp.int32))
  counts = core.count_params(shapes["params"])
  assert counts["total"] == core.param_count(spec, head, num_classes=3)
  assert counts["non_embedding"] == counts["total"] - 128 * 32
  assert ("ln_f" in shapes["params"]) == (norm == "pre")


def bert_base_shapes(head):
  """BERT-base's parameter shapes (no memory: `eval_shape`), built from the `:base` config."""
  c = config_lib.encoder("gelu", "base")
  model = core.Encoder(tasks.get(c).objective(config_lib.typed(c), 30522).model.spec, head=head)
  return model, jax.eval_shape(model.init, jax.random.PRNGKey(0),
                               jnp.zeros((1, 128), jnp.int32))["params"]


@pytest.mark.slow
def test_bert_base_parameter_count():
  """BERT-base: 109,482,240 parameters with the pooler at BERT's vocabulary of 30,522 (the
  "110M"); ours pads the vocabulary to 30,528 (+6·768)."""
  model, _ = bert_base_shapes("mlm")
  spec = model.spec
  assert (spec.num_layers, spec.d_model, spec.num_heads, spec.d_ff, spec.max_len) == (
      12, 768, 12, 3072, 512)
  assert spec.vocab_size == 30528 and spec.norm == "post" and spec.norm_eps == 1e-12
  # BERT as published: the trunk and the pooler (a classifier of no classes) at V = 30,522.
  published = dataclasses.replace(spec, vocab_size=30522)
  assert core.param_count(published, "classify", num_classes=0) == 109_482_240
  # Ours, as an `init` of the encoder counts them (the MLM projection is tied to wte):
  for head, total in (("all", 110_111_042), ("mlm", 109_518_912), ("classify", 109_488_386)):
    _, shapes = bert_base_shapes(head)
    assert core.count_params(shapes)["total"] == core.param_count(spec, head) == total


def expected_hf_names(num_layers):
  """A BERT with every head: the trunk under `bert.`, the heads' names at the top."""
  names = {f"bert.embeddings.{n}.weight" for n in
           ("word_embeddings", "position_embeddings", "token_type_embeddings")}
  names |= {"bert.embeddings.LayerNorm.weight", "bert.embeddings.LayerNorm.bias",
            "cls.predictions.bias", "bert.pooler.dense.weight", "bert.pooler.dense.bias",
            "classifier.weight", "classifier.bias"}
  names |= {f"cls.predictions.transform.{m}.{p}" for m in ("dense", "LayerNorm")
            for p in ("weight", "bias")}
  for i in range(num_layers):
    for m in ("attention.self.query", "attention.self.key", "attention.self.value",
              "attention.output.dense", "attention.output.LayerNorm", "intermediate.dense",
              "output.dense", "output.LayerNorm"):
      names |= {f"bert.encoder.layer.{i}.{m}.weight", f"bert.encoder.layer.{i}.{m}.bias"}
  return names


@pytest.mark.slow
def test_bert_names_are_one_to_one(encoder):
  _, params = encoder
  names = {"/".join(path): mapping.hf_name("bert", path) for path in flatten_dict(params)}
  assert len(set(names.values())) == len(names)
  assert set(names.values()) == expected_hf_names(2)
  assert names["block_1/ffn/up/kernel"] == "bert.encoder.layer.1.intermediate.dense.weight"
  assert names["mlm/bias"] == "cls.predictions.bias"
  state = mapping.to_hf("bert", params, SPEC.vocab_size)
  # PyTorch layout: Linear weights are (out, in).
  assert state["bert.encoder.layer.0.intermediate.dense.weight"].shape == (64, 32)
  assert state["bert.encoder.layer.0.output.dense.weight"].shape == (32, 64)
  assert state["bert.embeddings.word_embeddings.weight"].shape == (128, 32)


def test_from_hf_round_trip_prefix_gamma_and_vocab_padding(encoder):
  model, params = encoder
  state = mapping.to_hf("bert", params, SPEC.vocab_size)
  back, missing = mapping.gather("bert", state, params)
  assert missing == []
  jax.tree.map(np.testing.assert_array_equal, unflatten_dict(back),
               jax.tree.map(np.asarray, params))
  # A `BertModel`'s names (no `bert.` prefix), old gamma/beta, an unpadded vocabulary.
  hf = {k.removeprefix("bert.").replace("LayerNorm.weight", "LayerNorm.gamma")
        .replace("LayerNorm.bias", "LayerNorm.beta"): v for k, v in state.items()}
  hf["embeddings.word_embeddings.weight"] = state["bert.embeddings.word_embeddings.weight"][:100]
  hf["cls.predictions.bias"] = state["cls.predictions.bias"][:100]
  loaded = unflatten_dict(mapping.gather("bert", hf, params)[0])
  np.testing.assert_array_equal(loaded["wte"]["embedding"][:100], params["wte"]["embedding"][:100])
  for padded in (loaded["wte"]["embedding"], loaded["mlm"]["bias"]):  # the mean of the real rows
    mean = np.broadcast_to(padded[:100].mean(0), padded[100:].shape)
    np.testing.assert_allclose(padded[100:], mean, rtol=1e-6, atol=1e-7)
  np.testing.assert_array_equal(loaded["ln_emb"]["scale"], params["ln_emb"]["scale"])
  del hf["encoder.layer.1.output.dense.weight"]
  assert mapping.gather("bert", hf, params)[1] == ["bert.encoder.layer.1.output.dense.weight"]


def test_bidirectional(encoder):
  """Unlike the decoder, a later token changes the outputs at earlier positions."""
  model, params = encoder
  a = tokens((1, 16))
  b = a.at[0, 12].set(a[0, 12] % 100 + 6)
  apply = jax.jit(model.apply)
  out_a, out_b = apply({"params": params}, a)["mlm"], apply({"params": params}, b)["mlm"]
  assert np.abs(out_a[0, :12] - out_b[0, :12]).max() > 1e-4


@pytest.mark.slow
def test_padding_never_changes_unpadded_outputs(encoder):
  model, params = encoder
  apply = jax.jit(lambda t, m: model.apply({"params": params}, t, m))
  real = tokens((2, 10))
  ref = apply(real, jnp.ones_like(real, bool))
  for pad_len, filler in ((6, PAD), (22, PAD), (6, 17)):  # any token id in the padded slots
    padded = jnp.concatenate([real, jnp.full((2, pad_len), filler, jnp.int32)], axis=1)
    mask = jnp.arange(padded.shape[1])[None] < 10
    out = apply(padded, jnp.broadcast_to(mask, padded.shape))
    np.testing.assert_allclose(out["mlm"][:, :10], ref["mlm"], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(out["classify"], ref["classify"], rtol=1e-5, atol=1e-5)
    # Without the mask, attention reads the padding and the outputs change.
    unmasked = apply(padded, jnp.ones_like(padded, bool))
    assert np.abs(unmasked["mlm"][:, :10] - ref["mlm"]).max() > 1e-4


@pytest.mark.slow
def test_objective_masks_padding(encoder):
  """The classification objective derives the attention mask from [PAD]."""
  model = core.Encoder(SPEC, head="classify")
  params = {k: v for k, v in encoder[1].items() if k != "mlm"}  # the classifier's subset
  specials = core.Specials(pad=0, unk=1, cls=2, sep=3, mask=4)
  real = jnp.concatenate([jnp.full((2, 1), 2), tokens((2, 8)), jnp.full((2, 1), 3)], axis=1)
  labels = jnp.array([0, 1])
  loss = jax.jit(lambda batch: core.Classifier(model, specials.pad)(
      params, batch, jax.random.PRNGKey(0), train=False))
  short = loss({"tokens": real, "labels": labels})
  padded = jnp.concatenate([real, jnp.zeros((2, 7), jnp.int32)], axis=1)
  long = loss({"tokens": padded, "labels": labels})
  np.testing.assert_allclose(long.loss_sum, short.loss_sum, rtol=1e-5)
  assert int(long.count) == 2


def _sub(module, params, x, **kw):
  return module.apply({"params": params}, x, **kw)


@pytest.mark.slow
@pytest.mark.parametrize("norm", ["post", "pre"])
def test_block_order(norm):
  """post-LN: x = LN(x + Attn(x)); x = LN(x + FFN(x)). pre-LN: x += Attn(LN(x)); x += FFN(LN(x))."""
  spec = dataclasses.replace(SPEC, norm=norm)
  block = Block(spec, causal=False)
  x = jax.random.normal(jax.random.PRNGKey(1), (2, 8, 32))
  p = block.init(jax.random.PRNGKey(0), x)["params"]
  p = jax.tree.map(lambda v: v + 0.1 * jax.random.normal(jax.random.PRNGKey(2), v.shape), p)
  attn = lambda h: _sub(Attention(spec, causal=False), p["attn"], h)
  ffn = lambda h: _sub(FeedForward(spec), p["ffn"], h)
  ln = lambda name, h: _sub(layer_norm(spec, core.Execution(), name), p[name], h)

  @jax.jit
  def by_hand(x):
    if norm == "post":
      h = ln("ln_attn", x + attn(x))
      return ln("ln_ffn", h + ffn(h))
    h = x + attn(ln("ln_attn", x))
    return h + ffn(ln("ln_ffn", h))

  got, _ = jax.jit(block.apply)({"params": p}, x)
  np.testing.assert_allclose(got, by_hand(x), rtol=1e-5, atol=1e-5)
  # Post-LN ends in a LayerNorm: every position leaves the block normalized (scale ≈ 1.1 here).
  assert np.allclose(np.asarray(got).std(-1), 1.0, atol=0.3) == (norm == "post")
  # The other order gives something else: the two are different code paths.
  other = Block(dataclasses.replace(spec, norm="pre" if norm == "post" else "post"), causal=False)
  assert np.abs(jax.jit(other.apply)({"params": p}, x)[0] - got).max() > 1e-2


@pytest.mark.slow
def test_pooler_activation(encoder):
  """pooled = act(dense(h[CLS])): identity gives the dense output, tanh and gelu act on it."""
  from actlab.core import activations
  _, params = encoder
  t = tokens((2, 8))
  pooled = {name: jax.jit(core.Encoder(SPEC, head="all", pooler_activation=name).apply)(
      {"params": params}, t)["pooled"] for name in ("identity", "tanh", "gelu")}
  for name in ("tanh", "gelu"):
    np.testing.assert_allclose(pooled[name], activations.get(name).fn(pooled["identity"]),
                               rtol=1e-5, atol=1e-6)
  assert np.abs(pooled["tanh"]).max() < 1.0 and np.abs(pooled["identity"]).max() > 0.05
  # The pooler reads the first ([CLS]) position: later tokens act only through attention.
  t2 = t.at[:, 1:].set(t[:, 1:] % 50 + 7)
  other = jax.jit(core.Encoder(SPEC, head="all", pooler_activation="identity").apply)(
      {"params": params}, t2)["pooled"]
  assert np.abs(other - pooled["identity"]).max() > 1e-4


def test_mlm_head_is_tied_to_word_embeddings(encoder):
  _, params = encoder
  assert set(params["mlm"]) == {"dense", "ln", "bias"}
  assert not any("decoder" in k or "out" == k for k in params["mlm"])
  model = core.Encoder(SPEC, head="mlm")
  t = tokens((1, 8))
  p = jax.tree.map(lambda v: v, params)
  apply = jax.jit(model.apply)
  base = apply({"params": p}, t)
  p2 = {**p, "wte": {"embedding": p["wte"]["embedding"].at[4].add(jnp.linspace(-1, 1, 32))}}
  # Token 4 is not in the input: only its output logit moves, through the tied projection.
  assert 4 not in np.asarray(t)
  diff = np.abs(apply({"params": p2}, t) - base).max(axis=(0, 1))
  assert diff[4] > 1e-3 and np.delete(diff, 4).max() < 1e-6


def test_config_variants_and_validation():
  for v in ("", "smoke", "base", "classify", "smoke_classify", "base_classify"):
    c = config_lib.encoder("gelu", v)
    config_lib.validate(c)
    assert c.model.kind == "encoder" and c.model.norm == "post" and c.model.norm_eps == 1e-12
    assert c.model.task == ("classify" if "classify" in v else "mlm")
  small = config_lib.encoder("gelu")
  assert (small.model.num_layers, small.model.d_model) == (4, 256)
  with pytest.raises(config_lib.ConfigError, match="unknown encoder config variant"):
    config_lib.encoder("gelu", "huge")
  bad = [("model.pooler_activation", "swiglu", "gated"), ("model.pooler_activation", "nope",
                                                           "unknown activation"),
         ("model.task", "lm", "choose 'mlm' or 'classify'"), ("data.tokenizer", "byte",
                                                              "wordpiece"),
         ("data.mlm_prob", 0.0, "mlm_prob"), ("data.mlm_random_frac", 0.5, "sum <= 1"),
         ("data.classify", "imdb", "data.classify"), ("model.num_classes", 1, "num_classes")]
  for key, value, message in bad:
    c = config_lib.encoder("gelu", "smoke")
    section, field = key.split(".")
    c[section][field] = value
    with pytest.raises(config_lib.ConfigError, match=message):
      config_lib.validate(c)
  d = config_lib.decoder("gelu", "smoke")
  d.model.kind = "encoder"
  with pytest.raises(config_lib.ConfigError, match="bert_"):
    config_lib.validate(d)


@pytest.mark.parametrize("activation", ["gelu", "tanh", "relu", "swiglu"])
def test_config_files(activation):
  import importlib.util
  import pathlib
  path = pathlib.Path(__file__).resolve().parents[1] / "configs" / f"bert_{activation}.py"
  spec = importlib.util.spec_from_file_location(f"bert_{activation}", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  for variant in (None, "smoke", "base_classify"):
    c = module.get_config(variant)
    config_lib.validate(c)
    assert c.model.activation == activation and c.model.kind == "encoder"
