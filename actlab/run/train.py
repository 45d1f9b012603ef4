"""Trains runs in their workdirs: `run(config, workdir)` one run, `run_group` R runs of one
config that differ only in `optim.lr` and `train.seed` as one program (`steps.Program`), each
in its own workdir with its own log, checkpoints and summary (what `actlab.sweep` does with
`sweep.vectorize`). One run is R = 1 of the same path.

Everything that can refuse a run (config, devices, data, `train.init_from`, the workdirs' configs
and owners) is checked before anything is written. A finished run returns its summary without
touching its files. Runs resume from their latest intact checkpoint (checkpoint.py), exactly.
"""

import contextlib
import dataclasses
import functools
import pathlib
from typing import Callable, Sequence

import flax
import jax
import ml_collections

from actlab import data, models, tasks
from actlab import config as config_lib
from actlab.data import tokenizer_store
from actlab.models import execution, hf_checkpoint
from actlab.run import loop, parallel, steps
from actlab.run.lane import Lane
from actlab.run import workdir as workdir_lib
from actlab.run.checkpoint import Checkpoints
from actlab.run.workdir import RunDir, WorkdirError


# Fields that must agree between a run and the run it is initialised from (`train.init_from`).
INIT_FROM_FIELDS = {"model": ("kind", "activation", "num_layers", "d_model", "num_heads", "d_ff",
                              "gated_match_params", "max_len", "vocab_size", "norm",
                              "type_vocab_size"),
                    "data": ("source", "tokenizer", "tinystories_version")}


HF = "hf:"  # train.init_from=hf:DIR: a Hugging Face GPT-2 or BERT directory (hf_checkpoint.py)


def init_from_config(config: ml_collections.ConfigDict, vocab_size: int = 0):
  """What `train.init_from` names, checked before the workdir is touched: the config of a
  workdir's run (the same model and tokenizer, with a checkpoint), or for `hf:DIR` that
  directory's state dict (its config.json mapped onto this model; `vocab_size`: the
  tokenizer's)."""
  if config.train.init_from.startswith(HF):
    return hf_checkpoint.read(config.train.init_from[len(HF):], config, tasks.get(config).hf,
                              models.pad_vocab(config.model.vocab_size or vocab_size))
  source = pathlib.Path(config.train.init_from)
  old = workdir_lib.read_json(source / "config.json")
  if old is None:
    raise WorkdirError(f"train.init_from={str(source)!r} holds no run (no readable config.json); "
                       "train the model to start from there first (e.g. the :smoke MLM config), "
                       f"or give a Hugging Face model directory as {HF}<dir>")
  diffs = [f"{section}.{k}: {old[section].get(k)!r} there, {config[section].get(k)!r} here"
           for section, keys in INIT_FROM_FIELDS.items() for k in keys
           if old[section].get(k) != config[section].get(k)]
  if diffs:
    raise WorkdirError(f"train.init_from={str(source)!r} is a different model or tokenizer: "
                       + "; ".join(diffs))
  with Checkpoints(source / "checkpoints", 1, read_only=True) as checkpoints:
    if checkpoints.latest_step() is None:
      raise WorkdirError(f"train.init_from={str(source)!r} has no checkpoint yet")
  return ml_collections.ConfigDict(old)


def source_arrays(config: ml_collections.ConfigDict, source, like, vocab_size: int):
  """({path: array} in the per-layer layout, where from) of `source` (`init_from_config`'s) for
  the per-layer parameters `like`."""
  if not isinstance(source, ml_collections.ConfigDict):  # A Hugging Face state dict.
    return hf_checkpoint.arrays(source, tasks.get(config).hf, like), config.train.init_from
  with Checkpoints(pathlib.Path(config.train.init_from) / "checkpoints", 1,
                   read_only=True) as checkpoints:
    old_like = jax.eval_shape(steps.Steps.create(source, vocab_size).init, 0, source.optim.lr)
    step, restored, _ = checkpoints.restore_latest(old_like)
  flat = flax.traverse_util.flatten_dict(
      execution.per_layer_layout(flax.core.unfreeze(restored.params)))
  return flat, f"{config.train.init_from} step {step}"


def pretrained_params(config: ml_collections.ConfigDict, source, params, vocab_size: int):
  """One run's `params` with every parameter that `source` (`init_from_config`'s: a workdir's
  latest intact checkpoint, or a Hugging Face state dict) has under the same path and shape (for
  an MLM → classification run: the embeddings and blocks; the pooler and classifier keep their
  fresh initialisation, the MLM head is dropped)."""
  flat_old, where = source_arrays(config, source, execution.per_layer_layout(params), vocab_size)
  if "blocks" in params and any(k[0].startswith("block_") for k in flat_old):
    flat_old = flax.traverse_util.flatten_dict(
        execution.scanned_layout(flax.traverse_util.unflatten_dict(flat_old)))
  flat = flax.traverse_util.flatten_dict(flax.core.unfreeze(params))
  copied = [k for k, v in flat.items() if k in flat_old and flat_old[k].shape == v.shape]
  if not copied:
    raise WorkdirError(f"train.init_from={config.train.init_from!r}: no parameter matches this "
                       "model's")
  for k in copied:
    flat[k] = jax.device_put(flat_old[k], flat[k].sharding)
  fresh = sorted({k[0] for k in flat if k not in copied})
  print(f"actlab: initialised {len(copied)} of {len(flat)} parameter arrays from {where}"
        + (f"; new: {', '.join(fresh)}" if fresh else ""), flush=True)
  return flax.traverse_util.unflatten_dict(flat)


def load_run(workdir: pathlib.Path):
  """A trained run's config, tokenizer (the copy in its directory; an older run's from the data
  dir), `steps.Steps` and latest parameters on one device, and their step (`actlab.sample`,
  `actlab.export`: one process, JAX's default device, whatever the run trained on)."""
  config = workdir_lib.run_config(workdir)
  if config is None:
    raise WorkdirError(f"{workdir} holds no run (no readable actlab config.json); train one with "
                       "actlab.main")
  config, run_dir = ml_collections.ConfigDict(config), RunDir.open(workdir)
  tokenizer = data.load_tokenizer(config, run_dir.tokenizer)
  run_steps = steps.Steps.create(config, tokenizer.vocab_size)
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


def finished(config: ml_collections.ConfigDict, run_dir: RunDir) -> dict | None:
  """The summary of the run of `config` in `run_dir` if it has ended (trained to the end or
  diverged), else None; raises if the directory holds another run."""
  run_dir.check_config(config)
  return run_dir.summary()


def run(config: ml_collections.ConfigDict, workdir, cache: dict | None = None) -> dict:
  """Trains (or resumes) the run of `config` in `workdir`; returns its summary. `cache` (a dict
  the caller owns, e.g. a sweep) reuses compiled programs across runs (`steps.program`)."""
  return run_group([config], [workdir], cache)[0]


def run_group(configs: Sequence[ml_collections.ConfigDict], workdirs: Sequence,
              cache: dict | None = None, log: Callable[[str], None] = print) -> list[dict]:
  """Trains (or resumes) the runs `configs[i]` in `workdirs[i]` (paths or `RunDir`s) and returns
  their summaries, in order. The unfinished runs that resume at the same step train as one
  program (R states stacked); runs at another step train after them as another."""
  configs = list(configs)
  parallel.initialize(configs[0])  # Before anything asks JAX for a device (`RunDir.open` does).
  run_dirs = [RunDir.open(w) for w in workdirs]
  for c, r in zip(configs, run_dirs):
    config_lib.validate(c)
    workdir_lib.check_usable(r.root)
  steps.check_group(configs)
  unfinished = sum(finished(c, r) is None for c, r in zip(configs, run_dirs))
  if not unfinished:
    return [r.summary() for r in run_dirs]
  c0 = configs[0]
  dataset = tasks.get(c0).dataset(c0)
  vocab_size = dataset.tokenizer.vocab_size
  program = steps.program(c0, vocab_size, unfinished, cache)  # Checks the devices.
  source = init_from_config(c0, vocab_size) if c0.train.init_from else None
  with contextlib.ExitStack() as held:
    for r in run_dirs:
      held.enter_context(r.lock())
    held.enter_context(workdir_lib.full_disk_reported(run_dirs[0].root))
    summaries = [finished(c, r) for c, r in zip(configs, run_dirs)]  # Again, now they are ours.
    by_start = {}  # start step -> [(run index, its Checkpoints, its restored checkpoint)]
    for i, (c, r) in enumerate(zip(configs, run_dirs)):
      if summaries[i] is not None:
        continue
      r.write_config(c)
      if tokenizer_store.load(r.tokenizer) is None:
        tokenizer_store.save(dataset.tokenizer, r.tokenizer)
      checkpoints = held.enter_context(Checkpoints(r.checkpoints, c.train.keep_checkpoints))
      restored = checkpoints.restore_latest(program.run_like())
      by_start.setdefault(restored[0] if restored else 0, []).append((i, checkpoints, restored))
    if len(by_start) > 1 or (len(configs) > 1 and any(summaries)):
      log(f"runs at steps {sorted(by_start)} (or finished): training them by start step, one "
          "after another")
    for start, members in sorted(by_start.items()):
      if program.runs != len(members):
        program = steps.program(c0, vocab_size, len(members), cache)
      group = [configs[i] for i, _, _ in members]
      if start:
        state = program.stack([restored[1] for _, _, restored in members])
      else:
        state = program.start(group)
      if not start and source is not None:  # The trunk of another run (e.g. MLM), GPT-2, BERT.
        state = program.stack([run.replace(params=pretrained_params(c0, source, run.params,
                                                                    vocab_size))
                               for run in map(functools.partial(steps.run_part, state),
                                              range(len(group)))])
      lanes = [Lane.open(c, run_dirs[i], dataclasses.replace(dataset, seed=int(c.train.seed)),
                         ck, start, restored[2] if restored else None)
               for c, (i, ck, restored) in zip(group, members)]
      for (i, _, _), summary in zip(members, loop.train_lanes(program, lanes, state, start,
                                                              vocab_size)):
        summaries[i] = summary
  return summaries
