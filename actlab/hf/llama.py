"""The LLaMA-style decoder (`configs/decoder.py:block=llama`: RMSNorm, rotary positions, no biases,
an untied head) as transformers' `LlamaForCausalLM` (gated FFN), `ArceeForCausalLM` (plain FFN)
or `Qwen3ForCausalLM` (gated FFN, qk-norm), both ways (docs/huggingface.md): which class a config
is (`model_type`), its `config.json` fields (`hf_config`), the checks of one to import (`check`),
and the parameter names (`hf_name`, `to_hf`, `found`; checkpoint.py dispatches to them).

Names: `wte` = model.embed_tokens, block i = model.layers.i (`_BLOCK`), `ln_f` = model.norm,
`lm_head` = lm_head. Kernels are transposed (Flax (in, out), PyTorch (out, in)); the [D, D]
attention kernels need nothing else: actlab splits a projection's output as (H, K), heads major,
as transformers' view(B, L, H, K) does, and both rotate in the half-split `rotate_half` layout.
"""

from typing import Mapping

import numpy as np
from flax.traverse_util import flatten_dict

from actlab.config.schema import GPT2_BLOCK
from actlab.core import activations
from actlab.core.model import ffn_width, gated
from actlab.hf import bert, layout
from actlab.infra.errors import UserError

CLASSES = {"llama": "LlamaForCausalLM", "arcee": "ArceeForCausalLM", "qwen3": "Qwen3ForCausalLM"}
# What each class needs of the model besides the block (`BLOCK`): (model.ffn, model.qk_norm).
SETTINGS = {"llama": ("gated", False), "arcee": ("plain", False), "qwen3": ("gated", True)}
BLOCK = {"norm_type": "rms", "position": "rope", "bias": False, "tie_head": False}
# Models like these that actlab's block cannot be: why, for the import's one line.
REFUSED = {"qwen2": "Qwen2 always has biases on q_proj, k_proj and v_proj, and actlab's "
                    "LLaMA-style block has none (model.bias=False)",
           "gemma": "Gemma scales the embedding by √d_model and its RMSNorm by (1 + weight)"}
# config.model field -> config.json field, compared on import (`check`).
FIELDS = {"num_layers": "num_hidden_layers", "d_model": "hidden_size",
          "num_heads": "num_attention_heads", "norm_eps": "rms_norm_eps"}
# config.json features actlab's block does not have, and the value it must have instead.
REQUIRED = {"attention_bias": False, "mlp_bias": False, "use_sliding_window": False}

_LEAF = {"kernel": "weight", "scale": "weight", "embedding": "weight"}
_BLOCK = {("ln_attn",): "input_layernorm", ("attn", "query"): "self_attn.q_proj",
          ("attn", "key"): "self_attn.k_proj", ("attn", "value"): "self_attn.v_proj",
          ("attn", "out"): "self_attn.o_proj", ("attn", "query_norm"): "self_attn.q_norm",
          ("attn", "key_norm"): "self_attn.k_norm", ("ln_ffn",): "post_attention_layernorm",
          ("ffn", "gate"): "mlp.gate_proj", ("ffn", "up"): "mlp.up_proj",
          ("ffn", "down"): "mlp.down_proj"}
VOCAB = ("model.embed_tokens.weight", "lm_head.weight")  # rows: the vocabulary


def is_gpt2_block(config) -> bool:
  return all(config.model[k] == v for k, v in GPT2_BLOCK.items())


def model_type(config, doing: str) -> str:
  """"llama", "arcee" or "qwen3": the class of a decoder whose block is not GPT-2's; UserError
  (one line, naming what differs) for a block no transformers class mapped here has."""
  m = config.model
  other = [f"model.{k}={m[k]!r}" for k, v in BLOCK.items() if m[k] != v]
  if other:
    gpt2 = [f"model.{k}={m[k]!r}" for k, v in GPT2_BLOCK.items() if m[k] != v]
    raise UserError(
        f"{doing}: {', '.join(other)}: the LLaMA-style classes ({', '.join(CLASSES.values())}) "
        "have RMSNorm, rotary positions, no biases and an untied head (configs/decoder.py:"
        f"block=llama), and GPT2LMHeadModel LayerNorm with biases, learned positions and the "
        f"tied head, which this model has not either ({', '.join(gpt2)})")
  if m.norm != "pre":
    raise UserError(f"{doing}: the LLaMA-style classes are pre-norm and this model is "
                    f"model.norm={m.norm!r}; train with model.norm='pre'")
  if gated(m.activation, m.ffn):
    return "qwen3" if m.qk_norm else "llama"
  if m.qk_norm:
    raise UserError(f"{doing}: model.qk_norm=True with a plain FFN: Qwen3ForCausalLM (qk-norm) "
                    "has a gated FFN and ArceeForCausalLM (the plain FFN) no qk-norm; train with "
                    "model.ffn='gated' or model.qk_norm=False")
  return "arcee"


def function(activation: str) -> str:
  """The plain activation the FFN applies (a gated name's gate function: swiglu -> silu)."""
  return activations.GATE_BASE.get(activation, activation)


def hf_config(config, kind: str, vocab_size: int, eot_id: int, act_names: dict) -> dict:
  """The `config.json` fields of the run's model as `kind` (`model_type`); `act_names`: actlab's
  activation -> transformers' (hf_checkpoint.ACTIVATIONS)."""
  m = config.model
  act = function(m.activation)
  if act not in act_names:
    raise UserError(f"export: transformers has no activation equal to actlab's {act!r}; use one "
                    f"of {', '.join(act_names)}")
  out = {"model_type": kind, "architectures": [CLASSES[kind]], "vocab_size": vocab_size,
         "hidden_size": m.d_model, "intermediate_size": width(config),
         "num_hidden_layers": m.num_layers, "num_attention_heads": m.num_heads,
         "num_key_value_heads": m.num_heads, "head_dim": m.d_model // m.num_heads,
         "hidden_act": act_names[act], "max_position_embeddings": m.max_len,
         "rms_norm_eps": m.norm_eps, "rope_theta": m.rope_theta, "attention_bias": False,
         "attention_dropout": 0.0, "tie_word_embeddings": False, "bos_token_id": eot_id,
         "eos_token_id": eot_id}
  return out | ({"use_sliding_window": False} if kind == "qwen3" else {"mlp_bias": False})


def width(config) -> int:
  """The FFN's hidden width, transformers' `intermediate_size` (`Spec.ffn_width`)."""
  m = config.model
  return ffn_width(m.activation, m.d_ff, m.gated_match_params, m.ffn)


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


def check(cfg: dict, config, where: str) -> None:
  """UserError unless the checkpoint's features and sizes are the model's: no biases or sliding
  window, as many key/value heads as heads (no GQA), the head dim d_model/heads, the default
  RoPE at `model.rope_theta`, `intermediate_size` the FFN width actlab computes, at least
  `model.max_len` positions."""
  m = config.model
  unsupported = [f"{k}={cfg[k]!r}" for k, v in REQUIRED.items() if cfg.get(k, v) != v]
  if unsupported:
    raise UserError(f"{where}: {', '.join(unsupported)} has no actlab equivalent")
  heads, kv = cfg.get("num_attention_heads"), cfg.get("num_key_value_heads")
  if kv not in (None, heads):
    raise UserError(f"{where}: num_key_value_heads={kv} of num_attention_heads={heads} is "
                    "grouped-query attention; actlab's attention has a key and value per head")
  head_dim = cfg.get("head_dim") or cfg.get("hidden_size", 0) // max(heads or 1, 1)
  if heads and head_dim * heads != cfg.get("hidden_size"):
    raise UserError(f"{where}: head_dim={head_dim} × {heads} heads is not hidden_size="
                    f"{cfg.get('hidden_size')}; actlab's head dim is d_model/num_heads")
  wrong = [f"--config.model.{f}={cfg.get(h)}" for f, h in FIELDS.items() if cfg.get(h) != m[f]]
  if (cfg.get("max_position_embeddings") or 0) < m.max_len:
    wrong.append(f"--config.model.max_len={cfg.get('max_position_embeddings')}")
  theta = rope(cfg, where)
  if theta != m.rope_theta:
    wrong.append(f"--config.model.rope_theta={theta}")
  inner = cfg.get("intermediate_size")
  if inner != width(config):  # Read back into d_ff: the gated width is d_ff itself unmatched.
    wrong.append(f"--config.model.d_ff={inner}" + (" --config.model.gated_match_params=False"
                                                   if gated(m.activation, m.ffn) else ""))
  if wrong:
    raise UserError(f"{where}: the checkpoint's sizes differ from the model's; set "
                    + " ".join(wrong))


def other_class(theirs, kind: str, cls: str, where: str) -> str:
  """The one line for a checkpoint of model type `theirs` where the run's model is `kind`
  (transformers class `cls`)."""
  if theirs in REFUSED:
    return f"{where} is a {theirs!r} model: {REFUSED[theirs]}"
  line = f"{where} is a {theirs!r} model; this run starts from {kind} ({cls})"
  if theirs in SETTINGS and kind in CLASSES:
    ffn, qk_norm = SETTINGS[theirs]
    return line + f": set --config.model.ffn={ffn} --config.model.qk_norm={qk_norm}"
  if theirs in SETTINGS:  # A GPT-2 block's run.
    return line + ": train the LLaMA-style block (configs/decoder.py:<size>,block=llama)"
  return line


def hf_name(path: tuple[str, ...]) -> str:
  """("block_3", "ffn", "gate", "kernel") → "model.layers.3.mlp.gate_proj.weight"."""
  if path == ("lm_head",):
    return "lm_head.weight"
  head, *module, leaf = path
  if head in ("wte", "ln_f") and not module and leaf in _LEAF:
    return "model." + ("embed_tokens" if head == "wte" else "norm") + ".weight"
  if head.startswith("block_") and tuple(module) in _BLOCK and leaf in _LEAF:
    return f"model.layers.{int(head[6:])}.{_BLOCK[tuple(module)]}.weight"
  raise KeyError(f"no Llama name for decoder parameter {'/'.join(path)}")


def to_hf(params: Mapping) -> dict[str, np.ndarray]:
  """A `LlamaForCausalLM` (Arcee, Qwen3) state dict (numpy, PyTorch layout) from decoder
  parameters, per-layer or scanned."""
  return {hf_name(path): bert._transpose_kernel(path, np.asarray(value))
          for path, value in flatten_dict(layout.per_layer_layout(params)).items()}


def found(state: Mapping[str, np.ndarray], like: Mapping) -> tuple[dict, list[str]]:
  """`bert.gather` from a Llama state dict (a base model's names lack the `model.` prefix)."""
  state = {(k if k.startswith(("model.", "lm_head.")) else "model." + k): v
           for k, v in state.items()}
  return bert.gather(state, like, hf_name, bert._transpose_kernel)
