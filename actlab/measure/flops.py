"""Model FLOPs per token from the architecture alone, for MFU, by PaLM's and nanoGPT's
conventions (docs/performance.md): only matmuls count, 6·N per token for a weight matrix of N
entries in a training step; the LM head counts even when tied, the embedding lookups do not; the
MLM head counts P/L per token; attention 12·L·D per layer per token, the full L×L even causal.
"""

import dataclasses

from actlab import core, tasks


@dataclasses.dataclass(frozen=True)
class FlopCount:
  """Training FLOPs per token, broken down; `total` is what MFU uses."""
  block_matmul: float     # 6 · (attention + FFN matrices) · layers
  head_matmul: float      # 6 · head matrices (· P/L for the MLM head)
  attention: float        # 12 · L · D · layers
  matmul_params: int      # the N of 6·N: matrices that multiply activations, per token

  @property
  def total(self) -> float:
    return self.block_matmul + self.head_matmul + self.attention


def for_config(config, vocab_size: int) -> FlopCount:
  """Training FLOPs per token of a config's model at `data.seq_len`, with its task's head;
  `vocab_size`: the tokenizer's (padded as the model pads it) unless `model.vocab_size` is set."""
  model, head = config.model, tasks.get(config).head_matmul_params(config, vocab_size)
  D, layers = model.d_model, model.num_layers
  F = core.ffn_width(model.activation, model.d_ff, model.gated_match_params, model.ffn)
  per_block = 4 * D * D + (3 if core.gated(model.activation, model.ffn) else 2) * D * F
  return FlopCount(block_matmul=6 * per_block * layers, head_matmul=6 * head,
                   attention=12 * config.data.seq_len * D * layers,
                   matmul_params=int(round(per_block * layers + head)))
