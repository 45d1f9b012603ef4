"""Vectorized sweeps: runs that differ only in learning rate and seed train as one program.

Both live in the train state, not in the compiled step (`optim.py` keeps the peak LR in the
optimizer state; the seed only makes the initial parameters, the run key and the batches), so R
such runs are R states stacked on a leading axis and one `jax.vmap` of `Task.train_step` over
them: one compilation, one dispatch per step, and R times the work per kernel — small models
fill a big accelerator. `train.train_lanes`, the loop of `train.run`, trains the group with a
lane per run: every run keeps its own workdir, metrics.jsonl, TensorBoard log, checkpoints and
summary.json, written as `train.run` writes them, so reports, resuming (also sequentially: the
checkpoints are per run) and the sweep machinery cannot tell the difference;
tests/test_vectorized.py checks that the numbers equal sequential runs (≤ 1e-6).

    summaries = vectorized.train_group(configs, workdirs)   # what actlab.sweep calls

Batches: run r's training batch k is `Dataset.train_batch(k)` of its own seed (one `Dataset` per
seed, sharing the token arrays); the validation windows and the sharpness batch are the same for
every run, as in sequential sweeps. A run that diverges stops being logged and checkpointed at
once (exactly as `train.run` stops), while the others go on; its lane keeps computing harmlessly.

Runs must start from the same step: all fresh, or all resuming from checkpoints of the same step
(`train_group` falls back to sequential `train.run` otherwise, and for a single run).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import pathlib
import time
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

from actlab import config as config_lib
from actlab import data, parallel, train
from actlab import workdir as workdir_lib
from actlab.errors import UserError


class VectorizeError(UserError, ValueError):
  """The runs cannot share one vectorized program; the message says why."""


def check_group(configs: Sequence[ml_collections.ConfigDict], vocab_size: int = 0) -> None:
  """Raises unless the configs differ only in `optim.lr` and `train.seed`."""
  keys = {train.compile_key(c, vocab_size) for c in configs}
  if len(keys) > 1:
    base = json.loads(train.compile_key(configs[0], vocab_size))["config"]
    for c in configs[1:]:
      diffs = workdir_lib.diff_configs(base, json.loads(train.compile_key(c, vocab_size))["config"])
      if diffs:
        raise VectorizeError("vectorized runs may differ only in optim.lr and train.seed; these "
                             "also differ: " + "; ".join(diffs))


@dataclasses.dataclass(frozen=True)
class Group:
  """The jitted, vmapped functions of R runs of one config (stacked states, leading axis R)."""
  task: train.Task
  plan: parallel.Plan
  runs: int
  init: Callable        # (seeds[R], peak_lrs[R]) -> stacked TrainState
  train_step: Callable  # (state, batches[R, B, ...]) -> (state, metrics[R]); donates the state
  eval_step: Callable   # (stacked params, batch) -> stacked loss sums (one batch for all runs)
  sharpness: Callable   # (stacked params, batch) -> [R] top Hessian eigenvalues

  @classmethod
  def create(cls, config: ml_collections.ConfigDict, vocab_size: int, runs: int,
             plan: parallel.Plan | None = None) -> "Group":
    task = train.Task.create(config, vocab_size)
    plan = plan or parallel.plan(config)
    one = jax.eval_shape(task.init, 0, 1.0)
    # Per-run shardings with the run axis in front, unsplit: data parallelism splits each run's
    # batch (axis 1 of the stacked batch), FSDP each run's arrays as it would one run's.
    state_sh = jax.tree.map(
        lambda x: NamedSharding(plan.mesh, P(None, *plan.leaf_sharding(x.shape).spec)), one)
    batch_sh = NamedSharding(plan.mesh, P(None, parallel.AXIS))
    shared_batch_sh = plan.batch_sharding(1)
    eval_fn = functools.partial(task.eval_step, stats=config.metrics.act_stats)
    return cls(
        task, plan, runs,
        jax.jit(jax.vmap(task.init), out_shardings=state_sh),
        jax.jit(jax.vmap(task.train_step), donate_argnums=0, in_shardings=(state_sh, batch_sh),
                out_shardings=(state_sh, NamedSharding(plan.mesh, P()))),
        jax.jit(jax.vmap(eval_fn, in_axes=(0, None)),
                in_shardings=(state_sh.params, shared_batch_sh)),
        jax.jit(jax.vmap(task.sharpness, in_axes=(0, None)),
                in_shardings=(state_sh.params, shared_batch_sh)))

  def shard_batch(self, batches) -> Any:
    """Stacked host batches [R, B, ...] → devices, each run's batch split like one run's."""
    sharding = NamedSharding(self.plan.mesh, P(None, parallel.AXIS))
    def put(x):
      x = np.asarray(x)
      if jax.process_count() == 1:
        return jax.device_put(x, sharding)
      rows = parallel._process_rows(self.plan.mesh, x.shape[1])
      return jax.make_array_from_process_local_data(sharding, x[:, rows], x.shape)
    return jax.tree.map(put, batches)

  def shard_batches(self, batches: list) -> Any:
    """`train.train_lanes`' batch: one host batch per run → `shard_batch` of their stack."""
    return self.shard_batch(np.stack(batches))

  @staticmethod
  def unstack(tree: Any, r: int) -> Any:
    """`train.train_lanes`' lane r of a stacked state or result: run r's."""
    return unstack(tree, r)


def stack(trees: Sequence[Any]) -> Any:
  return jax.tree.map(lambda *xs: jnp.stack(xs), *trees)


def unstack(tree: Any, r: int) -> Any:
  return jax.tree.map(lambda x: x[r], tree)


def _sequential(configs, workdirs, cache) -> list[dict]:
  return [train.run(c, w, cache=cache) for c, w in zip(configs, workdirs)]


def train_group(configs: Sequence[ml_collections.ConfigDict], workdirs: Sequence,
                cache: dict | None = None, log: Callable[[str], None] = print) -> list[dict]:
  """Trains (or resumes) the runs `configs[i]` in `workdirs[i]` as one vectorized program and
  returns their summaries, in order. The configs may differ only in `optim.lr` and
  `train.seed`. Falls back to sequential `train.run` for one run or for runs at different steps.
  Checks and locks every workdir first, as `train.run` does for one.
  """
  configs = list(configs)
  workdirs = [pathlib.Path(w) for w in workdirs]
  for c, w in zip(configs, workdirs):
    config_lib.validate(c)
    workdir_lib.check_usable(w)
  check_group(configs)
  parallel.initialize(configs[0])
  if len(configs) == 1 or any(train.finished(c, w) for c, w in zip(configs, workdirs)):
    return _sequential(configs, workdirs, cache)
  dataset = data.load(configs[0])
  vocab_size = dataset.tokenizer.vocab_size
  c0 = configs[0]
  group = _group(c0, vocab_size, len(configs), cache)
  with contextlib.ExitStack() as held:
    for w in workdirs:
      held.enter_context(workdir_lib.Lock(train.logdir(w)))
    held.enter_context(workdir_lib.full_disk_reported(workdirs[0].parent))
    state = group.init(np.array([c.train.seed for c in configs]),
                       np.array([c.optim.lr for c in configs], np.float32))
    like = train.compiled(c0, vocab_size, cache).init(0, c0.optim.lr)
    for c, w in zip(configs, workdirs):
      workdir_lib.write_config(train.logdir(w), c)
    checkpoints = [train.open_checkpoints(c, w) for c, w in zip(configs, workdirs)]
    try:
      restored = [ck.restore_latest(like) for ck in checkpoints]
    except BaseException:
      for ck in checkpoints:
        ck.close()
      raise
    starts = {r[0] if r else 0 for r in restored}
    if len(starts) > 1 or any(c.train.get("init_from") for c in configs):
      for ck in checkpoints:
        ck.close()
      log("vectorized: runs are at different steps (or fine-tune from a checkpoint); "
          "training them one after another")
      return _sequential(configs, workdirs, cache)
    (start,) = starts
    if start:  # Every run from its own checkpoint, restored like train.run restores one run.
      state = jax.device_put(stack([r[1] for r in restored]),
                             jax.tree.map(lambda x: x.sharding, state))
    lanes = [train.Lane.open(c, w, dataclasses.replace(dataset, seed=int(c.train.seed)), ck,
                             start, r[2] if r else None)
             for c, w, ck, r in zip(configs, workdirs, checkpoints, restored)]
    return train.train_lanes(group, lanes, state, start, vocab_size)


def _group(config, vocab_size, runs, cache) -> Group:
  if cache is None:
    return Group.create(config, vocab_size, runs)
  key = ("vectorized", runs, train.compile_key(config, vocab_size))
  if key not in cache:
    cache[key] = Group.create(config, vocab_size, runs)
  return cache[key]


def sweep_group(cells: Sequence[Any], workdir, cache: dict | None = None,
                log: Callable[[str], None] = print) -> dict[str, dict]:
  """`actlab.sweep`'s hook: trains the unfinished cells of one compile group (objects with
  `.name` and `.config`; workdir `workdir / name`) vectorized, in programs of at most
  `sweep.max_runs` runs, when their config says `sweep.vectorize`. Returns {name: summary} of
  the cells it trained; the sweep runs everything else as before."""
  workdir = pathlib.Path(workdir)
  if not cells or not cells[0].config.get("sweep", {}).get("vectorize", False):
    return {}
  with contextlib.ExitStack() as held:
    todo = []
    for c in cells:  # Unfinished cells that no other process is training, locked for this one.
      if workdir_lib.read_summary(train.logdir(workdir / c.name), warn=False) is None:
        try:
          held.enter_context(workdir_lib.Lock(train.logdir(workdir / c.name)))
          todo.append(c)
        except workdir_lib.Lock.Busy:
          pass  # The sweep's own loop says so.
    if len(todo) < 2:
      return {}
    size = todo[0].config.sweep.get("max_runs", 0) or len(todo)
    out = {}
    for i in range(0, len(todo), size):
      chunk = todo[i:i + size]
      t0 = time.perf_counter()
      summaries = train_group([c.config for c in chunk], [workdir / c.name for c in chunk],
                              cache=cache, log=log)
      for cell, summary in zip(chunk, summaries):
        val = summary.get("final_val_loss")
        log(f"{cell.name}: {summary['status']}, val loss "
            f"{'n/a' if val is None else f'{val:.4f}'} "
            f"(vectorized ×{len(chunk)}, {time.perf_counter() - t0:.0f} s for all)")
        out[cell.name] = summary
    return out
