"""Vectorized sweeps: runs that differ only in learning rate and seed train as one program.

Both live in the train state, not in the compiled step (`optim.py` keeps the peak LR in the
optimizer state; the seed only makes the initial parameters, the run key and the batches), so R
such runs are R states stacked on a leading axis and one `jax.vmap` of `Task.train_step` over
them: one compilation, one dispatch per step, and R times the work per kernel — small models
fill a big accelerator. Every run keeps its own workdir, metrics.jsonl, TensorBoard log,
checkpoints and summary.json, written exactly as `train.run` writes them, so reports, resuming
(also sequentially: the checkpoints are per run) and the sweep machinery cannot tell the
difference; tests/test_vectorized.py checks that the numbers equal sequential runs (≤ 1e-6).

    summaries = vectorized.train_group(configs, workdirs)   # what actlab.sweep calls

Batches: run r's training batch k is `Dataset.train_batch(k)` of its own seed (one `Dataset` per
seed, sharing the token arrays); the validation windows and the sharpness batch are the same for
every run, as in sequential sweeps. A run that diverges stops being logged and checkpointed at
once (exactly as `train.run` stops), while the others go on; its lane keeps computing harmlessly.

Runs must start from the same step: all fresh, or all resuming from checkpoints of the same step
(`train_group` falls back to sequential `train.run` otherwise, and for a single run).
"""

from __future__ import annotations

import concurrent.futures
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
from actlab import data, models, parallel, train
from actlab import metrics as metrics_lib
from actlab.checkpoint import Checkpoints
from actlab.errors import UserError


class VectorizeError(UserError, ValueError):
  """The runs cannot share one vectorized program; the message says why."""


def check_group(configs: Sequence[ml_collections.ConfigDict], vocab_size: int = 0) -> None:
  """Raises unless the configs differ only in `optim.lr` and `train.seed`."""
  keys = {train.compile_key(c, vocab_size) for c in configs}
  if len(keys) > 1:
    base = json.loads(train.compile_key(configs[0], vocab_size))["config"]
    for c in configs[1:]:
      diffs = train.diff_configs(base, json.loads(train.compile_key(c, vocab_size))["config"])
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


def stack(trees: Sequence[Any]) -> Any:
  return jax.tree.map(lambda *xs: jnp.stack(xs), *trees)


def unstack(tree: Any, r: int) -> Any:
  return jax.tree.map(lambda x: x[r], tree)


@dataclasses.dataclass
class _Run:
  """One run's bookkeeping inside the group (what `train.run` keeps in local variables)."""
  config: ml_collections.ConfigDict
  workdir: pathlib.Path
  dataset: Any
  checkpoints: Checkpoints
  log: train.MetricsLog
  tb: Any
  counts: dict
  rates: list = dataclasses.field(default_factory=list)
  train_time: float = 0.0
  diverged_at: int | None = None
  stopped: bool = False   # diverged and logged: no more rows, no more checkpoints

  def write(self, row: dict) -> None:
    row = metrics_lib.jsonable(row)
    self.log.write(row)
    if self.tb:
      self.tb.write(row)


def _logdir(workdir: pathlib.Path) -> pathlib.Path:
  """As train.run: process 0 writes a run's files, process i > 0 its copies in process_<i>/."""
  i = jax.process_index()
  return workdir / f"process_{i}" if i else workdir


def _sequential(configs, workdirs, cache) -> list[dict]:
  return [train.run(c, w, cache=cache) for c, w in zip(configs, workdirs)]


def train_group(configs: Sequence[ml_collections.ConfigDict], workdirs: Sequence,
                cache: dict | None = None, log: Callable[[str], None] = print) -> list[dict]:
  """Trains (or resumes) the runs `configs[i]` in `workdirs[i]` as one vectorized program and
  returns their summaries, in order. The configs may differ only in `optim.lr` and
  `train.seed`. Falls back to sequential `train.run` for one run or for runs at different steps.
  """
  configs = list(configs)
  workdirs = [pathlib.Path(w) for w in workdirs]
  for c in configs:
    config_lib.validate(c)
  check_group(configs)
  parallel.initialize(configs[0])
  if len(configs) == 1:
    return _sequential(configs, workdirs, cache)
  dataset = data.load(configs[0])
  vocab_size = dataset.tokenizer.vocab_size
  for c, w in zip(configs, workdirs):
    train.prepare_workdir(_logdir(w), c)
  starts = []
  for w, c in zip(workdirs, configs):
    summary_path = _logdir(w) / "summary.json"
    if summary_path.exists():
      starts.append(None)  # finished (or diverged) before
      continue
    ck = Checkpoints((w / "checkpoints").absolute(), c.train.keep_checkpoints)
    starts.append(ck.latest_step() or 0)
    ck.close()
  if None in starts or len(set(starts)) > 1 or any(c.train.get("init_from") for c in configs):
    log("vectorized: runs are at different steps (or fine-tune from a checkpoint); "
        "training them one after another")
    return _sequential(configs, workdirs, cache)
  return _train(configs, workdirs, dataset, vocab_size, starts[0], cache)


def _group(config, vocab_size, runs, cache) -> Group:
  if cache is None:
    return Group.create(config, vocab_size, runs)
  key = ("vectorized", runs, train.compile_key(config, vocab_size))
  if key not in cache:
    cache[key] = Group.create(config, vocab_size, runs)
  return cache[key]


def _train(configs, workdirs, dataset, vocab_size, start, cache) -> list[dict]:
  R = len(configs)
  c0 = configs[0]
  t, m = c0.train, c0.metrics
  group = _group(c0, vocab_size, R, cache)
  plan = group.plan
  seeds = np.array([c.train.seed for c in configs])
  lrs = np.array([c.optim.lr for c in configs], np.float32)
  state = group.init(seeds, lrs)
  if start:  # Every run from its own checkpoint, restored like train.run restores one run.
    like = train.compiled(c0, vocab_size, cache).init(0, c0.optim.lr)
    restored = []
    for c, w in zip(configs, workdirs):
      ck = Checkpoints((w / "checkpoints").absolute(), c.train.keep_checkpoints)
      try:
        restored.append(ck.restore(start, like))
      finally:
        ck.close()
    state = jax.device_put(stack(restored), jax.tree.map(lambda x: x.sharding, state))
  runs = []
  for r, (c, w) in enumerate(zip(configs, workdirs)):
    logdir = _logdir(w)
    runs.append(_Run(
        c, logdir, dataclasses.replace(dataset, seed=int(c.train.seed)),
        Checkpoints((w / "checkpoints").absolute(), c.train.keep_checkpoints),
        train.MetricsLog(logdir / "metrics.jsonl", start),
        metrics_lib.TensorBoard(logdir / "tb", purge_step=start) if c.metrics.tensorboard
        else None,
        models.count_params(unstack(state.params, r))))

  val_batches = [plan.shard_batch(b) for b in dataset.val_batches()]
  sharpness_batch = (plan.shard_batch(dataclasses.replace(dataset, seed=0).train_batch(0))
                     if m.sharpness_every else None)
  tokens_per_step = t.batch_size * c0.data.seq_len

  def evaluate(params) -> list[dict]:
    """Every run's `train.evaluate_metrics`, from one vmapped pass over the validation set."""
    outs = jax.device_get([group.eval_step(params, b) for b in val_batches])
    return [train.evaluate_metrics(lambda _, o: o, None, [unstack(o, r) for o in outs])
            for r in range(R)]

  def sharpness(params) -> np.ndarray:
    return np.asarray(jax.device_get(group.sharpness(params, sharpness_batch)))

  if start == 0:
    evals = evaluate(state.params)
    sharp = sharpness(state.params) if m.sharpness_every else None
    for r, run in enumerate(runs):
      row = {"step": 0, **evals[r]}
      if sharp is not None:
        row["sharpness"] = float(sharp[r])
      run.write(row)
  print(f"actlab: {R} vectorized runs of {c0.model.kind} {c0.model.activation}, "
        f"{runs[0].counts['non_embedding'] / 1e6:.2f}M parameters without the token embedding "
        f"({runs[0].counts['total'] / 1e6:.2f}M total); lr {', '.join(f'{x:g}' for x in lrs)}; "
        f"seeds {', '.join(map(str, seeds))}; "
        f"{'resuming at step %d' % start if start else 'fresh runs'}", flush=True)

  stop = train.StopRequest()
  prefetch = concurrent.futures.ThreadPoolExecutor(max_workers=1)
  fetch = lambda k: prefetch.submit(
      lambda: group.shard_batch(np.stack([run.dataset.train_batch(k) for run in runs])))
  pending = []
  t0 = wall0 = time.perf_counter()
  next_batch = fetch(start)
  try:
    for step in range(start, t.steps):
      batch = next_batch.result()
      if step + 1 < t.steps:
        next_batch = fetch(step + 1)
      state, metrics = group.train_step(state, batch)
      if plan.sync_each_step:
        jax.block_until_ready(metrics)
      pending.append(metrics)
      done = step + 1
      is_last = done == t.steps
      evaluate_now = done % t.eval_every == 0 or is_last
      sharpness_now = bool(m.sharpness_every) and done % m.sharpness_every == 0
      save_now = done % t.checkpoint_every == 0 or is_last or stop.signum
      log_now = done % t.log_every == 0 or evaluate_now or sharpness_now or stop.signum
      if not (log_now or save_now):
        continue
      stacked = jax.device_get(pending)  # The loop's only host sync: log and save steps.
      elapsed = time.perf_counter() - t0
      active = [r for r, run in enumerate(runs) if not run.stopped]
      rows, logs = {}, {}
      for r in active:
        rows[r] = [unstack(s, r) for s in stacked]
        bad = metrics_lib.first_nonfinite(rows[r])
        logs[r] = log_now
        if bad is not None:  # As train.run: log the rows up to the first bad step, then stop.
          runs[r].diverged_at = done - len(rows[r]) + bad + 1
          rows[r], logs[r] = rows[r][:bad + 1], True
      any_eval = evaluate_now and any(logs[r] and runs[r].diverged_at is None for r in active)
      evals = evaluate(state.params) if any_eval else None
      any_sharp = sharpness_now and any(logs[r] and runs[r].diverged_at is None for r in active)
      sharp = sharpness(state.params) if any_sharp else None
      for r in active:
        run = runs[r]
        if logs[r]:
          run.train_time += elapsed
          # Each run's rate as it experiences it: its tokens over the group's wall time.
          run.rates.append(len(rows[r]) * tokens_per_step / elapsed)
          row = {"step": run.diverged_at or done, **{k: float(v) for k, v in rows[r][-1].items()},
                 "train_loss": float(np.mean([x["train_loss"] for x in rows[r]])),
                 "tokens_per_sec": run.rates[-1]}
          if evaluate_now and run.diverged_at is None:
            row.update(evals[r])
            if not metrics_lib.finite(row["val_loss"]):
              run.diverged_at = done
          if sharpness_now and run.diverged_at is None:
            row["sharpness"] = float(sharp[r])
          run.write(row)
        if run.diverged_at is not None:
          run.stopped = True  # The last good checkpoint stays the latest one.
        elif save_now:
          run.checkpoints.save(done, unstack(state, r))
      pending = []
      if all(run.stopped for run in runs):
        break
      if stop.signum:
        raise train.Interrupted(f"stopped by signal {stop.signum} at step {done}; checkpoints "
                                "saved; rerun the same command to resume", stop.signum)
      t0 = time.perf_counter()  # Restart the clock after host work (logging, eval, checkpoint).
  finally:
    prefetch.shutdown(wait=True)
    for run in runs:
      run.checkpoints.close()
      if run.tb:
        run.tb.close()
    stop.restore()

  wall = time.perf_counter() - wall0
  summaries = []
  for run in runs:
    steady = run.rates[1:] or run.rates
    verdict = metrics_lib.verdict_for(run.log.rows, run.config, vocab_size)
    summary = metrics_lib.jsonable({
        "status": verdict["status"],
        "status_reasons": verdict["reasons"],
        "diverged_at": run.diverged_at if run.diverged_at is not None else verdict["diverged_at"],
        "spike_steps": verdict["spike_steps"],
        "steps": run.config.train.steps,
        "last_step": run.log.rows[-1]["step"],
        **metrics_lib.summarize(run.log.rows, run.config.train.steps),
        "wall_time_sec": wall,
        "train_time_sec": run.train_time,
        "tokens_per_sec": float(np.median(steady)) if steady else None,
        "params": run.counts["total"],
        "params_non_embedding": run.counts["non_embedding"],
        "vocab_size": vocab_size,
        "vectorized_runs": R,
    })
    (run.workdir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    summaries.append(summary)
  return summaries


def sweep_group(cells: Sequence[Any], workdir, cache: dict | None = None,
                log: Callable[[str], None] = print) -> dict[str, dict]:
  """`actlab.sweep`'s hook: trains the unfinished cells of one compile group (objects with
  `.name` and `.config`; workdir `workdir / name`) vectorized, in programs of at most
  `sweep.max_runs` runs, when their config says `sweep.vectorize`. Returns {name: summary} of
  the cells it trained; the sweep runs everything else as before."""
  workdir = pathlib.Path(workdir)
  todo = [c for c in cells if not (workdir / c.name / "summary.json").exists()]
  if len(todo) < 2 or not todo[0].config.get("sweep", {}).get("vectorize", False):
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
      log(f"{cell.name}: {summary['status']}, val loss {'n/a' if val is None else f'{val:.4f}'} "
          f"(vectorized ×{len(chunk)}, {time.perf_counter() - t0:.0f} s for all)")
      out[cell.name] = summary
  return out
