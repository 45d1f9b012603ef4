"""What the training loop writes: each run's rows, checkpoints, provenance.json and summary.json
(a `Lane` per run); `Rows`, a row's whole state and the one way a row is written; `Measure`, the
evaluation and sharpness estimate; the line per evaluation and the progress bar.
"""

import contextlib
import dataclasses
import functools
import hashlib
import importlib.metadata
import os
import pathlib
import platform
import socket
import subprocess
import sys
import threading
import time
import weakref
from typing import Any, Mapping

import jax
import numpy as np
import tqdm

from actlab import config as config_lib, tasks
from actlab.infra import parallel, workdir
from actlab.infra.checkpoint import Checkpoints
from actlab.infra.errors import UserError
from actlab.measure import evaluators as evaluators_lib
from actlab.measure import metrics as metrics_lib
from actlab.measure.histogram import Histogram
from actlab.run.program import Program

# --- provenance.json: one segment per start of a run, with what it ran with (design.md §3.5) -----

PACKAGES = ("actlab", "jax", "jaxlib", "flax", "optax", "orbax-checkpoint", "numpy")


def _git(*args: str) -> str | None:
  try:
    out = subprocess.run(["git", *args], cwd=pathlib.Path(__file__).parent, capture_output=True,
                         text=True, timeout=10)
  except (OSError, subprocess.SubprocessError):
    return None
  return out.stdout.strip() if out.returncode == 0 else None


def host_cpu() -> str:
  """The host's processor as the OS names it (/proc/cpuinfo's model name on Linux)."""
  cpu = platform.processor() or platform.machine()
  with contextlib.suppress(OSError, StopIteration), open("/proc/cpuinfo") as f:
    cpu = next(l.split(":", 1)[1].strip() for l in f if l.startswith("model name"))
  return cpu


@functools.cache
def code() -> dict:
  """The PACKAGES' versions, and actlab's git commit and dirty flag when it runs from a checkout."""
  versions = dict.fromkeys(PACKAGES)
  for name in PACKAGES:
    with contextlib.suppress(importlib.metadata.PackageNotFoundError):
      versions[name] = importlib.metadata.version(name)
  commit = _git("rev-parse", "HEAD")
  status = _git("status", "--porcelain", "--untracked-files=no") if commit else None
  return {"versions": versions, "git_commit": commit,
          "git_dirty": None if status is None else bool(status)}


def segment(config, start_step: int, run_dir: "str | os.PathLike" = ".") -> dict:
  """How this process (re)started the run in `run_dir` at `start_step`: where, with what."""
  config = config_lib.typed(config)
  devices = jax.devices()
  recorded = workdir.dotted(workdir.recorded_config(config.fields, run_dir))
  return {
      "start_step": start_step, "started": workdir.now(), **code(),
      "device_kind": devices[0].device_kind, "device_count": len(devices),
      # XLA:CPU splits reductions over its threads, one per CPU this process may use: float32
      # results differ in rounding between CPU counts (docs/sweeps.md, "Using all the hardware").
      "cpus": len(os.sched_getaffinity(0)), "host_cpu": host_cpu(),
      "xla_flags": os.environ.get("XLA_FLAGS", ""),
      "deterministic_ops": {"asked": config.train.deterministic_ops,
                            "in_xla_flags": parallel.deterministic_ops()},
      "process_count": jax.process_count(), "host": socket.gethostname(),
      "command": workdir.recorded_command(sys.argv, sys.executable, run_dir),
      "runtime": {k: v for k, v in recorded.items() if k.startswith(config_lib.RUNTIME_FIELDS)},
  }


def append_segment(logdir: pathlib.Path, seg: dict) -> list[dict]:
  """Appends `seg` to provenance.json; returns every segment so far."""
  path = logdir / "provenance.json"
  segments = (workdir.read_json(path) or {}).get("segments", [])
  segments.append(seg)
  workdir.write_json(path, {"segments": segments})
  return segments


# --- The trackers (docs/tracking.md): each takes every row, histograms too, and is closed with the
# run's summary (None when it stopped early) ----------------------------------------------------


def tensorboardx():
  """tensorboardX without torch, which its writer imports (about 2 s) for tensors actlab never
  logs."""
  if "torch" in sys.modules:
    import tensorboardX
    return tensorboardX
  sys.modules["torch"] = None  # `import torch` raises ImportError while tensorboardX loads
  try:
    import tensorboardX
  finally:
    del sys.modules["torch"]
  return tensorboardX


def _scalars(row: Mapping[str, Any]):
  return ((k, v) for k, v in row.items()
          if k != "step" and isinstance(v, (int, float)) and not isinstance(v, bool))


def _histograms(row: Mapping[str, Any]):
  return ((k, v) for k, v in row.items() if isinstance(v, Histogram))


_WRITERS = weakref.WeakKeyDictionary()  # tensorboardX's threads → the error that ended it or None
_other_threads_hook = threading.excepthook


def _keep_writer_errors(args) -> None:
  """`threading.excepthook`: keeps the error that ends a writer's thread for the run to raise."""
  if args.thread in _WRITERS:
    _WRITERS[args.thread] = args.exc_value
  else:
    _other_threads_hook(args)


class TensorBoard:
  """Every row in `logdir`; `purge_step` (the resumed step) hides the events after it. An error
  that ends the writer's thread (a full disk) is raised at the next row or at `close`; its queue
  is unbounded, so that no row waits for a thread that is gone."""

  def __init__(self, logdir: pathlib.Path, purge_step: int | None = None):
    global _other_threads_hook
    if threading.excepthook is not _keep_writer_errors:
      _other_threads_hook, threading.excepthook = threading.excepthook, _keep_writer_errors
    before = set(threading.enumerate())
    self._writer = tensorboardx().SummaryWriter(str(logdir), purge_step=purge_step or None,
                                                max_queue=0)
    self._threads = set(threading.enumerate()) - before
    _WRITERS.update(dict.fromkeys(self._threads))

  def _raise_writer_error(self) -> None:
    for thread in self._threads:
      if (error := _WRITERS.get(thread)) is not None:
        _WRITERS[thread] = None
        raise error

  def write(self, row: Mapping[str, Any]) -> None:
    self._raise_writer_error()
    for key, value in _scalars(row):
      self._writer.add_scalar(key, value, row["step"])
    for key, hist in _histograms(row):
      edges, counts = hist.buckets()
      self._writer.add_histogram_raw(key, hist.min, hist.max, hist.num, hist.sum,
                                     hist.sum_squares, edges[1:].tolist(), counts.tolist(),
                                     row["step"])

  def close(self, summary: dict | None = None) -> None:
    del summary  # TensorBoard shows the rows; the summary is summary.json's.
    self._writer.close()  # Flushes first.
    self._raise_writer_error()


def wandb_run_id(logdir: pathlib.Path, first_segment: Mapping) -> str:
  """The W&B run id of the run in `logdir`, the same at every start (its path, first host, first
  start)."""
  key = f"{logdir.resolve()}|{first_segment.get('host')}|{first_segment.get('started')}"
  return "actlab-" + hashlib.sha256(key.encode()).hexdigest()[:16]


class WandB:
  """Every row logged to a W&B run, one per workdir across resumes."""

  def __init__(self, config, logdir: pathlib.Path, run_id: str):
    import wandb  # An optional extra, checked by config.validate.
    m = config.metrics
    sweep_dir = logdir.parent if (logdir.parent / "sweep.json").exists() else None
    try:
      self._run = wandb.init(
          project=m.wandb_project, mode=m.wandb_mode or None, dir=str(logdir), id=run_id,
          resume="allow", name=logdir.name, group=sweep_dir.name if sweep_dir else None,
          config=config_lib.typed(config).fields, reinit="create_new")
    except wandb.Error as e:
      raise UserError(f"metrics.wandb_project={m.wandb_project!r}: W&B refused the run ({e}); "
                      "log in (`wandb login`) or set --config.metrics.wandb_mode=offline") from None
    self._wandb = wandb

  def write(self, row: Mapping[str, Any]) -> None:
    data = dict(_scalars(row))
    for key, hist in _histograms(row):
      edges, counts = hist.buckets()
      data[key] = self._wandb.Histogram(np_histogram=(counts.tolist(), edges.tolist()))
    self._run.log(data, step=int(row["step"]))

  def close(self, summary: dict | None = None) -> None:
    if summary is not None:
      self._run.summary.update({k: v for k, v in summary.items() if k != "provenance"})
    self._run.finish(exit_code=0 if summary is not None else 1)


# --- A run's files --------------------------------------------------------------------------------


@dataclasses.dataclass
class Lane:
  """One run in the loop: its config, task and batches (its seed's), and its files."""
  config: Any             # config.Config
  task: tasks.Task
  run_dir: workdir.RunDir
  dataset: Any
  checkpoints: Checkpoints
  log: workdir.MetricsLog
  writers: list           # TensorBoard, WandB
  segments: list          # provenance.json: one entry per start of the run
  meta: dict              # its restored checkpoint's (rows, pending, rates, train_time); {} if none
  summary: dict | None = None  # the writers get it when they close

  @classmethod
  def open(cls, config, task: tasks.Task, run_dir: workdir.RunDir, dataset, ckpts: Checkpoints,
           start: int, meta: dict | None) -> "Lane":
    """The run of `config` in `run_dir`, resuming at `start` with its checkpoint's `meta`, and its
    trackers (W&B on process 0)."""
    meta, path = meta or {}, run_dir.logdir
    segments = append_segment(path, segment(config, start, run_dir.root))
    writers = [TensorBoard(path / "tb", purge_step=start)] if config.metrics.tensorboard else []
    if config.metrics.wandb_project and jax.process_index() == 0:
      try:
        writers.append(WandB(config, path, wandb_run_id(path, segments[0])))
      except BaseException:
        for w in writers:
          w.close()
        raise
    return cls(config, task, run_dir, dataset, ckpts,
               workdir.MetricsLog(path / "metrics.jsonl", meta.get("rows", []), start),
               writers, segments, meta)

  def write(self, row: dict) -> None:
    """The row's numbers to metrics.jsonl, the whole row (histograms too) to the trackers."""
    row = metrics_lib.jsonable(row)
    self.log.write({k: v for k, v in row.items() if not isinstance(v, Histogram)})
    for writer in self.writers:
      writer.write(row)

  def close_writers(self) -> None:
    """Closes the trackers, with the summary if the run ended, whatever one raises."""
    with contextlib.ExitStack() as closing:
      for writer in self.writers:
        closing.callback(writer.close, self.summary)


# --- What a row measures --------------------------------------------------------------------------


class Measure:
  """A row's evaluation (the test windows' loss too at the last step) and sharpness estimate, of
  every lane in one pass on the devices, and their cost (`sec`)."""

  def __init__(self, program: Program, dataset, doing):
    self.program, self.doing = program, doing
    self.val_batches = [program.plan.shard_batch(b) for b in dataset.val_batches()]  # Once.
    self.test_batches = [program.plan.shard_batch(b) for b in dataset.val_batches(test=True)]
    self.sharpness_batch = program.sharpness_batch(dataset)
    self.sec = {"evaluation": 0.0, "sharpness": 0.0}

  def evaluation(self, params, test: bool = False) -> list[dict]:
    """Each run's validation metrics; with `test`, also the test windows', `test_*`."""
    self.doing("evaluating")
    t0 = time.perf_counter()
    evals = self.pool_evaluation(jax.device_get(self.dispatch_evaluation(params)))
    if test and self.test_batches:
      outs = jax.device_get([self.program.eval_step(params, b)["loss"]
                             for b in self.test_batches])
      for r, ev in enumerate(evals):
        pooled = evaluators_lib.Loss().pool(self.program.part(outs, r))
        ev.update({"test_" + k.removeprefix("val_"): v for k, v in pooled.items()})
    self.sec["evaluation"] += time.perf_counter() - t0
    return evals

  def dispatch_evaluation(self, params) -> list:
    """The validation evaluators' device values on every validation batch (not waited for)."""
    return [self.program.eval_step(params, b) for b in self.val_batches]

  def pool_evaluation(self, outs: list) -> list[dict]:
    """Each run's validation metrics from `dispatch_evaluation`'s values, fetched."""
    return [self.program.evaluators.pool(self.program.part(outs, r))
            for r in range(self.program.runs)]

  def sharpness(self, params) -> list[float]:
    """Each run's sharpness estimate."""
    self.doing("sharpness")
    t0 = time.perf_counter()
    out = jax.device_get(self.program.sharpness_step(params, self.sharpness_batch))
    self.sec["sharpness"] += time.perf_counter() - t0
    return [float(self.program.part(out, r)) for r in range(self.program.runs)]


# --- The rows -------------------------------------------------------------------------------------

TIMED = ("tokens_per_sec",)  # a row's measures of time: the one part two equal trainings differ in


def untimed(row: dict) -> dict:
  """A metrics row without its measures of time (`TIMED`): what a training repeated with the
  same numerics writes again bit for bit."""
  return {k: v for k, v in row.items() if k not in TIMED}


class Rows:
  """Every lane's rows and all their state: the step metrics on the devices (`pending`), a plain
  row waiting for the next dispatch (`behind`), each lane's metrics fetched since its row
  (`carried`), rates, training time, divergence, step 0's row and the rows held behind it
  (`held`), the clock and the bar. `write` is the one way a row is written."""

  def __init__(self, program: Program, lanes: list[Lane], start: int):
    self.program, self.lanes = program, lanes
    config = lanes[0].config
    self.tokens_per_step = config.train.batch_size * config.data.seq_len
    self.bar = tqdm.tqdm(total=config.train.steps, initial=start, unit="step", dynamic_ncols=True,
                         disable=not config.train.progress or len(lanes) > 1)
    self.measure = Measure(program, lanes[0].dataset, self.doing)
    self.pending, self.behind = [], None  # behind: the step of a plain row not yet written
    # The float32 scalars the train step returned: the means that include them are computed as
    # without the interruption.
    self.carried = [[{k: np.float32(v) for k, v in row.items()}
                     for row in lane.meta.get("pending", [])] for lane in lanes]
    self.rates = [list(lane.meta.get("rates", [])) for lane in lanes]  # tokens/s of each row
    self.train_time = [lane.meta.get("train_time", 0.0) for lane in lanes]
    self.diverged_at = [None] * len(lanes)
    self.stopped = [False] * len(lanes)  # diverged and logged: no more rows, no checkpoints
    self.zero_params = self.zero_out = None  # step 0's parameters, then its device results
    self.held = None  # [(step, each lane's row)] behind step 0's row while it is measured
    self.steps, self.t0, self.wall0, self.elapsed = 0, None, None, None

  def doing(self, what: str, refresh: bool = True) -> None:
    """What the loop waits for, in the bar's description."""
    self.bar.set_description(what, refresh=refresh)

  def start_clock(self) -> None:
    """The clock and the count of the steps it times, from now (after a row's host work)."""
    self.doing("training", refresh=False)
    self.steps, self.t0 = 0, time.perf_counter()
    self.wall0 = self.wall0 or self.t0

  def add(self, metrics) -> None:
    """A step's metrics, kept on the devices until its row, once the plain row `behind` it is
    written (fetched while this step runs) and the clock restarted."""
    if self.behind is not None:
      done, self.behind = self.behind, None
      self.write(done, self.fetch(done))
      self.start_clock()
    self.pending.append(metrics)

  def fetch(self, done: int, log: bool = True) -> dict[int, list]:
    """Fetches the steps on the devices to each running lane's `carried`; returns the steps of the
    lanes that write a row now: every one where `log`, and one whose metrics turned non-finite, up
    to its first such step (it then stops)."""
    pending, self.pending = self.pending, []
    if self.zero_params is not None:  # Step 0's measurements, where their programs are ready.
      self.dispatch_step_zero()
    fetched = jax.device_get(pending)
    self.steps += len(fetched)
    self.elapsed = time.perf_counter() - self.t0
    if self.zero_out is not None:  # Step 0's row is measured: it is written first.
      self.settle_step_zero()
    due = {}
    for r in range(len(self.lanes)):
      if self.stopped[r]:
        continue
      steps = self.carried[r] = self.carried[r] + [self.program.part(x, r) for x in fetched]
      bad = metrics_lib.first_nonfinite(steps)
      if bad is not None:  # Log the rows up to the first bad step, then stop.
        self.diverged_at[r], due[r] = done - len(steps) + bad + 1, steps[:bad + 1]
      elif log:
        due[r] = steps
    return due

  def write(self, done: int, due: dict[int, list], evals: list[dict] | None = None,
            sharpness: list[float] | None = None) -> None:
    """Writes the rows `fetch` found `due` at step `done`, with each lane's evaluation (a
    non-finite validation loss: it has diverged) and sharpness estimate where given."""
    self.doing("training", refresh=False)
    rows = {}
    for r, steps in due.items():
      self.train_time[r] += self.elapsed
      # Each run's rate as it experiences it: its tokens over the loop's wall time.
      self.rates[r].append(self.steps * self.tokens_per_step / self.elapsed)
      row = {"step": self.diverged_at[r] or done, **metrics_lib.interval(steps),
             "tokens_per_sec": self.rates[r][-1]}
      if len(self.rates[r]) == 1:  # The run's first row after step 0's: steps[0] is step 0's.
        row["grad_norm_init"] = float(steps[0]["grad_norm"])
      if evals is not None and self.diverged_at[r] is None:
        row.update(evals[r])
        if not metrics_lib.finite(row["val_loss"]):
          self.diverged_at[r] = done
      if sharpness is not None and self.diverged_at[r] is None:
        row["sharpness"] = sharpness[r]
      rows[r] = row
      self.carried[r] = []
      self.bar.set_postfix(loss=f"{row['train_loss']:.3f}", tok_s=f"{row['tokens_per_sec']:,.0f}",
                           refresh=False)
      self.bar.update(self.steps)
    self.emit(done, rows)
    self.stopped = [s or d is not None for s, d in zip(self.stopped, self.diverged_at)]

  def emit(self, step: int, rows: dict[int, dict]) -> None:
    """The rows of `step` to their lanes, and a line per evaluation (nanoGPT's `step N: train loss
    …, val loss …`); or held behind step 0's row while it is measured."""
    if self.held is not None:
      self.held.append((step, rows))
      return
    for r, row in rows.items():
      self.lanes[r].write(row)
      if "val_loss" in row:
        c = self.lanes[r].config
        run = f" (lr {c.optim.lr:g}, seed {c.train.seed})" if len(self.lanes) > 1 else ""
        losses = [f"{k.removesuffix('_loss')} loss {row[k]:.4f}"
                  for k in ("train_loss", "val_loss", "test_loss") if k in row]
        tqdm.tqdm.write(f"step {step}{run}: {', '.join(losses)}")

  def checkpoint(self, done: int, states: list) -> None:
    """Checkpoints each running lane's state with its rows (step 0's first), the step metrics
    since its last row (float32 values are exact as floats), its rates and training time."""
    self.settle_step_zero()
    for r, lane in enumerate(self.lanes):
      if not self.stopped[r]:
        lane.checkpoints.save(done, states[r], {
            "rows": lane.log.rows, "pending": [{k: float(v) for k, v in row.items()}
                                               for row in self.carried[r]],
            "rates": self.rates[r], "train_time": self.train_time[r]})

  # Step 0's row is measured beside the first steps, so that the first step never waits for its
  # programs' compiles: on a copy of the initial parameters (the first step donates them), at the
  # first row that finds them compiled (with several processes, at the first row: they launch the
  # same programs in the same order).

  def measure_step_zero(self, params) -> None:
    self.zero_params = jax.device_put(params, self.program.shardings.params, may_alias=False)
    self.held = []

  def dispatch_step_zero(self, wait: bool = False) -> None:
    """Dispatches step 0's measurements once their programs are compiled (with `wait`, now: the
    wait counts as their cost) and lets the copy of the parameters go."""
    program, measure = self.program, self.measure
    programs = {kind: p for kind, p in (("evaluation", program.eval_step),
                                        ("sharpness", program.sharpness_step)) if p}
    if wait or jax.process_count() > 1:
      for kind, p in programs.items():
        t0 = time.perf_counter()
        p.ready()
        measure.sec[kind] += time.perf_counter() - t0
    elif not all(p.done for p in programs.values()):
      return
    params, self.zero_params = self.zero_params, None
    self.zero_out = (measure.dispatch_evaluation(params), None if program.sharpness_step is None
                     else program.sharpness_step(params, measure.sharpness_batch))
    if program.plan.sync_each_step:
      jax.block_until_ready(self.zero_out)

  def settle_step_zero(self) -> None:
    """Writes step 0's row, measured now if it was not yet, then the rows held behind it."""
    if self.held is None:
      return
    if self.zero_params is not None:
      self.dispatch_step_zero(wait=True)
    # Their cost: the waits for their results (their dispatch may wait for the queue of steps).
    t0 = time.perf_counter()
    evals = self.measure.pool_evaluation(jax.device_get(self.zero_out[0]))
    t1 = time.perf_counter()
    sharp = None if self.zero_out[1] is None else jax.device_get(self.zero_out[1])
    self.measure.sec["evaluation"] += t1 - t0
    self.measure.sec["sharpness"] += time.perf_counter() - t1
    held, self.held, self.zero_out = self.held, None, None
    self.emit(0, {r: {"step": 0, **ev, **({} if sharp is None else
                                           {"sharpness": float(self.program.part(sharp, r))})}
                  for r, ev in enumerate(evals)})
    for step, rows in held:
      self.emit(step, rows)

  def summaries(self, counts: dict, vocab_size: int, timing: dict) -> list[dict]:
    """Each lane's summary.json (docs/metrics.md §7), written: its verdict, its final numbers,
    `timing` (what the process compiled, the seconds its measurements took) and, for R > 1,
    `vectorized_runs`."""
    wall_time, out = time.perf_counter() - self.wall0, []
    timing = {**timing, "measure_share": sum(timing["measure_sec"].values())
              / max(wall_time, 1e-9)}
    for r, lane in enumerate(self.lanes):
      c, rows = lane.config, lane.log.rows
      steady = self.rates[r][1:] or self.rates[r]  # The first interval includes compilation.
      verdict = metrics_lib.verdict(
          rows, warmup_steps=c.optim.warmup_steps,
          uniform_loss=lane.task.chance_loss(c, vocab_size), spike_rel=c.metrics.spike_rel,
          final_gap_rel=c.metrics.final_gap_rel, uniform_frac=c.metrics.uniform_frac,
          grad_rel_max=c.metrics.grad_rel_max)
      lane.summary = {**metrics_lib.jsonable({
          "status": verdict["status"], "status_reasons": verdict["reasons"],
          "diverged_at": (self.diverged_at[r] if self.diverged_at[r] is not None
                          else verdict["diverged_at"]),
          "spike_steps": verdict["spike_steps"], "steps": c.train.steps,
          "last_step": rows[-1]["step"], **metrics_lib.summarize(rows, c.train.steps),
          "wall_time_sec": wall_time, "train_time_sec": self.train_time[r],
          "tokens_per_sec": float(np.median(steady)) if steady else None,
          "params": counts["total"], "params_non_embedding": counts["non_embedding"],
          "vocab_size": vocab_size, **lane.task.baselines(c, lane.dataset),
          **({"vectorized_runs": len(self.lanes)} if len(self.lanes) > 1 else {}),
          "timing": timing}), "provenance": lane.segments}
      workdir.write_json(lane.run_dir.logdir / "summary.json", lane.summary)
      out.append(lane.summary)
    return out
