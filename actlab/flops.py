"""Model FLOPs per token, from the architecture alone (no tracing), for MFU.

Conventions (those of PaLM, Chowdhery et al. 2022, appendix B, and nanoGPT's `estimate_mfu`):

- Only matrix multiplications count: a weight matrix with N entries costs 2·N FLOPs per token
  forward and 4·N backward (gradients for the input and for the weight): **6·N per token** for a
  training step. Biases, LayerNorms, activations, softmax and the optimizer are not counted.
- Matrices per block: query, key, value, out (4·D²) and the FFN's up and down (2·D·F); a gated
  FFN (GLU family) has three (up, gate, down: 3·D·F) at its own hidden width F (`Spec.ffn_width`:
  round(2/3·d_ff) to a multiple of 64 by default).
- The LM head is a matmul even when tied to the token embedding (V·D); the embedding lookups are
  not. The encoder's MLM head (dense D·D, then the tied V·D projection) runs only at the P
  masked positions of each sequence of L tokens, so it counts P/L per token.
- Attention scores and the weighted sum of values cost 2·L·D each per token forward, for
  **12·L·D per layer per token** in training, with the full L×L score matrix even for causal
  attention (nothing is halved for the mask, as in PaLM).

MFU = (model FLOPs per token × tokens per second) / peak FLOP/s. Recomputation (remat) does not
count: it is hardware work, not model work.
"""

from __future__ import annotations

import dataclasses
import math

from actlab import activations


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


def ffn_width(activation: str, d_ff: int, gated_match_params: bool = True) -> int:
  """The FFN hidden width F (as `layers.Spec.ffn_width`)."""
  if activations.get(activation).gated and gated_match_params:
    return max(64, round(2 * d_ff / 3 / 64) * 64)
  return d_ff


def pad_vocab(vocab_size: int, multiple: int = 64) -> int:
  return -(-vocab_size // multiple) * multiple


def per_token(model, seq_len: int, vocab_size: int, *, mlm_prob: float | None = None) -> FlopCount:
  """Training FLOPs per token of `config.model` (a ConfigDict or anything with its fields).

  `vocab_size` is the tokenizer's (padded here, as the model pads it) unless `model.vocab_size`
  is set. `mlm_prob` is the encoder's masking rate (`data.mlm_prob`): the MLM head then runs at
  P = ⌈mlm_prob · L⌉ positions per sequence (`objectives.max_predictions`).
  """
  D, layers = model.d_model, model.num_layers
  F = ffn_width(model.activation, model.d_ff, model.get("gated_match_params", True))
  gated = activations.get(model.activation).gated
  V = pad_vocab(model.get("vocab_size", 0) or vocab_size)
  L = seq_len
  per_block = 4 * D * D + (3 if gated else 2) * D * F
  kind = model.get("kind", "decoder")
  task = model.get("task", "mlm")
  if kind == "decoder":
    head = V * D
  elif task == "classify":
    head = D * D / L + D * model.get("num_classes", 2) / L  # pooler + classifier at [CLS] only
  else:
    P = max(1, math.ceil((mlm_prob if mlm_prob is not None else 0.15) * L))
    head = (D * D + V * D) * P / L
  return FlopCount(block_matmul=6 * per_block * layers, head_matmul=6 * head,
                   attention=12 * L * D * layers,
                   matmul_params=int(round(per_block * layers + head)))


def for_config(config, vocab_size: int) -> FlopCount:
  """`per_token` for a full config (sequence length and MLM rate from `config.data`)."""
  return per_token(config.model, config.data.seq_len, vocab_size,
                   mlm_prob=config.data.get("mlm_prob", None))
