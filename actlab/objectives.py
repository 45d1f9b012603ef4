"""Training objectives: `(model, params, batch, rng, train) -> {"loss_sum", "count", ...}`.

Sums (not means) so that evaluation can pool exactly over many batches. An objective may also
return `correct` (how many of the `count` predictions were right): evaluation then reports
`val_accuracy`.

- `causal_lm` (decoder): next-token cross-entropy over windows of L+1 tokens.
- `masked_lm` (encoder, `model.task="mlm"`): BERT's masked-LM loss on `[CLS] window [SEP]`
  sequences cut from the same windows, masked on the device from the step's key.
- `classify` (encoder, `model.task="classify"`): cross-entropy of the class logits over the
  examples of a `{"tokens", "labels"}` batch (label −1 marks padding rows, which do not count).
"""

import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from actlab import kernels


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


def causal_lm(model, params, batch_BL1, rng, train: bool) -> dict:
  """Next-token cross-entropy (nats) over every position of windows of L+1 tokens."""
  inputs_BL, targets_BL = batch_BL1[:, :-1], batch_BL1[:, 1:]
  if model.spec.loss_impl == "fused":  # The tied head and its loss without [B, L, V] logits.
    h_BLD = model.apply({"params": params}, inputs_BL, train=train, rngs={"dropout": rng},
                        head=False)
    loss_sum = kernels.xent_sum(h_BLD, params["wte"]["embedding"], targets_BL)
    return {"loss_sum": loss_sum, "count": targets_BL.size}
  logits_BLV = model.apply({"params": params}, inputs_BL, train=train, rngs={"dropout": rng})
  losses_BL = optax.softmax_cross_entropy_with_integer_labels(logits_BLV, targets_BL)
  return {"loss_sum": losses_BL.sum(), "count": losses_BL.size}


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
  """BERT's masking, on the device: returns (inputs_BL, positions_BP, targets_BP, weights_BP).

  Of each sequence's n maskable positions (not [PAD], [CLS], [SEP], [MASK]) exactly
  k = max(1, round(prob·n)) are selected, a uniformly random subset (BERT's
  create_pretraining_data; k ≤ P = `max_predictions`). Each selected position independently
  becomes [MASK] with probability `mask_frac`, a uniformly random ordinary (non-special) token
  with probability `random_frac`, and stays unchanged otherwise. `positions_BP` lists the
  selected positions (P slots, `weights_BP` False on unused slots), `targets_BP` their original
  tokens.
  """
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


def masked_lm(model, params, batch_BL1, rng, train: bool, *, specials: Specials,
              vocab_size: int, prob: float = 0.15, mask_frac: float = 0.8,
              random_frac: float = 0.1) -> dict:
  """MLM cross-entropy (nats) and accuracy over the selected positions only.

  The mask comes from `rng` (the step's key in training, a fixed key in evaluation, so
  `val_loss` uses the same mask at every evaluation); dropout gets an independent key.
  """
  tokens_BL = encoder_sequences(batch_BL1, specials)
  mask_key, dropout_key = jax.random.split(rng)
  inputs_BL, positions_BP, targets_BP, weights_BP = mask_tokens(
      mask_key, tokens_BL, specials, vocab_size, prob, mask_frac, random_frac)
  logits_BPV = model.apply({"params": params}, inputs_BL, inputs_BL != specials.pad,
                           masked_positions_BP=positions_BP, train=train,
                           rngs={"dropout": dropout_key})
  losses_BP = optax.softmax_cross_entropy_with_integer_labels(logits_BPV, targets_BP)
  correct_BP = (logits_BPV.argmax(-1) == targets_BP) & weights_BP
  return {"loss_sum": jnp.sum(losses_BP * weights_BP), "count": weights_BP.sum(),
          "correct": correct_BP.sum()}


def classify(model, params, batch, rng, train: bool, *, specials: Specials) -> dict:
  """Sequence-classification cross-entropy and accuracy; `batch` holds `tokens` [B, L]
  (`[CLS] text [SEP] [PAD]…`) and `labels` [B] (−1: a padding row, ignored)."""
  tokens_BL, labels_B = batch["tokens"], batch["labels"]
  logits_BC = model.apply({"params": params}, tokens_BL, tokens_BL != specials.pad,
                          train=train, rngs={"dropout": rng})
  valid_B = labels_B >= 0
  losses_B = optax.softmax_cross_entropy_with_integer_labels(logits_BC, jnp.maximum(labels_B, 0))
  return {"loss_sum": jnp.sum(losses_B * valid_B), "count": valid_B.sum(),
          "correct": jnp.sum((logits_BC.argmax(-1) == labels_B) & valid_B)}


def get(config, vocab_size: int):
  """The objective of `config` (model kind and task); `vocab_size` is the tokenizer's."""
  kind = config.model.kind
  if kind == "decoder":
    return causal_lm
  from actlab.data import tokenizer  # The special ids are the tokenizer's.
  specials = Specials(**tokenizer.special_ids(config.data.tokenizer))
  if config.model.task == "classify":
    return functools.partial(classify, specials=specials)
  d = config.data
  return functools.partial(masked_lm, specials=specials, vocab_size=vocab_size,
                           prob=d.mlm_prob, mask_frac=d.mlm_mask_frac,
                           random_frac=d.mlm_random_frac)
