"""The block options (`model.norm_type`, `position`, `bias`, `tie_head`, `ffn`, `qk_norm`) and the
LLaMA-style block they make: RMSNorm and RoPE against closed forms (half-split, not interleaved),
parameter counts against the closed form, causality, cached decoding, the attention statistics
after RoPE, and one-line errors. Trained, swept, reported, resumed: test_modern_block_runs.py;
sharded: test_parallel.py; beside PyTorch: test_bench.py."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from actlab import config as config_lib
from actlab import core, tasks
from actlab.core import model as model_lib
from conftest import tiny

LLAMA = config_lib.BLOCKS["llama"]


def llama(activation="silu", **overrides):
  return tiny(activation, **{**LLAMA, **overrides})


def init(c, vocab=257, seed=0):
  model = tasks.get(c).objective(config_lib.typed(c), vocab).model
  return model, jax.jit(model.init)(jax.random.PRNGKey(seed),
                                    jnp.zeros((2, c.data.seq_len), jnp.int32))["params"]


def test_rms_norm_is_llamas_in_float32():
  x = np.random.default_rng(0).normal(0, 3, (2, 5, 16)).astype(np.float32)
  norm = model_lib.RMSNorm(1e-6)
  params = norm.init(jax.random.PRNGKey(0), x)["params"]
  np.testing.assert_array_equal(params["scale"], np.ones(16, np.float32))  # initialised to 1
  scale = np.linspace(0.5, 2.0, 16).astype(np.float32)
  x64 = x.astype(np.float64)
  expected = x64 / np.sqrt((x64**2).mean(-1, keepdims=True) + 1e-6) * scale
  np.testing.assert_allclose(norm.apply({"params": {"scale": scale}}, x), expected, rtol=2e-6)
  # bfloat16 in: the statistic in float32 (squares of 300 overflow no float32, and the mean is
  # not rounded to bfloat16's 8 bits), cast back before the scale, as Llama does.
  xb = jnp.asarray(x * 100, jnp.bfloat16)
  yb = model_lib.RMSNorm(1e-6, jnp.bfloat16).apply({"params": {"scale": scale}}, xb)
  x32 = np.asarray(xb, np.float32)
  ref = (x32 / np.sqrt((x32**2).mean(-1, keepdims=True) + 1e-6)).astype(jnp.bfloat16)
  np.testing.assert_array_equal(np.asarray(yb), np.asarray(
      (jnp.asarray(scale) * ref.astype(jnp.bfloat16)).astype(jnp.bfloat16)))


def rotate(x, positions, theta, pairs):
  """float64 rotation of feature pairs `pairs` [(i, j), ...] by position · theta^(−2m/K)."""
  x = np.asarray(x, np.float64).copy()
  K, out = x.shape[-1], x.copy()
  for m, (i, j) in enumerate(pairs):
    angle = positions[:, None] * theta ** (-2.0 * m / K)
    c, s = np.cos(angle)[..., 0], np.sin(angle)[..., 0]
    out[..., i] = x[..., i] * c - x[..., j] * s
    out[..., j] = x[..., j] * c + x[..., i] * s
  return out


def test_rope_is_the_half_split_rotation_not_the_interleaved_one():
  """transformers' `rotate_half` pairs feature m with m + K/2; the original RoPE paper and Meta's
  checkpoints pair 2m with 2m + 1. A port that mixes them up is wrong but runs."""
  K, L = 8, 6
  x = np.random.default_rng(1).normal(size=(1, 2, L, K)).astype(np.float32)
  positions = np.arange(3, 3 + L)
  y = np.asarray(model_lib.rope(jnp.asarray(x), jnp.asarray(positions), 10000.0))
  half = [(m, m + K // 2) for m in range(K // 2)]
  interleaved = [(2 * m, 2 * m + 1) for m in range(K // 2)]
  np.testing.assert_allclose(y, rotate(x, positions, 10000.0, half), atol=1e-5)
  assert not np.allclose(y, rotate(x, positions, 10000.0, interleaved), atol=1e-2)


def test_rope_makes_attention_logits_depend_on_relative_position_only():
  K = 16
  rng = np.random.default_rng(2)
  q, k = (jnp.asarray(rng.normal(size=(1, 1, 1, K)), jnp.float32) for _ in range(2))
  logit = lambda i, j: float((model_lib.rope(q, jnp.array([i]), 500.0)
                              * model_lib.rope(k, jnp.array([j]), 500.0)).sum())
  assert logit(7, 3) == pytest.approx(logit(104, 100), abs=1e-4)
  assert logit(7, 3) != pytest.approx(logit(7, 4), abs=1e-3)


@pytest.mark.parametrize("overrides", [
    LLAMA, {**LLAMA, "model.ffn": "plain"}, {**LLAMA, "model.qk_norm": True},
    {"model.bias": False}, {"model.norm_type": "rms"}, {"model.position": "rope"},
    {"model.tie_head": False}, {"model.ffn": "gated"}, {"model.qk_norm": True, "model.bias": False},
    {"model.ffn": "gated", "model.gated_match_params": False}])
@pytest.mark.parametrize("activation", ["relu2", "gelu"])
def test_every_combination_counts_as_its_closed_form(overrides, activation):
  c = tiny(activation, **overrides)
  config_lib.validate(c)
  model = tasks.get(c).objective(config_lib.typed(c), 257).model
  shapes = jax.eval_shape(model.init, jax.random.PRNGKey(0), jnp.zeros((2, 8), jnp.int32))
  counted = core.count_params(shapes["params"])["total"]
  assert counted == core.param_count(model.spec)
  names = {"/".join(map(str, (k.key for k in path)))
           for path, _ in jax.tree_util.tree_leaves_with_path(shapes["params"])}
  assert any(n.endswith("bias") for n in names) == c.model.bias
  assert ("wpe/embedding" in names) == (c.model.position == "learned")
  assert ("lm_head" in names) == (not c.model.tie_head)
  assert any("/gate/" in n for n in names) == (c.model.ffn == "gated")


def test_gated_ffn_for_any_activation_is_its_glu_name_with_the_same_weights():
  """`ffn="gated"` with SiLU computes what the `swiglu` name does, parameter for parameter."""
  a_model, params = init(tiny("swiglu"))
  b_model, b_params = init(tiny("silu", **{"model.ffn": "gated"}))
  assert jax.tree.map(jnp.shape, params) == jax.tree.map(jnp.shape, b_params)
  tokens = np.random.default_rng(3).integers(0, 257, (2, 16))
  np.testing.assert_array_equal(a_model.apply({"params": params}, tokens),
                                b_model.apply({"params": params}, tokens))


@pytest.mark.slow
def test_the_modern_block_is_causal_and_decodes_by_absolute_position():
  c = llama("relu2", **{"model.qk_norm": True})
  model, params = init(c)
  tokens = np.random.default_rng(4).integers(0, 257, (2, 20))
  full = model.apply({"params": params}, tokens)
  changed = tokens.copy()
  changed[0, 9] = (changed[0, 9] + 1) % 257
  out = model.apply({"params": params}, changed)
  np.testing.assert_array_equal(out[0, :9], full[0, :9])
  assert not np.allclose(out[0, 9], full[0, 9])
  shapes = jax.eval_shape(lambda: model.init(jax.random.PRNGKey(0), tokens[:, :5], decode=True))
  cache = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes["cache"])
  step = jax.jit(lambda cache, t: model.apply({"params": params, "cache": cache}, t, decode=True,
                                              mutable=["cache"]))
  logits, v = step(cache, tokens[:, :5])
  outs = [logits]
  for t in range(5, 20):
    logits, v = step(v["cache"], tokens[:, t:t + 1])
    outs.append(logits)
  np.testing.assert_allclose(np.concatenate(outs, axis=1), full, rtol=1e-5, atol=1e-5)


def test_attention_statistics_are_those_of_the_rotated_queries_and_keys():
  """The stability measures (`AttentionStats`: the largest logit, each head's mean entropy) of
  the modern block are those of the logits attention uses, q·k/√K after qk-norm and RoPE: here
  recomputed in float64 for layer 0 from its parameters (norm scales made non-trivial)."""
  c = llama("relu2", **{"model.ffn": "plain", "model.qk_norm": True})
  model, params = init(c)
  rng = np.random.default_rng(6)
  block = dict(params["block_0"], ln_attn={"scale": rng.uniform(0.5, 2, 32).astype(np.float32)})
  block["attn"] = dict(block["attn"], **{n: {"scale": rng.uniform(0.5, 2, 16).astype(np.float32)}
                                         for n in ("query_norm", "key_norm")})
  params = dict(params, block_0=block)
  tokens = rng.integers(0, 257, (2, c.data.seq_len))
  _, sown = jax.jit(lambda p, t: core.apply(model, p, t, stats=True))(params, tokens)
  stats = core.per_layer(sown, core.AttentionStats)[0]

  p = jax.tree.map(lambda a: np.asarray(a, np.float64), params)["block_0"]
  eps, (B, L), H = c.model.norm_eps, tokens.shape, c.model.num_heads
  rms = lambda x, scale: x / np.sqrt((x**2).mean(-1, keepdims=True) + eps) * scale
  x = rms(np.asarray(params["wte"]["embedding"], np.float64)[tokens], p["ln_attn"]["scale"])
  K = x.shape[-1] // H
  heads = lambda name: rms((x @ p["attn"][name]["kernel"]).reshape(B, L, H, K).transpose(
      0, 2, 1, 3), p["attn"][f"{name}_norm"]["scale"])
  half = [(m, m + K // 2) for m in range(K // 2)]
  q, k = (rotate(heads(n), np.arange(L), c.model.rope_theta, half) for n in ("query", "key"))
  logits = np.where(np.tril(np.ones((L, L), bool)), q @ k.swapaxes(-1, -2) / np.sqrt(K), -np.inf)
  probs = np.exp(logits - logits.max(-1, keepdims=True))
  probs /= probs.sum(-1, keepdims=True)
  entropy_H = -np.where(probs > 0, probs * np.log(np.where(probs > 0, probs, 1)), 0).sum(-1)
  np.testing.assert_allclose(stats.logit_max, logits.max(), rtol=1e-5)
  np.testing.assert_allclose(stats.entropy_H, entropy_H.mean((0, 2)), rtol=1e-5)
  unrotated = heads("query") @ heads("key").swapaxes(-1, -2) / np.sqrt(K)
  assert abs(unrotated[..., np.tril(np.ones((L, L), bool))].max() - logits.max()) > 1e-2


def test_the_untied_head_is_its_own_matrix():
  model, params = init(llama())
  h = np.random.default_rng(5).normal(size=(1, 3, params["lm_head"].shape[1])).astype(np.float32)
  logits = model.apply({"params": params}, jnp.asarray(h), method="logits")
  np.testing.assert_allclose(logits, h @ np.asarray(params["lm_head"]).T, rtol=1e-5, atol=1e-5)
  assert params["lm_head"].shape == params["wte"]["embedding"].shape
  assert not np.allclose(params["lm_head"], params["wte"]["embedding"])


@pytest.mark.parametrize("overrides, message", [
    ({"model.ffn": "plain"}, "model.ffn='plain' with model.activation='swiglu', a gated (GLU) "
                             "name: use its plain activation ('silu') or model.ffn='gated'"),
    ({"model.norm_type": "batch"}, "model.norm_type='batch': choose 'layer' or 'rms'"),
    ({"model.position": "alibi"}, "model.position='alibi': choose 'learned' or 'rope'"),
    ({"model.position": "rope", "model.num_heads": 4, "model.d_model": 36},
     "model.position='rope' rotates pairs of features: the head dim d_model/num_heads = 9 must "
     "be even"),
    ({"model.bias": "no"}, "model.bias='no': expected bool, got str"),
])
def test_a_bad_block_option_is_one_line(overrides, message):
  with pytest.raises(config_lib.ConfigError) as e:
    config_lib.validate(tiny("swiglu", **overrides))
  assert str(e.value) == message


def test_the_encoder_refuses_the_decoders_block_options():
  c = config_lib.encoder("gelu", "smoke")
  config_lib.override(c, {"model.norm_type": "rms", "model.tie_head": False})
  with pytest.raises(config_lib.ConfigError, match=r"^model.norm_type='rms', model.tie_head=False: "
                     "the encoder builds BERT's block"):
    config_lib.validate(c)


def test_the_llama_block_is_a_named_combination_for_any_activation():
  for act in ("silu", "relu", "gelu", "relu2"):
    c = config_lib.decoder(act, "smoke", "llama")
    assert {k: c.model[k.split(".")[1]] for k in LLAMA} == LLAMA and c.model.activation == act
  assert config_lib.decoder("gelu", "smoke").model.position == "learned"  # GPT-2 by default
  with pytest.raises(config_lib.ConfigError, match="unknown block 'mamba'; choose one of: "
                                                   "'gpt2', 'llama'"):
    config_lib.decoder("gelu", "smoke", "mamba")
