"""Causal language modelling with the decoder: next-token cross-entropy over windows of L+1
tokens, from the logits or fused with the head (`model.loss_impl`: `Decoder.next_token_sums`)."""

import functools
import math

import numpy as np

from actlab import data, models
from actlab.models.hf_checkpoint import Architecture

CAUSAL = True
# actlab.export writes it and hf:DIR reads it: GPT-2's block; the LLaMA-style block (RMSNorm, RoPE,
# no biases, an untied head) is Llama, Arcee or Qwen3 by its FFN and qk-norm
# (hf_checkpoint.resolve).
HF = Architecture("gpt2", "GPT2LMHeadModel", "pre")


def model(config, vocab_size: int):
  return models.Decoder(models.Spec.from_config(config.model, vocab_size),
                        models.execution_from_config(config.model))


def loss(model, params, batch_BL1, rng, train: bool, stats: bool = False, *, fused: bool = False,
         z_loss: float = 0.0) -> models.Sums:
  """Next-token cross-entropy (nats) of windows of L+1 tokens, summed over positions 1…L; in
  training with the z-loss, and with `stats` what the blocks sowed and `logz_sum`. `fused`:
  without the [B, L, V] logits in memory (actlab.models.kernels)."""
  inputs_BL, targets_BL = batch_BL1[:, :-1], batch_BL1[:, 1:]
  sums, sown = models.apply(model, params, inputs_BL, targets_BL, train=train, fused=fused,
                            z_loss=z_loss if train else 0.0, logz=stats, rngs={"dropout": rng},
                            stats=stats, method="next_token_sums")
  return models.Sums.of({**sums, "count": targets_BL.size}, sown)


def objective(config, vocab_size: int):
  return functools.partial(loss, fused=config.model.loss_impl == "fused",
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
  return models.pad_vocab(config.model.vocab_size or vocab_size) * config.model.d_model
