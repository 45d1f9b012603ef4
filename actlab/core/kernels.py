"""The faster variants of model.py's plain computations, equal to them up to rounding and off
the reading path: `FusedCausalLM`, the decoder with the fused, chunked LM-head cross-entropy
`xent_sum` (the loss of `softmax(h·Eᵀ)` without the [B, L, V] logits, with model.py's logZ sums
chunk by chunk), and `Execution`, with the choice of attention: cuDNN flash attention where it
can (`attention_impl` decides, before tracing). The tasks choose the loss where a config asks
(`model.loss_impl`) and build this `Execution`; model.py never imports this module.

For the reference decoder (GPT-2 vocabulary) the tied LM head is three quarters of the FLOPs,
and the plain path (logits = h·Eᵀ, `softmax_cross_entropy` and its autodiff) writes and re-reads
[B·L, V] float32 tensors several times: 0.8 GB each for batch 32 × 128. `xent_sum` computes the
same sum in chunks of positions instead; under `jax.grad` (the custom VJP's forward) each chunk
also forms the softmax gradient `w·(softmax − onehot)` (times 1 + 2·z_loss·logZ with a z-loss)
while its logits are in cache, straight into dh and dE; the backward pass only scales both.

So the head costs its three matmuls, and its largest intermediates are one chunk's [B, Lc, V],
within the platform's chunk budget (`chunk_length`). Chunks run along the sequence axis, so a
batch sharded over devices stays sharded. Arithmetic is the plain path's: logits and softmax
statistics in float32, matmul operands in h's dtype; results agree with it to float32 rounding
(tests/test_kernels.py). Forward-over-reverse (the sharpness HVP) and vmap work through it.
"""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
from absl import logging

from actlab.core import model
from actlab.core.options import choice


# Logit elements per chunk: enough tokens to amortise adding each chunk's V×D weight gradient (on
# a 2-core CPU 32M elements measured best, 4M cost ~12% more per step). The accelerator budget
# (the reference batch of 32 × 128 tokens in four chunks) bounds memory; it is not tuned.
CPU_CHUNK_ELEMENTS = 1 << 25
ACCELERATOR_CHUNK_ELEMENTS = 1 << 26


def chunk_elements() -> int:
  return CPU_CHUNK_ELEMENTS if jax.default_backend() == "cpu" else ACCELERATOR_CHUNK_ELEMENTS


def chunk_length(batch: int, length: int, vocab: int, budget: int | None = None) -> int:
  """The largest divisor Lc of `length` with batch·Lc·vocab ≤ budget (at least 1)."""
  budget = budget or chunk_elements()
  return max((lc for lc in range(1, length + 1)
              if length % lc == 0 and batch * lc * vocab <= budget), default=1)


@dataclasses.dataclass(frozen=True)
class FusedCausalLM(model.CausalLM):
  """`model.CausalLM` with its head's sums from `xent_sum`: no [B, L, V] logits in memory."""

  def head_sums(self, h_BLD, head_VD, targets_BL, *, z_loss: float, logz: bool) -> dict:
    return xent_sum(h_BLD, head_VD, targets_BL, z_loss=z_loss, logz=logz)


def xent_sum(h_BLD, embedding_VD, targets_BL, weights_BL=None, *, chunk: int | None = None,
             z_loss: float = 0.0, logz: bool = False) -> dict:
  """The sums of an LM head tied to `embedding_VD` (cast to h's dtype for the matmuls), with
  logZ = logsumexp(h·Eᵀ) and w = `weights_BL` (default 1; not differentiated): `loss_sum` =
  Σ w·(logZ − h·E_t) plus the z-loss, the one differentiated sum, and `model.logit_sums`' sums.
  `chunk`: the positions per chunk (a divisor of L; default from `chunk_length`)."""
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
  """exp(logits − max) (f32) of one chunk (kept for the gradient: faster than recomputing it), its
  row sums and logZ ([B, Lc, 1] each) and the chunk's `xent_sum` sums."""
  logits = jnp.einsum("bld,vd->blv", h, E.astype(h.dtype), preferred_element_type=jnp.float32)
  m = jax.lax.stop_gradient(logits.max(-1, keepdims=True))
  p = jnp.exp(logits - m)
  s = p.sum(-1, keepdims=True)
  target = jnp.take_along_axis(logits, t[..., None], axis=-1)
  logz_BL1 = jnp.log(s) + m
  sums = model.logit_sums((w * (logz_BL1 - target)[..., 0]).sum(), logits, w, z_loss=z_loss,
                          logz=logz, logz_N=logz_BL1[..., 0])
  return p, s, logz_BL1, sums


def _zeros(z_loss, logz) -> dict:
  """The running sums of `_chunk_stats`, at zero."""
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
    # dEᵀ (D × V), not dE: g stays in its [tokens, V] layout (hᵀ is the small operand to
    # transpose); one transpose of the sum at the end instead of one of g per chunk (-4% time).
    dEt = dEt + jnp.einsum("bld,blv->dv", hc, g, preferred_element_type=jnp.float32)
    return (jax.tree.map(jnp.add, total, sums), dEt), dh.astype(h.dtype)

  (total, dEt), dh = jax.lax.scan(
      body, (_zeros(z_loss, logz), jnp.zeros(E.shape[::-1], jnp.float32)),
      (_split(h, chunk), _split(t, chunk), _split(w, chunk)))
  return total, (jnp.swapaxes(dh, 0, 1).reshape(h.shape), dEt.T.astype(E.dtype), t, w)


def _xent_bwd(chunk, z_loss, logz, residuals, g):
  """Only `loss_sum` is differentiated (`xent_sum` stops the gradient of the other sums)."""
  dh, dE, t, w = residuals
  g = g["loss_sum"]
  return ((g * dh).astype(dh.dtype), (g * dE).astype(dE.dtype),
          np.zeros(t.shape, jax.dtypes.float0), jnp.zeros_like(w))


_xent.defvjp(_xent_fwd, _xent_bwd)


# --- cuDNN attention ----------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Execution(model.Execution):
  """`model.Execution` with the choice of attention, written here only (`attention_impl`): cuDNN
  flash attention where it asks for it and the call allows it (`attention_impl`), else XLA's.
  cuDNN never forms the logits: in training no `attention_stats` (None), in evaluation those of
  logits computed apart. The tasks build this `Execution` (`config.specs`)."""
  attention_impl: str = choice("xla", "cudnn", "auto", help="jax.nn.dot_product_attention "
                               'implementation: "xla", "cudnn" (an error where it cannot run) or '
                               '"auto" (cuDNN where it can, else XLA: on a GPU said once)')

  def attend(self, q_BHLK, k_BHTK, v_BHTK, mask, *, causal: bool, train: bool):
    lengths = None if mask is None else (q_BHLK.shape[2], k_BHTK.shape[2])
    if attention_impl(self.attention_impl, q_BHLK.dtype, q_BHLK.shape[-1], lengths) == "xla":
      return super().attend(q_BHLK, k_BHTK, v_BHTK, mask, causal=causal, train=train)
    out_BHLK = cudnn_attention(q_BHLK, k_BHTK, v_BHTK, mask, causal=causal)
    return out_BHLK, None if train else model.attention_stats(
        model.attention_logits(q_BHLK, k_BHTK, mask, causal=causal))


def why_not_cudnn(dtype, head_dim: int, masked_lengths: tuple[int, int] | None = None):
  """Why cuDNN flash attention cannot run attention of this compute dtype and head dim, with a
  boolean mask over (L queries, T keys) when `masked_lengths` is given; None where it can. Not
  checked: the GPU's model and cuDNN version."""
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
  """The attention that runs, decided before tracing: "xla"; "cudnn", or a ValueError naming why
  it cannot (`why_not_cudnn`); "auto": cuDNN where it can run, else XLA (on a GPU said once)."""
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
  """`jax.nn.dot_product_attention`'s cuDNN flash attention (which takes sequence-major
  operands) of heads-major ones: `model.xla_attention`'s output, without its statistics."""
  to_BLHK = lambda x: x.transpose(0, 2, 1, 3)
  return to_BLHK(jax.nn.dot_product_attention(
      to_BLHK(q_BHLK), to_BLHK(k_BHTK), to_BLHK(v_BHTK), mask=mask, is_causal=causal,
      implementation="cudnn"))
