"""The faster, equal forms model.py chooses by `Execution`: the LM head's cross-entropy fused and
chunked (`xent_sum`, `model.loss_impl="fused"`: never the [B, L, V] logits in memory) and cuDNN
flash attention (`attention_impl`); and the sums every loss takes from its logits
(`logit_sums`). Equal to the plain forms up to float32 rounding (tests/test_kernels.py,
tests/test_model_execution.py). Nothing here imports model.py.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
from absl import logging

# Logit elements per chunk: on a 2-core CPU 32M measured best (4M cost ~12% more per step); the
# accelerator budget (the reference batch of 32 × 128 tokens in four chunks) bounds memory.
CPU_CHUNK_ELEMENTS = 1 << 25
ACCELERATOR_CHUNK_ELEMENTS = 1 << 26


def logit_sums(loss_sum, logits_NV, weights_N=None, *, z_loss: float = 0.0, logz: bool = False,
               logz_N=None) -> dict:
  """A loss's `loss_sum` with what it adds from its logits' logZ = logsumexp (`logz_N` where the
  loss has it), summed with weights w (default 1): `z_loss_sum` = z_loss · Σ w·logZ² (PaLM's
  z-loss, added to `loss_sum`) and, with `logz`, `logz_sum` = Σ w·logZ (not differentiated)."""
  if not (z_loss or logz):
    return {"loss_sum": loss_sum}
  logz_N = jax.nn.logsumexp(logits_NV, axis=-1) if logz_N is None else logz_N
  weights_N = jnp.ones(logz_N.shape) if weights_N is None else weights_N
  out = {"loss_sum": loss_sum}
  if z_loss:
    out["z_loss_sum"] = z_loss * jnp.sum(weights_N * jnp.square(logz_N))
    out["loss_sum"] = loss_sum + out["z_loss_sum"]
  if logz:
    out["logz_sum"] = jax.lax.stop_gradient(jnp.sum(weights_N * logz_N))
  return out


# --- The fused LM head ---------------------------------------------------------------------------
# The plain head writes and re-reads [B·L, V] float32 tensors several times (0.8 GB each for GPT-2's
# vocabulary at 32 × 128). `xent_sum` scans over chunks of positions instead; under `jax.grad` each
# chunk forms its softmax gradient while its logits are in cache, straight into dh and dE, and the
# backward pass only scales both. Chunks run along the sequence: a batch sharded over devices
# stays sharded. Logits and softmax statistics in float32, matmul operands in h's dtype.


def chunk_elements() -> int:
  return CPU_CHUNK_ELEMENTS if jax.default_backend() == "cpu" else ACCELERATOR_CHUNK_ELEMENTS


def chunk_length(batch: int, length: int, vocab: int, budget: int | None = None) -> int:
  """The largest divisor Lc of `length` with batch·Lc·vocab ≤ budget (at least 1)."""
  budget = budget or chunk_elements()
  return max((lc for lc in range(1, length + 1)
              if length % lc == 0 and batch * lc * vocab <= budget), default=1)


def xent_sum(h_BLD, embedding_VD, targets_BL, weights_BL=None, *, chunk: int | None = None,
             z_loss: float = 0.0, logz: bool = False) -> dict:
  """The sums of an LM head tied to `embedding_VD`: `loss_sum` = Σ w·(logZ − h·E_t) with its
  z-loss (the one differentiated sum) and `logit_sums`' others; w = `weights_BL` (default 1).
  `chunk`: positions per chunk (a divisor of L; default `chunk_length`)."""
  B, L, _ = h_BLD.shape
  chunk = chunk or chunk_length(B, L, embedding_VD.shape[0])
  if L % chunk:
    raise ValueError(f"chunk={chunk} does not divide the sequence length {L}")
  if weights_BL is None:
    weights_BL = jnp.ones((B, L), jnp.float32)
  sums = _xent(h_BLD, embedding_VD, targets_BL, weights_BL.astype(jnp.float32), chunk,
               float(z_loss), logz)
  return {k: v if k == "loss_sum" else jax.lax.stop_gradient(v) for k, v in sums.items()}


def _split(x, chunk):
  """[B, L, ...] → [L/chunk, B, chunk, ...]: scan over chunks of positions."""
  B, L = x.shape[:2]
  return jnp.swapaxes(x.reshape(B, L // chunk, chunk, *x.shape[2:]), 0, 1)


def _chunk_stats(h, E, t, w, z_loss, logz):
  """One chunk's exp(logits − max) (kept for the gradient), its row sums, logZ and sums."""
  logits = jnp.einsum("bld,vd->blv", h, E.astype(h.dtype), preferred_element_type=jnp.float32)
  m = jax.lax.stop_gradient(logits.max(-1, keepdims=True))
  p = jnp.exp(logits - m)
  s = p.sum(-1, keepdims=True)
  target = jnp.take_along_axis(logits, t[..., None], axis=-1)
  logz_BL1 = jnp.log(s) + m
  sums = logit_sums((w * (logz_BL1 - target)[..., 0]).sum(), logits, w, z_loss=z_loss,
                    logz=logz, logz_N=logz_BL1[..., 0])
  return p, s, logz_BL1, sums


def _zeros(z_loss, logz) -> dict:
  keys = ["loss_sum"] + ["z_loss_sum"] * bool(z_loss) + ["logz_sum"] * logz
  return {k: jnp.zeros((), jnp.float32) for k in keys}


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5, 6))
def _xent(h, E, t, w, chunk, z_loss, logz):
  def body(total, xs):
    hc, tc, wc = xs
    return jax.tree.map(jnp.add, total, _chunk_stats(hc, E, tc, wc, z_loss, logz)[3]), None
  total, _ = jax.lax.scan(body, _zeros(z_loss, logz),
                          (_split(h, chunk), _split(t, chunk), _split(w, chunk)))
  return total


def _xent_fwd(h, E, t, w, chunk, z_loss, logz):
  Ec = E.astype(h.dtype)

  def body(carry, xs):
    total, dEt = carry
    hc, tc, wc = xs
    p, s, logz_BL1, sums = _chunk_stats(hc, E, tc, wc, z_loss, logz)
    onehot = jnp.arange(E.shape[0], dtype=tc.dtype) == tc[..., None]
    w_BL1, softmax = wc[..., None], p / s
    if z_loss:  # d(z_loss · logZ²)/d logits = 2 · z_loss · logZ · softmax
      softmax = softmax * (1 + 2 * z_loss * logz_BL1)
    g = (w_BL1 * (softmax - onehot)).astype(h.dtype)                  # d loss_sum / d logits
    dh = jnp.einsum("blv,vd->bld", g, Ec, preferred_element_type=jnp.float32)
    # dEᵀ (D × V): g keeps its [tokens, V] layout; one transpose at the end (-4% time).
    dEt = dEt + jnp.einsum("bld,blv->dv", hc, g, preferred_element_type=jnp.float32)
    return (jax.tree.map(jnp.add, total, sums), dEt), dh.astype(h.dtype)

  (total, dEt), dh = jax.lax.scan(
      body, (_zeros(z_loss, logz), jnp.zeros(E.shape[::-1], jnp.float32)),
      (_split(h, chunk), _split(t, chunk), _split(w, chunk)))
  return total, (jnp.swapaxes(dh, 0, 1).reshape(h.shape), dEt.T.astype(E.dtype), t, w)


def _xent_bwd(chunk, z_loss, logz, residuals, g):
  """Only `loss_sum` is differentiated (`xent_sum` stops the others' gradients)."""
  dh, dE, t, w = residuals
  g = g["loss_sum"]
  return ((g * dh).astype(dh.dtype), (g * dE).astype(dE.dtype),
          np.zeros(t.shape, jax.dtypes.float0), jnp.zeros_like(w))


_xent.defvjp(_xent_fwd, _xent_bwd)


# --- cuDNN attention -----------------------------------------------------------------------------


def why_not_cudnn(dtype, head_dim: int, masked_lengths: tuple[int, int] | None = None):
  """Why cuDNN flash attention cannot run at this compute dtype and head dim (with a mask over
  (queries, keys) of `masked_lengths`); None where it can. The GPU's model is not checked."""
  if jax.default_backend() != "gpu":
    return f"cuDNN needs a GPU (the backend is {jax.default_backend()})"
  if jnp.dtype(dtype) not in (jnp.bfloat16, jnp.float16):
    return f"cuDNN needs bfloat16 or float16 (the compute dtype is {jnp.dtype(dtype)})"
  if head_dim % 8 or head_dim > 128:
    return f"cuDNN needs a head dim that is a multiple of 8 up to 128 (it is {head_dim})"
  if masked_lengths and any(n % 2 for n in masked_lengths):
    return f"cuDNN takes a mask only over even lengths (queries, keys: {masked_lengths})"
  return None


def attention_impl(requested: str, dtype, head_dim: int,
                   masked_lengths: tuple[int, int] | None = None) -> str:
  """The attention that runs, decided before tracing: "xla"; "cudnn" (a ValueError saying why it
  cannot run); "auto": cuDNN where it can run, else XLA (on a GPU said once)."""
  if requested == "xla":
    return "xla"
  reason = why_not_cudnn(dtype, head_dim, masked_lengths)
  if reason is None:
    return "cudnn"
  if requested == "cudnn":
    raise ValueError(f"model.attention_impl='cudnn' cannot run: {reason}")
  if jax.default_backend() == "gpu":
    _warn_once(f"model.attention_impl='auto' runs XLA attention: {reason}")
  return "xla"


@functools.cache
def _warn_once(message: str) -> None:
  logging.warning(message)


def cudnn_attention(q_BHLK, k_BHTK, v_BHTK, mask, *, causal: bool):
  """cuDNN flash attention (sequence-major operands) of heads-major ones; no statistics."""
  to_BLHK = lambda x: x.transpose(0, 2, 1, 3)
  return to_BLHK(jax.nn.dot_product_attention(
      to_BLHK(q_BHLK), to_BLHK(k_BHTK), to_BLHK(v_BHTK), mask=mask, is_causal=causal,
      implementation="cudnn"))
