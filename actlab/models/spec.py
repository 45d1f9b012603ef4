"""What the transformer is, apart from how it runs (execution.py): `Spec`, the architecture
that `config.model` resolves to, and the two sizes derived from it (the FFN's hidden width, the
padded vocabulary)."""

import dataclasses

import ml_collections

from actlab.models import activations
from actlab.models.execution import config_fields


@dataclasses.dataclass(frozen=True)
class Spec:
  """The architecture: `config.model` resolved, hashable for Flax."""
  activation: str
  num_layers: int
  d_model: int
  num_heads: int
  d_ff: int
  max_len: int
  vocab_size: int               # padded to a multiple of 64
  dropout: float = 0.0
  norm: str = "pre"             # "pre" (GPT-2: x + f(LN(x))) or "post" (BERT: LN(x + f(x)))
  norm_eps: float = 1e-5
  gated_match_params: bool = True
  qk_norm: bool = False         # LayerNorm of queries and keys over the head dim before q·k

  @classmethod
  def from_config(cls, model: ml_collections.ConfigDict, vocab_size: int) -> "Spec":
    vocab_size = pad_vocab(model.vocab_size or vocab_size)
    return cls(**{**config_fields(cls, model), "vocab_size": vocab_size})

  @property
  def ffn_width(self) -> int:
    return ffn_width(self.activation, self.d_ff, self.gated_match_params)


def ffn_width(activation: str, d_ff: int, gated_match_params: bool = True) -> int:
  """Hidden width F: d_ff, or for gated FFNs round(2/3·d_ff) to a multiple of 64 (Shazeer 2020's
  parameter match)."""
  if activations.get(activation).gated and gated_match_params:
    return max(64, round(2 * d_ff / 3 / 64) * 64)
  return d_ff


def pad_vocab(vocab_size: int, multiple: int = 64) -> int:
  return -(-vocab_size // multiple) * multiple
