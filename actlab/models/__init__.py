"""Model construction and parameter counting."""

import flax.linen as nn
import jax
import ml_collections
import numpy as np

from actlab.models.decoder import Decoder
from actlab.models.encoder import Encoder
from actlab.models.layers import Spec, pad_vocab

__all__ = ["Spec", "build", "count_params", "pad_vocab"]


def build(model: ml_collections.ConfigDict, vocab_size: int) -> nn.Module:
  """The Flax module for `config.model`; `vocab_size` is the tokenizer's (padded here)."""
  spec = Spec.from_config(model, vocab_size)
  if model.kind == "encoder":  # The head follows the task: MLM pretraining or classification.
    return Encoder(spec, head=model.task, pooler_activation=model.pooler_activation,
                   type_vocab_size=model.type_vocab_size, num_classes=model.num_classes)
  kinds = {"decoder": Decoder}
  return kinds[model.kind](spec)


def count_params(params) -> dict[str, int]:
  """Total parameters and the count without the token embedding (`wte`)."""
  sizes = jax.tree.map(lambda p: int(np.prod(p.shape)), params)
  total = sum(jax.tree.leaves(sizes))
  embedding = sum(jax.tree.leaves(sizes.get("wte", {})))
  return {"total": total, "non_embedding": total - embedding}
