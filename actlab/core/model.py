"""The decoder whole, read top-down: a field and the rule its values keep (`option`), what the
model is (`Spec`) and how it runs (`Execution`: XLA or cuDNN attention, the plain or the fused
loss, both kernels.py's equal forms); the norms, `dense` and `embed`; rotary positions;
attention; the FFN; the block and the stack; the `Decoder`; `CausalLM`, the decoder with its
loss, returning `Sums`; the parameter counts. Applied with `stats`, each block sows `FFNStats` and
`AttentionStats`, read back by `per_layer`. Shape suffixes: B batch, L sequence (T: the keys), D
d_model, H heads, K head dim, F FFN width, V vocabulary, P masked positions, C classes.
"""

import dataclasses
import math
from typing import Any, Callable, Protocol

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax import lax
from jax.nn.initializers import normal

from actlab.core import activations, kernels

# --- A field: its default, the rule its values keep, its help and its marks ---------------------
# A config's `model` and `optim` sections are the fields of `Spec`, `Execution` and
# `step.OptimSpec` (actlab/config/schema.py): checked by these rules, listed with this help. A rule
# is `(key, value) -> None` and raises ValueError with one line that names the key.

Rule = Callable[[str, Any], None]
# What a field is, each mark one of its values: `block`, the block's "form" (GPT-2's or the
# LLaMA-style) or an "option" any block takes; `init_from`, another value in the run started from
# is refused or said; `runtime`, how or where a run executes, not what it computes (read by its
# compiled programs, or not). Every list of fields derives from them (`config.marked`).
MARKS = {"block": ("form", "option"), "init_from": ("refuse", "say"),
         "runtime": ("program", "harness")}


def option(default, rule: Rule | None = None, help: str = "", **marks):
  assert all(v in MARKS.get(k, ()) for k, v in marks.items()), marks
  return dataclasses.field(default=default, metadata={"rule": rule, "help": help, **marks})


def choice(*values: str, help: str = "", **marks):
  """A field that takes one of `values`, the first its default."""
  field = option(values[0], one_of(*values), help, **marks)
  return dataclasses.field(default=field.default, metadata={**field.metadata, "choices": values})


def check(ok: bool, message: str, error: type[Exception] = ValueError) -> None:
  if not ok:
    raise error(message)


def choices(names) -> str:  # "'a', 'b', 'c'"
  return ", ".join(repr(n) for n in names)


def positive(k, v):
  check(v > 0, f"{k}={v} must be positive")


def boolean(k, v):
  check(isinstance(v, bool), f"{k}={v!r} must be true or false")


def non_negative(zero: str = "") -> Rule:
  """>= 0; `zero` says what 0 means."""
  return lambda k, v: check(v >= 0, f"{k}={v} must be >= 0{zero}")


def within(low, high, ends: str = "[)", note: str = "") -> Rule:
  """In the interval from `low` to `high`, each end closed or open as `ends` says."""
  above = (lambda v: v >= low) if ends[0] == "[" else (lambda v: v > low)
  below = (lambda v: v <= high) if ends[1] == "]" else (lambda v: v < high)
  return lambda k, v: check(above(v) and below(v),
                            f"{k}={v} must be in {ends[0]}{low}, {high}{ends[1]}{note}")


def one_of(*options) -> Rule:
  return lambda k, v: check(v in options,
                            f"{k}={v!r}: choose {choices(options[:-1])} or {options[-1]!r}")


def activation_name(k, v):
  try:
    activations.get(v)
  except ValueError as e:
    raise ValueError(f"{k}: {e}") from None


# --- What the model is, and how it runs ---------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Spec:
  """The architecture (hashable for Flax): GPT-2's block at the reference study's size by default,
  or a LLaMA-style one (RMSNorm, rotary positions, no biases, an untied head, a gated FFN)."""
  activation: str = option("gelu", activation_name, init_from="refuse",
                           help="FFN activation: a name from actlab.core.activations.NAMES")
  num_layers: int = option(6, positive, init_from="refuse")
  d_model: int = option(384, positive, init_from="refuse")
  num_heads: int = option(6, positive, init_from="refuse")
  d_ff: int = option(1536, positive, help="FFN hidden width of the plain (two-matrix) FFN",
                     init_from="refuse")
  max_len: int = option(128, positive, help="learned position embeddings (context length)",
                        init_from="refuse")
  vocab_size: int = option(0, non_negative(" (0 = tokenizer's)"), init_from="refuse",
                           help="0: the tokenizer's vocabulary; always padded to a multiple of 64")
  dropout: float = option(0.0, within(0, 1))
  norm: str = choice("pre", "post", help='"pre" (GPT-2) or "post" (BERT) placement of the norms',
                     block="option", init_from="refuse")
  norm_type: str = choice("layer", "rms", help='"layer" (LayerNorm) or "rms" (RMSNorm as '
                          "Llama's: float32, a scale only)", block="form", init_from="refuse")
  # Refused: the trained norms are of their epsilon (a run from hf:DIR too: its config.json's).
  norm_eps: float = option(1e-5, help="the norms' epsilon (GPT-2 1e-5, BERT 1e-12, Llama 1e-6)",
                           block="option", init_from="refuse")
  position: str = choice("learned", "rope", help='"learned" position embeddings (max_len of '
                         'them) or "rope" (rotary on queries and keys, transformers\' half-split '
                         "layout)", block="form", init_from="refuse")
  # Said, not refused: a run may change RoPE's base on purpose (e.g. for a longer context).
  rope_theta: float = option(10000.0, positive, help='RoPE\'s base (position="rope")',
                             block="option", init_from="say")
  bias: bool = option(True, boolean, help="every linear and norm bias (false: none, as Llama)",
                      block="form", init_from="refuse")
  tie_head: bool = option(True, boolean, help="the LM head is the token embedding (GPT-2) or its "
                          "own matrix", block="form", init_from="refuse")
  ffn: str = choice("auto", "plain", "gated", help='"plain" W₂·act(W₁x), "gated" W₂·(act(W_g x) '
                    '⊙ W₁x) for any activation, "auto": gated for the GLU names (swiglu, ...)',
                    block="option", init_from="refuse")
  gated_match_params: bool = option(True, boolean, help="gated FFNs use round(2/3·d_ff) to a "
                                    "multiple of 64 (Shazeer 2020)", init_from="refuse")
  qk_norm: bool = option(False, boolean, help="qk-norm: the block's norm of queries and keys over "
                         "the head dim before q·k (Wortsman et al. 2023); Hugging Face export in "
                         "the LLaMA-style block only (Qwen3)", block="option", init_from="refuse")
  parametrization: str = choice("sp", "mup", help='"sp" (the standard parametrization) or "mup" '
                                "(μP for Adam, Yang et al. 2022: hidden matrices' init std × "
                                "√(base/width) and AdamW LR × base/width, logits × base/width, "
                                "attention logits ∝ 1/head dim; the decoder only; docs/recipe.md)",
                                init_from="refuse")
  mup_base_width: int = option(0, non_negative(" (0 = unset)"), help="μP's base width: the "
                               "d_model at which a μP run is the SP run, bitwise (its head dim: "
                               "mup_base_width / num_heads); required by parametrization='mup'",
                               init_from="refuse")

  @property
  def head_dim(self) -> int:
    return self.d_model // self.num_heads

  @property
  def gated(self) -> bool:
    return gated(self.activation, self.ffn)

  @property
  def ffn_width(self) -> int:
    return ffn_width(self.activation, self.d_ff, self.gated_match_params, self.ffn)


def gated(activation: str, ffn: str = "auto") -> bool:
  """Whether the FFN is gated: `ffn` "gated", or "auto" with a GLU name (swiglu, geglu, …)."""
  return ffn == "gated" or (ffn == "auto" and activations.get(activation).gated)


def ffn_width(activation: str, d_ff: int, gated_match_params: bool = True,
              ffn: str = "auto") -> int:
  """Hidden width F: d_ff, or for gated FFNs round(2/3·d_ff) to a multiple of 64 (Shazeer 2020)."""
  if gated(activation, ffn) and gated_match_params:
    return max(64, round(2 * d_ff / 3 / 64) * 64)
  return d_ff


def pad_vocab(vocab_size: int, multiple: int = 64) -> int:
  return -(-vocab_size // multiple) * multiple


@dataclasses.dataclass(frozen=True)
class Execution:
  """How the model runs, not what it computes: every choice computes the same function up to
  rounding (tests/test_model_execution.py)."""
  dtype: str = choice("float32", "bfloat16", help='compute dtype: "float32" or "bfloat16" '
                      "(params stay float32)")
  scan_layers: bool = option(False, boolean, help="nn.scan over the blocks: compile time "
                             'independent of depth (params under "blocks" with a layer axis; '
                             "another random init)")
  remat: str = choice("none", "full", "dots", help="recompute activations in the backward pass "
                      'to save memory: "none", "full" (keep block inputs) or "dots" (also matmul '
                      "outputs)")
  attention_impl: str = choice("xla", "cudnn", "auto", help="jax.nn.dot_product_attention "
                               'implementation: "xla", "cudnn" (an error where it cannot run) or '
                               '"auto" (cuDNN where it can, else XLA: on a GPU said once)')
  loss_impl: str = choice("fused", "plain", help='the decoder\'s LM head + loss: "fused" '
                          "(chunked, no [B, L, V] logits in memory; core/kernels.py) or \"plain\" "
                          "(logits, then cross-entropy)")

  @property
  def compute_dtype(self) -> jnp.dtype:
    return jnp.dtype(self.dtype)

  def attend(self, q_BHLK, k_BHTK, v_BHTK, mask, *, causal: bool, train: bool):
    """Attention's output and its `attention_stats` (None where not formed): XLA's, or cuDNN's
    where `attention_impl` picks it (it never forms the logits: in evaluation the stats are of
    logits computed apart, in training none)."""
    lengths = None if mask is None else (q_BHLK.shape[2], k_BHTK.shape[2])
    if kernels.attention_impl(self.attention_impl, q_BHLK.dtype, q_BHLK.shape[-1],
                              lengths) == "xla":
      return xla_attention(q_BHLK, k_BHTK, v_BHTK, mask, causal=causal)
    out_BHLK = kernels.cudnn_attention(q_BHLK, k_BHTK, v_BHTK, mask, causal=causal)
    return out_BHLK, None if train else attention_stats(
        attention_logits(q_BHLK, k_BHTK, mask, causal=causal))

  @property
  def remat_policy(self):
    """What `nn.remat` keeps of a block for the backward pass ("full": only its input)."""
    return {"full": None, "dots": jax.checkpoint_policies.dots_with_no_batch_dims_saveable}[
        self.remat]


# --- The layers the `Spec` chooses --------------------------------------------------------------


def norm(spec: Spec, ex: Execution, name: str | None = None) -> nn.Module:
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


def embed(n: int, spec: Spec, ex: Execution, name: str | None = None) -> nn.Embed:
  return nn.Embed(n, spec.d_model, embedding_init=normal(0.02), dtype=ex.compute_dtype, name=name)


def residual_std(spec: Spec) -> float:
  """GPT-2: residual output projections start at 0.02/√(2·layers)."""
  return 0.02 / math.sqrt(2 * spec.num_layers)


# --- μP: what the width changes -----------------------------------------------------------------
# `parametrization="mup"`: μP for Adam-type optimizers (Yang et al. 2022, Tensor Programs V), in
# its multiplier form, with the width multiplier m = d_model / mup_base_width. Hidden matrices
# (every `kernel`: attention's and the FFN's) start at their SP std / √m and take AdamW's LR / m
# (`lr_factor`); the logits are the head's × 1/m, for a tied head and an untied one alike;
# attention's logits are q·k · √K_base / K (∝ 1/K, K the head dim, K_base = mup_base_width /
# num_heads); embeddings, biases and norm scales keep SP's init and LR. Every factor is exactly 1
# at the base width and is then not applied: there a μP run is the SP run, bitwise.


def width_multiplier(spec: Spec) -> float:
  """m = d_model / mup_base_width under μP; 1 under SP."""
  return spec.d_model / spec.mup_base_width if spec.parametrization == "mup" else 1.0


def hidden_std(spec: Spec, std: float = 0.02) -> float:
  """A hidden matrix's initial std: SP's `std`, under μP / √m."""
  m = width_multiplier(spec)
  return std if m == 1.0 else std / math.sqrt(m)


def attention_multiplier(spec: Spec) -> float:
  """What scales the queries beyond SP's 1/√K: √(K_base / K) under μP (so that the logits are
  q·k · √K_base / K), else 1."""
  return math.sqrt(1.0 / width_multiplier(spec))


def output_multiplier(spec: Spec) -> float:
  """What scales the head's input: 1/m under μP, else 1."""
  return 1.0 / width_multiplier(spec)


def lr_factor(spec: Spec, path: tuple[str, ...]) -> float:
  """AdamW's LR multiplier of the parameter at `path` (its names): 1/m for a hidden matrix
  (`kernel`) under μP, else 1."""
  return 1.0 / width_multiplier(spec) if path[-1] == "kernel" else 1.0


# --- Attention ----------------------------------------------------------------------------------


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


class Attention(nn.Module):
  """Multi-head self-attention: query, key, value and out projections of [D, D], heads-major
  (B, H, L, K) in between; with `decode`, a key/value cache. With `spec.qk_norm`, queries and keys
  pass the block's norm over K (one of [K] each, shared by the heads: Wortsman et al. 2023) before
  q·k; with `spec.position` "rope" they are then rotated by their absolute positions."""
  spec: Spec
  causal: bool
  execution: Execution = Execution()
  layer: int | None = None
  train: bool = False
  decode: bool = False

  @nn.compact
  def __call__(self, x_BLD, mask_BL=None):
    s, ex = self.spec, self.execution
    q_BHLK, k_BHLK, v_BHLK = (HeadsDense(s, ex, split=True, std=hidden_std(s), name=name)(x_BLD)
                              for name in ("query", "key", "value"))
    if s.qk_norm:
      q_BHLK = norm(s, ex, "query_norm")(q_BHLK)
      k_BHLK = norm(s, ex, "key_norm")(k_BHLK)
    index = (self.variable("cache", "index", lambda: jnp.zeros((), jnp.int32)) if self.decode
             else None)
    if s.position == "rope":
      positions_L = (0 if index is None else index.value) + jnp.arange(q_BHLK.shape[2])
      q_BHLK, k_BHLK = (rope(x, positions_L, s.rope_theta) for x in (q_BHLK, k_BHLK))
    if (scale := attention_multiplier(s)) != 1.0:  # μP away from its base
      q_BHLK = q_BHLK * scale
    mask = None if mask_BL is None else mask_BL[:, None, None, :]
    causal = self.causal
    if self.decode:
      k_BHLK, v_BHLK, mask = self.extend_cache(k_BHLK, v_BHLK, index)
      causal = False  # the cache mask already hides the future
    out_BHLK, stats = ex.attend(q_BHLK, k_BHLK, v_BHLK, mask, causal=causal, train=self.train)
    if stats is not None:  # sow: a no-op unless "stats" is mutable (unused, jit drops it)
      self.sow("stats", "attention", AttentionStats(*stats, self.layer))
    out_BLD = HeadsDense(s, ex, split=False, std=hidden_std(s, residual_std(s)), name="out")(
        out_BHLK)
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


def xla_attention(q_BHLK, k_BHTK, v_BHTK, mask, *, causal: bool):
  """softmax(q·kᵀ/√K)·v with float32 softmax, and the `attention_stats` of the same logits and
  probabilities. Heads-major: every matmul is a plain batched matmul over (B, H), with no
  transposes around it (the layout XLA:CPU runs fastest)."""
  logits_BHLT = attention_logits(q_BHLK, k_BHTK, mask, causal=causal)
  probs_BHLT = jax.nn.softmax(logits_BHLT, axis=-1)
  return (jnp.einsum("bhlt,bhtk->bhlk", probs_BHLT.astype(v_BHTK.dtype), v_BHTK),
          attention_stats(logits_BHLT, probs_BHLT))


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


@flax.struct.dataclass
class AttentionStats:
  """What an attention layer sows: the largest pre-softmax logit q·k/√K over the positions it may
  see (a scalar), and each head's entropy (nats) of its attention distribution, averaged over
  the batch and the queries ([H]); a leading [layers] under `scan_layers`, with `layer` None."""
  logit_max: jax.Array
  entropy_H: jax.Array
  layer: int | None = flax.struct.field(pytree_node=False)


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


# --- The FFN, the block and the stack -----------------------------------------------------------


class FeedForward(nn.Module):
  """W₂·act(W₁x) or, gated (`spec.gated`: `ffn` "gated", or a GLU name), W₂·(act(W_gate x) ⊙ W₁x)
  (Shazeer 2020); biases as `spec.bias` says."""
  spec: Spec
  execution: Execution = Execution()
  layer: int | None = None
  train: bool = False

  @nn.compact
  def __call__(self, x_BLD):
    s, ex = self.spec, self.execution
    act = activations.get(s.activation).fn
    up_BLF = dense(s.ffn_width, ex, hidden_std(s), name="up", bias=s.bias)(x_BLD)
    if s.gated:
      z_BLF = dense(s.ffn_width, ex, hidden_std(s), name="gate", bias=s.bias)(x_BLD)
      h_BLF = act(z_BLF) * up_BLF
    else:
      z_BLF = up_BLF
      h_BLF = act(z_BLF)
    self.sow("stats", "ffn", FFNStats(z_BLF, h_BLF, self.layer))  # no-op unless mutable
    out_BLD = dense(x_BLD.shape[-1], ex, hidden_std(s, residual_std(s)), name="down",
                    bias=s.bias)(h_BLF)
    return nn.Dropout(s.dropout)(out_BLD, deterministic=not self.train)


@flax.struct.dataclass
class FFNStats:
  """What an FFN sows: its pre-activation `z` (W₁x, or the gate's W_gate x) and hidden vector `h`
  (the input of W₂), [B, L, F] each; `layer` is the block's index, or None under `scan_layers`,
  where the arrays have a leading layer axis instead."""
  z: jax.Array
  h: jax.Array
  layer: int | None = flax.struct.field(pytree_node=False)


class Block(nn.Module):
  """Pre-norm (GPT-2: x + f(LN(x))) or post-norm (BERT: LN(x + f(x))) block:
  `(x, mask) → (y, None)`, the form `nn.scan` needs; `train` and `decode` are attributes (Python
  values: `nn.scan` and `nn.remat` trace arguments)."""
  spec: Spec
  causal: bool
  execution: Execution = Execution()
  layer: int | None = None      # its index in the stack (for the statistics)
  train: bool = False
  decode: bool = False

  @nn.compact
  def __call__(self, x_BLD, mask_BL=None):
    s, ex = self.spec, self.execution
    attn = Attention(s, self.causal, ex, self.layer, self.train, self.decode, name="attn")
    ffn = FeedForward(s, ex, self.layer, self.train, name="ffn")
    ln_attn, ln_ffn = norm(s, ex, "ln_attn"), norm(s, ex, "ln_ffn")
    if s.norm == "pre":
      x_BLD = x_BLD + attn(ln_attn(x_BLD), mask_BL)
      return x_BLD + ffn(ln_ffn(x_BLD)), None
    x_BLD = ln_attn(x_BLD + attn(x_BLD, mask_BL))
    return ln_ffn(x_BLD + ffn(x_BLD)), None


def stack(spec: Spec, ex: Execution, x_BLD, mask_BL=None, *, causal: bool, train: bool = False,
          decode: bool = False):
  """The `num_layers` blocks, created in the calling module's compact method: `block_0` …
  `block_{n-1}`, each `nn.remat`-ed under `ex.remat`; under `ex.scan_layers` one `nn.scan` over
  one traced block, `blocks` (parameters, sown statistics and decoding cache with a leading
  layer axis; compile time independent of depth; the same function, but another random
  initialisation for a given seed, as per-layer keys are split differently)."""
  block = Block
  if ex.remat != "none":
    block = nn.remat(Block, policy=ex.remat_policy, prevent_cse=not ex.scan_layers)
  flags = dict(causal=causal, execution=ex, train=train, decode=decode)
  if ex.scan_layers:
    blocks = nn.scan(block, variable_axes={"params": 0, "stats": 0, "cache": 0},
                     split_rngs={"params": True, "dropout": True}, in_axes=(nn.broadcast,),
                     length=spec.num_layers)
    return blocks(spec, **flags, name="blocks")(x_BLD, mask_BL)[0]
  for i in range(spec.num_layers):
    x_BLD, _ = block(spec, **flags, layer=i, name=f"block_{i}")(x_BLD, mask_BL)
  return x_BLD


# --- The decoder --------------------------------------------------------------------------------


class Decoder(nn.Module):
  """GPT-2: token (`wte`) + position (`wpe`) embeddings, causal blocks, a final LayerNorm
  (`ln_f`) and an LM head tied to `wte`. The `Spec` may drop `wpe` for rotary positions in
  attention (`position`), make the norms RMSNorm (`norm_type`) and give the head its own
  [V, D] matrix `lm_head` (`tie_head` off). The embeddings, the final norm and the head are
  declared in `setup`, so that the head reaches `wte` as an attribute; the blocks in `hidden`."""
  spec: Spec
  execution: Execution = Execution()

  def setup(self):
    s, ex = self.spec, self.execution
    if not s.tie_head:  # the head's own weights, declared beside the embedding it would reuse
      self.lm_head = self.param("lm_head", normal(0.02), (s.vocab_size, s.d_model), jnp.float32)
    self.wte = embed(s.vocab_size, s, ex)
    self.wpe = embed(s.max_len, s, ex) if s.position == "learned" else None
    self.ln_f = norm(s, ex)

  def __call__(self, tokens_BL, *, train: bool = False, decode: bool = False):
    """Next-token logits [B, L, V] (float32) for every position; position t sees tokens ≤ t."""
    return self.logits(self.hidden(tokens_BL, train=train, decode=decode))

  @nn.compact
  def hidden(self, tokens_BL, *, train: bool = False, decode: bool = False):
    """The head's input [B, L, D]: the final norm's output (under μP × `output_multiplier`, so
    that the logits are the head's × 1/m). With `decode`, keys and values
    persist in the "cache" collection and `tokens_BL` continues the sequence cached so far
    (prompt first, then one token per call)."""
    s, ex = self.spec, self.execution
    x_BLD = self.wte(tokens_BL)
    if self.wpe is not None:
      L, start = tokens_BL.shape[1], 0
      if decode:
        position = self.variable("cache", "position", lambda: jnp.zeros((), jnp.int32))
        start, position.value = position.value, position.value + L
      x_BLD = x_BLD + self.wpe(start + jnp.arange(L))[None]
    x_BLD = nn.Dropout(s.dropout)(x_BLD, deterministic=not train)
    x_BLD = stack(s, ex, x_BLD, causal=True, train=train, decode=decode)
    h_BLD = self.ln_f(x_BLD)
    return h_BLD if (scale := output_multiplier(s)) == 1.0 else h_BLD * scale

  def head_weights(self) -> jax.Array:
    """The LM head's [V, D] weights: the token embedding's when tied, else `lm_head`."""
    return self.wte.embedding if self.spec.tie_head else self.lm_head

  def logits(self, h_BLD) -> jax.Array:
    """The LM head: h·Eᵀ with E `head_weights` (float32 logits)."""
    return tied_logits(h_BLD, self.head_weights())

  def head_input(self, tokens_BL, *, train: bool = False):
    """What a loss takes: (`hidden`, `head_weights`)."""
    return self.hidden(tokens_BL, train=train), self.head_weights()


def tied_logits(h_BLD, embedding_VD) -> jax.Array:
  """= `nn.Embed.attend(h_BLD)`, with float32 logits also when computing in bfloat16."""
  return jnp.einsum("bld,vd->blv", h_BLD, embedding_VD.astype(h_BLD.dtype),
                    preferred_element_type=jnp.float32)


# --- The decoder with its loss ------------------------------------------------------------------


@flax.struct.dataclass
class Sums:
  """What an objective returns: sums over a batch (kernels.py's sums are keyed by these names);
  those a loss does not compute are None."""
  loss_sum: jax.Array        # the differentiated sum: cross-entropy (+ the z-loss in training)
  count: jax.Array           # the positions (or examples) summed over
  z_loss_sum: jax.Array | None = None  # with a z-loss, its part of loss_sum: z_loss · Σ logZ²
  logz_sum: jax.Array | None = None  # Σ logZ of the output logits (`stats`; not differentiated)
  correct: jax.Array | None = None   # the right argmax predictions, where accuracy applies
  mask: "Sums | None" = None  # MLM: the same over the positions whose input is [MASK]
  sown: Any = None           # with `stats`: the blocks' `FFNStats` and `AttentionStats`


class Objective(Protocol):
  """A model with its loss (`CausalLM`, `MaskedLM`, `Classifier`): pure, so a step can close over
  it. `train`: dropout on and the z-loss added; `stats`: the blocks' sown statistics and
  `logz_sum` too."""
  model: nn.Module
  z_loss: float

  def __call__(self, params, batch, rng, *, train: bool, stats: bool = False) -> Sums: ...


@dataclasses.dataclass(frozen=True)
class CausalLM:
  """The decoder with its loss (an `Objective`): next-token cross-entropy (nats) of windows of
  L+1 tokens, summed over positions 1…L, from the logits (`loss_impl="plain"`) or fused with the
  head (kernels.xent_sum); in training with the z-loss, with `stats` the sown values and
  `logz_sum`."""
  model: Decoder
  z_loss: float = 0.0

  def __call__(self, params, batch_BL1, rng, *, train: bool, stats: bool = False) -> Sums:
    inputs_BL, targets_BL = batch_BL1[:, :-1], batch_BL1[:, 1:]
    (h_BLD, head_VD), sown = apply(self.model, params, inputs_BL, train=train,
                                   rngs={"dropout": rng}, stats=stats, method=Decoder.head_input)
    z_loss = self.z_loss if train else 0.0
    if self.model.execution.loss_impl == "fused":
      sums = kernels.xent_sum(h_BLD, head_VD, targets_BL, z_loss=z_loss, logz=stats)
    else:
      logits_BLV = tied_logits(h_BLD, head_VD)
      losses_BL = optax.softmax_cross_entropy_with_integer_labels(logits_BLV, targets_BL)
      sums = kernels.logit_sums(losses_BL.sum(), logits_BLV, z_loss=z_loss, logz=stats)
    return Sums(**sums, count=targets_BL.size, sown=sown)


def apply(model: nn.Module, params, *args, stats: bool = False, **kwargs):
  """`model.apply({"params": params}, ...)` → (output, sown): with `stats`, the "stats" collection
  is mutable and `sown` holds the blocks' `FFNStats` and `AttentionStats` (an evaluation's, and
  a logged training step's: `Step.train_step`'s `diagnostics`); otherwise it is None and nothing
  extra is computed."""
  if not stats:
    return model.apply({"params": params}, *args, **kwargs), None
  out, state = model.apply({"params": params}, *args, mutable=["stats"], **kwargs)
  return out, state["stats"]


def per_layer(sown, kind: type) -> list:
  """The `kind` values (`FFNStats` or `AttentionStats`) in `sown`, one per layer in layer order;
  a value stacked by `scan_layers` (`layer` None) is split along its layer axis."""
  by_layer = {}
  for value in jax.tree.leaves(sown, is_leaf=lambda x: isinstance(x, kind)):
    if not isinstance(value, kind):
      continue
    if value.layer is not None:
      by_layer[value.layer] = value
      continue
    for i in range(jax.tree.leaves(value)[0].shape[0]):
      by_layer[i] = jax.tree.map(lambda x: x[i], value)
  return [by_layer[i] for i in sorted(by_layer)]


def count_params(params) -> dict[str, int]:
  """Total parameters and the count without the token embedding (`wte`)."""
  sizes = jax.tree.map(lambda p: int(np.prod(p.shape)), params)
  total = sum(jax.tree.leaves(sizes))
  embedding = sum(jax.tree.leaves(sizes.get("wte", {})))
  return {"total": total, "non_embedding": total - embedding}


def param_count(spec: Spec, head: str = "lm", type_vocab_size: int = 2,
                num_classes: int = 2) -> int:
  """`count_params(...)["total"]` in closed form: the decoder (`head="lm"`), else the encoder
  with that head."""
  D, V, P, F, K = spec.d_model, spec.vocab_size, spec.max_len, spec.ffn_width, spec.head_dim
  b = 1 if spec.bias else 0
  norm = lambda n: n * (1 if spec.norm_type == "rms" else 1 + b)  # scale (and bias) of [n]
  attention = 4 * (D * D + b * D) + (2 * norm(K) if spec.qk_norm else 0)
  ffn = (3 if spec.gated else 2) * D * F + b * ((2 if spec.gated else 1) * F + D)
  blocks = spec.num_layers * (attention + ffn + 2 * norm(D))
  if head == "lm":
    positions = P * D if spec.position == "learned" else 0
    return V * D * (1 if spec.tie_head else 2) + positions + blocks + norm(D)
  ln = norm(D)
  total = (V + P + type_vocab_size) * D + ln + blocks + (ln if spec.norm == "pre" else 0)
  if head in ("mlm", "all"):
    total += D * D + D + ln + V
  if head in ("classify", "all"):
    total += D * D + D + D * num_classes + num_classes
  return total
