"""The transformer, top-down: the feed-forward network, attention, the block, the stack of
blocks; the GPT-style `Decoder` and its plain loss. What it is (sizes, activation, norm
placement) is `Spec`, in spec.py; how it runs (dtype, attention implementation, scan, remat) is
`Execution`, in execution.py; the BERT-style encoder is built from these blocks in encoder.py
(its losses are its tasks': actlab/tasks/).

Shape suffixes: B batch, L sequence (T: the keys' positions), D d_model, H heads, K head dim,
F FFN hidden width, V vocabulary, P masked positions, C classes.

Applied with the "stats" collection mutable (`apply(..., stats=True)`), every block also sows one
`FFNStats` and one `AttentionStats`, the typed values actlab.measure.metrics reduces; otherwise nothing
extra is computed.
"""

import functools
import math

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from actlab.models import activations
from actlab.models.execution import Execution, attend, transformed_stack
from actlab.models.spec import Spec


def normal(std: float) -> nn.initializers.Initializer:
  return nn.initializers.normal(stddev=std)


def dense(features: int, ex: Execution, std: float = 0.02, name: str | None = None) -> nn.Dense:
  return nn.Dense(features, dtype=ex.compute_dtype, kernel_init=normal(std), name=name)


def layer_norm(spec: Spec, ex: Execution, name: str) -> nn.LayerNorm:
  return nn.LayerNorm(epsilon=spec.norm_eps, dtype=ex.compute_dtype, name=name)


def residual_std(spec: Spec) -> float:
  """GPT-2: residual output projections start at 0.02/√(2·layers)."""
  return 0.02 / math.sqrt(2 * spec.num_layers)


def tied_logits(h_BLD, embedding_VD) -> jax.Array:
  """= `nn.Embed.attend(h_BLD)`, with float32 logits also when computing in bfloat16."""
  return jnp.einsum("bld,vd->blv", h_BLD, embedding_VD.astype(h_BLD.dtype),
                    preferred_element_type=jnp.float32)


# --- Feed-forward network -----------------------------------------------------------------------


@flax.struct.dataclass
class FFNStats:
  """What an FFN sows: its pre-activation `z` (W₁x, or the gate's W_gate x) and hidden vector `h`
  (the input of W₂), [B, L, F] each; `layer` is the block's index, or None under `scan_layers`,
  where the arrays have a leading layer axis instead."""
  z: jax.Array
  h: jax.Array
  layer: int | None = flax.struct.field(pytree_node=False)


class FeedForward(nn.Module):
  """W₂·act(W₁x) or, for the GLU family, W₂·(act(W_gate x) ⊙ W₁x) (Shazeer 2020)."""
  spec: Spec
  execution: Execution = Execution()
  layer: int | None = None

  @nn.compact
  def __call__(self, x_BLD, *, train: bool = False):
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
    return nn.Dropout(s.dropout)(out_BLD, deterministic=not train)


# --- Attention ----------------------------------------------------------------------------------


@flax.struct.dataclass
class AttentionStats:
  """What an attention layer sows: the largest pre-softmax logit q·k/√K over the positions it may
  see (a scalar; [layers] under `scan_layers`, with `layer` None)."""
  logit_max: jax.Array
  layer: int | None = flax.struct.field(pytree_node=False)


def visible_positions(mask, L: int, *, causal: bool):
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


def logit_max(q_BHLK, k_BHTK, mask, *, causal: bool) -> jax.Array:
  """The largest pre-softmax attention logit q·k/√K over the positions attention may see."""
  visible = visible_positions(mask, q_BHLK.shape[2], causal=causal)
  return attention_logits(q_BHLK, k_BHTK, visible).max()


def xla_attention(q_BHLK, k_BHTK, v_BHTK, mask, *, causal: bool):
  """softmax(q·kᵀ/√K)·v with float32 softmax, heads-major: every matmul is a plain batched
  matmul over (B, H), with no transposes around it (the layout XLA:CPU runs fastest)."""
  visible = visible_positions(mask, q_BHLK.shape[2], causal=causal)
  probs_BHLT = jax.nn.softmax(attention_logits(q_BHLK, k_BHTK, visible), axis=-1)
  return jnp.einsum("bhlt,bhtk->bhlk", probs_BHLT.astype(v_BHTK.dtype), v_BHTK)


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


class Attention(nn.Module):
  """Multi-head self-attention: query, key, value and out projections of [D, D] (BERT/GPT-2),
  heads-major (B, H, L, K) in between; with `decode`, a key/value cache. With `spec.qk_norm`,
  queries and keys pass a LayerNorm over the head dim K (`query_norm`, `key_norm`: one scale and
  bias of [K] each, shared by the heads) before q·k (qk-layernorm: Dehghani et al. 2023,
  Wortsman et al. 2023)."""
  spec: Spec
  causal: bool
  execution: Execution = Execution()
  layer: int | None = None

  @nn.compact
  def __call__(self, x_BLD, mask_BL=None, *, train: bool = False, decode: bool = False):
    s, ex = self.spec, self.execution
    q_BHLK, k_BHLK, v_BHLK = (HeadsDense(s, ex, split=True, name=name)(x_BLD)
                              for name in ("query", "key", "value"))
    if s.qk_norm:
      q_BHLK = layer_norm(s, ex, "query_norm")(q_BHLK)
      k_BHLK = layer_norm(s, ex, "key_norm")(k_BHLK)
    mask = None if mask_BL is None else mask_BL[:, None, None, :]
    causal = self.causal
    if decode:
      k_BHLK, v_BHLK, mask = self.extend_cache(k_BHLK, v_BHLK)
      causal = False  # the cache mask already hides the future
    out_BHLK = attend(xla_attention, q_BHLK, k_BHLK, v_BHLK, mask, causal=causal,
                      impl=ex.attention_impl)
    if self.is_mutable_collection("stats"):  # one more q·k product: only when asked for
      stats = AttentionStats(logit_max(q_BHLK, k_BHLK, mask, causal=causal), self.layer)
      self.sow("stats", "attention", stats)
    out_BLD = HeadsDense(s, ex, split=False, std=residual_std(s), name="out")(out_BHLK)
    return nn.Dropout(s.dropout)(out_BLD, deterministic=not train)

  def extend_cache(self, k_BHLK, v_BHLK):
    """Appends this call's keys and values to a cache of `max_len` positions (the "cache"
    collection) and returns the whole cache with the mask that lets query l (at absolute
    position index + l) see cache positions ≤ index + l."""
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


# --- Block and stack ----------------------------------------------------------------------------


class Block(nn.Module):
  """Pre-LN (GPT-2: x + f(LN(x))) or post-LN (BERT: LN(x + f(x))) transformer block."""
  spec: Spec
  causal: bool
  execution: Execution = Execution()
  layer: int | None = None      # its index in the stack (for the statistics)

  @nn.compact
  def __call__(self, x_BLD, mask_BL=None, *, train: bool = False, decode: bool = False):
    s, ex = self.spec, self.execution
    attn = functools.partial(Attention(s, causal=self.causal, execution=ex, layer=self.layer,
                                       name="attn"),
                             train=train, decode=decode)
    ffn = functools.partial(FeedForward(s, ex, layer=self.layer, name="ffn"), train=train)
    ln_attn, ln_ffn = layer_norm(s, ex, "ln_attn"), layer_norm(s, ex, "ln_ffn")
    if s.norm == "pre":
      x_BLD = x_BLD + attn(ln_attn(x_BLD), mask_BL)
      return x_BLD + ffn(ln_ffn(x_BLD))
    x_BLD = ln_attn(x_BLD + attn(x_BLD, mask_BL))
    return ln_ffn(x_BLD + ffn(x_BLD))


def stack(spec: Spec, ex: Execution, x_BLD, mask_BL=None, *, causal: bool, train: bool = False,
          decode: bool = False):
  """The `num_layers` blocks, created in the calling module's compact method: `block_0` …
  `block_{n-1}`, or what `scan_layers` / `remat` make of them (execution.transformed_stack)."""
  if ex.scan_layers or ex.remat != "none":
    return transformed_stack(BlockCall, spec, ex, x_BLD, mask_BL, causal=causal, train=train,
                             decode=decode)
  for i in range(spec.num_layers):
    block = Block(spec, causal=causal, execution=ex, layer=i, name=f"block_{i}")
    x_BLD = block(x_BLD, mask_BL, train=train, decode=decode)
  return x_BLD


class BlockCall(Block):
  """A Block called as `(x, mask)` with `train`/`decode` as attributes, the form `nn.scan` and
  `nn.remat` need (their arguments are traced; these flags must stay Python values). A subclass:
  its parameter names are a Block's."""
  train: bool = False
  decode: bool = False
  scanned: bool = False

  def __call__(self, x_BLD, mask_BL=None):
    y_BLD = Block.__call__(self, x_BLD, mask_BL, train=self.train, decode=self.decode)
    return (y_BLD, None) if self.scanned else y_BLD


# --- Decoder ------------------------------------------------------------------------------------


def embed(n: int, spec: Spec, ex: Execution, name: str) -> nn.Embed:
  return nn.Embed(n, spec.d_model, embedding_init=normal(0.02), dtype=ex.compute_dtype, name=name)


class Decoder(nn.Module):
  """GPT-2: token (`wte`) + position (`wpe`) embeddings, causal blocks, a final LayerNorm
  (`ln_f`) and an LM head tied to `wte`."""
  spec: Spec
  execution: Execution = Execution()

  def __call__(self, tokens_BL, *, train: bool = False, decode: bool = False):
    """Next-token logits [B, L, V] (float32) for every position; position t sees tokens ≤ t."""
    h_BLD = self.hidden(tokens_BL, train=train, decode=decode)
    return tied_logits(h_BLD, self.variables["params"]["wte"]["embedding"])

  @nn.compact
  def hidden(self, tokens_BL, *, train: bool = False, decode: bool = False):
    """The final LayerNorm's output [B, L, D], the head's input (`apply(..., method="hidden")`:
    the fused loss applies the head itself, kernels.xent_sum).

    With `decode`, keys and values persist in the "cache" collection and `tokens_BL` continues
    the sequence cached so far (prompt first, then one token per call)."""
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


def apply(model: nn.Module, params, *args, stats: bool = False, **kwargs):
  """`model.apply({"params": params}, ...)` → (output, sown): with `stats`, the "stats" collection
  is mutable and `sown` holds the blocks' `FFNStats` and `AttentionStats`; otherwise it is None
  and nothing extra is computed (training never asks for statistics)."""
  if not stats:
    return model.apply({"params": params}, *args, **kwargs), None
  out, state = model.apply({"params": params}, *args, mutable=["stats"], **kwargs)
  return out, state["stats"]


# --- Losses ------------------------------------------------------------------------------------


def logit_sums(logits_NV, weights_N=None, *, z_loss: float = 0.0, logz: bool = False) -> dict:
  """What the losses add to the cross-entropy from the output logits' logZ = logsumexp (nats),
  summed over the predicted positions with weights w (default 1): `z_loss_sum` = z_loss · Σ
  w·logZ² (PaLM's z-loss, when `z_loss` > 0) and, with `logz`, `logz_sum` = Σ w·logZ (not
  differentiated). `logits_NV` and `weights_N` share their leading axes. The fused head computes
  the same (kernels.xent_sum)."""
  out = {}
  if z_loss or logz:
    logz_N = jax.nn.logsumexp(logits_NV, axis=-1)
    weights_N = jnp.ones(logz_N.shape) if weights_N is None else weights_N
  if z_loss:
    out["z_loss_sum"] = z_loss * jnp.sum(weights_N * jnp.square(logz_N))
  if logz:
    out["logz_sum"] = jax.lax.stop_gradient(jnp.sum(weights_N * logz_N))
  return out


def with_logit_sums(out: dict, sums: dict, sown) -> dict:
  """A loss's `out` with `logit_sums` (the z-loss term added to `loss_sum`) and what was sown."""
  if "z_loss_sum" in sums:
    out = {**out, "loss_sum": out["loss_sum"] + sums["z_loss_sum"]}
  out = {**out, **sums}
  return out if sown is None else {**out, "sown": sown}


def next_token_loss(model: Decoder, params, batch_BL1, rng, train: bool,
                    stats: bool = False, *, z_loss: float = 0.0) -> dict:
  """Next-token cross-entropy (nats), summed over every position of windows of L+1 tokens: the
  model reads tokens 0…L−1 and predicts 1…L. In training `loss_sum` adds the z-loss
  (`logit_sums`; `z_loss_sum` its part); with `stats`, the output also has what the blocks sowed
  and `logz_sum`."""
  inputs_BL, targets_BL = batch_BL1[:, :-1], batch_BL1[:, 1:]
  logits_BLV, sown = apply(model, params, inputs_BL, train=train, rngs={"dropout": rng},
                           stats=stats)
  losses_BL = optax.softmax_cross_entropy_with_integer_labels(logits_BLV, targets_BL)
  sums = logit_sums(logits_BLV, z_loss=z_loss if train else 0.0, logz=stats)
  return with_logit_sums({"loss_sum": losses_BL.sum(), "count": losses_BL.size}, sums, sown)
