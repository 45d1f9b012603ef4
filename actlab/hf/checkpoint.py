"""A Hugging Face model directory (`config.json` + weights) against an actlab config, both ways
(docs/huggingface.md): `write` exports a run's model as GPT-2, a LLaMA-style class (Llama, Arcee,
Qwen3: llama.py, `resolve`) or BERT for `from_pretrained`, `read` checks and loads one for
`train.init_from=hf:DIR`; what cannot map is refused in one line (`UserError`). Parameter names:
bert.py (BERT), gpt2.py, llama.py. No torch needed (except for an old pytorch_model.bin):
weights go through `safetensors.numpy`.
"""

import json
import pathlib
from typing import NamedTuple

import numpy as np

from actlab.config.schema import GPT2_BLOCK
from actlab.core.model import gated
from actlab.hf import bert, gpt2, llama
from actlab.infra.errors import UserError

INSTALL = 'pip install -e ".[hf]"'  # transformers, safetensors
EXPORTED = "actlab"  # the config.json entry of an export: where from, step, steps, finished, status


class Architecture(NamedTuple):
  """The transformers model a task's model is (each task's `HF`)."""
  model_type: str               # "gpt2", "bert", or "llama", "arcee", "qwen3" (`resolve`)
  cls: str                      # the transformers class, e.g. "GPT2LMHeadModel"
  norm: str                     # its LayerNorm placement, "pre" or "post"
  pooler: bool = False          # it has BERT's tanh pooler


# actlab activation -> transformers' name (transformers.activations.ACT2FN) of the same function.
# gelu_tanh is GPT-2's "gelu_new", 0.5·z·(1 + tanh(√(2/π)(z + 0.044715 z³))).
ACTIVATIONS = {"gelu": "gelu", "gelu_tanh": "gelu_new", "relu": "relu", "relu2": "relu2",
               "silu": "silu", "tanh": "tanh", "sigmoid": "sigmoid", "identity": "linear"}
# config.model field -> config.json field.
FIELDS = {"gpt2": {"num_layers": "n_layer", "d_model": "n_embd", "num_heads": "n_head",
                   "d_ff": "n_inner", "max_len": "n_positions", "norm_eps": "layer_norm_epsilon"},
          "bert": {"num_layers": "num_hidden_layers", "d_model": "hidden_size",
                   "num_heads": "num_attention_heads", "d_ff": "intermediate_size",
                   "max_len": "max_position_embeddings", "norm_eps": "layer_norm_eps",
                   "type_vocab_size": "type_vocab_size"}}
NAMES = {"gpt2": gpt2, "bert": bert, **{kind: llama for kind in llama.CLASSES}}
# config.json features actlab's model does not have, and the value it must have instead.
REQUIRED = {"gpt2": {"scale_attn_weights": True, "scale_attn_by_inverse_layer_idx": False},
            "bert": {"position_embedding_type": "absolute", "is_decoder": False}}


def resolve(config, arch: Architecture, doing: str = "export") -> Architecture:
  """The class of the config's model: `arch` (the task's `HF`), or for a decoder whose block is
  not GPT-2's the LLaMA-style class its FFN and qk-norm choose (llama.model_type; UserError
  for a block no class has)."""
  if arch.model_type != "gpt2" or llama.is_gpt2_block(config):
    return arch
  kind = llama.model_type(config, doing)
  return Architecture(kind, llama.CLASSES[kind], "pre")


def _check_architecture(config, arch: Architecture, doing: str) -> None:
  """UserError unless the model has `arch`'s block: GPT-2's or BERT's (LayerNorm with biases at
  its placement, learned positions, the tied head), a plain FFN and no qk-norm."""
  m, cls, norm = config.model, arch.cls, arch.norm
  other = [f"model.{k}={m[k]!r}" for k, v in GPT2_BLOCK.items() if m[k] != v]
  if other:
    raise UserError(f"{doing}: {', '.join(other)}: {cls} has "
                    f"{'GPT-2' if arch.model_type == 'gpt2' else 'BERT'}'s block (LayerNorm with "
                    "biases, learned positions, the tied head); no transformers class for this "
                    "block is mapped yet")
  llama = (", or the LLaMA-style block (configs/decoder.py:<size>,block=llama: {})"
           if arch.model_type == "gpt2" else "")
  if gated(m.activation, m.ffn):
    raise UserError(f"{doing}: model.activation={m.activation!r} is a gated FFN (a third matrix), "
                    f"which {cls} cannot express; use a plain activation "
                    f"({', '.join(ACTIVATIONS)})" + llama.format("LlamaForCausalLM"))
  if m.norm != norm:
    raise UserError(f"{doing}: {cls} is {norm}-LN and this model is model.norm={m.norm!r}; "
                    f"train with model.norm={norm!r}")
  if m.qk_norm:
    raise UserError(f"{doing}: model.qk_norm=True normalises queries and keys, which {cls} "
                    "cannot express; train with model.qk_norm=False"
                    + llama.format("Qwen3ForCausalLM, with a gated FFN"))


def hf_config(config, arch: Architecture, vocab_size: int, eot_id: int) -> dict:
  """The `config.json` fields of the run's model (`vocab_size`: the tokenizer's, unpadded)."""
  arch = resolve(config, arch, "export")
  if arch.model_type in llama.CLASSES:
    return llama.hf_config(config, arch.model_type, vocab_size, eot_id, ACTIVATIONS)
  _check_architecture(config, arch, "export")
  model_type, cls, m = arch.model_type, arch.cls, config.model
  if m.activation not in ACTIVATIONS:
    raise UserError(f"export: transformers has no activation equal to actlab's "
                    f"{m.activation!r}; use one of {', '.join(ACTIVATIONS)}")
  if arch.pooler and m.pooler_activation != "tanh":
    raise UserError(f"export: {cls}'s pooler is tanh and this model's is "
                    f"model.pooler_activation={m.pooler_activation!r}; train with 'tanh'")
  out = {"model_type": model_type, "architectures": [cls], "vocab_size": vocab_size,
         "tie_word_embeddings": True,
         **{hf_field: m[field] for field, hf_field in FIELDS[model_type].items()}}
  if model_type == "gpt2":
    return {**out, "activation_function": ACTIVATIONS[m.activation], "resid_pdrop": m.dropout,
            "embd_pdrop": m.dropout, "attn_pdrop": 0.0, "bos_token_id": eot_id,
            "eos_token_id": eot_id}
  return {**out, "hidden_act": ACTIVATIONS[m.activation], "hidden_dropout_prob": m.dropout,
          "attention_probs_dropout_prob": 0.0, "pad_token_id": 0, "num_labels": m.num_classes}


def state_dict(params, arch: Architecture, vocab_size: int) -> dict[str, np.ndarray]:
  """The transformers state dict of `params` with the padded vocabulary rows dropped."""
  if arch.model_type == "gpt2":
    state = gpt2.to_hf(params)
  elif arch.model_type in llama.CLASSES:
    state = llama.to_hf(params)
  else:
    state = {("" if k.startswith(("cls.", "classifier")) else "bert.") + k: v
             for k, v in bert.to_hf(params).items()}
  vocab = ("transformer.wte.weight", "bert.embeddings.word_embeddings.weight",
           "cls.predictions.bias", *llama.VOCAB)
  return {k: np.ascontiguousarray(v[:vocab_size] if k in vocab else v, np.float32)
          for k, v in state.items()}


def write(directory: pathlib.Path, config, arch: Architecture, params, vocab_size: int,
          eot_id: int, run: dict) -> None:
  """`config.json` (with `run` as its `EXPORTED` entry), then `model.safetensors` of the run's
  model in `directory`: an interrupted export is still recognised as an export's."""
  import transformers
  from safetensors.numpy import save_file

  arch = resolve(config, arch, "export")
  fields = hf_config(config, arch, vocab_size, eot_id)
  try:
    hf_model_config = transformers.AutoConfig.for_model(**fields, **{EXPORTED: run})
  except (KeyError, ValueError) as e:  # a transformers older than the class
    raise UserError(f"export: this transformers ({transformers.__version__}) lacks {arch.cls} "
                    f"({e.__class__.__name__}); pip install -U transformers") from None
  hf_model_config.save_pretrained(directory)
  save_file(state_dict(params, arch, vocab_size), str(directory / "model.safetensors"),
            metadata={"format": "pt"})


def read(directory, config, arch: Architecture, vocab_size: int) -> dict[str, np.ndarray]:
  """The state dict of the model in `directory` (safetensors, or pytorch_model.bin through
  torch) once its `config.json` maps onto the config's model (`check`). The FFN activation is
  the config's, whatever the checkpoint's."""
  directory = pathlib.Path(directory)
  where = f"train.init_from=hf:{directory}"
  try:
    cfg = json.loads((directory / "config.json").read_text())
  except (OSError, ValueError) as e:
    raise UserError(f"{where}: no readable config.json ({e.__class__.__name__}); give a "
                    "directory written by save_pretrained") from None
  arch = resolve(config, arch, where)
  theirs = cfg.get("model_type")
  family = {*llama.CLASSES, *llama.REFUSED}
  if theirs != arch.model_type and (arch.model_type in family or theirs in family):
    raise UserError(llama.other_class(theirs, arch.model_type, arch.cls, where))
  if arch.model_type in llama.CLASSES:
    return _read_llama(directory, cfg, config, vocab_size, where)
  _check_architecture(config, arch, where)
  if theirs != arch.model_type:
    raise UserError(f"{where} is a {theirs!r} model; this run starts from "
                    f"{arch.model_type} ({arch.cls})")
  check(cfg, config, arch.model_type, vocab_size, where)
  _note_activation(cfg.get("activation_function" if arch.model_type == "gpt2" else "hidden_act"),
                   config.model.activation, where)
  return _weights(directory, where)


def _read_llama(directory: pathlib.Path, cfg: dict, config, vocab_size: int,
                where: str) -> dict[str, np.ndarray]:
  """`read` for the LLaMA-style classes: `cfg` as transformers' config class reads it (its
  defaults filled in, transformers 4's rope fields as 5's), checked (llama.check); a tied
  head's `lm_head.weight` is the embedding's."""
  try:
    import transformers
    cfg = transformers.AutoConfig.from_pretrained(directory).to_dict()
  except ImportError:
    raise UserError(f"{where} needs transformers: {INSTALL}") from None
  except (KeyError, ValueError, TypeError) as e:  # an older transformers, or a field it refuses
    raise UserError(f"{where}: transformers cannot read its config.json: "
                    f"{str(e).splitlines()[0] if str(e) else e.__class__.__name__}") from None
  llama.check(cfg, config, where)
  _check_vocab(cfg, config, vocab_size, where)
  _note_activation(cfg.get("hidden_act"), llama.function(config.model.activation), where)
  state = _weights(directory, where)
  tied = cfg.get("tie_word_embeddings") and "lm_head.weight" not in state
  embedding = state.get("model.embed_tokens.weight", state.get("embed_tokens.weight"))
  return state | ({"lm_head.weight": embedding} if tied and embedding is not None else {})


def _note_activation(theirs, ours: str, where: str) -> None:
  if theirs != ACTIVATIONS.get(ours):
    print(f"actlab: {where}: the FFN activation is the config's, {ours!r} "
          f"(the checkpoint's: {theirs!r})", flush=True)


def check(cfg: dict, config, model_type: str, vocab_size: int, where: str) -> None:
  """UserError unless the checkpoint's features and sizes are the model's (more positions are
  cut to `model.max_len`) and its vocabulary is no larger than `vocab_size`."""
  m = config.model
  have = dict(cfg)
  if model_type == "gpt2":
    have["n_inner"] = have.get("n_inner") or 4 * have.get("n_embd", 0)
  unsupported = [f"{k}={cfg[k]!r}" for k, v in REQUIRED[model_type].items() if cfg.get(k, v) != v]
  if unsupported:
    raise UserError(f"{where}: {', '.join(unsupported)} has no actlab equivalent")
  fields = {f: h for f, h in FIELDS[model_type].items() if f in m}
  wrong = [(f, have.get(h)) for f, h in fields.items()
           if not ((have.get(h) or 0) >= m[f] if f == "max_len" else have.get(h) == m[f])]
  if wrong:
    raise UserError(f"{where}: the checkpoint's sizes differ from the model's; set "
                    + " ".join(f"--config.model.{f}={v}" for f, v in wrong))
  _check_vocab(cfg, config, vocab_size, where)


def _check_vocab(cfg: dict, config, vocab_size: int, where: str) -> None:
  if cfg.get("vocab_size", 0) > vocab_size:
    raise UserError(f"{where}: the checkpoint's vocabulary ({cfg['vocab_size']}) is larger than "
                    f"the model's ({vocab_size}, data.tokenizer={config.data.tokenizer!r}); use "
                    "the checkpoint's tokenizer")


def _weights(directory: pathlib.Path, where: str) -> dict[str, np.ndarray]:
  try:
    from safetensors.numpy import load_file
  except ImportError:
    raise UserError(f"{where} needs safetensors: {INSTALL}") from None

  index = directory / "model.safetensors.index.json"
  if index.is_file():
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


def arrays(state: dict[str, np.ndarray], arch: Architecture, like) -> dict:
  """{path: array} of the parameters of the per-layer `like` that `state` has (`found`)."""
  return NAMES[arch.model_type].found(state, like)[0]
