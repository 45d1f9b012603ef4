"""The models (built by the tasks: actlab/tasks/): the decoder read top-down in transformer.py,
its attention in attention.py, what it is in spec.py, the layers it chooses in layers.py, how it
runs in execution.py, what losses take from output logits in
kernels.py, the BERT encoder in encoder.py and its parameter names in hf.py; parameter counting
here."""

import jax
import numpy as np

from actlab.models import hf
from actlab.models.encoder import Encoder
from actlab.models.execution import Execution
from actlab.models.kernels import Sums, logit_sums, with_logit_sums
from actlab.models.spec import Spec, execution_from_config, ffn_width, gated, pad_vocab
from actlab.models.attention import AttentionStats
from actlab.models.transformer import Decoder, FFNStats, apply

__all__ = ["AttentionStats", "Decoder", "Encoder", "Execution", "FFNStats", "Spec", "Sums", "apply",
           "count_params", "execution_from_config", "ffn_width", "gated", "hf", "logit_sums", "pad_vocab",
           "param_count", "with_logit_sums"]


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
