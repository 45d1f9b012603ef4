"""What a run learns: causal LM with the decoder, MLM and classification with the encoder. A `Task`
owns its objective (the core's model with its loss), its data, its chance level and its head's
FLOPs; `get(config)` is the task of a config, and no module outside this one asks what kind of
model or task a config is. A new task is one `Task` here and an entry in `TASKS`.
"""

import dataclasses
import math
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from actlab import core, data
from actlab.core import encoder
from actlab.data import tokenizer


@dataclasses.dataclass(frozen=True)
class Task:
  """What a run learns; every function takes the (typed) config first."""
  name: str
  objective: Callable         # (config, vocab_size) -> core.Objective: the model with its loss
  dataset: Callable           # (config) -> data.Dataset: `train_batch(step)`, `val_batches()`
  random_batch: Callable      # (config, vocab_size, seed) -> a batch of the right form (benchmarks)
  chance_loss: Callable       # (config, vocab_size) -> the loss of a uniform prediction (nats)
  baselines: Callable         # (config, dataset) -> {"unigram_loss", …}: context-free predictors'
  #                             val losses, where comparable (the report's "not learned" bar)
  head_matmul_params: Callable  # (config, vocab_size) -> the head's matrix entries per token
  causal: bool                # predicts the next token (`actlab.sample` continues text)


def windows(config, vocab_size: int, seed: int = 0, low: int = 0) -> np.ndarray:
  """Windows of random tokens in [low, vocab_size): a decoder's or MLM's batch."""
  rng = np.random.default_rng(seed)
  shape = (config.train.batch_size, config.data.seq_len + 1)
  return rng.integers(low, vocab_size, shape).astype(np.int32)


def vocab_loss(config, vocab_size: int) -> float:
  return math.log(vocab_size)


# --- Causal LM (the decoder): next-token cross-entropy over windows of L+1 tokens ----------------


def lm_objective(config, vocab_size: int) -> core.CausalLM:
  return core.CausalLM(core.Decoder(config.spec(vocab_size), config.execution),
                       z_loss=config.optim.z_loss)


def lm_head_params(config, vocab_size: int) -> float:
  """The tied LM head, V·D at every position."""
  return core.pad_vocab(config.model.vocab_size or vocab_size) * config.model.d_model


CAUSAL_LM = Task("causal_lm", lm_objective, data.load, windows, vocab_loss,
                 # `unigram_loss`: a run that ends no better has not learned (no `copy_loss`: the
                 # decoder never sees the token it predicts).
                 lambda config, dataset: {"unigram_loss": dataset.unigram_loss()},
                 lm_head_params, causal=True)


# --- MLM (the encoder): windows masked on the device; cross-entropy at the masked positions ------


def specials(config) -> core.Specials:
  """The special-token ids of the config's (WordPiece) tokenizer."""
  return core.Specials(**tokenizer.special_ids(config.data.tokenizer))


def mlm_objective(config, vocab_size: int) -> core.MaskedLM:
  m, d = config.model, config.data
  model = core.Encoder(config.spec(vocab_size), head="mlm", type_vocab_size=m.type_vocab_size,
                       execution=config.execution)
  return core.MaskedLM(model, specials(config), vocab_size, prob=d.mlm_prob,
                       mask_frac=d.mlm_mask_frac, random_frac=d.mlm_random_frac,
                       z_loss=config.optim.z_loss)


def mlm_head_params(config, vocab_size: int) -> float:
  """The MLM head (dense D·D, tied V·D) at the P masked positions of L: P/L of it per token."""
  m, L = config.model, config.data.seq_len
  V = core.pad_vocab(m.vocab_size or vocab_size)
  P = encoder.max_predictions(L, config.data.mlm_prob)
  return (m.d_model * m.d_model + V * m.d_model) * P / L


def mlm_selections(config, dataset, ids: core.Specials):
  """(visible token, target) at every selected position of the evaluation's fixed mask."""
  d, inputs, targets = config.data, [], []
  for batch_BL1 in dataset.val_batches():
    (inputs_BL, positions_BP, targets_BP, weights_BP), _ = encoder.masked_batch(
        jax.random.PRNGKey(core.EVAL_SEED), jnp.asarray(batch_BL1), ids,
        dataset.tokenizer.vocab_size, d.mlm_prob, d.mlm_mask_frac, d.mlm_random_frac)
    weights_BP = np.asarray(weights_BP)
    visible_BP = np.take_along_axis(np.asarray(inputs_BL), np.asarray(positions_BP), 1)
    inputs.append(visible_BP[weights_BP])
    targets.append(np.asarray(targets_BP)[weights_BP])
  return np.concatenate(inputs), np.concatenate(targets)


def mlm_baselines(config, dataset) -> dict[str, float]:
  """Context-free predictors' val losses from the training unigram u (docs/metrics.md):
  `unigram_loss`, `copy_loss` (sees the selected token) and `mask_unigram_loss` (at [MASK])."""
  d, ids = config.data, specials(config)
  log_u = dataset.unigram_log_probs(exclude=ids.unmaskable)
  inputs, targets = mlm_selections(config, dataset, ids)
  keep, r = 1.0 - d.mlm_mask_frac - d.mlm_random_frac, d.mlm_random_frac
  n = dataset.tokenizer.vocab_size - len(core.Specials._fields)  # the ordinary tokens
  visible = inputs != ids.mask
  x, t = inputs[visible], targets[visible]
  u_x, u_t = np.exp(log_u[x]), np.exp(log_u[t])
  posterior = (keep * u_x * (t == x) + r * u_t / n) / (keep * u_x + r / n)
  return {"unigram_loss": float(-log_u[targets].mean()),
          "mask_unigram_loss": float(-log_u[targets[~visible]].mean()),
          "copy_loss": float((-log_u[targets[~visible]].sum() - np.log(posterior).sum())
                             / len(targets))}


MLM = Task("mlm", mlm_objective, data.load,
           lambda config, vocab_size, seed=0: windows(config, vocab_size, seed,
                                                      low=len(core.Specials._fields)),
           vocab_loss, mlm_baselines, mlm_head_params, causal=False)


# --- Classification (the encoder): the pooler over [CLS], a classifier; cross-entropy of the class


def classify_objective(config, vocab_size: int) -> core.Classifier:
  m = config.model
  model = core.Encoder(config.spec(vocab_size), head="classify",
                       pooler_activation=m.pooler_activation, type_vocab_size=m.type_vocab_size,
                       num_classes=m.num_classes, execution=config.execution)
  return core.Classifier(model, specials(config).pad, z_loss=config.optim.z_loss)


def classify_batch(config, vocab_size: int, seed: int = 0) -> dict:
  rng = np.random.default_rng(seed)
  B, L = config.train.batch_size, config.data.seq_len
  return {"tokens": rng.integers(len(core.Specials._fields), vocab_size, (B, L)).astype(np.int32),
          "labels": rng.integers(0, config.model.num_classes, (B,)).astype(np.int32)}


def classify_head_params(config, vocab_size: int) -> float:
  """The pooler (D·D) and the classifier (D·C) at the [CLS] position only: 1/L per token."""
  m, L = config.model, config.data.seq_len
  return (m.d_model * m.d_model + m.d_model * m.num_classes) / L


CLASSIFY = Task("classify", classify_objective,
                lambda config: data.load(config, labelled=True), classify_batch,
                lambda config, vocab_size: math.log(config.model.num_classes),
                # None: a context-free predictor's loss is not comparable with this task's.
                lambda config, dataset: {}, classify_head_params, causal=False)


TASKS: dict[str, Task] = {t.name: t for t in (CAUSAL_LM, MLM, CLASSIFY)}


def name(config) -> str:
  """The task of `config`: the decoder's is `causal_lm`; the encoder's is `model.task`."""
  m = config.model
  return "causal_lm" if m.kind == "decoder" else m.task


def get(config) -> Task:
  return TASKS[name(config)]
