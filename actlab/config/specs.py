"""The config as the core's typed values, in one place: `model_spec` (what the model is),
`execution` (how it runs) and `optim` (the optimizer and its schedule). Every field of
`config.model` is one of `core.Spec`'s, `core.Execution`'s or `OBJECTIVE_FIELDS`, and every
field of `config.optim` one of `core.OptimSpec`'s or the objective's `z_loss`: a field that
matches none is an error here, never dropped.
"""

import dataclasses

import ml_collections

from actlab import core

# What the task builds the objective from (actlab/tasks/), not the trunk's `Spec`.
OBJECTIVE_FIELDS = {"model": {"kind", "task", "loss_impl", "type_vocab_size",
                              "pooler_activation", "num_classes"},
                    "optim": {"z_loss"}}


def model_spec(config: ml_collections.ConfigDict, vocab_size: int) -> core.Spec:
  """`config.model` as a `Spec`; the vocabulary is `model.vocab_size` or the tokenizer's
  `vocab_size`, padded to a multiple of 64."""
  fields = _fields(config, "model", core.Spec, core.Execution)
  return core.Spec(**{**fields[core.Spec],
                      "vocab_size": core.pad_vocab(config.model.vocab_size or vocab_size)})


def execution(config: ml_collections.ConfigDict) -> core.Execution:
  return core.Execution(**_fields(config, "model", core.Spec, core.Execution)[core.Execution])


def optim(config: ml_collections.ConfigDict) -> core.OptimSpec:
  """`config.optim` with `train.steps` as an `OptimSpec`."""
  return core.OptimSpec(total_steps=config.train.steps,
                        **_fields(config, "optim", core.OptimSpec)[core.OptimSpec])


def _fields(config: ml_collections.ConfigDict, section: str, *classes) -> dict:
  """`config.<section>`'s values, by the dataclass of `classes` each belongs to; raises on a
  field that belongs to none (or to `OBJECTIVE_FIELDS`)."""
  values = config[section].to_dict()
  out = {cls: {} for cls in classes}
  for name, value in values.items():
    owner = [cls for cls in classes if name in {f.name for f in dataclasses.fields(cls)}]
    if owner:
      out[owner[0]][name] = value
    elif name not in OBJECTIVE_FIELDS[section]:
      raise ValueError(f"{section}.{name} is no field of {', '.join(c.__name__ for c in classes)}"
                       " nor the objective's: it would be ignored")
  return out
