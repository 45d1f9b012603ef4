"""Model FLOPs per token, from the architecture alone (no tracing), for MFU.

Conventions (those of PaLM, Chowdhery et al. 2022, appendix B, and nanoGPT's `estimate_mfu`):

- Only matrix multiplications count: a weight matrix with N entries costs 2·N FLOPs per token
  forward and 4·N backward: **6·N per token** for a training step.
- Matrices per block: query, key, value, out (4·D²) and the FFN's up and down (2·D·F); a gated
  FFN (GLU family) has three (up, gate, down: 3·D·F) at its own width F (`Spec.ffn_width`).
- The LM head is a matmul even when tied to the token embedding (V·D); the embedding lookups are
  not. The encoder's MLM head (dense D·D, then the tied V·D projection) runs only at the P
  masked positions of each sequence of L tokens, so it counts P/L per token.
- Attention scores and the weighted sum of values cost 2·L·D each per token forward: **12·L·D
  per layer per token** in training, the full L×L score matrix even when causal (as in PaLM).

MFU = (model FLOPs per token × tokens per second) / peak FLOP/s; remat's recomputation is not
model work and does not count.
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
