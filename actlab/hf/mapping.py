"""The transformers model families actlab maps (`FAMILIES`) and a model's parameters copied both
ways in the per-layer layout (`to_hf`, `gather`). Kernels are transposed (Flax (in, out), torch
(out, in)) but for GPT-2's Conv1D; parameters of one name are its column blocks (GPT-2's `c_attn`).
"""

from typing import Mapping, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax.traverse_util import flatten_dict

from actlab import config as config_lib

# The decoder's blocks (config.BLOCKS) as the fields that make them: GPT-2's (the encoder's too)
# and the LLaMA-style one (RMSNorm, rotary positions, no biases, an untied head).
BLOCKS = {name: {k: config_lib.BLOCKS[name].get(f"model.{k}", v)
                 for k, v in config_lib.GPT2_BLOCK.items()} for name in config_lib.BLOCKS}
LEAF = {"kernel": "weight", "bias": "bias", "scale": "weight", "embedding": "weight"}
OLD_LEAF = {"gamma": "weight", "beta": "bias"}  # old BERT files' LayerNorm
VOCAB = (("wte", "embedding"), ("mlm", "bias"), ("lm_head",))  # rows: the (padded) vocabulary


class Family(NamedTuple):
  """A transformers model family: its classes, the model they are, and its parameter names."""
  classes: dict[str, str]   # actlab task -> transformers class
  block: str                # of BLOCKS
  norm: str                 # "pre" or "post"
  ffn: str                  # "plain" or "gated"
  qk_norm: bool
  top: dict[str, str]       # actlab module ("wte", "mlm/dense") or whole parameter -> name
  layer: str                # block i's prefix, "transformer.h.{}."
  in_layer: dict[str, str]  # actlab module within a block ("ffn/up") -> name
  trunk: str                # the prefix of the names a base model lacks
  transposed: bool = True   # kernels (out, in)


_LLAMA = dict(
    block="llama", norm="pre", top={"wte": "model.embed_tokens", "ln_f": "model.norm",
                                    "lm_head": "lm_head.weight"},
    layer="model.layers.{}.",
    in_layer={"ln_attn": "input_layernorm", "attn/query": "self_attn.q_proj",
              "attn/key": "self_attn.k_proj", "attn/value": "self_attn.v_proj",
              "attn/out": "self_attn.o_proj", "attn/query_norm": "self_attn.q_norm",
              "attn/key_norm": "self_attn.k_norm", "ln_ffn": "post_attention_layernorm",
              "ffn/gate": "mlp.gate_proj", "ffn/up": "mlp.up_proj", "ffn/down": "mlp.down_proj"},
    trunk="model.")

FAMILIES = {
    "gpt2": Family(
        {"causal_lm": "GPT2LMHeadModel"}, "gpt2", "pre", "plain", False,
        top={"wte": "transformer.wte", "wpe": "transformer.wpe", "ln_f": "transformer.ln_f"},
        layer="transformer.h.{}.",
        in_layer={"ln_attn": "ln_1", "attn/query": "attn.c_attn", "attn/key": "attn.c_attn",
                  "attn/value": "attn.c_attn", "attn/out": "attn.c_proj", "ln_ffn": "ln_2",
                  "ffn/up": "mlp.c_fc", "ffn/down": "mlp.c_proj"},
        trunk="transformer.", transposed=False),
    "bert": Family(
        {"mlm": "BertForMaskedLM", "classify": "BertForSequenceClassification"}, "gpt2", "post",
        "plain", False,
        top={"wte": "bert.embeddings.word_embeddings", "wpe": "bert.embeddings.position_embeddings",
             "wtt": "bert.embeddings.token_type_embeddings", "ln_emb": "bert.embeddings.LayerNorm",
             "pooler": "bert.pooler.dense", "classifier": "classifier",
             "mlm/dense": "cls.predictions.transform.dense",
             "mlm/ln": "cls.predictions.transform.LayerNorm", "mlm/bias": "cls.predictions.bias"},
        layer="bert.encoder.layer.{}.",
        in_layer={"attn/query": "attention.self.query", "attn/key": "attention.self.key",
                  "attn/value": "attention.self.value", "attn/out": "attention.output.dense",
                  "ln_attn": "attention.output.LayerNorm", "ffn/up": "intermediate.dense",
                  "ffn/down": "output.dense", "ln_ffn": "output.LayerNorm"},
        trunk="bert."),
    "llama": Family({"causal_lm": "LlamaForCausalLM"}, ffn="gated", qk_norm=False, **_LLAMA),
    "arcee": Family({"causal_lm": "ArceeForCausalLM"}, ffn="plain", qk_norm=False, **_LLAMA),
    "qwen3": Family({"causal_lm": "Qwen3ForCausalLM"}, ffn="gated", qk_norm=True, **_LLAMA),
}


def hf_name(family: str, path: tuple[str, ...]) -> str:
  """("block_3", "ffn", "up", "kernel") → "bert.encoder.layer.3.intermediate.dense.weight";
  KeyError for a parameter the family has no name for."""
  f = FAMILIES[family]
  try:
    if "/".join(path) in f.top:
      return f.top["/".join(path)]
    (head, *module), leaf = path[:-1], path[-1]
    if head.startswith("block_"):
      return f"{f.layer.format(int(head[6:]))}{f.in_layer['/'.join(module)]}.{LEAF[leaf]}"
    return f"{f.top['/'.join((head, *module))]}.{LEAF[leaf]}"
  except (KeyError, ValueError):
    raise KeyError(f"no {family} name for parameter {'/'.join(path)}") from None


def _columns(family: str, path: tuple[str, ...]) -> tuple[int, int]:
  """(which, of how many) column blocks of its name the parameter at `path` is."""
  if not path[0].startswith("block_"):
    return 0, 1
  names = FAMILIES[family].in_layer
  module = "/".join(path[1:-1])
  sharing = [k for k, name in names.items() if name == names[module]]
  return sharing.index(module), len(sharing)


def _transposed(family: str, leaf: str, value: np.ndarray) -> np.ndarray:
  return value.T if FAMILIES[family].transposed and leaf == "kernel" else value


def to_hf(family: str, params: Mapping, vocab_size: int) -> dict[str, np.ndarray]:
  """The family's float32 state dict (PyTorch layout) of `params`, rows past `vocab_size` cut."""
  columns = {}
  for path, value in flatten_dict(per_layer_layout(params)).items():
    which, n = _columns(family, path)
    parts = columns.setdefault((hf_name(family, path), path[-1]), [None] * n)
    parts[which] = np.asarray(value)[:vocab_size] if path in VOCAB else np.asarray(value)
  return {name: np.ascontiguousarray(_transposed(family, leaf, np.concatenate(parts, -1)),
                                     np.float32)
          for (name, leaf), parts in columns.items()}


def gather(family: str, state: Mapping[str, np.ndarray], like: Mapping) -> tuple[dict, list[str]]:
  """({path: array} of the parameters of the per-layer `like` that `state` has, in Flax layout
  and `fit` to `like`; the names of those it lacks)."""
  state = {_new_name(k): v for k, v in state.items()}
  trunk = FAMILIES[family].trunk
  flat, missing = {}, []
  for path, target in flatten_dict(like).items():
    try:
      name = hf_name(family, path)
    except KeyError:
      missing.append("/".join(path))
      continue
    value = state.get(name, state.get(name.removeprefix(trunk)))
    if value is None:
      missing.append(name)
      continue
    which, n = _columns(family, path)
    value = np.split(_transposed(family, path[-1], np.asarray(value, np.float32)), n, -1)[which]
    flat[path] = fit(path, name, value, target.shape)
  return flat, missing


def _new_name(name: str) -> str:
  """Old BERT files' LayerNorm `gamma` and `beta` as `weight` and `bias`."""
  stem, _, leaf = name.rpartition(".")
  return f"{stem}.{OLD_LEAF[leaf]}" if stem and leaf in OLD_LEAF else name


def fit(path: tuple[str, ...], name: str, value: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
  """`value` shaped as the parameter at `path`: a smaller vocabulary padded with the mean row, a
  longer position table cut; ValueError for any other difference."""
  shape = tuple(shape)
  if value.ndim == len(shape) and value.shape[1:] == shape[1:]:
    extra = shape[0] - value.shape[0]  # rows the model has beyond the checkpoint's
    if path in VOCAB and extra > 0:
      value = np.concatenate([value, np.repeat(value.mean(0, keepdims=True), extra, axis=0)])
    elif path[0] == "wpe" and extra < 0:
      value = value[:shape[0]]
  if value.shape != shape:
    raise ValueError(f"{name}: shape {value.shape}, the model wants {shape}")
  return value


def scanned_layout(params) -> dict:
  """Per-layer `block_i` trees → the scanned model's `blocks`, stacked on a leading layer axis."""
  n = sum(k.startswith("block_") for k in params)
  out = {k: v for k, v in params.items() if not k.startswith("block_")}
  out["blocks"] = jax.tree.map(lambda *xs: jnp.stack(xs), *[params[f"block_{i}"] for i in range(n)])
  return out


def per_layer_layout(params) -> dict:
  """The inverse of `scanned_layout` (a tree without `blocks` is returned as it is)."""
  if "blocks" not in params:
    return params
  out = {k: v for k, v in params.items() if k != "blocks"}
  n = jax.tree.leaves(params["blocks"])[0].shape[0]
  out.update({f"block_{i}": jax.tree.map(lambda x: x[i], params["blocks"]) for i in range(n)})
  return out
