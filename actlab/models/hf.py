"""The BERT (Hugging Face) names of the encoder's parameters, and conversion both ways.

Parameter names map one-to-one onto a standard BERT checkpoint (Hugging Face `bert-base-uncased`;
its task models prefix the trunk with `bert.`). Flax kernels are stored (in, out), the transpose
of PyTorch's `weight`; LayerNorm `scale`/`bias` are `weight`/`bias` (`gamma`/`beta` in old files).
`hf_names` gives the table for a parameter tree; `to_hf` / `from_hf` convert.

| actlab (Flax)                         | BERT (PyTorch)                                   | shape (Flax)   |
|---------------------------------------|--------------------------------------------------|----------------|
| `wte/embedding`                       | `embeddings.word_embeddings.weight`              | (V, D)         |
| `wpe/embedding`                       | `embeddings.position_embeddings.weight`          | (P, D)         |
| `wtt/embedding`                       | `embeddings.token_type_embeddings.weight`        | (2, D)         |
| `ln_emb/{scale,bias}`                 | `embeddings.LayerNorm.{weight,bias}`             | (D,)           |
| `block_i/attn/{query,key,value}/kernel` | `encoder.layer.i.attention.self.{query,key,value}.weight`ᵀ | (D, D) |
| `block_i/attn/out/kernel`             | `encoder.layer.i.attention.output.dense.weight`ᵀ | (D, D)         |
| `block_i/ln_attn/{scale,bias}`        | `encoder.layer.i.attention.output.LayerNorm.*`   | (D,)           |
| `block_i/ffn/up/kernel`               | `encoder.layer.i.intermediate.dense.weight`ᵀ     | (D, F)         |
| `block_i/ffn/gate/kernel` (GLU only)  | `encoder.layer.i.intermediate.gate.weight`ᵀ (no BERT equivalent) | (D, F) |
| `block_i/ffn/down/kernel`             | `encoder.layer.i.output.dense.weight`ᵀ           | (F, D)         |
| `block_i/ln_ffn/{scale,bias}`         | `encoder.layer.i.output.LayerNorm.*`             | (D,)           |
| `ln_f/{scale,bias}` (pre-LN only)     | `encoder.LayerNorm.*` (no BERT equivalent)       | (D,)           |
| `pooler/kernel`                       | `pooler.dense.weight`ᵀ                           | (D, D)         |
| `mlm/dense/kernel`                    | `cls.predictions.transform.dense.weight`ᵀ        | (D, D)         |
| `mlm/ln/{scale,bias}`                 | `cls.predictions.transform.LayerNorm.*`          | (D,)           |
| `mlm/bias`                            | `cls.predictions.bias` (= `decoder.bias`; `decoder.weight` is tied to the word embeddings) | (V,) |
| `classifier/kernel`                   | `classifier.weight`ᵀ                             | (D, C)         |

Every `…/kernel` has a `…/bias` beside it (`….bias` in BERT, not transposed). The vocabulary V
is the tokenizer's padded to a multiple of 64 (BERT's 30,522 → 30,528): `from_hf` pads with
zeros. BERT-base (12 layers, 768, 12 heads, d_ff 3072, 512 positions) has 109,482,240
parameters with the pooler at V = 30,522 — the "110M" — and 109,486,848 at V = 30,528
(tests/test_encoder.py derives both from the closed form `models.param_count`).
"""

from __future__ import annotations

from typing import Mapping

from flax.traverse_util import flatten_dict, unflatten_dict
import jax
import numpy as np

from actlab.models import execution

_LEAF = {"kernel": "weight", "bias": "bias", "scale": "weight", "embedding": "weight"}
_TOP = {
    "wte": "embeddings.word_embeddings", "wpe": "embeddings.position_embeddings",
    "wtt": "embeddings.token_type_embeddings", "ln_emb": "embeddings.LayerNorm",
    "ln_f": "encoder.LayerNorm", "pooler": "pooler.dense", "classifier": "classifier",
}
_BLOCK = {
    ("attn", "query"): "attention.self.query", ("attn", "key"): "attention.self.key",
    ("attn", "value"): "attention.self.value", ("attn", "out"): "attention.output.dense",
    ("ln_attn",): "attention.output.LayerNorm", ("ffn", "up"): "intermediate.dense",
    ("ffn", "gate"): "intermediate.gate", ("ffn", "down"): "output.dense",
    ("ln_ffn",): "output.LayerNorm",
}
_MLM = {("dense",): "cls.predictions.transform.dense",
        ("ln",): "cls.predictions.transform.LayerNorm"}


def hf_name(path: tuple[str, ...]) -> str:
  """The BERT (Hugging Face) name of one Flax parameter path, e.g.
  ("block_3", "ffn", "up", "kernel") → "encoder.layer.3.intermediate.dense.weight"."""
  head, *rest = path
  if head == "mlm" and rest == ["bias"]:
    return "cls.predictions.bias"
  *module, leaf = rest
  if head in _TOP and len(module) == 0:
    return f"{_TOP[head]}.{_LEAF[leaf]}"
  if head.startswith("block_") and tuple(module) in _BLOCK:
    return f"encoder.layer.{int(head[6:])}.{_BLOCK[tuple(module)]}.{_LEAF[leaf]}"
  if head == "mlm" and tuple(module) in _MLM:
    return f"{_MLM[tuple(module)]}.{_LEAF[leaf]}"
  raise KeyError(f"no BERT name for encoder parameter {'/'.join(path)}")


def hf_names(params: Mapping) -> dict[str, str]:
  """{"block_0/attn/query/kernel": "encoder.layer.0.attention.self.query.weight", ...}."""
  return {"/".join(p): hf_name(p) for p in flatten_dict(params)}


def to_hf(params: Mapping) -> dict[str, np.ndarray]:
  """A BERT state dict (numpy, PyTorch layout: kernels transposed) from encoder parameters
  (per-layer, or a `scan_layers` model's, unstacked first)."""
  out = {}
  for path, value in flatten_dict(execution.per_layer_layout(params)).items():
    value = np.asarray(value)
    out[hf_name(path)] = value.T if path[-1] == "kernel" else value
  return out


def from_hf(state: Mapping[str, np.ndarray], like: Mapping) -> dict:
  """Encoder parameters shaped like `like` (e.g. from `init` or `jax.eval_shape`) from a BERT
  state dict. Names may carry the `bert.` prefix of Hugging Face task models; LayerNorm
  `gamma`/`beta` (old checkpoints) are accepted; a smaller vocabulary is padded with zeros.
  Raises KeyError naming any parameter the state dict lacks. A `scan_layers` model's `like`
  gets its parameters in its own layout (`blocks` with a leading layer axis)."""
  if "blocks" in like:
    like = execution.per_layer_layout(jax.tree.map(lambda t: np.zeros(t.shape, t.dtype), like))
    return execution.scanned_layout(from_hf(state, like))
  state = {k.removeprefix("bert."): v for k, v in state.items()}
  for k in list(state):
    if k.endswith(".gamma") or k.endswith(".beta"):
      state[k.rsplit(".", 1)[0] + (".weight" if k.endswith(".gamma") else ".bias")] = state.pop(k)
  missing = []

  def convert(path, target):
    name = hf_name(path)
    if name not in state:
      missing.append(name)
      return None
    value = np.asarray(state[name], np.float32)
    if path[-1] == "kernel":
      value = value.T
    if value.shape != tuple(target.shape):
      pad = [(0, t - v) for t, v in zip(target.shape, value.shape)]
      if len(value.shape) != len(target.shape) or any(p < 0 for _, p in pad) or path[0] not in (
          "wte", "mlm"):
        raise ValueError(f"{name}: shape {value.shape}, the encoder wants {tuple(target.shape)}")
      value = np.pad(value, pad)  # vocabulary padding
    return value

  flat = {p: convert(p, t) for p, t in flatten_dict(like).items()}
  if missing:
    raise KeyError(f"the state dict lacks {len(missing)} encoder parameters: {missing[:5]}")
  return unflatten_dict(flat)
