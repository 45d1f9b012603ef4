"""Masked-language-model pretraining of the encoder (BERT, `core.MaskedLM`): `[CLS] window [SEP]`
sequences cut from the decoder's windows (one data path for both models), masked on the device
from the step's key, and cross-entropy at the masked positions only."""

import math

import jax
import jax.numpy as jnp
import numpy as np

from actlab import config as config_lib, core, data
from actlab.core import encoder
from actlab.data import tokenizer
from actlab.tasks.task import Task


def specials_of(config) -> core.Specials:
  """The special-token ids of the config's (WordPiece) tokenizer."""
  return core.Specials(**tokenizer.special_ids(config.data.tokenizer))


def objective(config, vocab_size: int) -> core.MaskedLM:
  m, d = config.model, config.data
  spec, execution = config_lib.specs(config, vocab_size)
  encoder = core.Encoder(spec, head="mlm", type_vocab_size=m.type_vocab_size, execution=execution)
  return core.MaskedLM(encoder, specials_of(config), vocab_size, prob=d.mlm_prob,
                       mask_frac=d.mlm_mask_frac, random_frac=d.mlm_random_frac,
                       z_loss=config.optim.z_loss)


def dataset(config):
  return data.load(config)


def random_batch(config, vocab_size: int, seed: int = 0) -> np.ndarray:
  """Windows of random ordinary tokens (the special ids 0–4 excluded)."""
  rng = np.random.default_rng(seed)
  shape = (config.train.batch_size, config.data.seq_len + 1)
  return rng.integers(len(core.Specials._fields), vocab_size, shape).astype(np.int32)


def chance_loss(config, vocab_size: int) -> float:
  return math.log(vocab_size)


def head_matmul_params(config, vocab_size: int) -> float:
  """The MLM head (dense D·D, then the tied V·D projection) at the P masked positions of each
  sequence of L tokens: P/L of it per token."""
  m, L = config.model, config.data.seq_len
  V = core.pad_vocab(m.vocab_size or vocab_size)
  P = encoder.max_predictions(L, config.data.mlm_prob)
  return (m.d_model * m.d_model + V * m.d_model) * P / L


def _eval_selections(config, dataset, specials: core.Specials):
  """(inputs, targets) at every selected position of the evaluation's fixed mask
  (`core.EVAL_SEED`): the visible token and the one to predict, as `val_loss` sees them."""
  d, inputs, targets = config.data, [], []
  for batch_BL1 in dataset.val_batches():
    (inputs_BL, positions_BP, targets_BP, weights_BP), _ = encoder.masked_batch(
        jax.random.PRNGKey(core.EVAL_SEED), jnp.asarray(batch_BL1), specials,
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
  n = dataset.tokenizer.vocab_size - len(core.Specials._fields)  # the ordinary tokens
  visible = inputs != specials.mask
  x, t = inputs[visible], targets[visible]
  u_x, u_t = np.exp(log_u[x]), np.exp(log_u[t])
  posterior = (keep * u_x * (t == x) + r * u_t / n) / (keep * u_x + r / n)
  return {"unigram_loss": float(-log_u[targets].mean()),
          "mask_unigram_loss": float(-log_u[targets[~visible]].mean()),
          "copy_loss": float((-log_u[targets[~visible]].sum() - np.log(posterior).sum())
                             / len(targets))}


TASK = Task("mlm", objective, dataset, random_batch, chance_loss, baselines, head_matmul_params,
            causal=False)
