"""The transformer, top-down: the `Decoder` (embeddings, the stack of blocks, the LM head, its
next-token sums) and `CausalLM`, the decoder with its loss (an `Objective`, returning `Sums`);
the `Block`, its `FeedForward`, then helpers; its `Attention`: attention.py.
What it is: `Spec` (spec.py: GPT-2's block by default, or a LLaMA-style one: RMSNorm, rotary
positions, no biases, an untied head, a gated FFN); the layers the `Spec` chooses: layers.py; how
it runs: `Execution` (execution.py); what a loss takes from its output logits, and the fused
loss: kernels.py; the BERT-style encoder from these blocks, with its losses: encoder.py.

Shape suffixes: B batch, L sequence (T: the keys' positions), D d_model, H heads, K head dim,
F FFN hidden width, V vocabulary, P masked positions, C classes.

Applied with the "stats" collection mutable (`apply(..., stats=True)`), every block also sows one
`FFNStats` and one `AttentionStats` (not in training under cuDNN attention: `Attention`), typed
values that `per_layer` reads back in layer order (step.py, actlab.measure); otherwise nothing
extra is computed.
"""

import dataclasses
from typing import Any, Protocol

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
from jax.nn.initializers import normal

from actlab.core import activations, kernels
from actlab.core.attention import Attention
from actlab.core.execution import Execution
from actlab.core.layers import dense, embed, norm, residual_std
from actlab.core.spec import Spec


@flax.struct.dataclass
class Sums:
  """What an objective returns: sums over a batch. The fields are fixed; those a loss does not
  compute are None."""
  loss_sum: jax.Array        # the differentiated sum: cross-entropy (+ the z-loss in training)
  count: jax.Array           # the positions (or examples) summed over
  z_loss_sum: jax.Array      # the z-loss part of loss_sum: z_loss · Σ logZ² (0 without one)
  logz_sum: jax.Array | None = None  # Σ logZ of the output logits (`stats`; not differentiated)
  correct: jax.Array | None = None   # the right argmax predictions, where accuracy applies
  mask: "Sums | None" = None  # MLM: the same over the positions whose input is [MASK]
  sown: Any = None           # with `stats`: the blocks' `FFNStats` and `AttentionStats`

  @classmethod
  def of(cls, sums: dict, sown=None) -> "Sums":
    """From named sums (a loss's own with `logit_sums`', or `xent_sum`'s; `mask_*`: the [MASK]
    positions')."""
    mask = {k.removeprefix("mask_"): v for k, v in sums.items() if k.startswith("mask_")}
    return cls(sums["loss_sum"], sums["count"], sums.get("z_loss_sum", jnp.zeros((), jnp.float32)),
               sums.get("logz_sum"), sums.get("correct"), cls.of(mask) if mask else None, sown)


class Objective(Protocol):
  """A model with its loss (`CausalLM`, `MaskedLM`, `Classifier`): pure, so a step can close over
  it. `train`: dropout on and the z-loss added; `stats`: the blocks' sown statistics and
  `logz_sum` too."""
  model: nn.Module
  z_loss: float

  def __call__(self, params, batch, rng, *, train: bool, stats: bool = False) -> Sums: ...


class Decoder(nn.Module):
  """GPT-2: token (`wte`) + position (`wpe`) embeddings, causal blocks, a final LayerNorm
  (`ln_f`) and an LM head tied to `wte`. The `Spec` may drop `wpe` for rotary positions in
  attention (`position`), make the norms RMSNorm (`norm_type`) and give the head its own
  [V, D] matrix `lm_head` (`tie_head` off)."""
  spec: Spec
  execution: Execution = Execution()

  def __call__(self, tokens_BL, *, train: bool = False, decode: bool = False):
    """Next-token logits [B, L, V] (float32) for every position; position t sees tokens ≤ t."""
    return self.logits(self.hidden(tokens_BL, train=train, decode=decode))

  def logits(self, h_BLD) -> jax.Array:
    """The LM head: h·Eᵀ with E `head_weights` (float32 logits)."""
    return tied_logits(h_BLD, self.head_weights())

  def next_token_sums(self, tokens_BL, targets_BL, *, train: bool = False, fused: bool = False,
                      z_loss: float = 0.0, logz: bool = False) -> dict:
    """The cross-entropy (nats) of `targets_BL` after `tokens_BL`, summed (`loss_sum`, with the
    z-loss), and `kernels.logz_sums`. `fused`: the head and the loss in chunks of positions,
    without the [B, L, V] logits (`kernels.xent_sum`); else from `logits`."""
    h_BLD = self.hidden(tokens_BL, train=train)
    if fused:
      return kernels.xent_sum(h_BLD, self.head_weights(), targets_BL, z_loss=z_loss, logz=logz)
    logits_BLV = self.logits(h_BLD)
    losses_BL = optax.softmax_cross_entropy_with_integer_labels(logits_BLV, targets_BL)
    return kernels.logit_sums({"loss_sum": losses_BL.sum()}, logits_BLV, z_loss=z_loss,
                              logz=logz)

  def head_weights(self) -> jax.Array:
    """The LM head's [V, D] weights: the token embedding `wte`'s when tied, else `lm_head`."""
    params = self.variables["params"]
    return params["wte"]["embedding"] if self.spec.tie_head else params["lm_head"]

  @nn.compact
  def hidden(self, tokens_BL, *, train: bool = False, decode: bool = False):
    """The final norm's output [B, L, D], the head's input. With `decode`, keys and values
    persist in the "cache" collection and `tokens_BL` continues the sequence cached so far
    (prompt first, then one token per call)."""
    s, ex = self.spec, self.execution
    if not s.tie_head:  # the head's own weights, declared beside the embedding it would reuse
      self.param("lm_head", normal(0.02), (s.vocab_size, s.d_model), jnp.float32)
    x_BLD = embed(s.vocab_size, s, ex, "wte")(tokens_BL)
    if s.position == "learned":
      L, start = tokens_BL.shape[1], 0
      if decode:
        position = self.variable("cache", "position", lambda: jnp.zeros((), jnp.int32))
        start, position.value = position.value, position.value + L
      x_BLD = x_BLD + embed(s.max_len, s, ex, "wpe")(start + jnp.arange(L))[None]
    x_BLD = nn.Dropout(s.dropout)(x_BLD, deterministic=not train)
    x_BLD = stack(s, ex, x_BLD, causal=True, train=train, decode=decode)
    return norm(s, ex, "ln_f")(x_BLD)


@dataclasses.dataclass(frozen=True)
class CausalLM:
  """The decoder with its loss (an `Objective`): next-token cross-entropy (nats) of windows of
  L+1 tokens, summed over positions 1…L; in training with the z-loss, and with `stats` what the
  blocks sowed and `logz_sum`. `fused`: without the [B, L, V] logits in memory (kernels.py)."""
  model: Decoder
  fused: bool = False
  z_loss: float = 0.0

  def __call__(self, params, batch_BL1, rng, *, train: bool, stats: bool = False) -> Sums:
    inputs_BL, targets_BL = batch_BL1[:, :-1], batch_BL1[:, 1:]
    sums, sown = apply(self.model, params, inputs_BL, targets_BL, train=train, fused=self.fused,
                       z_loss=self.z_loss if train else 0.0, logz=stats, rngs={"dropout": rng},
                       stats=stats, method=Decoder.next_token_sums)
    return Sums.of({**sums, "count": targets_BL.size}, sown)


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
  """Pre-norm (GPT-2: x + f(LN(x))) or post-norm (BERT: LN(x + f(x))) block: `(x, mask) → (y, None)`,
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
    ln_attn, ln_ffn = norm(s, ex, "ln_attn"), norm(s, ex, "ln_ffn")
    if s.norm == "pre":
      x_BLD = x_BLD + attn(ln_attn(x_BLD), mask_BL)
      return x_BLD + ffn(ln_ffn(x_BLD)), None
    x_BLD = ln_attn(x_BLD + attn(x_BLD, mask_BL))
    return ln_ffn(x_BLD + ffn(x_BLD)), None


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
    up_BLF = dense(s.ffn_width, ex, name="up", bias=s.bias)(x_BLD)
    if s.gated:
      z_BLF = dense(s.ffn_width, ex, name="gate", bias=s.bias)(x_BLD)
      h_BLF = act(z_BLF) * up_BLF
    else:
      z_BLF = up_BLF
      h_BLF = act(z_BLF)
    self.sow("stats", "ffn", FFNStats(z_BLF, h_BLF, self.layer))  # no-op unless mutable
    out_BLD = dense(x_BLD.shape[-1], ex, residual_std(s), name="down", bias=s.bias)(h_BLF)
    return nn.Dropout(s.dropout)(out_BLD, deterministic=not self.train)


@flax.struct.dataclass
class FFNStats:
  """What an FFN sows: its pre-activation `z` (W₁x, or the gate's W_gate x) and hidden vector `h`
  (the input of W₂), [B, L, F] each; `layer` is the block's index, or None under `scan_layers`,
  where the arrays have a leading layer axis instead."""
  z: jax.Array
  h: jax.Array
  layer: int | None = flax.struct.field(pytree_node=False)


def apply(model: nn.Module, params, *args, stats: bool = False, **kwargs):
  """`model.apply({"params": params}, ...)` → (output, sown): with `stats`, the "stats" collection
  is mutable and `sown` holds the blocks' `FFNStats` and `AttentionStats`; otherwise it is None
  and nothing extra is computed (training never asks for statistics)."""
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


def tied_logits(h_BLD, embedding_VD) -> jax.Array:
  """= `nn.Embed.attend(h_BLD)`, with float32 logits also when computing in bfloat16."""
  return jnp.einsum("bld,vd->blv", h_BLD, embedding_VD.astype(h_BLD.dtype),
                    preferred_element_type=jnp.float32)
