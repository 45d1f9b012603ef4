"""Causal language modelling with the decoder: next-token cross-entropy over windows of L+1
tokens (`models.next_token_loss`, beside the model), or its fused variant (`fused_loss`)."""

import functools
import math

import numpy as np

from actlab import data, models
from actlab.models import kernels
from actlab.models.hf_checkpoint import Architecture

CAUSAL = True
HF = Architecture("gpt2", "GPT2LMHeadModel", "pre")  # actlab.export writes it, hf:DIR starts from it


def model(config, vocab_size: int):
  m = config.model
  return models.Decoder(models.Spec.from_config(m, vocab_size), models.Execution.from_config(m))


def fused_loss(model, params, batch_BL1, rng, train: bool, stats: bool = False, *,
               z_loss: float = 0.0) -> dict:
  """`models.next_token_loss` without the [B, L, V] logits in memory: the tied head and the
  cross-entropy (and z-loss, logZ) in chunks of positions (actlab.models.kernels; equal in
  tests/test_kernels.py)."""
  inputs_BL, targets_BL = batch_BL1[:, :-1], batch_BL1[:, 1:]
  h_BLD, sown = models.apply(model, params, inputs_BL, train=train, rngs={"dropout": rng},
                             stats=stats, method="hidden")
  sums = kernels.xent_sum(h_BLD, params["wte"]["embedding"], targets_BL,
                          z_loss=z_loss if train else 0.0, logz=stats)
  out = {**sums, "count": targets_BL.size}
  return out if sown is None else {**out, "sown": sown}


def objective(config, vocab_size: int):
  loss = fused_loss if config.model.loss_impl == "fused" else models.next_token_loss
  return functools.partial(loss, z_loss=config.optim.z_loss)


def dataset(config):
  return data.load(config)


def random_batch(config, vocab_size: int, seed: int = 0) -> np.ndarray:
  rng = np.random.default_rng(seed)
  shape = (config.train.batch_size, config.data.seq_len + 1)
  return rng.integers(0, vocab_size, shape).astype(np.int32)


def chance_loss(config, vocab_size: int) -> float:
  return math.log(vocab_size)


def baselines(config, dataset) -> dict[str, float]:
  """`unigram_loss`: the val loss of predicting every token from the training tokens' unigram
  frequencies (`data.Dataset.unigram_loss`): a run that ends no better has not learned. (No
  `copy_loss`: the decoder never sees the token it predicts.)"""
  return {"unigram_loss": dataset.unigram_loss()}


def head_matmul_params(config, vocab_size: int) -> float:
  """The tied LM head, V·D at every position."""
  return models.pad_vocab(config.model.vocab_size or vocab_size) * config.model.d_model
