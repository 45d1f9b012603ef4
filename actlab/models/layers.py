"""Transformer layers shared by the decoder and the encoder: attention, FFN, block.

Shape suffixes: B batch, L sequence (T: the keys' positions), D d_model, H heads, K head dim,
F FFN hidden width.
"""

import dataclasses
import functools
import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections

from actlab import activations


@dataclasses.dataclass(frozen=True)
class Spec:
  """The model's hyperparameters: `config.model` resolved, hashable for Flax."""
  activation: str
  num_layers: int
  d_model: int
  num_heads: int
  d_ff: int
  max_len: int
  vocab_size: int               # padded to a multiple of 64
  dropout: float = 0.0
  norm: str = "pre"
  norm_eps: float = 1e-5
  gated_match_params: bool = True
  dtype: str = "float32"
  attention_impl: str = "xla"
  loss_impl: str = "fused"      # decoder LM loss: "fused" (kernels.xent_sum) or "plain" (logits)
  scan_layers: bool = False     # one nn.scan over the blocks (params under "blocks", layer axis 0)
  remat: str = "none"           # recompute in the backward pass: "none", "full", "dots"

  @classmethod
  def from_config(cls, model: ml_collections.ConfigDict, vocab_size: int) -> "Spec":
    fields = {f.name for f in dataclasses.fields(cls)}
    kwargs = {k: v for k, v in model.to_dict().items() if k in fields}
    kwargs["vocab_size"] = pad_vocab(model.vocab_size or vocab_size)
    return cls(**kwargs)

  @property
  def ffn_width(self) -> int:
    """Hidden width F: d_ff, or for gated FFNs round(2/3·d_ff) to a multiple of 64."""
    if activations.get(self.activation).gated and self.gated_match_params:
      return max(64, round(2 * self.d_ff / 3 / 64) * 64)
    return self.d_ff

  @property
  def compute_dtype(self) -> jnp.dtype:
    return jnp.dtype(self.dtype)


def pad_vocab(vocab_size: int, multiple: int = 64) -> int:
  return -(-vocab_size // multiple) * multiple


def normal(std: float) -> nn.initializers.Initializer:
  return nn.initializers.normal(stddev=std)


def dense(features: int, spec: Spec, std: float = 0.02, name: str | None = None) -> nn.Dense:
  return nn.Dense(features, dtype=spec.compute_dtype, kernel_init=normal(std), name=name)


def layer_norm(spec: Spec, name: str) -> nn.LayerNorm:
  return nn.LayerNorm(epsilon=spec.norm_eps, dtype=spec.compute_dtype, name=name)


def residual_std(spec: Spec) -> float:
  """GPT-2: residual output projections start at 0.02/√(2·layers)."""
  return 0.02 / math.sqrt(2 * spec.num_layers)


def visible_positions(mask, causal: bool, L: int):
  """The [B|1, 1, L, T] boolean mask of the keys each query may attend to, or None (all)."""
  if causal:
    tril_LL = jnp.tril(jnp.ones((L, L), bool))[None, None]
    return tril_LL if mask is None else mask & tril_LL
  return mask


def attention_logits(q_BHLK, k_BHTK, visible) -> jax.Array:
  """Pre-softmax logits q·k/√K in float32; invisible positions at float32's lowest value (not
  −inf, so that a row with nothing visible stays finite)."""
  logits_BHLT = jnp.einsum("bhlk,bhtk->bhlt", q_BHLK, k_BHTK,
                           preferred_element_type=jnp.float32) / math.sqrt(q_BHLK.shape[-1])
  if visible is None:
    return logits_BHLT
  return jnp.where(visible, logits_BHLT, jnp.finfo(jnp.float32).min)


def logit_max(q_BHLK, k_BHTK, mask, causal: bool) -> jax.Array:
  """The largest pre-softmax attention logit q·k/√K over the positions attention may see."""
  visible = visible_positions(mask, causal, q_BHLK.shape[2])
  return attention_logits(q_BHLK, k_BHTK, visible).max()


def attention_impl(requested: str, dtype, head_dim: int) -> str:
  """The attention implementation for `model.attention_impl`: "auto" takes cuDNN flash attention
  on an NVIDIA GPU where it applies (bfloat16/float16, head dim a multiple of 8 up to 128) and
  XLA's otherwise (float32, CPU, TPU)."""
  if requested != "auto":
    return requested
  ok = (jax.default_backend() == "gpu" and jnp.dtype(dtype) in (jnp.bfloat16, jnp.float16)
        and head_dim % 8 == 0 and head_dim <= 128)
  return "cudnn" if ok else "xla"


def xla_attention(q_BHLK, k_BHTK, v_BHTK, mask, causal: bool):
  """softmax(q·kᵀ/√K)·v with float32 softmax, heads-major: every matmul is a plain batched
  matmul over (B, H), with no transposes around it (the layout XLA:CPU runs fastest)."""
  visible = visible_positions(mask, causal, q_BHLK.shape[2])
  probs_BHLT = jax.nn.softmax(attention_logits(q_BHLK, k_BHTK, visible), axis=-1)
  return jnp.einsum("bhlt,bhtk->bhlk", probs_BHLT.astype(v_BHTK.dtype), v_BHTK)


def attend(q_BHLK, k_BHTK, v_BHTK, mask, causal: bool, requested: str = "xla"):
  """Attention with `model.attention_impl`: "xla" is `xla_attention`; "cudnn" is
  `jax.nn.dot_product_attention`'s cuDNN flash attention (sequence-major inputs); "auto" falls
  back to XLA when cuDNN refuses the call (it checks shapes, masks and the GPU at trace time)."""
  impl = attention_impl(requested, q_BHLK.dtype, q_BHLK.shape[-1])
  if impl == "xla":
    return xla_attention(q_BHLK, k_BHTK, v_BHTK, mask, causal)
  to_BLHK = lambda x: x.transpose(0, 2, 1, 3)
  cudnn = lambda: to_BLHK(jax.nn.dot_product_attention(
      to_BLHK(q_BHLK), to_BLHK(k_BHTK), to_BLHK(v_BHTK), mask=mask, is_causal=causal,
      implementation="cudnn"))
  if requested == "auto":
    try:
      return cudnn()
    except Exception:  # noqa: BLE001 -- any refusal means: not this shape/GPU; use XLA.
      return xla_attention(q_BHLK, k_BHTK, v_BHTK, mask, causal)
  return cudnn()


class HeadsDense(nn.Module):
  """`nn.Dense(d_model)` (the same kernel [D, D], bias [D] and initialisation) whose matmul
  splits its output into heads (`split=True`: x_BLD → y_BHLK) or merges its input from them
  (x_BHLK → y_BLD), so that attention needs no transposes."""
  spec: Spec
  split: bool
  std: float = 0.02

  @nn.compact
  def __call__(self, x):
    s = self.spec
    D, H = s.d_model, s.num_heads
    kernel = self.param("kernel", normal(self.std), (D, D), jnp.float32)
    bias = self.param("bias", nn.initializers.zeros_init(), (D,), jnp.float32)
    x, kernel, bias = nn.dtypes.promote_dtype(x, kernel, bias, dtype=s.compute_dtype)
    if self.split:
      return (jnp.einsum("bld,dhk->bhlk", x, kernel.reshape(D, H, D // H))
              + bias.reshape(H, 1, D // H))
    return jnp.einsum("bhlk,hkd->bld", x, kernel.reshape(H, D // H, D)) + bias


class Attention(nn.Module):
  """Multi-head self-attention. Parameters as in BERT/GPT-2: query, key, value and out Dense
  layers of [D, D]; the activations in between are heads-major (B, H, L, K).

  When the "stats" collection is mutable (evaluation with statistics) it also sows `logit_max`,
  which the attention does not return; training never computes it.
  """
  spec: Spec
  causal: bool

  @nn.compact
  def __call__(self, x_BLD, mask_BL=None, *, train: bool = False, decode: bool = False):
    s = self.spec
    q_BHLK, k_BHLK, v_BHLK = (HeadsDense(s, split=True, name=name)(x_BLD)
                              for name in ("query", "key", "value"))
    mask = None if mask_BL is None else mask_BL[:, None, None, :]
    causal = self.causal
    if decode:
      k_BHLK, v_BHLK, mask = self.extend_cache(k_BHLK, v_BHLK)
      causal = False  # the cache mask already hides the future
    out_BHLK = attend(q_BHLK, k_BHLK, v_BHLK, mask, causal, s.attention_impl)
    if self.is_mutable_collection("stats"):
      self.sow("stats", "logit_max", logit_max(q_BHLK, k_BHLK, mask, causal))
    out_BLD = HeadsDense(s, split=False, std=residual_std(s), name="out")(out_BHLK)
    return nn.Dropout(s.dropout)(out_BLD, deterministic=not train)

  def extend_cache(self, k_BHLK, v_BHLK):
    """Autoregressive decoding: appends this call's keys and values to a cache of `max_len`
    positions (the "cache" collection) and returns the whole cache with the mask that lets query
    l (at absolute position index + l) see cache positions ≤ index + l."""
    B, H, L, K = k_BHLK.shape
    T = self.spec.max_len
    cached_k = self.variable("cache", "cached_key", jnp.zeros, (B, H, T, K), k_BHLK.dtype)
    cached_v = self.variable("cache", "cached_value", jnp.zeros, (B, H, T, K), v_BHLK.dtype)
    index = self.variable("cache", "index", lambda: jnp.zeros((), jnp.int32))
    i = index.value
    cached_k.value = jax.lax.dynamic_update_slice(cached_k.value, k_BHLK, (0, 0, i, 0))
    cached_v.value = jax.lax.dynamic_update_slice(cached_v.value, v_BHLK, (0, 0, i, 0))
    index.value = i + L
    visible_LT = jnp.arange(T)[None, :] <= (i + jnp.arange(L))[:, None]
    return cached_k.value, cached_v.value, visible_LT[None, None]


class FeedForward(nn.Module):
  """W₂·act(W₁x) or, for the GLU family, W₂·(act(W_gate x) ⊙ W₁x) (Shazeer 2020).

  `z` is the pre-activation the statistics are taken on: W₁x, or the gate's W_gate x. Both `z`
  and the hidden vector `h` are sown into the "stats" collection, a no-op unless it is mutable.
  """
  spec: Spec

  @nn.compact
  def __call__(self, x_BLD, *, train: bool = False):
    s = self.spec
    act = activations.get(s.activation)
    F = s.ffn_width
    up_BLF = dense(F, s, name="up")(x_BLD)
    if act.gated:
      z_BLF = dense(F, s, name="gate")(x_BLD)
      h_BLF = act.fn(z_BLF) * up_BLF
    else:
      z_BLF = up_BLF
      h_BLF = act.fn(z_BLF)
    self.sow("stats", "z", z_BLF)
    self.sow("stats", "h", h_BLF)
    out_BLD = dense(x_BLD.shape[-1], s, residual_std(s), name="down")(h_BLF)
    return nn.Dropout(s.dropout)(out_BLD, deterministic=not train)


class Block(nn.Module):
  """Pre-LN (GPT-2: x + f(LN(x))) or post-LN (BERT: LN(x + f(x))) transformer block."""
  spec: Spec
  causal: bool

  @nn.compact
  def __call__(self, x_BLD, mask_BL=None, *, train: bool = False, decode: bool = False):
    s = self.spec
    attn = functools.partial(Attention(s, self.causal, name="attn"), train=train, decode=decode)
    ffn = FeedForward(s, name="ffn")
    ln_attn, ln_ffn = layer_norm(s, "ln_attn"), layer_norm(s, "ln_ffn")
    if s.norm == "pre":
      x_BLD = x_BLD + attn(ln_attn(x_BLD), mask_BL)
      return x_BLD + ffn(ln_ffn(x_BLD), train=train)
    x_BLD = ln_attn(x_BLD + attn(x_BLD, mask_BL))
    return ln_ffn(x_BLD + ffn(x_BLD, train=train))


class _BlockCall(Block):
  """A Block called as `(x, mask)` with `train`/`decode` as attributes, the form `nn.scan` and
  `nn.remat` need (their arguments are traced; these flags must stay Python values). As a
  subclass it creates the same submodules, so parameter names do not change."""
  train: bool = False
  decode: bool = False
  scanned: bool = False

  def __call__(self, x_BLD, mask_BL=None):
    y_BLD = Block.__call__(self, x_BLD, mask_BL, train=self.train, decode=self.decode)
    return (y_BLD, None) if self.scanned else y_BLD


REMAT_POLICIES = {
    "full": None,  # keep only each block's input; recompute everything else
    "dots": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,  # keep matmul outputs
}


def stack_blocks(spec: Spec, causal: bool, x_BLD, mask_BL=None, *, train: bool = False,
                 decode: bool = False):
  """The `num_layers` blocks, created inside the calling module's compact method.

  Default: a Python loop, parameters under `block_0` … `block_{n-1}`. `spec.scan_layers`: one
  `nn.scan` over a single traced block, parameters (and sown statistics, and the decoding cache)
  under `blocks` with a leading layer axis — compile time no longer grows with depth; the same
  function, but a different random initialisation for a given seed (per-layer keys are split
  differently). `spec.remat`: `nn.remat` around each block — "full" keeps only the block's
  input for the backward pass, "dots" also its matmul outputs — memory for recomputation.
  """
  cls = _BlockCall
  if spec.remat != "none":
    cls = nn.remat(cls, policy=REMAT_POLICIES[spec.remat], prevent_cse=not spec.scan_layers)
  if spec.scan_layers:
    scanned = nn.scan(cls, variable_axes={"params": 0, "stats": 0, "cache": 0},
                      split_rngs={"params": True, "dropout": True}, in_axes=(nn.broadcast,),
                      length=spec.num_layers)
    x_BLD, _ = scanned(spec, causal, train=train, decode=decode, scanned=True,
                       name="blocks")(x_BLD, mask_BL)
    return x_BLD
  for i in range(spec.num_layers):
    x_BLD = cls(spec, causal, train=train, decode=decode, name=f"block_{i}")(x_BLD, mask_BL)
  return x_BLD
