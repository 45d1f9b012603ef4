"""actlab's core: the model, its loss and its step, from typed specs alone (never a config, a
task, a run directory or a measurement; tests/test_layers.py holds it to that). Read: model.py,
the decoder whole, top-down (`Spec` and `Execution`, its layers, attention, FFN, block, stack,
`Decoder`, `CausalLM` and its `Sums`), with activations.py (the FFN's functions); step.py
(`Step`: init, train_step, eval_step; the optimizer). Off the reading path: kernels.py (the
fused loss and cuDNN attention, equal to model.py's plain ones) and encoder.py (the BERT-style
encoder and its losses). Parameter counting here. In a notebook, docs/notebook.md trains the
decoder in 15 lines.
"""

import jax
import numpy as np

from actlab.core.encoder import Classifier, Encoder, MaskedLM, Specials
from actlab.core.model import (AttentionStats, CausalLM, Decoder, Execution, FFNStats, Objective,
                               Spec, Sums, apply, ffn_width, gated, pad_vocab, per_layer)
from actlab.core.step import EVAL_SEED, OptimSpec, Step, TrainState, optimizer

__all__ = ["AttentionStats", "CausalLM", "Classifier", "Decoder", "EVAL_SEED", "Encoder",
           "Execution", "FFNStats", "MaskedLM", "Objective", "OptimSpec", "Spec", "Specials",
           "Step", "Sums", "TrainState", "apply", "count_params", "ffn_width", "gated",
           "optimizer", "pad_vocab", "param_count", "per_layer"]


def count_params(params) -> dict[str, int]:
  """Total parameters and the count without the token embedding (`wte`)."""
  sizes = jax.tree.map(lambda p: int(np.prod(p.shape)), params)
  total = sum(jax.tree.leaves(sizes))
  embedding = sum(jax.tree.leaves(sizes.get("wte", {})))
  return {"total": total, "non_embedding": total - embedding}


def param_count(spec: Spec, head: str = "lm", type_vocab_size: int = 2,
                num_classes: int = 2) -> int:
  """The closed form of `count_params(...)["total"]` (checked against `init` by the tests): the
  decoder with `head="lm"` (tied: no parameters of its own), else the encoder with that head."""
  D, V, P, F, K = spec.d_model, spec.vocab_size, spec.max_len, spec.ffn_width, spec.head_dim
  b = 1 if spec.bias else 0
  norm = lambda n: n * (1 if spec.norm_type == "rms" else 1 + b)  # scale (and bias) of [n]
  attention = 4 * (D * D + b * D) + (2 * norm(K) if spec.qk_norm else 0)
  ffn = (3 if spec.gated else 2) * D * F + b * ((2 if spec.gated else 1) * F + D)
  blocks = spec.num_layers * (attention + ffn + 2 * norm(D))
  if head == "lm":
    positions = P * D if spec.position == "learned" else 0
    return V * D * (1 if spec.tie_head else 2) + positions + blocks + norm(D)
  ln = norm(D)
  total = (V + P + type_vocab_size) * D + ln + blocks + (ln if spec.norm == "pre" else 0)
  if head in ("mlm", "all"):
    total += D * D + D + ln + V
  if head in ("classify", "all"):
    total += D * D + D + D * num_classes + num_classes
  return total
