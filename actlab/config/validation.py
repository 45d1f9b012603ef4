"""`validate(config)`: every field against its own rule (schema.py), then the fields' relations,
those of the core's dataclasses by building them (`OptimSpec` checks its own), checked before
anything compiles or is written; the first problem found raises `ConfigError`, the one-line error
of a config, with one readable line that says what to fix."""

import dataclasses
import importlib.util

import ml_collections

from actlab import core
from actlab.config import schema
from actlab.config.schema import GPT2_BLOCK
from actlab.core import activations
from actlab.core.options import check
from actlab.data import tokenizer
from actlab.infra import errors


class ConfigError(errors.UserError, ValueError):
  """An inconsistent or invalid config; the message says what to fix."""


def validate(c: ml_collections.ConfigDict) -> None:
  """ConfigError (one readable line) for the first problem: a field schema.py does not declare,
  each field's rule, then the relations."""
  try:
    _validate(c)
  except ValueError as e:  # a rule's or relation's (core/options.py: `check`), or the core's own
    raise ConfigError(str(e)) from None


def _validate(c: ml_collections.ConfigDict) -> None:
  _check_names(c)
  encoder = c.model.kind == "encoder"  # the encoder's own fields are the encoder's to check
  for section, cls in [*schema.SECTIONS.items(), *(schema.ENCODER.items() if encoder else ())]:
    for f in dataclasses.fields(cls):
      if f.metadata["rule"] and f.name in c[section]:
        f.metadata["rule"](f"{section}.{f.name}", c[section][f.name])
  m, o, t, d, mt = c.model, c.optim, c.train, c.data, c.metrics
  if m.kind == "decoder":
    check(m.get("task", "lm") == "lm",
          f"model.task={m.get('task')!r}: the decoder has one task, causal LM ('lm')")
  else:
    _check_encoder(c)
  check(m.d_model % m.num_heads == 0,
        f"model.d_model={m.d_model} is not divisible by model.num_heads={m.num_heads}")
  check(m.position != "rope" or (m.d_model // m.num_heads) % 2 == 0,
        f"model.position='rope' rotates pairs of features: the head dim d_model/num_heads = "
        f"{m.d_model // m.num_heads} must be even")
  check(m.ffn != "plain" or not activations.get(m.activation).gated,
        f"model.ffn='plain' with model.activation={m.activation!r}, a gated (GLU) name: use its "
        f"plain activation ({activations.GATE_BASE.get(m.activation)!r}) or model.ffn='gated'")
  schema.build(core.OptimSpec, o, total_steps=t.steps)  # warm-up within the steps, one clipping
  check(d.seq_len <= m.max_len,
        f"data.seq_len={d.seq_len} is longer than model.max_len={m.max_len}")
  check(not mt.wandb_project or importlib.util.find_spec("wandb") is not None,
        f"metrics.wandb_project={mt.wandb_project!r} needs wandb, which is not installed: "
        'pip install -e ".[wandb]"')


def _check_names(c: ml_collections.ConfigDict) -> None:
  """A section or field no section of schema.py declares would be ignored, and one it declares
  but the config lacks would fail later: both refused."""
  known = schema.defaults()
  for section, values in schema.defaults(schema.ENCODER).items():
    known[section] = {**known[section], **values}
  known = ml_collections.ConfigDict(known)
  for section, values in c.items():
    for name in values if isinstance(values, ml_collections.ConfigDict) else [None]:
      key = section if name is None else f"{section}.{name}"
      problem = errors.unknown_field(known, key)
      check(problem is None, f"{key}: no such field ({problem})")
  for section, values in schema.defaults().items():
    for name in values:
      check(section in c and name in c[section], f"{section}.{name} is missing: a config starts "
            "from one of configs/*.py or actlab.config.base(), which have every field")


def _check_encoder(config) -> None:
  """The encoder's relations (`config.encoder`): a config switches between its tasks (mlm,
  classify) by `model.task` alone."""
  m, d = config.model, config.data
  missing = [f"{section}.{name}" for section, values in schema.defaults(schema.ENCODER).items()
             for name in values if name not in config[section]]
  check(not missing, f"model.kind='encoder' needs the encoder's fields ({', '.join(missing)} "
        "missing): start from configs/bert_<activation>.py (config.encoder)")
  changed = [f"model.{k}={m[k]!r}" for k, v in GPT2_BLOCK.items() if m[k] != v]
  check(not changed, f"{', '.join(changed)}: the encoder builds BERT's block (LayerNorm, learned "
        "positions, biases, the tied MLM head); these options are the decoder's")
  check(tokenizer.parse_spec(d.tokenizer)[0] == "wordpiece",  # a spec its rule took
        f"data.tokenizer={d.tokenizer!r}: the encoder needs [CLS], [SEP], [MASK] and [PAD]; "
        "use 'wordpiece:<vocab size>'")
  check(d.seq_len >= 3, f"data.seq_len={d.seq_len}: an encoder sequence needs [CLS], a token "
        "and [SEP]")
  check(d.mlm_mask_frac >= 0 and d.mlm_random_frac >= 0
        and d.mlm_mask_frac + d.mlm_random_frac <= 1.0,
        f"data.mlm_mask_frac={d.mlm_mask_frac} and data.mlm_random_frac={d.mlm_random_frac} must "
        "be >= 0 with a sum <= 1")
  check(m.task != "classify" or not d.test_batches,
        "data.test_batches: classification scores the labelled validation split whole; "
        "set data.test_batches=0")
