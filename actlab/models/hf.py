"""The BERT (Hugging Face) names of the encoder's parameters, and conversion both ways.

Parameter names map one-to-one onto a standard BERT checkpoint (Hugging Face `bert-base-uncased`;
its task models prefix the trunk with `bert.`). Flax kernels are stored (in, out), the transpose
of PyTorch's `weight`; LayerNorm `scale`/`bias` are `weight`/`bias` (`gamma`/`beta` in old files).
`hf_names` gives the table for a parameter tree; `to_hf` / `from_hf` convert (`found`: what a
checkpoint has, for `train.init_from=hf:DIR`; GPT-2's names: hf_gpt2.py).

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
the mean of the real rows (`fit`). BERT-base (12 layers, 768, 12 heads, d_ff 3072, 512
positions) has 109,482,240 parameters with the pooler at V = 30,522 — the "110M" — and
109,486,848 at V = 30,528 (tests/test_encoder.py derives both from the closed form `models.param_count`).
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


def found(state: Mapping[str, np.ndarray], like: Mapping) -> tuple[dict, list[str]]:
  """({path: array} for every parameter of the per-layer `like` that the BERT state dict has,
  the names of those it lacks). Names may carry the `bert.` prefix of Hugging Face task models;
  LayerNorm `gamma`/`beta` (old checkpoints) are accepted; arrays are `fit` to `like`."""
  state = {k.removeprefix("bert."): v for k, v in state.items()}
  for k in list(state):
    if k.endswith(".gamma") or k.endswith(".beta"):
      state[k.rsplit(".", 1)[0] + (".weight" if k.endswith(".gamma") else ".bias")] = state.pop(k)
  flat, missing = {}, []
  for path, target in flatten_dict(like).items():
    name = hf_name(path)
    if name not in state:
      missing.append(name)
      continue
    value = np.asarray(state[name], np.float32)
    flat[path] = fit(path, name, value.T if path[-1] == "kernel" else value, target.shape)
  return flat, missing


def from_hf(state: Mapping[str, np.ndarray], like: Mapping) -> dict:
  """Encoder parameters shaped like `like` (e.g. from `init` or `jax.eval_shape`) from a BERT
  state dict (`found`). Raises KeyError naming any parameter the state dict lacks."""
  return complete(found, state, like)


def complete(found_fn, state: Mapping[str, np.ndarray], like: Mapping) -> dict:
  """Every parameter of `like` by `found_fn` (this module's `found` or hf_gpt2's); KeyError if
  one is missing. A `scan_layers` model's `like` gets them in its own layout (`blocks` with a
  leading layer axis)."""
  scanned = "blocks" in like
  if scanned:
    like = execution.per_layer_layout(jax.tree.map(lambda t: np.zeros(t.shape, t.dtype), like))
  flat, missing = found_fn(state, like)
  if missing:
    raise KeyError(f"the state dict lacks {len(missing)} parameters: {missing[:5]}")
  params = unflatten_dict(flat)
  return execution.scanned_layout(params) if scanned else params


def fit(path: tuple[str, ...], name: str, value: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
  """`value` shaped as the model's parameter at `path`: a checkpoint's smaller vocabulary is
  padded (the token embedding's and MLM bias's new rows are the mean of the real ones, so each
  padded logit is the mean real logit and the loss grows by at most ln(1 + padding/V)), its
  longer position table cut to the model's `max_len`. ValueError for any other difference."""
  shape = tuple(shape)
  extra = shape[0] - value.shape[0] if value.ndim == len(shape) else None
  if value.shape == shape or extra is None or value.shape[1:] != shape[1:]:
    pass
  elif path[0] in ("wte", "mlm") and extra > 0:
    value = np.concatenate([value, np.repeat(value.mean(0, keepdims=True), extra, axis=0)])
  elif path[0] == "wpe" and extra < 0:
    value = value[:shape[0]]
  if value.shape != shape:
    raise ValueError(f"{name}: shape {value.shape}, the model wants {shape}")
  return value
