"""Sequence classification with the encoder (fine-tuning, e.g. from an MLM run through
`train.init_from`): the pooler over `[CLS]`, a dense classifier, and cross-entropy of the class.
Batches are `{"tokens": [B, L], "labels": [B]}` of labelled examples (`data.classify`)."""

import functools
import math

import jax.numpy as jnp
import numpy as np
import optax

from actlab import data, models
from actlab.models.hf_checkpoint import Architecture
from actlab.tasks.mlm import Specials, specials_of

CAUSAL = False
HF = Architecture("bert", "BertForSequenceClassification", "post", pooler=True)


def model(config, vocab_size: int):
  m = config.model
  return models.Encoder(models.Spec.from_config(m, vocab_size), head="classify",
                        pooler_activation=m.pooler_activation,
                        type_vocab_size=m.type_vocab_size, num_classes=m.num_classes,
                        execution=models.execution_from_config(m))


def loss(model, params, batch, rng, train: bool, stats: bool = False, *,
         specials: Specials, z_loss: float = 0.0) -> models.Sums:
  """Sequence-classification cross-entropy and accuracy; `batch` holds `tokens` [B, L]
  (`[CLS] text [SEP] [PAD]…`) and `labels` [B] (−1: a padding row, ignored). In training with
  the z-loss of the class logits, and with `stats` `logz_sum` (`models.logit_sums`)."""
  tokens_BL, labels_B = batch["tokens"], batch["labels"]
  logits_BC, sown = models.apply(model, params, tokens_BL, tokens_BL != specials.pad,
                                 train=train, rngs={"dropout": rng}, stats=stats)
  valid_B = labels_B >= 0
  losses_B = optax.softmax_cross_entropy_with_integer_labels(logits_BC, jnp.maximum(labels_B, 0))
  out = {"loss_sum": jnp.sum(losses_B * valid_B), "count": valid_B.sum(),
         "correct": jnp.sum((logits_BC.argmax(-1) == labels_B) & valid_B)}
  sums = models.logit_sums(logits_BC, valid_B, z_loss=z_loss if train else 0.0, logz=stats)
  return models.Sums.of(models.with_logit_sums(out, sums), sown)


def objective(config, vocab_size: int):
  return functools.partial(loss, specials=specials_of(config), z_loss=config.optim.z_loss)


def dataset(config):
  return data.load(config, labelled=True)


def random_batch(config, vocab_size: int, seed: int = 0) -> dict:
  rng = np.random.default_rng(seed)
  B, L = config.train.batch_size, config.data.seq_len
  return {"tokens": rng.integers(len(Specials._fields), vocab_size, (B, L)).astype(np.int32),
          "labels": rng.integers(0, config.model.num_classes, (B,)).astype(np.int32)}


def chance_loss(config, vocab_size: int) -> float:
  return math.log(config.model.num_classes)


def head_matmul_params(config, vocab_size: int) -> float:
  """The pooler (D·D) and the classifier (D·C) at the [CLS] position only: 1/L per token."""
  m, L = config.model, config.data.seq_len
  return (m.d_model * m.d_model + m.d_model * m.num_classes) / L


def baselines(config, dataset) -> dict[str, float]:
  """None (an empty dict): a context-free predictor's loss is not comparable with this task's."""
  return {}
