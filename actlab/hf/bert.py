"""The BERT (Hugging Face) names of the encoder's parameters, and conversion both ways.

The names map one-to-one onto a standard BERT checkpoint (`bert-base-uncased`; task models prefix
the trunk with `bert.`): `_TOP`, `_BLOCK` and `_MLM` below. Kernels are transposed (Flax (in,
out), PyTorch (out, in)); LayerNorm `scale`/`bias` are `weight`/`bias` (`gamma`/`beta` in old
files). A GLU's `ffn/gate` (`intermediate.gate`) and pre-LN's `ln_f` (`encoder.LayerNorm`) have no
BERT equivalent; the MLM decoder is tied to the word embeddings. The vocabulary is padded to a
multiple of 64 (BERT's 30,522 → 30,528, `fit`). GPT-2's names: gpt2.py.
"""

from typing import Mapping

from flax.traverse_util import flatten_dict, unflatten_dict
import jax
import numpy as np

from actlab.hf import layout

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
  """("block_3", "ffn", "up", "kernel") → "encoder.layer.3.intermediate.dense.weight"."""
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
  """A BERT state dict (numpy, PyTorch layout) from encoder parameters, per-layer or scanned."""
  return {hf_name(path): _transpose_kernel(path, np.asarray(value))
          for path, value in flatten_dict(layout.per_layer_layout(params)).items()}


def _transpose_kernel(path: tuple[str, ...], value: np.ndarray) -> np.ndarray:
  return value.T if path[-1] == "kernel" else value


def found(state: Mapping[str, np.ndarray], like: Mapping) -> tuple[dict, list[str]]:
  """`gather` from a BERT state dict, whose names may carry task models' `bert.` prefix and old
  checkpoints' LayerNorm `gamma`/`beta`."""
  state = {k.removeprefix("bert."): v for k, v in state.items()}
  for k in list(state):
    if k.endswith(".gamma") or k.endswith(".beta"):
      state[k.rsplit(".", 1)[0] + (".weight" if k.endswith(".gamma") else ".bias")] = state.pop(k)
  return gather(state, like, hf_name, _transpose_kernel)


def gather(state: Mapping[str, np.ndarray], like: Mapping, hf_name,
           to_flax) -> tuple[dict, list[str]]:
  """({path: array} of the parameters of the per-layer `like` that `state` has under
  `hf_name(path)`, in Flax layout (`to_flax`) and `fit` to `like`; the names of those it lacks)."""
  flat, missing = {}, []
  for path, target in flatten_dict(like).items():
    try:
      name = hf_name(path)
    except KeyError:
      missing.append("/".join(path))
      continue
    if name not in state:
      missing.append(name)
      continue
    value = to_flax(path, np.asarray(state[name], np.float32))
    flat[path] = fit(path, name, value, target.shape)
  return flat, missing


def from_hf(state: Mapping[str, np.ndarray], like: Mapping) -> dict:
  """Encoder parameters shaped like `like` (per-layer or `scan_layers`) from a BERT state dict;
  KeyError if one is missing."""
  scanned = "blocks" in like
  if scanned:
    like = layout.per_layer_layout(jax.tree.map(lambda t: np.zeros(t.shape, t.dtype), like))
  flat, missing = found(state, like)
  if missing:
    raise KeyError(f"the state dict lacks {len(missing)} parameters: {missing[:5]}")
  params = unflatten_dict(flat)
  return layout.scanned_layout(params) if scanned else params


def fit(path: tuple[str, ...], name: str, value: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
  """`value` shaped as the model's parameter at `path`: a smaller vocabulary padded with the
  mean of the real rows (so the loss grows by at most ln(1 + padding/V)), a longer position
  table cut to `max_len`; ValueError for any other difference."""
  shape = tuple(shape)
  if value.ndim == len(shape) and value.shape[1:] == shape[1:]:
    extra = shape[0] - value.shape[0]  # rows the model has beyond the checkpoint's
    if path[0] in ("wte", "mlm", "lm_head") and extra > 0:
      value = np.concatenate([value, np.repeat(value.mean(0, keepdims=True), extra, axis=0)])
    elif path[0] == "wpe" and extra < 0:
      value = value[:shape[0]]
  if value.shape != shape:
    raise ValueError(f"{name}: shape {value.shape}, the model wants {shape}")
  return value
