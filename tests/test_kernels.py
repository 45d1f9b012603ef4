"""The fused LM-head cross-entropy (actlab/models/kernels.py) against the plain one: values, gradients,
second order, vmap, bfloat16, chunking, and inside the decoder's loss."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from actlab.models import kernels
from actlab.run import steps


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
  f = lambda h, E: kernels.xent_sum(h, E, t, w, chunk=chunk)
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
  got = hvp(lambda h, E: kernels.xent_sum(h, E, t, chunk=2))
  assert relative_error(ref, got) <= 1e-5
  hs = jnp.stack([h, 2 * h])
  per_run = jax.vmap(jax.grad(lambda h: kernels.xent_sum(h, E, t, chunk=4)))(hs)
  assert relative_error(jax.grad(lambda h: plain_xent_sum(h, E, t))(2 * h), per_run[1]) <= 1e-5


@pytest.mark.slow
def test_fused_xent_bfloat16_keeps_float32_statistics():
  h, E, t, _ = inputs(dtype=jnp.bfloat16)
  val = kernels.xent_sum(h, E, t, chunk=4)
  assert val.dtype == jnp.float32
  ref = plain_xent_sum(h, E, t)  # the same bf16 operands, float32 logits
  assert abs(float(val - ref)) <= 1e-5 * abs(float(ref))
  g = jax.grad(lambda h, E: kernels.xent_sum(h, E, t), argnums=(0, 1))(h, E)
  assert g[0].dtype == jnp.bfloat16 and g[1].dtype == jnp.float32


def test_chunk_length_divides_and_fits():
  assert kernels.chunk_length(32, 128, 50304, budget=1 << 22) == 2
  assert kernels.chunk_length(32, 128, 50304, budget=1 << 25) == 16
  assert kernels.chunk_length(16, 128, 320, budget=1 << 22) == 128
  assert kernels.chunk_length(7, 100, 10**9, budget=10) == 1
  with pytest.raises(ValueError, match="divide"):
    kernels.xent_sum(*inputs()[:3], chunk=3)


@pytest.mark.slow
def test_decoder_loss_impls_agree(tiny_config):
  c = tiny_config
  batch = jnp.asarray(np.random.default_rng(0).integers(0, 257, (8, 33)), jnp.int32)
  out = {}
  for impl in ("plain", "fused"):
    c.model.loss_impl = impl
    step_fns = steps.Steps.create(c, 257)
    params = jax.jit(step_fns.init)(0).params
    f = lambda p: step_fns.objective(step_fns.model, p, batch, jax.random.PRNGKey(0), train=True)
    out[impl] = jax.jit(jax.value_and_grad(lambda p: f(p)["loss_sum"]))(params)
  assert abs(float(out["plain"][0] - out["fused"][0])) <= 1e-5 * float(out["plain"][0])
  assert relative_error(out["plain"][1], out["fused"][1]) <= 1e-5
