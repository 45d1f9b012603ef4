"""Parameters from elsewhere than a run's own checkpoints: `train.init_from` (another run's latest
checkpoint, or `hf:DIR`), checked before anything is written; and a trained run read back
(`load_run`)."""

import pathlib

import flax
import jax
import ml_collections
from flax.traverse_util import flatten_dict, unflatten_dict

from actlab import config as config_lib, core, data, tasks
from actlab.core import activations
from actlab.hf import checkpoint as hf_checkpoint
from actlab.hf import mapping
from actlab.infra import workdir as workdir_lib
from actlab.infra.checkpoint import Checkpoints
from actlab.infra.workdir import RunDir, WorkdirError
from actlab.run import program


HF = "hf:"  # train.init_from=hf:DIR: a Hugging Face model directory (hf/checkpoint.py)


def init_from_config(config, vocab_size: int = 0):
  """What `train.init_from` names, checked against this model: a workdir's run's config (the same
  model and tokenizer, with a checkpoint; fields marked "say" may differ, in a line), or for
  `hf:DIR` its `hf_checkpoint.Weights` (`vocab_size`: the tokenizer's)."""
  config = config_lib.typed(config)
  if config.train.init_from.startswith(HF):
    return hf_checkpoint.read(config.train.init_from[len(HF):], config, tasks.name(config),
                              core.pad_vocab(config.model.vocab_size or vocab_size))
  source = pathlib.Path(config.train.init_from)
  old = workdir_lib.run_config(source)
  if old is None:
    raise WorkdirError(f"train.init_from={str(source)!r} holds no run (no readable config.json); "
                       "train the model to start from there first (e.g. the :smoke MLM config), "
                       f"or give a Hugging Face model directory as {HF}<dir>")
  there, here = workdir_lib.dotted(old), workdir_lib.dotted(config.fields)
  diffs = {how: [f"{k}: {there.get(k)!r} there, {here.get(k)!r} here" for k, mark in
                 config_lib.INIT_FROM.items() if mark == how and there.get(k) != here.get(k)]
           for how in ("refuse", "say")}
  if diffs["refuse"]:
    raise WorkdirError(f"train.init_from={str(source)!r} is a different model or tokenizer: "
                       + "; ".join(diffs["refuse"]))
  with Checkpoints(source / "checkpoints", 1, read_only=True) as checkpoints:
    if checkpoints.latest_step() is None:
      raise WorkdirError(f"train.init_from={str(source)!r} has no checkpoint yet")
  hf_checkpoint.say_allowed(f"train.init_from={str(source)!r}", diffs["say"])
  return config_lib.typed(ml_collections.ConfigDict(old))


def params_from(config, source, params, vocab_size: int):
  """One run's `params` with every parameter that `source` (`init_from_config`'s) has under the same
  path and shape (MLM → classification: all but the MLM head)."""
  where = config.train.init_from
  if isinstance(source, config_lib.Config):  # Its arrays in the per-layer layout.
    with Checkpoints(pathlib.Path(where) / "checkpoints", 1, read_only=True) as checkpoints:
      old_like = jax.eval_shape(program.create_step(source, vocab_size).init, 0, source.optim.lr)
      step, restored, _ = checkpoints.restore_latest(old_like)
    flat_old = flatten_dict(mapping.per_layer_layout(flax.core.unfreeze(restored.params)))
    where = f"{where} step {step}"
  else:  # A Hugging Face state dict (`hf_checkpoint.Weights`).
    flat_old = mapping.gather(source.family, source.state, mapping.per_layer_layout(params))[0]
  if "blocks" in params and any(k[0].startswith("block_") for k in flat_old):
    flat_old = flatten_dict(mapping.scanned_layout(unflatten_dict(flat_old)))
  flat = flatten_dict(flax.core.unfreeze(params))
  copied = [k for k, v in flat.items() if k in flat_old and flat_old[k].shape == v.shape]
  if not copied:
    raise WorkdirError(f"train.init_from={config.train.init_from!r}: no parameter matches this "
                       "model's")
  for k in copied:
    flat[k] = jax.device_put(flat_old[k], flat[k].sharding)
  fresh = sorted({k[0] for k in flat if k not in copied})
  print(f"actlab: initialised {len(copied)} of {len(flat)} parameter arrays from {where}"
        + (f"; new: {', '.join(fresh)}" if fresh else ""), flush=True)
  return unflatten_dict(flat)


def load_run(workdir: pathlib.Path):
  """A trained run's config, tokenizer, `core.Step`, latest parameters (on JAX's first device) and
  their step."""
  config = workdir_lib.run_config(workdir)
  if config is None and workdir_lib.is_sweep(workdir):
    raise WorkdirError(f"{workdir} is a sweep directory; pick one of its cells, e.g. "
                       f"--workdir={workdir / a_cell(workdir)}")
  if config is None:
    raise WorkdirError(f"{workdir} holds no run (no readable actlab config.json); train one with "
                       "actlab.main")
  for field in ("activation", "pooler_activation"):  # Checked as actlab.main checks them.
    if field in config["model"]:
      try:
        activations.get(config["model"][field])
      except ValueError as e:
        raise WorkdirError(f"{workdir} holds a run with model.{field}: {e}; register it again to "
                           "load the run (docs/extending.md)") from None
  config, run_dir = config_lib.typed(ml_collections.ConfigDict(config)), RunDir.open(workdir)
  tokenizer = data.load_tokenizer(config, run_dir.tokenizer)
  run_steps = program.create_step(config, tokenizer.vocab_size)
  with Checkpoints(run_dir.checkpoints, 1, read_only=True) as checkpoints:  # Creates nothing.
    # On this process's first device, whatever devices and hosts the run trained on.
    one_device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    restored = checkpoints.restore_latest(jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=one_device),
        jax.eval_shape(run_steps.init, 0)))
  if restored is None:
    raise WorkdirError(f"{workdir}/checkpoints holds no checkpoint yet")
  step, state, _ = restored
  return config, tokenizer, run_steps, state.params, step


def a_cell(sweep_dir: pathlib.Path) -> str:
  """A cell of the sweep in `sweep_dir` to name: its first with a checkpoint, else its first."""
  names = [c.get("name") for c in (workdir_lib.read_json(sweep_dir / "sweep.json") or {}).get(
      "cells", []) if isinstance(c, dict) and c.get("name")]
  return next((n for n in names if (sweep_dir / n / "checkpoints").is_dir()),
              names[0] if names else "<cell>")
