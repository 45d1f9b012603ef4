"""Causal language modelling with the decoder (`core.CausalLM`): next-token cross-entropy over
windows of L+1 tokens."""

import math

import numpy as np

from actlab import config as config_lib, core, data
from actlab.core import kernels
from actlab.tasks.task import Task


def objective(config, vocab_size: int) -> core.CausalLM:
  """The decoder (`config.specs`) with its next-token loss: from the logits, or fused with the
  head (`model.loss_impl`: kernels.FusedCausalLM)."""
  objective = kernels.FusedCausalLM if config.model.loss_impl == "fused" else core.CausalLM
  return objective(core.Decoder(*config_lib.specs(config, vocab_size)),
                   z_loss=config.optim.z_loss)


def dataset(config):
  return data.load(config)


def random_batch(config, vocab_size: int, seed: int = 0) -> np.ndarray:
  rng = np.random.default_rng(seed)
  shape = (config.train.batch_size, config.data.seq_len + 1)
  return rng.integers(0, vocab_size, shape).astype(np.int32)


def chance_loss(config, vocab_size: int) -> float:
  return math.log(vocab_size)


def baselines(config, dataset) -> dict[str, float]:
  """`unigram_loss` (`data.Dataset.unigram_loss`): a run that ends no better has not learned. (No
  `copy_loss`: the decoder never sees the token it predicts.)"""
  return {"unigram_loss": dataset.unigram_loss()}


def head_matmul_params(config, vocab_size: int) -> float:
  """The tied LM head, V·D at every position."""
  return core.pad_vocab(config.model.vocab_size or vocab_size) * config.model.d_model


TASK = Task("causal_lm", objective, dataset, random_batch, chance_loss, baselines, head_matmul_params,
            causal=True)
