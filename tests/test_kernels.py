"""The fused LM-head cross-entropy (actlab/core/kernels.py) against the plain one: values, gradients,
second order, vmap, bfloat16, chunking, and inside the decoder's loss."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from actlab.core import kernels
from actlab.run import program
from conftest import tiny


def plain_xent_sum(h, E, t, w=None):
  logits = jnp.einsum("bld,vd->blv", h, E.astype(h.dtype), preferred_element_type=jnp.float32)
  losses = optax.softmax_cross_entropy_with_integer_labels(logits, t)
  return (losses if w is None else losses * w).sum()


def inputs(B=4, L=8, D=16, V=96, seed=0, dtype=jnp.float32):
  r = np.random.default_rng(seed)
  return (jnp.asarray(r.normal(size=(B, L, D)), dtype), jnp.asarray(r.normal(size=(V, D)) * 0.3,
          jnp.float32), jnp.asarray(r.integers(0, V, (B, L)), jnp.int32),
          jnp.asarray(r.uniform(size=(B, L)) > 0.3, jnp.float32))


def relative_error(a, b):
  return float(optax.tree.norm(jax.tree.map(lambda x, y: x - y, a, b)) / optax.tree.norm(a))


@pytest.mark.slow
@pytest.mark.parametrize("chunk", [1, 2, 8])
@pytest.mark.parametrize("weighted", [False, True])
def test_fused_xent_equals_plain(chunk, weighted):
  h, E, t, w = inputs()
  w = w if weighted else None
  ref, ref_g = jax.value_and_grad(plain_xent_sum, argnums=(0, 1))(h, E, t, w)
  f = lambda h, E: kernels.xent_sum(h, E, t, w, chunk=chunk)["loss_sum"]
  val, g = jax.jit(jax.value_and_grad(f, argnums=(0, 1)))(h, E)
  assert abs(float(val - ref)) <= 1e-5 * abs(float(ref))
  assert relative_error(ref_g, g) <= 1e-5
  assert abs(float(jax.jit(f)(h, E) - ref)) <= 1e-5 * abs(float(ref))  # forward-only path


@pytest.mark.slow
def test_fused_xent_second_order_and_vmap():
  h, E, t, _ = inputs()
  v = jax.tree.map(lambda x: jnp.ones_like(x) * 0.01, (h, E))
  hvp = lambda f: jax.jvp(jax.grad(lambda a: f(*a)), ((h, E),), (v,))[1]  # the sharpness HVP
  ref = hvp(lambda h, E: plain_xent_sum(h, E, t))
  got = hvp(lambda h, E: kernels.xent_sum(h, E, t, chunk=2)["loss_sum"])
  assert relative_error(ref, got) <= 1e-5
  hs = jnp.stack([h, 2 * h])
  per_run = jax.vmap(jax.grad(lambda h: kernels.xent_sum(h, E, t, chunk=4)["loss_sum"]))(hs)
  assert relative_error(jax.grad(lambda h: plain_xent_sum(h, E, t))(2 * h), per_run[1]) <= 1e-5


@pytest.mark.slow
def test_fused_xent_bfloat16_keeps_float32_statistics():
  h, E, t, _ = inputs(dtype=jnp.bfloat16)
  val = kernels.xent_sum(h, E, t, chunk=4)["loss_sum"]
  assert val.dtype == jnp.float32
  ref = plain_xent_sum(h, E, t)  # the same bf16 operands, float32 logits
  assert abs(float(val - ref)) <= 1e-5 * abs(float(ref))
  g = jax.grad(lambda h, E: kernels.xent_sum(h, E, t)["loss_sum"], argnums=(0, 1))(h, E)
  assert g[0].dtype == jnp.bfloat16 and g[1].dtype == jnp.float32


def plain_sums(h, E, t, w, z_loss):
  """`kernels.xent_sum`'s sums from the [B, L, V] logits, by autodiff."""
  logits = jnp.einsum("bld,vd->blv", h, E.astype(h.dtype), preferred_element_type=jnp.float32)
  logz = jax.nn.logsumexp(logits, axis=-1)
  z_loss_sum = z_loss * (w * logz**2).sum()
  return {"loss_sum": plain_xent_sum(h, E, t, w) + z_loss_sum, "z_loss_sum": z_loss_sum,
          "logz_sum": jax.lax.stop_gradient((w * logz).sum())}


@pytest.mark.slow
@pytest.mark.parametrize("chunk", [1, 8])
def test_fused_z_loss_and_logz_equal_plain(chunk):
  """With the z-loss and logZ on, every sum and the gradient of `loss_sum` (which now has the
  factor 1 + 2·z_loss·logZ on the softmax) equal autodiff of the logits, to float32 rounding."""
  h, E, t, w = inputs()
  h = 3 * h  # logZ far from 0, so that the z-loss's gradient matters
  ref = plain_sums(h, E, t, w, 1e-2)
  ref_g = jax.grad(lambda h, E: plain_sums(h, E, t, w, 1e-2)["loss_sum"], argnums=(0, 1))(h, E)
  f = lambda h, E: kernels.xent_sum(h, E, t, w, chunk=chunk, z_loss=1e-2, logz=True)
  got = jax.jit(f)(h, E)
  assert got.keys() == ref.keys()
  for k in ref:
    assert abs(float(got[k] - ref[k])) <= 1e-5 * abs(float(ref[k])), k
  g = jax.jit(jax.grad(lambda h, E: f(h, E)["loss_sum"], argnums=(0, 1)))(h, E)
  assert relative_error(ref_g, g) <= 1e-5
  without = jax.grad(lambda h, E: plain_xent_sum(h, E, t, w), argnums=(0, 1))(h, E)
  assert relative_error(without, g) > 1e-3  # the z-loss's gradient is there


def test_z_loss_closed_form():
  """h = the logits (E = I): logits (0, 0) and (ln 3, 0), both targets 0: logZ = ln 2 and ln 4,
  CE = ln 2 and ln 4 − ln 3; the gradient of the first is softmax·(1 + 2c·logZ) − onehot."""
  c = 0.1
  h = jnp.asarray([[[0.0, 0.0], [np.log(3.0), 0.0]]], jnp.float32)
  E, t = jnp.eye(2, dtype=jnp.float32), jnp.zeros((1, 2), jnp.int32)
  got = kernels.xent_sum(h, E, t, z_loss=c, logz=True)
  logz = np.log([2.0, 4.0])
  np.testing.assert_allclose(float(got["z_loss_sum"]), c * np.sum(logz**2), rtol=1e-6)
  np.testing.assert_allclose(float(got["logz_sum"]), np.sum(logz), rtol=1e-6)
  np.testing.assert_allclose(float(got["loss_sum"]),
                             np.log(2) + np.log(4) - np.log(3) + c * np.sum(logz**2), rtol=1e-6)
  dh = jax.grad(lambda h: kernels.xent_sum(h, E, t, z_loss=c)["loss_sum"])(h)
  factor = 1 + 2 * c * np.log(2)
  np.testing.assert_allclose(dh[0, 0], [0.5 * factor - 1, 0.5 * factor], rtol=1e-6)


def test_chunk_length_divides_and_fits():
  assert kernels.chunk_length(32, 128, 50304, budget=1 << 22) == 2
  assert kernels.chunk_length(32, 128, 50304, budget=1 << 25) == 16
  assert kernels.chunk_length(16, 128, 320, budget=1 << 22) == 128  # all fit: one chunk
  assert kernels.chunk_length(7, 100, 10**9, budget=10) == 1
  assert kernels.chunk_length(4, 1, 96, budget=1 << 22) == 1
  with pytest.raises(ValueError, match="divide"):
    kernels.xent_sum(*inputs()[:3], chunk=3)


def largest_intermediate(jaxpr) -> int:
  """The most elements of any value a jaxpr computes, in its sub-jaxprs (scan bodies, custom
  VJPs, ...) too."""
  sizes = [int(np.prod(v.aval.shape)) for e in jaxpr.eqns for v in e.outvars]
  for e in jaxpr.eqns:
    for param in e.params.values():
      for sub in param if isinstance(param, (list, tuple)) else [param]:
        sub = getattr(sub, "jaxpr", sub)  # a ClosedJaxpr's Jaxpr
        if hasattr(sub, "eqns"):
          sizes.append(largest_intermediate(sub))
  return max(sizes, default=0)


@pytest.mark.parametrize("budget", ["ACCELERATOR_CHUNK_ELEMENTS", "CPU_CHUNK_ELEMENTS"])
def test_fused_loss_never_holds_all_logits(monkeypatch, budget):
  """At the reference shape (batch 32 × 128 tokens, V = 50,304, D = 384), with either
  platform's chunk budget, no value in the loss's gradient holds all B·L·V logits or more than
  the budget (only traced, nothing allocated)."""
  budget = getattr(kernels, budget)
  monkeypatch.setattr(kernels, "chunk_elements", lambda: budget)
  B, L, D, V = 32, 128, 384, 50304
  h, E = jax.ShapeDtypeStruct((B, L, D), jnp.float32), jax.ShapeDtypeStruct((V, D), jnp.float32)
  t = jax.ShapeDtypeStruct((B, L), jnp.int32)
  loss = lambda h, E, t: kernels.xent_sum(h, E, t, z_loss=1e-4, logz=True)["loss_sum"]
  jaxpr = jax.make_jaxpr(jax.value_and_grad(loss, argnums=(0, 1)))(h, E, t)
  assert 0 < largest_intermediate(jaxpr.jaxpr) <= min(budget, B * L * V // 2)


@pytest.fixture(scope="module")
def decoder_params():
  """The tiny decoder's initial parameters (the same for either loss and any z-loss)."""
  return jax.jit(program.create_step(tiny(), 257).init)(0).params


@pytest.mark.slow
@pytest.mark.parametrize("z_loss", [0.0, 1e-3])
def test_decoder_loss_impls_agree(tiny_config, decoder_params, z_loss):
  """The decoder's plain and fused losses: the same sums (with the z-loss, `z_loss_sum`; with
  `stats`, `logz_sum`) and gradients."""
  c = tiny_config
  c.optim.z_loss = z_loss
  batch = jnp.asarray(np.random.default_rng(0).integers(0, 257, (8, 33)), jnp.int32)
  out = {}
  for impl in ("plain", "fused"):
    c.model.loss_impl = impl
    step_fns = program.create_step(c, 257)
    def f(p):
      o = step_fns.objective(p, batch, jax.random.PRNGKey(0), train=True,
                             stats=True)
      return o.loss_sum, o
    out[impl] = jax.jit(jax.value_and_grad(f, has_aux=True))(decoder_params)
  ((plain, plain_out), plain_g), ((fused, fused_out), fused_g) = out["plain"], out["fused"]
  assert abs(float(plain - fused)) <= 1e-5 * float(plain)
  assert relative_error(plain_g, fused_g) <= 1e-5
  keys = ["z_loss_sum", "logz_sum"] if z_loss else ["logz_sum"]
  for k in keys:
    p, f = getattr(plain_out, k), getattr(fused_out, k)
    assert abs(float(p - f)) <= 1e-5 * abs(float(p)), k
