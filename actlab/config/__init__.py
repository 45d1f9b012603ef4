"""The default config (`base`), the builders of the shipped config files (`decoder`, `encoder`),
overrides, and the listing `python -m actlab.config` prints. The fields themselves: schema.py."""

import ast
import contextlib
import dataclasses
from typing import Any, Mapping

import ml_collections

from actlab.config import schema
from actlab.config.schema import (BLOCK_FIELDS, GPT2_BLOCK, INIT_FROM, RUNTIME_FIELDS, Config,
                                  ConfigError, identity_diffs, marked, typed, validate)
from actlab.config.sizes import (CLASSIFY_SETTINGS, DECODER_SIZES, ENCODER_PREFIX, ENCODER_SIZES,
                                 SIZES)
from actlab.core import activations
from actlab.core.model import check, choices
from actlab.infra import errors

__all__ = ["BLOCKS", "BLOCK_FIELDS", "Config", "ConfigError", "GPT2_BLOCK", "INIT_FROM",
           "RUNTIME_FIELDS", "base", "decoder", "encoder", "identity_diffs", "listing", "marked",
           "override", "parse_arg", "parse_overrides", "typed", "validate"]


def base(activation: str = "gelu") -> ml_collections.ConfigDict:
  """The reference study's setup (docs/reference.md §2): GPT decoder on TinyStories, GPT-2 BPE."""
  c = ml_collections.ConfigDict(schema.defaults())
  c.model.activation = activation
  return c


# The decoder's blocks by name, each the `BLOCK_FIELDS` it sets: GPT-2's (`base`: the defaults),
# and the LLaMA-style block (RMSNorm, rotary positions, no biases, an untied head, a gated FFN).
BLOCKS = {"gpt2": {},
          "llama": {"model.norm_type": "rms", "model.norm_eps": 1e-6, "model.position": "rope",
                    "model.bias": False, "model.tie_head": False, "model.ffn": "gated"}}


def decoder(activation: str = "gelu", size: str | None = None,
            block: str = "gpt2") -> ml_collections.ConfigDict:
  """`configs/decoder.py`: `base` at a decoder size of `SIZES` with a block of `BLOCKS`."""
  size = size or "reference"
  check(size in DECODER_SIZES,
        f"unknown config variant {size!r}; choose one of: {choices(DECODER_SIZES)}", ConfigError)
  check(block in BLOCKS, f"unknown block {block!r}; choose one of: {choices(BLOCKS)}", ConfigError)
  return override(override(base(activation), SIZES[size]), BLOCKS[block])


def encoder(activation: str = "gelu", size: str | None = None,
            task: str = "mlm") -> ml_collections.ConfigDict:
  """`configs/encoder.py`: the BERT-style encoder at a size of `SIZES` (default "small") for `task`
  "mlm" or "classify", which a `size` may name too ("classify", "smoke_classify")."""
  if size and (size == "classify" or size.endswith("_classify")):
    size, task = size.removesuffix("classify").removesuffix("_"), "classify"
  size = size or "small"
  check(task in ("mlm", "classify"), f"encoder task {task!r}: choose 'mlm' or 'classify'",
        ConfigError)
  variant = size if task == "mlm" else f"{size}_classify"
  variants = ENCODER_SIZES + ["classify"] + [f"{s}_classify" for s in CLASSIFY_SETTINGS]
  check(variant in variants,
        f"unknown encoder config variant {variant!r}; choose one of: {choices(variants)}",
        ConfigError)
  c = base(activation)
  for section, values in schema.defaults(schema.ENCODER).items():  # the encoder's own fields
    c[section].update(values)
  c.model.update(kind="encoder", norm="post", norm_eps=1e-12)
  c.optim.update(b2=0.999, eps=1e-6, weight_decay=0.01)
  override(c, SIZES[ENCODER_PREFIX + size])
  if task == "classify":
    steps, lr, batch_size = CLASSIFY_SETTINGS[size]
    override(c, {"model.task": "classify", "optim.lr": lr, "optim.warmup_steps": steps // 10,
                 "optim.min_lr_ratio": 0.0, "train.steps": steps, "train.batch_size": batch_size,
                 "train.eval_every": max(50, steps // 10),
                 "train.checkpoint_every": max(50, steps // 4), "metrics.sharpness_every": 0,
                 # A new 2-class head starts with a near-zero gradient: growth from it is no
                 # sign of instability (docs/metrics.md §6).
                 "metrics.grad_rel_max": 0.0})
  return c


# --- Arguments and overrides --------------------------------------------------------------------

_BOOLS = {"true": True, "false": False}


def parse_arg(arg: str | None, **defaults) -> ml_collections.ConfigDict:
  """`get_config(arg)`'s "key=value,..." as the types of `defaults`; a first item without "=" is
  the first key's value (`decoder.py:smoke,act=swiglu`)."""
  values = dict(defaults)
  for i, item in enumerate(filter(None, (x.strip() for x in (arg or "").split(",")))):
    key, eq, text = item.partition("=")
    if not eq and i == 0:
      key, text = next(iter(defaults)), item
    if key not in defaults:
      raise ConfigError(f"unknown config argument {item!r}; use {', '.join(defaults)} "
                        "(key=value, comma-separated)")
    kind = type(defaults[key])
    try:
      values[key] = _BOOLS[text.lower()] if kind is bool else kind(text)
    except (KeyError, ValueError):
      raise ConfigError(f"config argument {item!r}: expected {kind.__name__}") from None
  return ml_collections.ConfigDict(values)


def parse_overrides(text: str) -> dict[str, Any]:
  """"model.loss_impl=plain,train.steps=3" → {"model.loss_impl": "plain", "train.steps": 3}:
  values as Python literals, true/false as bools, anything else as a string."""
  overrides = {}
  for item in filter(None, (x.strip() for x in text.split(","))):
    key, eq, value = (x.strip() for x in item.partition("="))
    if not eq:
      raise ConfigError(f"override {item!r}: write section.field=value")
    overrides[key] = _BOOLS.get(value.lower(), value)
    if value.lower() not in _BOOLS:
      with contextlib.suppress(ValueError, SyntaxError):
        overrides[key] = ast.literal_eval(value)
  return overrides


def override(config: ml_collections.ConfigDict,
             overrides: Mapping[str, Any]) -> ml_collections.ConfigDict:
  """`config` with each dotted `section.field` of `overrides` set in place (True and False as
  "true" and "false" in a str field, as a `--config.` flag gives them)."""
  for key, value in overrides.items():
    *sections, field = key.split(".")
    node = config
    for part in sections:
      node = node.get(part) if isinstance(node, ml_collections.ConfigDict) else None
    if (not isinstance(node, ml_collections.ConfigDict) or field not in node
        or isinstance(node[field], ml_collections.ConfigDict)):
      problem = errors.unknown_field(config, key)
      raise ConfigError(f"{key}: no such field" + (f" ({problem})" if problem else ""))
    if isinstance(value, bool) and isinstance(node[field], str):
      value = str(value).lower()
    try:
      node[field] = value
    except TypeError:
      raise ConfigError(f"{key}={value!r}: expected {type(node[field]).__name__}, got "
                        f"{type(value).__name__}") from None
  return config


# --- The listing --------------------------------------------------------------------------------


def listing() -> str:
  """Every field by section with its default (the decoder's, and the encoder's where it differs),
  its help and the names it accepts."""
  dec, enc = base().to_dict(), encoder().to_dict()
  plain = ", ".join(n for n in activations.NAMES if not activations.get(n).gated)
  accepted = {"model.activation": f"{plain}; gated (GLU): {', '.join(activations.GATE_BASE)}",
              "model.pooler_activation": plain}
  lines = []
  for section, cls in [*schema.SECTIONS.items(), *schema.ENCODER.items()]:
    lines.append(f"\n{section}")
    for f in dataclasses.fields(cls):
      key, value = f"{section}.{f.name}", enc[section][f.name]
      tag = (" [encoder]" if f.name not in dec[section] else
             f" [encoder: {value!r}]" if value != dec[section][f.name] else "")
      lines.append(f"  {key} = {dec[section].get(f.name, value)!r}{tag}")
      if f.metadata["help"]:
        lines.append(f"      {f.metadata['help']}")
      if key in accepted:
        lines.append(f"      one of: {accepted[key]}")
  return "\n".join(lines).lstrip("\n")
