"""Transformer layers shared by the decoder and the encoder: attention, FFN, block.

Shape suffixes: B batch, L sequence, D d_model, H heads, K head dim, F FFN hidden width.
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


def logit_max(q_BLHK, k_BLHK, mask, causal: bool) -> jax.Array:
  """The largest pre-softmax attention logit q·k/√K over the positions attention may see."""
  L, K = q_BLHK.shape[1], q_BLHK.shape[3]
  logits_BHLL = jnp.einsum("bqhk,bshk->bhqs", q_BLHK, k_BLHK,
                           preferred_element_type=jnp.float32) / math.sqrt(K)
  visible = jnp.ones((1, 1, L, L), bool) if mask is None else mask
  if causal:
    visible = visible & jnp.tril(jnp.ones((L, L), bool))
  return jnp.where(visible, logits_BHLL, -jnp.inf).max()


def attention_impl(requested: str, dtype, head_dim: int) -> str:
  """The `jax.nn.dot_product_attention` implementation for `model.attention_impl`: "auto" takes
  cuDNN flash attention on an NVIDIA GPU where it applies (bfloat16/float16, head dim a multiple
  of 8 up to 128) and XLA's otherwise (float32, CPU, TPU)."""
  if requested != "auto":
    return requested
  ok = (jax.default_backend() == "gpu" and jnp.dtype(dtype) in (jnp.bfloat16, jnp.float16)
        and head_dim % 8 == 0 and head_dim <= 128)
  return "cudnn" if ok else "xla"


def attend(q_BLHK, k_BLHK, v_BLHK, mask, causal: bool, requested: str = "xla"):
  """`jax.nn.dot_product_attention` with `attention_impl`; "auto" falls back to XLA when cuDNN
  refuses the call (it checks shapes, masks and the GPU when the step is traced)."""
  impl = attention_impl(requested, q_BLHK.dtype, q_BLHK.shape[-1])
  call = lambda impl: jax.nn.dot_product_attention(
      q_BLHK, k_BLHK, v_BLHK, mask=mask, is_causal=causal, implementation=impl)
  if impl == "cudnn" and requested == "auto":
    try:
      return call("cudnn")
    except Exception:  # noqa: BLE001 -- any refusal means: not this shape/GPU; use XLA.
      return call("xla")
  return call(impl)


class Attention(nn.Module):
  """Multi-head self-attention through `jax.nn.dot_product_attention`.

  When the "stats" collection is mutable (evaluation with statistics) it also sows `logit_max`,
  which the fused attention does not expose; training never computes it.
  """
  spec: Spec
  causal: bool

  @nn.compact
  def __call__(self, x_BLD, mask_BL=None, *, train: bool = False, decode: bool = False):
    s = self.spec
    B, L, D = x_BLD.shape
    H, K = s.num_heads, D // s.num_heads
    q_BLHK, k_BLHK, v_BLHK = (
        dense(D, s, name=name)(x_BLD).reshape(B, L, H, K) for name in ("query", "key", "value"))
    mask = None if mask_BL is None else mask_BL[:, None, None, :]
    causal = self.causal
    if decode:
      k_BLHK, v_BLHK, mask = self.extend_cache(k_BLHK, v_BLHK)
      causal = False  # the cache mask already hides the future
    out_BLHK = attend(q_BLHK, k_BLHK, v_BLHK, mask, causal, s.attention_impl)
    if self.is_mutable_collection("stats"):
      self.sow("stats", "logit_max", logit_max(q_BLHK, k_BLHK, mask, causal))
    out_BLD = dense(D, s, residual_std(s), name="out")(out_BLHK.reshape(B, L, D))
    return nn.Dropout(s.dropout)(out_BLD, deterministic=not train)

  def extend_cache(self, k_BLHK, v_BLHK):
    """Autoregressive decoding: appends this call's keys and values to a cache of `max_len`
    positions (the "cache" collection) and returns the whole cache with the mask that lets query
    l (at absolute position index + l) see cache positions ≤ index + l."""
    B, L, H, K = k_BLHK.shape
    T = self.spec.max_len
    cached_k = self.variable("cache", "cached_key", jnp.zeros, (B, T, H, K), k_BLHK.dtype)
    cached_v = self.variable("cache", "cached_value", jnp.zeros, (B, T, H, K), v_BLHK.dtype)
    index = self.variable("cache", "index", lambda: jnp.zeros((), jnp.int32))
    i = index.value
    cached_k.value = jax.lax.dynamic_update_slice(cached_k.value, k_BLHK, (0, i, 0, 0))
    cached_v.value = jax.lax.dynamic_update_slice(cached_v.value, v_BLHK, (0, i, 0, 0))
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
