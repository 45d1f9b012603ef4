"""The transformer, top-down: the GPT-style `Decoder` (embeddings, the stack of blocks, the tied
LM head, its next-token loss), the `Block`, its `Attention` and `FeedForward`, then helpers. What
it is: `Spec` (spec.py); how it runs: `Execution` (execution.py); what losses take from output
logits: kernels.py; the BERT-style encoder from these blocks: encoder.py.

Shape suffixes: B batch, L sequence (T: the keys' positions), D d_model, H heads, K head dim,
F FFN hidden width, V vocabulary, P masked positions, C classes.

Applied with the "stats" collection mutable (`apply(..., stats=True)`), every block also sows one
`FFNStats` and one `AttentionStats` (not in training under cuDNN attention: `Attention`), the
typed values actlab.measure.metrics reduces; otherwise nothing extra is computed.
"""

import math

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
from jax.nn.initializers import normal

from actlab.models import activations, kernels
from actlab.models.execution import Execution, attention_impl, cudnn_attention
from actlab.models.spec import Spec


class Decoder(nn.Module):
  """GPT-2: token (`wte`) + position (`wpe`) embeddings, causal blocks, a final LayerNorm
  (`ln_f`) and an LM head tied to `wte`."""
  spec: Spec
  execution: Execution = Execution()

  def __call__(self, tokens_BL, *, train: bool = False, decode: bool = False):
    """Next-token logits [B, L, V] (float32) for every position; position t sees tokens ≤ t."""
    return self.logits(self.hidden(tokens_BL, train=train, decode=decode))

  def logits(self, h_BLD) -> jax.Array:
    """The LM head: h·Eᵀ with E the token embedding `wte` (float32 logits)."""
    return tied_logits(h_BLD, self.token_embedding())

  def next_token_sums(self, tokens_BL, targets_BL, *, train: bool = False, fused: bool = False,
                      z_loss: float = 0.0, logz: bool = False) -> dict:
    """The cross-entropy (nats) of `targets_BL` after `tokens_BL`, summed (`loss_sum`, with the
    z-loss), and `kernels.logz_sums`. `fused`: the head and the loss in chunks of positions,
    without the [B, L, V] logits (`kernels.xent_sum`); else from `logits`."""
    h_BLD = self.hidden(tokens_BL, train=train)
    if fused:
      return kernels.xent_sum(h_BLD, self.token_embedding(), targets_BL, z_loss=z_loss, logz=logz)
    logits_BLV = self.logits(h_BLD)
    losses_BL = optax.softmax_cross_entropy_with_integer_labels(logits_BLV, targets_BL)
    return kernels.with_logit_sums({"loss_sum": losses_BL.sum()},
                                   kernels.logit_sums(logits_BLV, z_loss=z_loss, logz=logz))

  def token_embedding(self) -> jax.Array:  # the head's weights: `wte`'s, tied
    return self.variables["params"]["wte"]["embedding"]

  @nn.compact
  def hidden(self, tokens_BL, *, train: bool = False, decode: bool = False):
    """The final LayerNorm's output [B, L, D], the head's input. With `decode`, keys and values
    persist in the "cache" collection and `tokens_BL` continues the sequence cached so far
    (prompt first, then one token per call)."""
    s, ex = self.spec, self.execution
    L = tokens_BL.shape[1]
    start = 0
    if decode:
      position = self.variable("cache", "position", lambda: jnp.zeros((), jnp.int32))
      start, position.value = position.value, position.value + L
    x_BLD = (embed(s.vocab_size, s, ex, "wte")(tokens_BL)
             + embed(s.max_len, s, ex, "wpe")(start + jnp.arange(L))[None])
    x_BLD = nn.Dropout(s.dropout)(x_BLD, deterministic=not train)
    x_BLD = stack(s, ex, x_BLD, causal=True, train=train, decode=decode)
    return layer_norm(s, ex, "ln_f")(x_BLD)


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


class Block(nn.Module):
  """Pre-LN (GPT-2: x + f(LN(x))) or post-LN (BERT: LN(x + f(x))) block: `(x, mask) → (y, None)`,
  the form `nn.scan` needs; `train` and `decode` are attributes (Python values: `nn.scan` and
  `nn.remat` trace arguments)."""
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
    ln_attn, ln_ffn = layer_norm(s, ex, "ln_attn"), layer_norm(s, ex, "ln_ffn")
    if s.norm == "pre":
      x_BLD = x_BLD + attn(ln_attn(x_BLD), mask_BL)
      return x_BLD + ffn(ln_ffn(x_BLD)), None
    x_BLD = ln_attn(x_BLD + attn(x_BLD, mask_BL))
    return ln_ffn(x_BLD + ffn(x_BLD)), None


class Attention(nn.Module):
  """Multi-head self-attention: query, key, value and out projections of [D, D] (BERT/GPT-2),
  heads-major (B, H, L, K) in between; with `decode`, a key/value cache. With `spec.qk_norm`,
  queries and keys pass a LayerNorm over the head dim K (`query_norm`, `key_norm`: one scale and
  bias of [K] each, shared by the heads) before q·k (qk-layernorm: Dehghani et al. 2023,
  Wortsman et al. 2023). Its `AttentionStats` come from the logits and probabilities XLA
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
      q_BHLK = layer_norm(s, ex, "query_norm")(q_BHLK)
      k_BHLK = layer_norm(s, ex, "key_norm")(k_BHLK)
    mask = None if mask_BL is None else mask_BL[:, None, None, :]
    causal = self.causal
    if self.decode:
      k_BHLK, v_BHLK, mask = self.extend_cache(k_BHLK, v_BHLK)
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

  def extend_cache(self, k_BHLK, v_BHLK):
    """Appends this call's keys and values to a cache of `max_len` positions (the "cache"
    collection) and returns the whole cache with the mask that lets query l (at absolute
    position index + l) see cache positions ≤ index + l."""
    (B, H, L, K), T = k_BHLK.shape, self.spec.max_len
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
  """W₂·act(W₁x) or, for the GLU family, W₂·(act(W_gate x) ⊙ W₁x) (Shazeer 2020)."""
  spec: Spec
  execution: Execution = Execution()
  layer: int | None = None
  train: bool = False

  @nn.compact
  def __call__(self, x_BLD):
    s, ex = self.spec, self.execution
    act = activations.get(s.activation)
    up_BLF = dense(s.ffn_width, ex, name="up")(x_BLD)
    if act.gated:
      z_BLF = dense(s.ffn_width, ex, name="gate")(x_BLD)
      h_BLF = act.fn(z_BLF) * up_BLF
    else:
      z_BLF = up_BLF
      h_BLF = act.fn(z_BLF)
    self.sow("stats", "ffn", FFNStats(z_BLF, h_BLF, self.layer))  # no-op unless mutable
    out_BLD = dense(x_BLD.shape[-1], ex, residual_std(s), name="down")(h_BLF)
    return nn.Dropout(s.dropout)(out_BLD, deterministic=not self.train)


@flax.struct.dataclass
class FFNStats:
  """What an FFN sows: its pre-activation `z` (W₁x, or the gate's W_gate x) and hidden vector `h`
  (the input of W₂), [B, L, F] each; `layer` is the block's index, or None under `scan_layers`,
  where the arrays have a leading layer axis instead."""
  z: jax.Array
  h: jax.Array
  layer: int | None = flax.struct.field(pytree_node=False)


@flax.struct.dataclass
class AttentionStats:
  """What an attention layer sows: the largest pre-softmax logit q·k/√K over the positions it may
  see (a scalar), and each head's entropy (nats) of its attention distribution, averaged over
  the batch and the queries ([H]); a leading [layers] under `scan_layers`, with `layer` None."""
  logit_max: jax.Array
  entropy_H: jax.Array
  layer: int | None = flax.struct.field(pytree_node=False)


def apply(model: nn.Module, params, *args, stats: bool = False, **kwargs):
  """`model.apply({"params": params}, ...)` → (output, sown): with `stats`, the "stats" collection
  is mutable and `sown` holds the blocks' `FFNStats` and `AttentionStats`; otherwise it is None
  and nothing extra is computed (training never asks for statistics)."""
  if not stats:
    return model.apply({"params": params}, *args, **kwargs), None
  out, state = model.apply({"params": params}, *args, mutable=["stats"], **kwargs)
  return out, state["stats"]


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
  """`nn.Dense(d_model)` (the same kernel [D, D], bias [D] and initialisation) whose matmul
  splits its output into heads (`split=True`: x_BLD → y_BHLK) or merges its input from them
  (x_BHLK → y_BLD), so that attention needs no transposes."""
  spec: Spec
  execution: Execution = Execution()
  split: bool = True
  std: float = 0.02

  @nn.compact
  def __call__(self, x):
    D, H = self.spec.d_model, self.spec.num_heads
    kernel = self.param("kernel", normal(self.std), (D, D), jnp.float32)
    bias = self.param("bias", nn.initializers.zeros_init(), (D,), jnp.float32)
    x, kernel, bias = nn.dtypes.promote_dtype(x, kernel, bias, dtype=self.execution.compute_dtype)
    if self.split:
      return (jnp.einsum("bld,dhk->bhlk", x, kernel.reshape(D, H, D // H))
              + bias.reshape(H, 1, D // H))
    return jnp.einsum("bhlk,hkd->bld", x, kernel.reshape(H, D // H, D)) + bias


def dense(features: int, ex: Execution, std: float = 0.02, name: str | None = None) -> nn.Dense:
  return nn.Dense(features, dtype=ex.compute_dtype, kernel_init=normal(std), name=name)


def embed(n: int, spec: Spec, ex: Execution, name: str) -> nn.Embed:
  return nn.Embed(n, spec.d_model, embedding_init=normal(0.02), dtype=ex.compute_dtype, name=name)


def layer_norm(spec: Spec, ex: Execution, name: str) -> nn.LayerNorm:
  return nn.LayerNorm(epsilon=spec.norm_eps, dtype=ex.compute_dtype, name=name)


def residual_std(spec: Spec) -> float:
  """GPT-2: residual output projections start at 0.02/√(2·layers)."""
  return 0.02 / math.sqrt(2 * spec.num_layers)


def tied_logits(h_BLD, embedding_VD) -> jax.Array:
  """= `nn.Embed.attend(h_BLD)`, with float32 logits also when computing in bfloat16."""
  return jnp.einsum("bld,vd->blv", h_BLD, embedding_VD.astype(h_BLD.dtype),
                    preferred_element_type=jnp.float32)
