"""Decoder: shapes, causality, parameter counts, initialisation, jit equals no-jit."""

import dataclasses
import flax
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from actlab import core, tasks
from actlab import config as config_lib
from actlab.core import activations
from actlab.core import model as model_lib
from actlab.core.model import Spec
from conftest import tiny


def spec_of(c, vocab: int) -> Spec:
  """The `Spec` the config's task builds."""
  return tasks.get(c).objective(config_lib.typed(c), vocab).model.spec


def init(c, vocab=257, seed=0):
  model = tasks.get(c).objective(config_lib.typed(c), vocab).model
  tokens = jnp.zeros((2, c.data.seq_len), jnp.int32)
  return model, jax.jit(model.init)(jax.random.PRNGKey(seed), tokens)["params"]


def init_shapes(c, vocab=257):
  """The model of `c` and its parameters' shapes (`jax.eval_shape`: nothing is compiled)."""
  model = tasks.get(c).objective(config_lib.typed(c), vocab).model
  tokens = jnp.zeros((2, c.data.seq_len), jnp.int32)
  return model, jax.eval_shape(model.init, jax.random.PRNGKey(0), tokens)["params"]


@pytest.fixture(scope="module")
def gelu():
  """`init(tiny("gelu"))` and its jitted `apply`, shared by the tests of one model."""
  model, params = init(tiny("gelu"))
  return model, params, jax.jit(model.apply, static_argnames=("method", "train"))


@pytest.mark.parametrize("activation", ["gelu", "relu", "swiglu", "bilinear"])
def test_shapes_and_param_formula(activation):
  model, params = init_shapes(tiny(activation, **{"model.d_ff": 96}))
  spec = model.spec
  assert spec.vocab_size == 320  # 257 padded to a multiple of 64
  logits = jax.eval_shape(model.apply, {"params": params}, jnp.zeros((3, 32), jnp.int32))
  assert logits.shape == (3, 32, 320) and logits.dtype == jnp.float32
  gated = activations.get(activation).gated
  assert spec.ffn_width == (64 if gated else 96)  # gated: round(2/3·96 / 64)·64
  counts = core.count_params(params)
  assert counts["total"] == core.param_count(spec)
  assert counts["non_embedding"] == counts["total"] - 320 * 32


def test_reference_configuration_counts():
  """docs/reference.md §2.1: 6 layers, 384, 6 heads, ctx 128, vocab 50,304 → ≈10.7M without wte."""
  c = config_lib.decoder("gelu")
  model = tasks.get(c).objective(config_lib.typed(c), 50257).model
  shapes = jax.eval_shape(lambda: model.init(jax.random.PRNGKey(0),
                                             jnp.zeros((1, 128), jnp.int32)))["params"]
  counts = core.count_params(shapes)
  assert model.spec.vocab_size == 50304
  assert counts["non_embedding"] == core.param_count(model.spec) - 50304 * 384 == 10_696_704
  assert counts["total"] == 10_696_704 + 50304 * 384


@pytest.mark.parametrize("d_ff, width", [(1536, 1024), (3072, 2048), (2048, 1344), (64, 64)])
def test_gated_width_is_parameter_matched(d_ff, width):
  spec = Spec("swiglu", 1, 384, 6, d_ff, 128, 64)
  assert spec.ffn_width == width
  assert Spec("swiglu", 1, 384, 6, d_ff, 128, 64, gated_match_params=False).ffn_width == d_ff
  assert Spec("gelu", 1, 384, 6, d_ff, 128, 64).ffn_width == d_ff


def test_gated_ffn_matches_plain_within_a_few_percent():
  c = config_lib.decoder("gelu")
  plain = tasks.get(c).objective(config_lib.typed(c), 50257).model
  c.model.activation = "swiglu"
  gated = tasks.get(c).objective(config_lib.typed(c), 50257).model
  count = lambda m: core.count_params(jax.eval_shape(
      lambda: m.init(jax.random.PRNGKey(0), jnp.zeros((1, 8), jnp.int32)))["params"])
  a, b = count(plain)["non_embedding"], count(gated)["non_embedding"]
  assert abs(a - b) / a < 0.03


@pytest.mark.slow
def test_causality(gelu):
  """Changing token t never changes the logits at positions before t."""
  _, params, apply = gelu
  rng = np.random.default_rng(0)
  tokens = rng.integers(0, 257, (2, 32))
  base = apply({"params": params}, tokens)
  for t in (0, 5, 17, 31):
    changed = tokens.copy()
    changed[0, t] = (changed[0, t] + 1) % 257
    out = apply({"params": params}, changed)
    np.testing.assert_array_equal(out[0, :t], base[0, :t])
    assert not np.allclose(out[0, t], base[0, t])


@pytest.mark.slow
def test_jit_equals_no_jit():
  c = tiny("swiglu")
  model, params = init(c)
  tokens = np.random.default_rng(1).integers(0, 257, (2, 32))
  eager = model.apply({"params": params}, tokens)
  jitted = jax.jit(lambda p, t: model.apply({"params": p}, t))(params, tokens)
  np.testing.assert_allclose(eager, jitted, rtol=1e-5, atol=1e-5)


def test_gpt2_initialisation():
  c = config_lib.decoder("gelu")
  c.model.update(num_layers=2, d_model=128, num_heads=4, d_ff=512)
  _, params = init(c, vocab=1024)  # ≥ 16k entries a matrix: its std within 5% for sure
  block = params["block_0"]
  np.testing.assert_allclose(np.std(params["wte"]["embedding"]), 0.02, rtol=0.05)
  np.testing.assert_allclose(np.std(block["attn"]["query"]["kernel"]), 0.02, rtol=0.05)
  residual = 0.02 / np.sqrt(2 * 2)  # 1/√(2L), not 1/√L (0.014)
  np.testing.assert_allclose(np.std(block["attn"]["out"]["kernel"]), residual, rtol=0.05)
  np.testing.assert_allclose(np.std(block["ffn"]["down"]["kernel"]), residual, rtol=0.05)
  assert np.all(block["ffn"]["up"]["bias"] == 0) and np.all(block["ln_ffn"]["scale"] == 1)


@pytest.mark.slow
def test_tied_head_uses_token_embedding(gelu):
  model, params, _ = gelu
  assert set(params) == {"wte", "wpe", "ln_f", "block_0"}  # no separate head
  tokens = jnp.zeros((1, 4), jnp.int32)
  grads = jax.jit(jax.grad(lambda p: model.apply({"params": p}, tokens)[0, -1, 7]))(params)
  assert np.abs(grads["wte"]["embedding"][7]).sum() > 0  # the head row of token 7 is wte[7]


@pytest.mark.slow
def test_dropout_only_in_training(gelu):
  c = tiny("gelu", **{"model.dropout": 0.5})
  model, params = tasks.get(c).objective(config_lib.typed(c), 257).model, gelu[1]  # dropout adds no parameters
  tokens = jnp.zeros((1, 8), jnp.int32)
  apply = jax.jit(model.apply, static_argnames="train")
  a = apply({"params": params}, tokens)
  b = apply({"params": params}, tokens)
  np.testing.assert_array_equal(a, b)
  t1 = apply({"params": params}, tokens, train=True, rngs={"dropout": jax.random.PRNGKey(1)})
  assert not np.allclose(a, t1)


@pytest.mark.slow
@pytest.mark.parametrize("causal,padded", [(True, False), (False, True), (True, True)])
def test_attention_equals_jax_reference(causal, padded):
  """The heads-major XLA attention is softmax(q·kᵀ/√K)·v: equal to jax.nn.dot_product_attention
  (sequence-major) under causal and padding masks, and so are the projections around it."""
  r = np.random.default_rng(0)
  q, k, v = (jnp.asarray(r.normal(size=(2, 3, 6, 8)), jnp.float32) for _ in range(3))
  mask = None
  if padded:
    mask = jnp.asarray(np.arange(6)[None, :] < np.array([[6], [4]]))[:, None, None, :]
  to_BLHK = lambda x: x.transpose(0, 2, 1, 3)
  ref = to_BLHK(jax.nn.dot_product_attention(to_BLHK(q), to_BLHK(k), to_BLHK(v), mask=mask,
                                             is_causal=causal, implementation="xla"))
  np.testing.assert_allclose(model_lib.xla_attention(q, k, v, mask, causal=causal)[0], ref,
                             atol=1e-6)

  spec = spec_of(tiny(), 64)
  x = jnp.asarray(r.normal(size=(2, 5, spec.d_model)), jnp.float32)
  split = model_lib.HeadsDense(spec, split=True)
  params = split.init(jax.random.PRNGKey(1), x)
  dense = {"params": params["params"]}  # the same parameters an nn.Dense(d_model) has
  y = jax.nn.relu(x) @ params["params"]["kernel"] + params["params"]["bias"]
  heads = split.apply(dense, jax.nn.relu(x))
  B, H, L, K = heads.shape
  np.testing.assert_allclose(heads.transpose(0, 2, 1, 3).reshape(B, L, H * K), y, atol=1e-5)
  merge = model_lib.HeadsDense(spec, split=False)
  np.testing.assert_allclose(merge.apply(dense, heads), y.reshape(B, L, -1) @ params["params"][
      "kernel"] + params["params"]["bias"], atol=1e-5)
  reference = flax.linen.Dense(spec.d_model, kernel_init=jax.nn.initializers.normal(0.02))
  assert all(jax.tree.leaves(jax.tree.map(jnp.array_equal, params,
                                          reference.init(jax.random.PRNGKey(1), x))))


@pytest.mark.slow
def test_hidden_is_the_tied_heads_input(gelu):
  """`hidden` (the fused loss's input) is the final LayerNorm's output; the logits are its
  product with the token embedding."""
  _, params, apply = gelu
  tokens = np.random.default_rng(2).integers(0, 257, (2, 32))
  h = apply({"params": params}, tokens, method="hidden")
  assert h.shape == (2, 32, 32)
  np.testing.assert_allclose(apply({"params": params}, tokens),
                             h @ params["wte"]["embedding"].T, rtol=1e-5, atol=1e-5)


def attention_and_input(qk_norm: bool, seed: int = 0):
  """A tiny decoder's first attention layer, its parameters and an input [2, 8, D]."""
  spec = spec_of(tiny(**{"model.qk_norm": qk_norm}), 64)
  attn = model_lib.Attention(spec, causal=True)
  x = jnp.asarray(np.random.default_rng(seed).normal(size=(2, 8, spec.d_model)), jnp.float32)
  return spec, attn, attn.init(jax.random.PRNGKey(seed), x)["params"], x


def test_qk_norm_normalises_queries_and_keys_over_the_head_dim():
  """qk-layernorm: `query_norm` and `key_norm` of [K]; the output does not change when the
  query and key projections are scaled (LayerNorm removes the scale), and every attention logit
  of a unit-scale norm is at most √K (|LN(q)·LN(k)| ≤ K)."""
  spec, attn, params, x = attention_and_input(qk_norm=True)
  K = spec.d_model // spec.num_heads
  assert {n: p["scale"].shape for n, p in params.items() if n.endswith("_norm")} == {
      "query_norm": (K,), "key_norm": (K,)}
  scaled = {**params, **{n: jax.tree.map(lambda a: 30.0 * a, params[n]) for n in ("query", "key")}}
  out = attn.apply({"params": params}, x)
  # Equal but for LayerNorm's ε, which weighs less on the scaled projections: about 4e-4 of the
  # output's scale here.
  np.testing.assert_allclose(attn.apply({"params": scaled}, x), out,
                             atol=1e-3 * float(np.abs(out).max()))
  _, sown = model_lib.apply(attn, scaled, x, stats=True)
  assert float(sown["attention"][0].logit_max) <= np.sqrt(K)
  _, plain_attn, plain_params, _ = attention_and_input(qk_norm=False)
  _, plain_sown = model_lib.apply(plain_attn, {**plain_params, **{
      n: scaled[n] for n in ("query", "key")}}, x, stats=True)
  assert float(plain_sown["attention"][0].logit_max) > np.sqrt(K)  # without it, the scale shows


def test_qk_norm_off_by_default_leaves_the_model_unchanged(gelu):
  """The default (`model.qk_norm` false) is the model without the field (a `Spec` not given it):
  the same parameters and logits, bit for bit; the decoder and the encoder gain the norms only
  when it is on."""
  assert tiny().model.qk_norm is False and tiny().model.activation == "gelu"
  model, params, apply = gelu
  fields = {k: v for k, v in dataclasses.asdict(model.spec).items() if k != "qk_norm"}
  model_without = core.Decoder(Spec(**fields), model.execution)
  params_without = jax.jit(model_without.init)(jax.random.PRNGKey(0),
                                               jnp.zeros((2, 32), jnp.int32))["params"]
  assert jax.tree.all(jax.tree.map(jnp.array_equal, params, params_without))
  tokens = np.random.default_rng(1).integers(0, 257, (2, 32))
  assert jnp.array_equal(apply({"params": params}, tokens),
                         jax.jit(model_without.apply)({"params": params_without}, tokens))
  has_norms = lambda p: any("query_norm" in jax.tree_util.keystr(path)
                            for path, _ in jax.tree_util.tree_leaves_with_path(p))
  assert not has_norms(params)
  qk_model, qk_params = init_shapes(tiny(**{"model.qk_norm": True}))
  assert has_norms(qk_params)
  assert core.count_params(qk_params)["total"] == core.param_count(qk_model.spec)
  encoder = config_lib.encoder("gelu", "smoke")
  encoder.model.qk_norm = True
  assert has_norms(init_shapes(encoder, vocab=300)[1])
