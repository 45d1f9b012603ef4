"""A Hugging Face model directory (`config.json` + weights) against an actlab config, both ways
(docs/huggingface.md): `write` exports a run's model as the family it is, `read` checks and loads
one for `train.init_from=hf:DIR`; what cannot map is refused in one line (`UserError`).
"""

import json
import pathlib
from typing import NamedTuple

import numpy as np
from flax.core import unfreeze
from flax.traverse_util import flatten_dict, unflatten_dict

from actlab.config import INIT_FROM
from actlab.core import activations
from actlab.core.model import (attention_multiplier, ffn_width, gated, output_multiplier,
                               width_multiplier)
from actlab.hf import mapping
from actlab.hf.mapping import BLOCKS, FAMILIES
from actlab.infra.errors import UserError

INSTALL = 'pip install -e ".[hf]"'  # transformers, safetensors
EXPORTED = "actlab"  # the config.json entry of an export: where from, step, steps, finished, status
LLAMA_STYLE = [name for name, f in FAMILIES.items() if f.block == "llama"]

# actlab activation -> transformers' name (transformers.activations.ACT2FN) of the same function.
# gelu_tanh is GPT-2's "gelu_new", 0.5·z·(1 + tanh(√(2/π)(z + 0.044715 z³))).
ACTIVATIONS = {"gelu": "gelu", "gelu_tanh": "gelu_new", "relu": "relu", "relu2": "relu2",
               "silu": "silu", "tanh": "tanh", "sigmoid": "sigmoid", "identity": "linear"}
# config.model field -> config.json field, written on export and compared on import.
FIELDS = {"gpt2": {"num_layers": "n_layer", "d_model": "n_embd", "num_heads": "n_head",
                   "d_ff": "n_inner", "max_len": "n_positions", "norm_eps": "layer_norm_epsilon"},
          "bert": {"num_layers": "num_hidden_layers", "d_model": "hidden_size",
                   "num_heads": "num_attention_heads", "d_ff": "intermediate_size",
                   "max_len": "max_position_embeddings", "norm_eps": "layer_norm_eps",
                   "type_vocab_size": "type_vocab_size"},
          **dict.fromkeys(LLAMA_STYLE, {"num_layers": "num_hidden_layers", "d_model": "hidden_size",
                                        "num_heads": "num_attention_heads",
                                        "norm_eps": "rms_norm_eps",
                                        "max_len": "max_position_embeddings"})}
# config.json features actlab's model does not have, and the value it must have instead.
REQUIRED = {"gpt2": {"scale_attn_weights": True, "scale_attn_by_inverse_layer_idx": False},
            "bert": {"position_embedding_type": "absolute", "is_decoder": False},
            **dict.fromkeys(LLAMA_STYLE, {"attention_bias": False, "mlp_bias": False,
                                          "use_sliding_window": False})}
# Models like the LLaMA-style ones that actlab's block cannot be: why, for the import's one line.
REFUSED = {"qwen2": "Qwen2 always has biases on q_proj, k_proj and v_proj, and actlab's "
                    "LLaMA-style block has none (model.bias=False)",
           "gemma": "Gemma scales the embedding by √d_model and its RMSNorm by (1 + weight)"}
# Each block as its classes have it ({}: their names), and as a run trains it.
BLOCK_TEXT = {"gpt2": "{} has LayerNorm with biases, learned positions and the tied head",
              "llama": "the LLaMA-style classes ({}) have RMSNorm, rotary positions, no biases and "
                       "an untied head (configs/decoder.py:block=llama)"}
TRAIN = {"gpt2": "GPT-2's block (configs/decoder.py:<size>)",
         "llama": "the LLaMA-style block (configs/decoder.py:<size>,block=llama)"}


class Weights(NamedTuple):
  """A model directory's state dict and the family its config.json names (`read`)."""
  family: str
  state: dict[str, np.ndarray]


def families(task: str) -> list[str]:
  """The families with a class for `task`."""
  return [name for name, f in FAMILIES.items() if task in f.classes]


def model_family(config, task: str, named: str | None) -> tuple[str, str | None]:
  """(the family the config's model of `task` is, None), else (the nearest family, `named` first
  among those of its block, and why the model is not that one's)."""
  fit = [name for name in families(task) if _unlike(config, name, task) is None]
  if fit:
    return fit[0], None
  m = config.model
  has_block = lambda name: all(getattr(m, k) == v for k, v in BLOCKS[FAMILIES[name].block].items())
  nearest = min(families(task), key=lambda name: (not has_block(name), name != named))
  return nearest, _unlike(config, nearest, task)


def _unlike(config, family: str, task: str) -> str | None:
  """Why the config's model is not the family's (the end of a line), or None if it is."""
  m, f = config.model, FAMILIES[family]
  cls, ffn = f.classes[task], "gated" if gated(m.activation, m.ffn) else "plain"

  def differs(block):
    return ", ".join(f"model.{k}={getattr(m, k)!r}" for k, v in BLOCKS[block].items()
                     if getattr(m, k) != v)

  def text(block):
    return BLOCK_TEXT[block].format(", ".join(FAMILIES[name].classes[task]
                                              for name in families(task)
                                              if FAMILIES[name].block == block))

  def elsewhere(want):
    """', or <block>: <class>' of a family with another block that `want`s."""
    other = [g for g in FAMILIES.values() if task in g.classes and g.block != f.block and want(g)]
    return f", or {TRAIN[other[0].block]}: {other[0].classes[task]}" if other else ""

  if differs(f.block):
    return f"{differs(f.block)}: {text(f.block)}" + "".join(
        f", and {text(block)}, which this model has not either ({differs(block)})"
        for block in dict.fromkeys(FAMILIES[name].block for name in families(task))
        if block != f.block)
  if m.norm != f.norm:
    return (f"{cls} is {f.norm}-LN (a {f.norm}-norm block) and this model is "
            f"model.norm={m.norm!r}; train with model.norm={f.norm!r}")
  if f.block == "llama" and m.qk_norm and ffn == "plain":  # the one pair no such class has
    return ("model.qk_norm=True with a plain FFN: Qwen3ForCausalLM (qk-norm) has a gated FFN and "
            "ArceeForCausalLM (the plain FFN) no qk-norm; train with model.ffn='gated' or "
            "model.qk_norm=False")
  if ffn == "gated" and f.ffn == "plain":
    return (f"model.activation={m.activation!r} is a gated FFN (a third matrix), which {cls} "
            f"cannot express; use a plain activation ({', '.join(ACTIVATIONS)})"
            + elsewhere(lambda g: g.ffn == "gated" and not g.qk_norm))
  if ffn == "plain" and f.ffn == "gated":
    return f"{cls} has a gated FFN and this model a plain one; train with model.ffn='gated'"
  if m.qk_norm and not f.qk_norm:
    return (f"model.qk_norm=True normalises queries and keys, which {cls} cannot express; train "
            "with model.qk_norm=False" + elsewhere(lambda g: g.qk_norm))
  if f.qk_norm and not m.qk_norm:
    return f"{cls} normalises queries and keys (qk-norm); train with model.qk_norm=True"
  if width_multiplier(m) != 1.0 and (m.tie_head or m.qk_norm):
    return (f"μP away from its base width scales the logits and attention's queries, which {cls} "
            "holds only in an untied head and unnormalised query weights; export a run with "
            "model.tie_head=False and model.qk_norm=False")
  return None


def function(activation: str) -> str:
  """The plain activation the FFN applies (a gated name's gate function: swiglu -> silu)."""
  return activations.GATE_BASE.get(activation, activation)


def width(config) -> int:
  """The FFN's hidden width, transformers' `intermediate_size` (`Spec.ffn_width`)."""
  m = config.model
  return ffn_width(m.activation, m.d_ff, m.gated_match_params, m.ffn)


def hf_config(config, family: str | None, task: str, vocab_size: int, eot_id: int) -> dict:
  """The `config.json` fields of the run's model as the family it is (`family`, if given)."""
  fit, why = model_family(config, task, family)
  if why:
    raise UserError(f"export: {why}")
  if family not in (None, fit):
    raise UserError(f"export: --family={family}: this run's model is {fit}'s "
                    f"({FAMILIES[fit].classes[task]}); pass --family={fit}, or no --family")
  family = fit
  m, cls, act = config.model, FAMILIES[family].classes[task], function(config.model.activation)
  if act not in ACTIVATIONS:
    raise UserError(f"export: transformers has no activation equal to actlab's {act!r}; use one "
                    f"of {', '.join(ACTIVATIONS)}")
  if task == "classify" and m.pooler_activation != "tanh":
    raise UserError(f"export: {cls}'s pooler is tanh and this model's is "
                    f"model.pooler_activation={m.pooler_activation!r}; train with 'tanh'")
  out = {"model_type": family, "architectures": [cls], "vocab_size": vocab_size,
         **{hf_field: getattr(m, field) for field, hf_field in FIELDS[family].items()}}
  if family == "gpt2":
    return {**out, "tie_word_embeddings": True, "activation_function": ACTIVATIONS[act],
            "resid_pdrop": m.dropout, "embd_pdrop": m.dropout, "attn_pdrop": 0.0,
            "bos_token_id": eot_id, "eos_token_id": eot_id}
  if family == "bert":
    return {**out, "tie_word_embeddings": True, "hidden_act": ACTIVATIONS[act],
            "hidden_dropout_prob": m.dropout, "attention_probs_dropout_prob": 0.0,
            "pad_token_id": 0, "num_labels": m.num_classes}
  return {**out, "intermediate_size": width(config), "num_key_value_heads": m.num_heads,
          "head_dim": m.d_model // m.num_heads, "hidden_act": ACTIVATIONS[act],
          "rope_theta": m.rope_theta, "attention_dropout": 0.0, "tie_word_embeddings": False,
          "bos_token_id": eot_id, "eos_token_id": eot_id, "attention_bias": False,
          **({"use_sliding_window": False} if family == "qwen3" else {"mlp_bias": False})}


def write(directory: pathlib.Path, config, family: str | None, task: str, params,
          vocab_size: int, eot_id: int, run: dict) -> str:
  """`config.json` (`run` its `EXPORTED` entry), then `model.safetensors`; returns the class."""
  import transformers
  from safetensors.numpy import save_file

  fields = hf_config(config, family, task, vocab_size, eot_id)
  cls, family = fields["architectures"][0], fields["model_type"]
  try:
    hf_model_config = transformers.AutoConfig.for_model(**fields, **{EXPORTED: run})
  except (KeyError, ValueError) as e:  # a transformers older than the class
    raise UserError(f"export: this transformers ({transformers.__version__}) lacks {cls} "
                    f"({e.__class__.__name__}); pip install -U transformers") from None
  hf_model_config.save_pretrained(directory)
  save_file(mapping.to_hf(family, mup_folded(config, params), vocab_size),
            str(directory / "model.safetensors"), metadata={"format": "pt"})
  return cls


def mup_folded(config, params):
  """`params` with μP's multipliers folded in, as transformers computes without them: the logits'
  into the untied head `lm_head`, attention's into the query weights (rotary positions commute
  with a scale); SP's and μP's at its base as they are (`_unlike` refuses what cannot fold)."""
  if width_multiplier(config.model) == 1.0:
    return params
  out, query = output_multiplier(config.model), attention_multiplier(config.model)
  flat = flatten_dict(unfreeze(params))
  return unflatten_dict({path: value * (out if path[-1] == "lm_head" else
                                        query if "query" in path else 1.0)
                         for path, value in flat.items()})


def read(directory, config, task: str, vocab_size: int) -> Weights:
  """The state dict in `directory` once its `config.json` names the config's model's family and
  its sizes (`_check_sizes`); a tied LLaMA-style head's `lm_head.weight` is the embedding's."""
  directory = pathlib.Path(directory)
  where = f"train.init_from=hf:{directory}"
  try:
    cfg = json.loads((directory / "config.json").read_text())
  except (OSError, ValueError) as e:
    raise UserError(f"{where}: no readable config.json ({e.__class__.__name__}); give a "
                    "directory written by save_pretrained") from None
  theirs = cfg.get("model_type")
  if theirs in REFUSED:
    raise UserError(f"{where} is a {theirs!r} model: {REFUSED[theirs]}")
  ours, why = model_family(config, task, theirs)
  if theirs != ours:
    raise UserError(f"{where} is a {theirs!r} model; this run starts from {ours} "
                    f"({FAMILIES[ours].classes[task]}){_hint(theirs, ours, task)}")
  if why:
    raise UserError(f"{where}: {why}")
  if width_multiplier(config.model) != 1.0:
    raise UserError(f"{where}: its weights are SP's, and μP away from its base width would "
                    "compute another function with them; start from it under "
                    "model.parametrization='sp'")
  llama_style = theirs in LLAMA_STYLE
  if llama_style:
    cfg = _transformers_config(directory, where)
  said = _check_sizes(cfg, config, theirs, vocab_size, where)
  plain = function(config.model.activation)  # the FFN's: the config's, whatever the checkpoint's
  act = cfg.get("activation_function" if theirs == "gpt2" else "hidden_act")
  if act != ACTIVATIONS.get(plain):
    said.append(f"the FFN activation: {act!r} there, the config's {plain!r} here")
  say_allowed(where, said)
  state = _weights(directory, where)
  if llama_style and cfg.get("tie_word_embeddings") and "lm_head.weight" not in state:
    embedding = state.get("model.embed_tokens.weight", state.get("embed_tokens.weight"))
    state = state | ({"lm_head.weight": embedding} if embedding is not None else {})
  return Weights(theirs, state)


def _hint(theirs, ours: str, task: str) -> str:
  """What makes the run's model (`ours`) the checkpoint's family's, if that has `task`."""
  if theirs not in families(task):
    return ""
  t = FAMILIES[theirs]
  if t.block != FAMILIES[ours].block:
    return f": train {TRAIN[t.block]}"
  return f": set --config.model.ffn={t.ffn} --config.model.qk_norm={t.qk_norm}"


def _transformers_config(directory: pathlib.Path, where: str) -> dict:
  """`config.json` as transformers reads it: defaults filled in, version 4's rope fields as 5's."""
  try:
    import transformers
    return transformers.AutoConfig.from_pretrained(directory).to_dict()
  except ImportError:
    raise UserError(f"{where} needs transformers: {INSTALL}") from None
  except (KeyError, ValueError, TypeError) as e:  # an older transformers, or a field it refuses
    raise UserError(f"{where}: transformers cannot read its config.json: "
                    f"{str(e).splitlines()[0] if str(e) else e.__class__.__name__}") from None


def say_allowed(where: str, diffs: list[str]) -> None:
  """The run's first line for what `train.init_from` allows to differ (`init_from="say"`)."""
  if diffs:
    print(f"actlab: {where}: {'; '.join(diffs)} (allowed: the parameters carry over)", flush=True)


def _check_sizes(cfg: dict, config, family: str, vocab_size: int, where: str) -> list[str]:
  """UserError unless the checkpoint's features, sizes (but `init_from="say"` fields: returned)
  and vocabulary (at most `vocab_size`) fit the model."""
  m = config.model
  unsupported = [f"{k}={cfg[k]!r}" for k, v in REQUIRED[family].items() if cfg.get(k, v) != v]
  if unsupported:
    raise UserError(f"{where}: {', '.join(unsupported)} has no actlab equivalent")
  have = dict(cfg)
  if family == "gpt2":
    have["n_inner"] = have.get("n_inner") or 4 * have.get("n_embd", 0)
  theirs = {f: have.get(h) for f, h in FIELDS[family].items() if hasattr(m, f)}
  if family in LLAMA_STYLE:
    _check_heads(cfg, where)
    theirs["rope_theta"] = rope(cfg, where)
  differ = [f for f, v in theirs.items()
            if not ((v or 0) >= getattr(m, f) if f == "max_len" else v == getattr(m, f))]
  wrong = [f"--config.model.{f}={theirs[f]}" for f in differ if INIT_FROM[f"model.{f}"] == "refuse"]
  inner = cfg.get("intermediate_size")  # read back into d_ff: gated, the width is d_ff unmatched
  if family in LLAMA_STYLE and inner != width(config):
    wrong.append(f"--config.model.d_ff={inner}" + (" --config.model.gated_match_params=False"
                                                   if gated(m.activation, m.ffn) else ""))
  if wrong:
    raise UserError(f"{where}: the checkpoint's sizes differ from the model's; set "
                    + " ".join(wrong))
  if cfg.get("vocab_size", 0) > vocab_size:
    raise UserError(f"{where}: the checkpoint's vocabulary ({cfg['vocab_size']}) is larger than "
                    f"the model's ({vocab_size}, data.tokenizer={config.data.tokenizer!r}); use "
                    "the checkpoint's tokenizer")
  return [f"model.{f}: {theirs[f]!r} there, {getattr(m, f)!r} here" for f in differ
          if INIT_FROM[f"model.{f}"] == "say"]


def _check_heads(cfg: dict, where: str) -> None:
  """UserError for grouped-query attention or a head dim other than hidden_size/heads."""
  heads, kv = cfg.get("num_attention_heads"), cfg.get("num_key_value_heads")
  if kv not in (None, heads):
    raise UserError(f"{where}: num_key_value_heads={kv} of num_attention_heads={heads} is "
                    "grouped-query attention; actlab's attention has a key and value per head")
  head_dim = cfg.get("head_dim") or cfg.get("hidden_size", 0) // max(heads or 1, 1)
  if heads and head_dim * heads != cfg.get("hidden_size"):
    raise UserError(f"{where}: head_dim={head_dim} × {heads} heads is not hidden_size="
                    f"{cfg.get('hidden_size')}; actlab's head dim is d_model/num_heads")


def rope(cfg: dict, where: str) -> float:
  """The checkpoint's RoPE base, from transformers 5's `rope_parameters` or 4's `rope_theta` and
  `rope_scaling`; UserError for any rope but the default (scaled, partial, per layer type)."""
  params = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
  if any(isinstance(v, dict) for v in params.values()):
    raise UserError(f"{where}: rope parameters per layer type ({', '.join(params)}) have no actlab "
                    "equivalent")
  kind = params.get("rope_type", params.get("type", "default"))
  partial = params.get("partial_rotary_factor", cfg.get("partial_rotary_factor", 1.0))
  if kind != "default" or partial != 1.0:
    raise UserError(f"{where}: rope_type={kind!r}, partial_rotary_factor={partial}: actlab rotates "
                    "every query and key feature by the default (unscaled) RoPE only")
  return float(params.get("rope_theta", cfg.get("rope_theta", 10000.0)))


def _weights(directory: pathlib.Path, where: str) -> dict[str, np.ndarray]:
  try:
    from safetensors.numpy import load_file
  except ImportError:
    raise UserError(f"{where} needs safetensors: {INSTALL}") from None

  if (index := directory / "model.safetensors.index.json").is_file():
    shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    return {k: v for shard in shards for k, v in load_file(str(directory / shard)).items()}
  if (directory / "model.safetensors").is_file():
    return load_file(str(directory / "model.safetensors"))
  if (directory / "pytorch_model.bin").is_file():
    try:
      import torch
    except ImportError:
      raise UserError(f"{where}: reading pytorch_model.bin needs torch: pip install torch "
                      "--index-url https://download.pytorch.org/whl/cpu") from None
    state = torch.load(directory / "pytorch_model.bin", map_location="cpu", weights_only=True)
    return {k: v.float().numpy() for k, v in state.items()}
  raise UserError(f"{where}: no model.safetensors or pytorch_model.bin")

