"""Sequence classification with the encoder (fine-tuning, e.g. from an MLM run through
`train.init_from`): the pooler over `[CLS]`, a dense classifier, and cross-entropy of the class.
Batches are `{"tokens": [B, L], "labels": [B]}` of labelled examples (`data.classify`); the loss:
`core.Classifier`."""

import math

import numpy as np

from actlab import config as config_lib, core, data
from actlab.tasks.task import Task
from actlab.tasks.mlm import specials_of


def objective(config, vocab_size: int) -> core.Classifier:
  m = config.model
  spec, execution = config_lib.specs(config, vocab_size)
  encoder = core.Encoder(spec, head="classify", pooler_activation=m.pooler_activation,
                         type_vocab_size=m.type_vocab_size, num_classes=m.num_classes,
                         execution=execution)
  return core.Classifier(encoder, specials_of(config).pad, z_loss=config.optim.z_loss)


def dataset(config):
  return data.load(config, labelled=True)


def random_batch(config, vocab_size: int, seed: int = 0) -> dict:
  rng = np.random.default_rng(seed)
  B, L = config.train.batch_size, config.data.seq_len
  return {"tokens": rng.integers(len(core.Specials._fields), vocab_size, (B, L)).astype(np.int32),
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


TASK = Task("classify", objective, dataset, random_batch, chance_loss, baselines, head_matmul_params,
            causal=False)
