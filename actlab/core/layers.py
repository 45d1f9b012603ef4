"""The layers the blocks are built from, each chosen by the `Spec`: `norm` (LayerNorm or Llama's
RMSNorm, with or without biases), `dense`, `embed`, and GPT-2's initialisation scale."""

import math

import flax.linen as nn
import jax.numpy as jnp
from jax import lax
from jax.nn.initializers import normal

from actlab.core.execution import Execution
from actlab.core.spec import Spec


def norm(spec: Spec, ex: Execution, name: str) -> nn.Module:
  """The block's normalisation (`spec.norm_type`): LayerNorm, its bias as `spec.bias` says, or
  `RMSNorm`; over the last axis, with `spec.norm_eps`."""
  if spec.norm_type == "rms":
    return RMSNorm(spec.norm_eps, ex.compute_dtype, name=name)
  return nn.LayerNorm(epsilon=spec.norm_eps, use_bias=spec.bias, dtype=ex.compute_dtype, name=name)


class RMSNorm(nn.Module):
  """x / √(mean(x²) + eps) · scale, as transformers' Llama computes it: the statistic and the
  division in float32, the result cast back to x's dtype before the scale (initialised to 1)."""
  eps: float
  dtype: jnp.dtype = jnp.float32

  @nn.compact
  def __call__(self, x):
    scale = self.param("scale", nn.initializers.ones_init(), (x.shape[-1],), jnp.float32)
    x32 = x.astype(jnp.float32)
    y = x32 * lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
    return (scale * y.astype(x.dtype)).astype(self.dtype)


def dense(features: int, ex: Execution, std: float = 0.02, name: str | None = None,
          bias: bool = True) -> nn.Dense:
  return nn.Dense(features, use_bias=bias, dtype=ex.compute_dtype, kernel_init=normal(std),
                  name=name)


def embed(n: int, spec: Spec, ex: Execution, name: str) -> nn.Embed:
  return nn.Embed(n, spec.d_model, embedding_init=normal(0.02), dtype=ex.compute_dtype, name=name)


def residual_std(spec: Spec) -> float:
  """GPT-2: residual output projections start at 0.02/√(2·layers)."""
  return 0.02 / math.sqrt(2 * spec.num_layers)
