"""The BERT-style encoder: the decoder's blocks (model.py), bidirectional with a padding mask,
under BERT's embeddings and heads; and its losses (`Objective`s): `MaskedLM`, with BERT's
masking on the device, and `Classifier`. BERT's parameter names: actlab/hf/mapping.py.
"""

import dataclasses
import math
from typing import NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

from actlab.core import activations
from actlab.core.kernels import logit_sums
from actlab.core.model import Execution, Spec, Sums, apply, dense, embed, norm, stack, tied_logits

HEADS = ("mlm", "classify", "all")


class Specials(NamedTuple):
  """An encoder tokenizer's special-token ids."""
  pad: int
  unk: int
  cls: int
  sep: int
  mask: int

  @property
  def unmaskable(self) -> tuple[int, ...]:
    """Ids masking never selects: [PAD], [CLS], [SEP], and [MASK] itself. [UNK] stands for
    text, so it may be selected (and predicted)."""
    return (self.pad, self.cls, self.sep, self.mask)



class MLMHead(nn.Module):
  """BERT's `cls.predictions`: dense → activation (the FFN's; its gate's for the GLU family) →
  LayerNorm → the projection tied to the word embeddings, + bias."""
  spec: Spec
  execution: Execution = Execution()

  @nn.compact
  def __call__(self, x_BPD, embedding_VD):
    s, ex = self.spec, self.execution
    h_BPD = dense(s.d_model, ex, name="dense")(x_BPD)
    h_BPD = norm(s, ex, "ln")(activations.get(s.activation).fn(h_BPD))
    bias_V = self.param("bias", nn.initializers.zeros, (s.vocab_size,), jnp.float32)
    return tied_logits(h_BPD, embedding_VD) + bias_V


class Encoder(nn.Module):
  """BERT (Devlin et al. 2019): word (`wte`), position (`wpe`) and segment (`wtt`) embeddings,
  LayerNorm (`ln_emb`), dropout; bidirectional blocks (post-LN, or pre-LN with a final `ln_f`);
  the `head` "mlm" (`MLMHead`), "classify" (dense `pooler` over [CLS], `pooler_activation`,
  dropout, dense `classifier`) or "all" (both, to build a full checkpoint). Unlike BERT, layers
  are initialised as GPT-2's and attention probabilities have no dropout."""
  spec: Spec
  head: str = "mlm"
  pooler_activation: str = "tanh"
  type_vocab_size: int = 2
  num_classes: int = 2
  execution: Execution = Execution()

  @nn.compact
  def __call__(self, tokens_BL, mask_BL=None, segments_BL=None, *,
               masked_positions_BP=None, train: bool = False):
    """MLM logits [B, L, V] (float32), class logits [B, C], or both in a dict (`head="all"`).
    `mask_BL` is True at real tokens (attention never reads padding); `segments_BL` default to 0.
    With `masked_positions_BP` the MLM head runs at those P positions only: [B, P, V]."""
    s, ex = self.spec, self.execution
    if self.head not in HEADS:
      raise ValueError(f"Encoder.head={self.head!r}: choose one of {HEADS}")
    L = tokens_BL.shape[1]
    if segments_BL is None:
      segments_BL = jnp.zeros_like(tokens_BL)
    wte = embed(s.vocab_size, s, ex, "wte")
    x_BLD = (wte(tokens_BL) + embed(s.max_len, s, ex, "wpe")(jnp.arange(L))[None]
             + embed(self.type_vocab_size, s, ex, "wtt")(segments_BL))
    x_BLD = norm(s, ex, "ln_emb")(x_BLD)
    x_BLD = nn.Dropout(s.dropout)(x_BLD, deterministic=not train)
    x_BLD = stack(s, ex, x_BLD, mask_BL, causal=False, train=train)
    if s.norm == "pre":
      x_BLD = norm(s, ex, "ln_f")(x_BLD)

    out = {}
    if self.head in ("mlm", "all"):
      h = x_BLD if masked_positions_BP is None else jnp.take_along_axis(
          x_BLD, masked_positions_BP[..., None], axis=1)
      out["mlm"] = MLMHead(s, ex, name="mlm")(h, wte.embedding)
    if self.head in ("classify", "all"):
      pooled_BD = dense(s.d_model, ex, name="pooler")(x_BLD[:, 0])
      out["pooled"] = pooled_BD = activations.get(self.pooler_activation).fn(pooled_BD)
      pooled_BD = nn.Dropout(s.dropout)(pooled_BD, deterministic=not train)
      out["classify"] = dense(self.num_classes, ex, name="classifier")(pooled_BD).astype(
          jnp.float32)
    return out if self.head == "all" else out[self.head]


# --- Its losses ---------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class MaskedLM:
  """The encoder with BERT's masked-LM loss (an `Objective`): cross-entropy (nats) and accuracy
  over the selected positions only (in training with the z-loss, and with `stats` `logz_sum`),
  and apart over those whose input is [MASK] (`Sums.mask`). The mask comes from `rng` (the step's
  key in training, a fixed key in evaluation); dropout gets an independent key. Batches are the
  decoder's windows of L+1 tokens (`encoder_sequences`)."""
  model: Encoder
  specials: Specials
  vocab_size: int
  prob: float = 0.15
  mask_frac: float = 0.8
  random_frac: float = 0.1
  z_loss: float = 0.0

  def __call__(self, params, batch_BL1, rng, *, train: bool, stats: bool = False) -> Sums:
    specials = self.specials
    (inputs_BL, positions_BP, targets_BP, weights_BP), dropout_key = masked_batch(
        rng, batch_BL1, specials, self.vocab_size, self.prob, self.mask_frac, self.random_frac)
    logits_BPV, sown = apply(self.model, params, inputs_BL, inputs_BL != specials.pad,
                             masked_positions_BP=positions_BP, train=train,
                             rngs={"dropout": dropout_key}, stats=stats)
    losses_BP = optax.softmax_cross_entropy_with_integer_labels(logits_BPV, targets_BP)
    correct_BP = (logits_BPV.argmax(-1) == targets_BP) & weights_BP
    masked_BP = weights_BP & (jnp.take_along_axis(inputs_BL, positions_BP, 1) == specials.mask)
    mask = Sums(jnp.sum(losses_BP * masked_BP), masked_BP.sum(),
                correct=(correct_BP & masked_BP).sum())
    sums = logit_sums(jnp.sum(losses_BP * weights_BP), logits_BPV, weights_BP,
                      z_loss=self.z_loss if train else 0.0, logz=stats)
    return Sums(**sums, count=weights_BP.sum(), correct=correct_BP.sum(), mask=mask, sown=sown)


@dataclasses.dataclass(frozen=True)
class Classifier:
  """The encoder with sequence-classification cross-entropy and accuracy (an `Objective`);
  `batch` holds `tokens` [B, L] (`[CLS] text [SEP] [PAD]…`) and `labels` [B] (−1: a padding row,
  ignored). In training with the z-loss of the class logits, and with `stats` `logz_sum`."""
  model: Encoder
  pad: int                    # the [PAD] id: attention never reads it
  z_loss: float = 0.0

  def __call__(self, params, batch, rng, *, train: bool, stats: bool = False) -> Sums:
    tokens_BL, labels_B = batch["tokens"], batch["labels"]
    logits_BC, sown = apply(self.model, params, tokens_BL, tokens_BL != self.pad, train=train,
                            rngs={"dropout": rng}, stats=stats)
    valid_B = labels_B >= 0
    losses_B = optax.softmax_cross_entropy_with_integer_labels(logits_BC,
                                                               jnp.maximum(labels_B, 0))
    sums = logit_sums(jnp.sum(losses_B * valid_B), logits_BC, valid_B,
                      z_loss=self.z_loss if train else 0.0, logz=stats)
    return Sums(**sums, count=valid_B.sum(),
                correct=jnp.sum((logits_BC.argmax(-1) == labels_B) & valid_B), sown=sown)


def encoder_sequences(batch_BL1, specials: Specials):
  """`[CLS] w₀ … w_{L−3} [SEP]`: BERT sequences of L tokens from the decoder's windows of L+1
  (the first L−2 tokens of each window; one data path for both models)."""
  B, L = batch_BL1.shape[0], batch_BL1.shape[1] - 1
  cls = jnp.full((B, 1), specials.cls, batch_BL1.dtype)
  sep = jnp.full((B, 1), specials.sep, batch_BL1.dtype)
  return jnp.concatenate([cls, batch_BL1[:, :L - 2], sep], axis=1)


def max_predictions(seq_len: int, prob: float) -> int:
  """P, the static number of prediction slots per sequence: ⌈prob·L⌉ (BERT: 20 for L = 128)."""
  return max(1, math.ceil(prob * seq_len))


def mask_tokens(key, tokens_BL, specials: Specials, vocab_size: int, prob: float = 0.15,
                mask_frac: float = 0.8, random_frac: float = 0.1):
  """BERT's masking, on the device (docs/encoder.md, "Masked-LM objective"): k = max(1,
  round(prob·n)) ≤ P of each sequence's n maskable positions, each then [MASK], a random ordinary
  token or kept. Returns (inputs_BL, positions_BP: the selected positions, targets_BP: their
  original tokens, weights_BP: False on unused slots)."""
  B, L = tokens_BL.shape
  P = max_predictions(L, prob)
  select_key, how_key, random_key = jax.random.split(key, 3)
  maskable_BL = ~jnp.isin(tokens_BL, jnp.asarray(specials.unmaskable))
  # Maskable positions score in [0, 1), the others −1: the top k scores are a uniform k-subset.
  scores_BL = jnp.where(maskable_BL, jax.random.uniform(select_key, (B, L)), -1.0)
  top_BP, positions_BP = jax.lax.top_k(scores_BL, P)
  n_B = maskable_BL.sum(axis=1)
  k_B = jnp.minimum(jnp.maximum(1, jnp.round(prob * n_B)), n_B).astype(jnp.int32)
  weights_BP = (jnp.arange(P)[None] < k_B[:, None]) & (top_BP >= 0)
  targets_BP = jnp.take_along_axis(tokens_BL, positions_BP, axis=1)

  ordinary = np.setdiff1d(np.arange(vocab_size), specials).astype(np.int32)
  random_BP = jnp.asarray(ordinary)[jax.random.randint(random_key, (B, P), 0, len(ordinary))]
  u_BP = jax.random.uniform(how_key, (B, P))
  new_BP = jnp.where(u_BP < mask_frac, specials.mask,
                     jnp.where(u_BP < mask_frac + random_frac, random_BP, targets_BP))
  new_BP = jnp.where(weights_BP, new_BP, targets_BP).astype(tokens_BL.dtype)
  inputs_BL = tokens_BL.at[jnp.arange(B)[:, None], positions_BP].set(new_BP)
  return inputs_BL, positions_BP, targets_BP, weights_BP


def masked_batch(rng, batch_BL1, specials: Specials, vocab_size: int, prob: float,
                 mask_frac: float, random_frac: float):
  """(`mask_tokens`' outputs for the encoder sequences of `batch_BL1`, the dropout key): the
  mask from one half of `rng`, dropout from the other."""
  mask_key, dropout_key = jax.random.split(rng)
  return mask_tokens(mask_key, encoder_sequences(batch_BL1, specials), specials, vocab_size,
                     prob, mask_frac, random_frac), dropout_key
