"""How the model runs, not what it computes: `Execution`, and the choice of attention with the
cuDNN call. Every choice computes the same function up to rounding
(tests/test_model_execution.py).
"""

import dataclasses
import functools

import jax
import jax.numpy as jnp
from absl import logging

from actlab.core.spec import choice


@dataclasses.dataclass(frozen=True)
class Execution:
  """The execution settings of `config.model` (`actlab/config/specs.py`). The decoder's loss
  implementation (`model.loss_impl`) is its task's choice: tasks/causal_lm.py."""
  dtype: str = choice("float32", "bfloat16")  # compute dtype; parameters stay float32
  attention_impl: str = choice("xla", "cudnn", "auto")  # (`attention_impl`)
  scan_layers: bool = False     # one nn.scan over the blocks (transformer.stack)
  remat: str = choice("none", "full", "dots")  # recompute in the backward pass

  @property
  def compute_dtype(self) -> jnp.dtype:
    return jnp.dtype(self.dtype)

  @property
  def remat_policy(self):
    """What `nn.remat` keeps of a block for the backward pass ("full": only its input)."""
    return {"full": None, "dots": jax.checkpoint_policies.dots_with_no_batch_dims_saveable}[
        self.remat]


# --- Attention ----------------------------------------------------------------------------------


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
  operands) of heads-major ones."""
  to_BLHK = lambda x: x.transpose(0, 2, 1, 3)
  return to_BLHK(jax.nn.dot_product_attention(
      to_BLHK(q_BHLK), to_BLHK(k_BHTK), to_BLHK(v_BHTK), mask=mask, is_causal=causal,
      implementation="cudnn"))

