"""Masked-language-model pretraining of the encoder (BERT): `[CLS] window [SEP]` sequences cut
from the decoder's windows (one data path for both models), masked on the device from the step's
key, and cross-entropy at the masked positions only."""

import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from actlab import data, models
from actlab.data import tokenizer
from actlab.models.hf_checkpoint import Architecture

CAUSAL = False
HF = Architecture("bert", "BertForMaskedLM", "post")  # actlab.export, train.init_from=hf:DIR


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


def specials_of(config) -> Specials:
  """The special-token ids of the config's (WordPiece) tokenizer."""
  return Specials(**tokenizer.special_ids(config.data.tokenizer))


def model(config, vocab_size: int):
  m = config.model
  return models.Encoder(models.Spec.from_config(m, vocab_size), head="mlm",
                        type_vocab_size=m.type_vocab_size,
                        execution=models.execution_from_config(m))


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


def loss(model, params, batch_BL1, rng, train: bool, stats: bool = False, *,
         specials: Specials, vocab_size: int, prob: float = 0.15, mask_frac: float = 0.8,
         random_frac: float = 0.1, z_loss: float = 0.0) -> models.Sums:
  """MLM cross-entropy (nats) and accuracy over the selected positions only (in training with
  the z-loss, and with `stats` `logz_sum`), and apart over those whose input is [MASK]
  (`mask_*`). The mask comes from `rng` (the step's key in training, a fixed key in
  evaluation); dropout gets an independent key."""
  (inputs_BL, positions_BP, targets_BP, weights_BP), dropout_key = masked_batch(
      rng, batch_BL1, specials, vocab_size, prob, mask_frac, random_frac)
  logits_BPV, sown = models.apply(model, params, inputs_BL, inputs_BL != specials.pad,
                                  masked_positions_BP=positions_BP, train=train,
                                  rngs={"dropout": dropout_key}, stats=stats)
  losses_BP = optax.softmax_cross_entropy_with_integer_labels(logits_BPV, targets_BP)
  correct_BP = (logits_BPV.argmax(-1) == targets_BP) & weights_BP
  masked_BP = weights_BP & (jnp.take_along_axis(inputs_BL, positions_BP, 1) == specials.mask)
  out = {"loss_sum": jnp.sum(losses_BP * weights_BP), "count": weights_BP.sum(),
         "correct": correct_BP.sum(), "mask_loss_sum": jnp.sum(losses_BP * masked_BP),
         "mask_count": masked_BP.sum(), "mask_correct": (correct_BP & masked_BP).sum()}
  sums = models.logit_sums(logits_BPV, weights_BP, z_loss=z_loss if train else 0.0, logz=stats)
  return models.Sums.of(models.with_logit_sums(out, sums), sown)


def objective(config, vocab_size: int):
  d = config.data
  return functools.partial(loss, specials=specials_of(config), vocab_size=vocab_size,
                           prob=d.mlm_prob, mask_frac=d.mlm_mask_frac,
                           random_frac=d.mlm_random_frac, z_loss=config.optim.z_loss)


def dataset(config):
  return data.load(config)


def random_batch(config, vocab_size: int, seed: int = 0) -> np.ndarray:
  """Windows of random ordinary tokens (the special ids 0–4 excluded)."""
  rng = np.random.default_rng(seed)
  shape = (config.train.batch_size, config.data.seq_len + 1)
  return rng.integers(len(Specials._fields), vocab_size, shape).astype(np.int32)


def chance_loss(config, vocab_size: int) -> float:
  return math.log(vocab_size)


def head_matmul_params(config, vocab_size: int) -> float:
  """The MLM head (dense D·D, then the tied V·D projection) at the P masked positions of each
  sequence of L tokens: P/L of it per token."""
  m, L = config.model, config.data.seq_len
  V = models.pad_vocab(m.vocab_size or vocab_size)
  return (m.d_model * m.d_model + V * m.d_model) * max_predictions(L, config.data.mlm_prob) / L


def _eval_selections(config, dataset, specials: Specials):
  """(inputs, targets) at every selected position of the evaluation's fixed mask
  (`data.VAL_SEED`): the visible token and the one to predict, as `val_loss` sees them."""
  d, inputs, targets = config.data, [], []
  for batch_BL1 in dataset.val_batches():
    (inputs_BL, positions_BP, targets_BP, weights_BP), _ = masked_batch(
        jax.random.PRNGKey(data.VAL_SEED), jnp.asarray(batch_BL1), specials,
        dataset.tokenizer.vocab_size, d.mlm_prob, d.mlm_mask_frac, d.mlm_random_frac)
    weights_BP = np.asarray(weights_BP)
    visible_BP = np.take_along_axis(np.asarray(inputs_BL), np.asarray(positions_BP), 1)
    inputs.append(visible_BP[weights_BP])
    targets.append(np.asarray(targets_BP)[weights_BP])
  return np.concatenate(inputs), np.concatenate(targets)


def baselines(config, dataset) -> dict[str, float]:
  """The val losses of two context-free predictors on `val_loss`'s targets, from u, the training
  tokens' unigram frequencies over the maskable tokens: `unigram_loss` (every target predicted by
  u) and `copy_loss` (the best predictor that sees only the token at the selected position: u at
  [MASK], else the posterior p(t | x) of docs/metrics.md §3); `mask_unigram_loss`, u on the
  targets at [MASK] inputs alone: the bar of `val_mask_loss`."""
  d, specials = config.data, specials_of(config)
  log_u = dataset.unigram_log_probs(exclude=specials.unmaskable)
  inputs, targets = _eval_selections(config, dataset, specials)
  keep, r = 1.0 - d.mlm_mask_frac - d.mlm_random_frac, d.mlm_random_frac
  n = dataset.tokenizer.vocab_size - len(Specials._fields)  # the ordinary tokens
  visible = inputs != specials.mask
  x, t = inputs[visible], targets[visible]
  u_x, u_t = np.exp(log_u[x]), np.exp(log_u[t])
  posterior = (keep * u_x * (t == x) + r * u_t / n) / (keep * u_x + r / n)
  return {"unigram_loss": float(-log_u[targets].mean()),
          "mask_unigram_loss": float(-log_u[targets[~visible]].mean()),
          "copy_loss": float((-log_u[targets[~visible]].sum() - np.log(posterior).sum())
                             / len(targets))}
