"""The GPT-2 (Hugging Face `GPT2LMHeadModel`) names of the decoder's parameters, and conversion
both ways: `wte`, `wpe`, `ln_f` keep their names under `transformer.`, block i is `h.i` (`_BLOCK`).
Query, key and value are thirds (columns) of the fused `attn.c_attn`. GPT-2's `Conv1D` stores
weights (in, out), as Flax does: no transpose (unlike BERT, bert.py). The LM head is tied to `wte`;
a gated FFN's `gate` has no GPT-2 name; a `GPT2Model` checkpoint (no prefix) reads the same.
"""

from typing import Mapping

import numpy as np
from flax.traverse_util import flatten_dict

from actlab.hf import bert, layout

_BLOCK = {("ln_attn",): "ln_1", ("attn", "out"): "attn.c_proj", ("ln_ffn",): "ln_2",
          ("ffn", "up"): "mlp.c_fc", ("ffn", "down"): "mlp.c_proj"}
QKV = ("query", "key", "value")


def hf_name(path: tuple[str, ...]) -> str:
  """("block_3", "ffn", "up", "kernel") → "h.3.mlp.c_fc.weight" (no `transformer.` prefix);
  query, key and value → `c_attn`."""
  head, *rest = path
  *module, leaf = rest
  if head in ("wte", "wpe", "ln_f") and not module:
    return f"{head}.{bert._LEAF[leaf]}"
  if head.startswith("block_") and module[:1] == ["attn"] and module[1:] and module[1] in QKV:
    return f"h.{int(head[6:])}.attn.c_attn.{bert._LEAF[leaf]}"
  if head.startswith("block_") and tuple(module) in _BLOCK:
    return f"h.{int(head[6:])}.{_BLOCK[tuple(module)]}.{bert._LEAF[leaf]}"
  raise KeyError(f"no GPT-2 name for decoder parameter {'/'.join(path)}")


def to_hf(params: Mapping) -> dict[str, np.ndarray]:
  """A `GPT2LMHeadModel` state dict (numpy, no tied `lm_head.weight`) from decoder parameters."""
  out, qkv = {}, {}
  for path, value in flatten_dict(layout.per_layer_layout(params)).items():
    name = "transformer." + hf_name(path)
    if path[-2] in QKV:
      qkv.setdefault(name, {})[path[-2]] = np.asarray(value)
    else:
      out[name] = np.asarray(value)
  for name, parts in qkv.items():
    out[name] = np.concatenate([parts[k] for k in QKV], axis=-1)
  return out


def found(state: Mapping[str, np.ndarray], like: Mapping) -> tuple[dict, list[str]]:
  """`bert.gather` from a GPT-2 state dict."""
  state = {k.removeprefix("transformer."): v for k, v in state.items()}

  def third_of_c_attn(path, value):
    return np.split(value, 3, axis=-1)[QKV.index(path[-2])] if path[-2] in QKV else value

  return bert.gather(state, like, hf_name, third_of_c_attn)
