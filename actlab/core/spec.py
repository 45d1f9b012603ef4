"""What the model is: `Spec`, the architecture, with the sizes derived from it (the FFN's hidden
width, the padded vocabulary). How it runs is `Execution` (execution.py); both are built from a
config in one place (actlab/config/specs.py)."""

import dataclasses

from actlab.core import activations



def choice(*values: str):
  """A field that takes one of `values`, the first its default: written here once, and a config
  is checked against them (actlab/config/schema.py)."""
  return dataclasses.field(default=values[0], metadata={"choices": values})


@dataclasses.dataclass(frozen=True)
class Spec:
  """The architecture, hashable for Flax."""
  activation: str
  num_layers: int
  d_model: int
  num_heads: int
  d_ff: int
  max_len: int
  vocab_size: int               # padded to a multiple of 64
  dropout: float = 0.0
  norm: str = choice("pre", "post")  # GPT-2's x + f(LN(x)), or BERT's LN(x + f(x))
  norm_type: str = choice("layer", "rms")  # LayerNorm, or RMSNorm as Llama's
  norm_eps: float = 1e-5
  position: str = choice("learned", "rope")  # `wpe`, or rotary on queries and keys
  rope_theta: float = 10000.0
  bias: bool = True             # every linear and norm bias
  tie_head: bool = True         # the LM head is the token embedding, or its own matrix
  ffn: str = choice("auto", "plain", "gated")  # "auto": gated for the GLU names
  gated_match_params: bool = True
  qk_norm: bool = False         # the block's norm of queries and keys over the head dim

  @property
  def head_dim(self) -> int:
    return self.d_model // self.num_heads

  @property
  def gated(self) -> bool:
    return gated(self.activation, self.ffn)

  @property
  def ffn_width(self) -> int:
    return ffn_width(self.activation, self.d_ff, self.gated_match_params, self.ffn)


def gated(activation: str, ffn: str = "auto") -> bool:
  """Whether the FFN is gated: `ffn` "gated", or "auto" with a GLU name (swiglu, geglu, …)."""
  return ffn == "gated" or (ffn == "auto" and activations.get(activation).gated)


def ffn_width(activation: str, d_ff: int, gated_match_params: bool = True,
              ffn: str = "auto") -> int:
  """Hidden width F: d_ff, or for gated FFNs round(2/3·d_ff) to a multiple of 64 (Shazeer 2020's
  parameter match)."""
  if gated(activation, ffn) and gated_match_params:
    return max(64, round(2 * d_ff / 3 / 64) * 64)
  return d_ff


def pad_vocab(vocab_size: int, multiple: int = 64) -> int:
  return -(-vocab_size // multiple) * multiple
