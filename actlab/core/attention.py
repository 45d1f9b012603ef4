"""Self-attention: `Attention` (query, key, value and out projections, optional qk-norm and
rotary positions, a key/value cache for decoding), the XLA attention it computes with the
statistics it sows, and `HeadsDense`, the projection that splits or merges heads.

Shape suffixes as in transformer.py: B batch, L queries, T keys, D d_model, H heads, K head dim.
"""

import math

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.nn.initializers import normal

from actlab.core.layers import norm, residual_std
from actlab.core.execution import Execution, attention_impl, cudnn_attention
from actlab.core.spec import Spec


class Attention(nn.Module):
  """Multi-head self-attention: query, key, value and out projections of [D, D] (with biases as
  `spec.bias` says), heads-major (B, H, L, K) in between; with `decode`, a key/value cache. With
  `spec.qk_norm`, queries and keys pass the block's norm over the head dim K (`query_norm`,
  `key_norm`: one of [K] each, shared by the heads) before q·k (qk-layernorm: Dehghani et al.
  2023, Wortsman et al. 2023; Qwen3's RMSNorm). With `spec.position` "rope", queries and keys
  are then rotated by their absolute positions (`rope`). Its `AttentionStats` come from the logits and probabilities XLA
  attention computes; cuDNN flash attention never forms them, so in training it sows none (a log
  step would rebuild them), in evaluation (`train` False) those of logits computed apart."""
  spec: Spec
  causal: bool
  execution: Execution = Execution()
  layer: int | None = None
  train: bool = False
  decode: bool = False

  @nn.compact
  def __call__(self, x_BLD, mask_BL=None):
    s, ex = self.spec, self.execution
    q_BHLK, k_BHLK, v_BHLK = (HeadsDense(s, ex, split=True, name=name)(x_BLD)
                              for name in ("query", "key", "value"))
    if s.qk_norm:
      q_BHLK = norm(s, ex, "query_norm")(q_BHLK)
      k_BHLK = norm(s, ex, "key_norm")(k_BHLK)
    index = (self.variable("cache", "index", lambda: jnp.zeros((), jnp.int32)) if self.decode
             else None)
    if s.position == "rope":
      positions_L = (0 if index is None else index.value) + jnp.arange(q_BHLK.shape[2])
      q_BHLK, k_BHLK = (rope(x, positions_L, s.rope_theta) for x in (q_BHLK, k_BHLK))
    mask = None if mask_BL is None else mask_BL[:, None, None, :]
    causal = self.causal
    if self.decode:
      k_BHLK, v_BHLK, mask = self.extend_cache(k_BHLK, v_BHLK, index)
      causal = False  # the cache mask already hides the future
    lengths = None if mask is None else (q_BHLK.shape[2], k_BHLK.shape[2])
    if attention_impl(ex.attention_impl, q_BHLK.dtype, q_BHLK.shape[-1], lengths) == "xla":
      out_BHLK, stats = xla_attention(q_BHLK, k_BHLK, v_BHLK, mask, causal=causal)
    else:
      out_BHLK = cudnn_attention(q_BHLK, k_BHLK, v_BHLK, mask, causal=causal)
      stats = None if self.train else attention_stats(
          attention_logits(q_BHLK, k_BHLK, mask, causal=causal))
    if stats is not None:  # sow: a no-op unless "stats" is mutable (unused, jit drops it)
      self.sow("stats", "attention", AttentionStats(*stats, self.layer))
    out_BLD = HeadsDense(s, ex, split=False, std=residual_std(s), name="out")(out_BHLK)
    return nn.Dropout(s.dropout)(out_BLD, deterministic=not self.train)

  def extend_cache(self, k_BHLK, v_BHLK, index):
    """Appends this call's keys and values to a cache of `max_len` positions (the "cache"
    collection, `index` the positions filled) and returns the whole cache with the mask that
    lets query l (at absolute position index + l) see cache positions ≤ index + l."""
    (B, H, L, K), T = k_BHLK.shape, self.spec.max_len
    cached_k = self.variable("cache", "cached_key", jnp.zeros, (B, H, T, K), k_BHLK.dtype)
    cached_v = self.variable("cache", "cached_value", jnp.zeros, (B, H, T, K), v_BHLK.dtype)
    i = index.value
    cached_k.value = jax.lax.dynamic_update_slice(cached_k.value, k_BHLK, (0, 0, i, 0))
    cached_v.value = jax.lax.dynamic_update_slice(cached_v.value, v_BHLK, (0, 0, i, 0))
    index.value = i + L
    visible_LT = jnp.arange(T)[None, :] <= (i + jnp.arange(L))[:, None]
    return cached_k.value, cached_v.value, visible_LT[None, None]


def rope(x_BHLK, positions_L, theta: float) -> jax.Array:
  """Rotary position embedding in the half-split convention of transformers' Llama
  (`rotate_half`): feature j < K/2 pairs with j + K/2, rotated by position · theta^(−2j/K); the
  angles in float32, the result in x's dtype."""
  K = x_BHLK.shape[-1]
  inv_freq_J = 1.0 / theta ** (jnp.arange(0, K, 2, dtype=jnp.float32) / K)
  angles_LK = jnp.tile(positions_L.astype(jnp.float32)[:, None] * inv_freq_J[None], (1, 2))
  x1, x2 = jnp.split(x_BHLK, 2, axis=-1)
  rotated_BHLK = jnp.concatenate([-x2, x1], axis=-1)
  return (x_BHLK * jnp.cos(angles_LK) + rotated_BHLK * jnp.sin(angles_LK)).astype(x_BHLK.dtype)


@flax.struct.dataclass
class AttentionStats:
  """What an attention layer sows: the largest pre-softmax logit q·k/√K over the positions it may
  see (a scalar), and each head's entropy (nats) of its attention distribution, averaged over
  the batch and the queries ([H]); a leading [layers] under `scan_layers`, with `layer` None."""
  logit_max: jax.Array
  entropy_H: jax.Array
  layer: int | None = flax.struct.field(pytree_node=False)


def attention_logits(q_BHLK, k_BHTK, mask, *, causal: bool) -> jax.Array:
  """Pre-softmax logits q·k/√K [B, H, L, T] in float32; where a query may not look (`mask`
  [B|1, 1, L|1, T] False, or the future when `causal`) at float32's lowest value (not −inf, so
  that a row with nothing visible stays finite)."""
  logits_BHLT = jnp.einsum("bhlk,bhtk->bhlt", q_BHLK, k_BHTK,
                           preferred_element_type=jnp.float32) / math.sqrt(q_BHLK.shape[-1])
  if causal:
    tril_LL = jnp.tril(jnp.ones(logits_BHLT.shape[2:], bool))[None, None]
    mask = tril_LL if mask is None else mask & tril_LL
  return logits_BHLT if mask is None else jnp.where(mask, logits_BHLT, jnp.finfo(jnp.float32).min)


def attention_stats(logits_BHLT, probs_BHLT=None) -> tuple[jax.Array, jax.Array]:
  """`AttentionStats`' values: the largest logit, and each head's mean entropy (keys a query may
  not see have probability 0 and add nothing)."""
  probs_BHLT = jax.nn.softmax(logits_BHLT, axis=-1) if probs_BHLT is None else probs_BHLT
  return logits_BHLT.max(), jax.scipy.special.entr(probs_BHLT).sum(-1).mean((0, 2))


def xla_attention(q_BHLK, k_BHTK, v_BHTK, mask, *, causal: bool):
  """softmax(q·kᵀ/√K)·v with float32 softmax, and the `attention_stats` of the same logits and
  probabilities. Heads-major: every matmul is a plain batched matmul over (B, H), with no
  transposes around it (the layout XLA:CPU runs fastest)."""
  logits_BHLT = attention_logits(q_BHLK, k_BHTK, mask, causal=causal)
  probs_BHLT = jax.nn.softmax(logits_BHLT, axis=-1)
  return (jnp.einsum("bhlt,bhtk->bhlk", probs_BHLT.astype(v_BHTK.dtype), v_BHTK),
          attention_stats(logits_BHLT, probs_BHLT))


class HeadsDense(nn.Module):
  """`nn.Dense(d_model)` (the same kernel [D, D], bias [D] unless `spec.bias` is off, and
  initialisation) whose matmul splits its output into heads (`split=True`: x_BLD → y_BHLK) or
  merges its input from them (x_BHLK → y_BLD), so that attention needs no transposes."""
  spec: Spec
  execution: Execution = Execution()
  split: bool = True
  std: float = 0.02

  @nn.compact
  def __call__(self, x):
    D, H = self.spec.d_model, self.spec.num_heads
    kernel = self.param("kernel", normal(self.std), (D, D), jnp.float32)
    x, kernel = nn.dtypes.promote_dtype(x, kernel, dtype=self.execution.compute_dtype)
    if self.split:
      y = jnp.einsum("bld,dhk->bhlk", x, kernel.reshape(D, H, D // H))
    else:
      y = jnp.einsum("bhlk,hkd->bld", x, kernel.reshape(H, D // H, D))
    if not self.spec.bias:
      return y
    bias = self.param("bias", nn.initializers.zeros_init(), (D,), jnp.float32).astype(y.dtype)
    return y + (bias.reshape(H, 1, D // H) if self.split else bias)
