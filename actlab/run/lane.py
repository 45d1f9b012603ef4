"""One run of the training loop: a `Lane` holds what the loop writes for it (metrics.jsonl, the
trackers, provenance.json, checkpoints, summary.json) and what its checkpoints carry so that a
resumed run continues exactly where it stopped."""

import contextlib
import dataclasses
import functools
import importlib.metadata
import os
import pathlib
import platform
import socket
import subprocess
import sys
from typing import Any

import jax
import ml_collections
import numpy as np

from actlab import tasks
from actlab.infra import metrics_log, parallel, recorded
from actlab.infra import workdir as workdir_lib
from actlab.infra.checkpoint import Checkpoints
from actlab.measure import metrics as metrics_lib
from actlab.measure.histogram import Histogram
from actlab.run import tracking


# --- provenance.json: one segment per start of a run (fresh or resumed) with what it ran with
# (docs/design.md §3.5) ---------------------------------------------------------------------------

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


def segment(config: ml_collections.ConfigDict, start_step: int,
            run_dir: "str | os.PathLike" = ".") -> dict:
  """Where, with what and how this process (re)started the run in `run_dir` at `start_step`; its
  paths as the run directory records them (`recorded.recorded_command`, `recorded_config`)."""
  devices = jax.devices()
  return {
      "start_step": start_step, "started": workdir_lib.now(), **code(),
      "device_kind": devices[0].device_kind, "device_count": len(devices),
      # XLA:CPU splits reductions over its threads, one per CPU this process may use: float32
      # results differ in rounding between CPU counts (docs/sweeps.md, "Using all the hardware").
      "cpus": len(os.sched_getaffinity(0)), "host_cpu": host_cpu(),
      # On a GPU, bitwise runs need --xla_gpu_deterministic_ops=true (docs/guarantees.md).
      "xla_flags": os.environ.get("XLA_FLAGS", ""),
      "deterministic_ops": {"asked": config.train.deterministic_ops,
                            "in_xla_flags": parallel.deterministic_ops()},
      "process_count": jax.process_count(), "host": socket.gethostname(),
      "command": recorded.recorded_command(sys.argv, sys.executable, run_dir),
      "runtime": {k: v for k, v in
                  workdir_lib.dotted(recorded.recorded_config(config, run_dir)).items()
                  if k.startswith(workdir_lib.RUNTIME_FIELDS)},
  }


def append_segment(logdir: pathlib.Path, seg: dict) -> list[dict]:
  """Appends `seg` to provenance.json; returns every segment so far."""
  path = logdir / "provenance.json"
  segments = (workdir_lib.read_json(path) or {}).get("segments", [])
  segments.append(seg)
  workdir_lib.write_json(path, {"segments": segments})
  return segments


# --- The lane -----------------------------------------------------------------------------------


@dataclasses.dataclass
class Lane:
  """One run in `train_lanes`: its files, its trackers (`tracking`) and what its summary reports,
  which each checkpoint keeps (`meta`) so that a resumed lane continues where it stopped."""
  config: ml_collections.ConfigDict
  task: tasks.Task
  run_dir: workdir_lib.RunDir
  dataset: Any            # the run's own training batches (its seed)
  checkpoints: Checkpoints
  log: metrics_log.MetricsLog
  writers: list           # tracking.TensorBoard, tracking.WandB: each gets every row
  segments: list          # provenance.json: one entry per start of the run
  unlogged: list = dataclasses.field(default_factory=list)  # the step metrics since its last
  # row, as its checkpoint restored them (the loop's `Rows.carried` takes them on)
  rates: list = dataclasses.field(default_factory=list)    # tokens/s of each logged interval
  train_time: float = 0.0
  diverged_at: int | None = None
  stopped: bool = False   # diverged and logged: no more rows, no more checkpoints
  summary: dict | None = None  # set by `finish`: the writers get it when they close

  @classmethod
  def open(cls, config: ml_collections.ConfigDict, task: tasks.Task, run_dir: workdir_lib.RunDir,
           dataset, ckpts: Checkpoints, start: int, meta: dict | None) -> "Lane":
    """The run of `config` (of `task`) in `run_dir`, resuming at `start` with the restored
    checkpoint's `meta` (None for a fresh run)."""
    meta, path = meta or {}, run_dir.logdir
    segments = append_segment(path, segment(config, start, run_dir.root))
    return cls(config, task, run_dir, dataset, ckpts,
               metrics_log.MetricsLog(path / "metrics.jsonl", meta.get("rows", []), start),
               tracking.open_writers(config, path, start, segments), segments,
               # The float32 scalars the train step returned: the means that include them
               # are computed exactly as without the interruption.
               [{k: np.float32(v) for k, v in row.items()} for row in meta.get("pending", [])],
               list(meta.get("rates", [])),
               meta.get("train_time", 0.0))

  def write(self, row: dict) -> None:
    """The row's numbers to metrics.jsonl, the whole row (histograms too) to the trackers."""
    row = metrics_lib.jsonable(row)
    self.log.write({k: v for k, v in row.items() if not isinstance(v, Histogram)})
    for writer in self.writers:
      writer.write(row)

  def save(self, step: int, state, carried: list[dict]) -> None:
    """Checkpoints `state` with the lane: its rows, the step metrics since its last row
    (`carried`; float32 values are exact as floats), rates."""
    pending = [{k: float(v) for k, v in row.items()} for row in carried]
    self.checkpoints.save(step, state, {"rows": self.log.rows, "pending": pending,
                                        "rates": self.rates, "train_time": self.train_time})

  def close_writers(self) -> None:
    """Closes the trackers, with the summary if the run ended (`finish`), whatever one raises."""
    with contextlib.ExitStack() as closing:
      for writer in self.writers:
        closing.callback(writer.close, self.summary)

  def finish(self, counts: dict, vocab_size: int, wall_time: float, runs: int,
             timing: dict) -> dict:
    """Writes summary.json (with `vectorized_runs` when `runs` > 1, and `timing`: what this
    process compiled, and the seconds its measurements took) and returns it."""
    steady = self.rates[1:] or self.rates  # Steady state: the first interval includes compilation.
    c = self.config
    verdict = metrics_lib.verdict(
        self.log.rows, warmup_steps=c.optim.warmup_steps,
        uniform_loss=self.task.chance_loss(c, vocab_size), spike_rel=c.metrics.spike_rel,
        final_gap_rel=c.metrics.final_gap_rel, uniform_frac=c.metrics.uniform_frac,
        grad_rel_max=c.metrics.grad_rel_max)
    summary = metrics_lib.jsonable({
        "status": verdict["status"],
        "status_reasons": verdict["reasons"],
        "diverged_at": self.diverged_at if self.diverged_at is not None else verdict["diverged_at"],
        "spike_steps": verdict["spike_steps"],
        "steps": c.train.steps,
        "last_step": self.log.rows[-1]["step"],
        **metrics_lib.summarize(self.log.rows, c.train.steps),
        "wall_time_sec": wall_time,
        "train_time_sec": self.train_time,
        "tokens_per_sec": float(np.median(steady)) if steady else None,
        "params": counts["total"],
        "params_non_embedding": counts["non_embedding"],
        "vocab_size": vocab_size,
        **self.task.baselines(c, self.dataset),
        **({"vectorized_runs": runs} if runs > 1 else {}),
        # Where this process's time went (docs/performance.md): compiling, to the first step,
        # measuring, and measurement's share of the loop's wall time (from step 0's row on).
        "timing": {**timing, "measure_share": sum(timing["measure_sec"].values())
                   / max(wall_time, 1e-9)},
    })
    summary["provenance"] = self.segments
    workdir_lib.write_json(self.run_dir.logdir / "summary.json", summary)
    self.summary = summary
    return summary
