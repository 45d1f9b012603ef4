"""The training loop, shaped like nanodo's, for the runs of one `Program` (a `Lane` each): dispatch
step k, write step k − 1's plain row while it runs, then what step k is due for as plain ifs (an
evaluation, a sharpness estimate, a checkpoint: the loop's only host syncs). SIGINT/SIGTERM: the
step under way is checkpointed, and `Interrupted` says which.
"""

import concurrent.futures
import contextlib
import dataclasses
import os
import pathlib
import signal
import time
from typing import Callable

import jax

from actlab import core
from actlab.infra.errors import UserError
from actlab.run.program import Program, Tally, init_args
from actlab.run.rows import Lane, Rows


def train_lanes(program: Program, lanes: list[Lane], initial: Callable[[], core.TrainState],
                start: int, vocab_size: int, compiles: Tally,
                began: float | None, then: Callable[[], None] | None = None) -> list[dict]:
  """Trains `lanes` (run r of `program` is `lanes[r]`) from step `start` and the state `initial()`
  returns (called once the first step is compiling); writes and returns their summaries, with
  `compiles` and the seconds from `began` (None: the process's start) to the first dispatch.
  `then` is called once the first step is dispatched (a sweep compiles its next group)."""
  config = lanes[0].config
  counts = core.count_params(program.run_state_like.params)
  with contextlib.ExitStack() as closing:  # The trackers last: W&B logs the summary.
    for lane in lanes:
      closing.callback(lane.close_writers)
    print(start_line(lanes, counts, start), flush=True)
    if config.optim.name == "muon":
      print(f"actlab: {core.step.muon_split_line(program.run_state_like.params)}", flush=True)
    if config.train.deterministic_ops and not program.plan.accelerated:
      print("actlab: train.deterministic_ops changes nothing here: a CPU's programs are "
            "deterministic already", flush=True)
    if config.metrics.sharpness_every and program.evaluators.sharpness is None:
      print(f"actlab: no sharpness estimate, not even at step 0: metrics.sharpness_every "
            f"({config.metrics.sharpness_every}) is more than train.steps ({config.train.steps}); "
            f"set it to at most {config.train.steps} for estimates (docs/metrics.md §5)",
            flush=True)
    stop = StopRequest()
    batches = Prefetch(program, lanes, config.train.steps)
    starting = Start(program, lanes, start, batches, began, then)  # Before any array is put.
    rows = Rows(program, lanes, start)
    try:
      state = initial()  # A fresh run's `init` compiles (or loads) beside the first step's program.
      if start == 0:
        rows.measure_step_zero(state.params)
      rows.start_clock()
      stopped_at = run_steps(program, state, start, rows, batches, stop,
                             lambda: starting.dispatched(rows.measure))
      rows.settle_step_zero()
    finally:
      rows.bar.close()
      batches.pool.shutdown(wait=True)
      starting.pool.shutdown(wait=True, cancel_futures=True)
      stop.restore()
      with contextlib.ExitStack() as closing_checkpoints:  # Every lane, whatever one raises.
        for lane in lanes:  # Waits for the checkpoint being written (and raises its error).
          closing_checkpoints.callback(lane.checkpoints.close)
    if stopped_at is not None:
      saved = {lane.checkpoints.latest_step() for lane, stopped in zip(lanes, rows.stopped)
               if not stopped}
      what = (f"checkpoint of step {stopped_at} saved" if saved == {stopped_at}
              else f"latest checkpoints: {sorted(saved)}")
      raise Interrupted(f"stopped by signal {stop.signum} after step {stopped_at}; {what}; "
                        "rerun the same command to resume", stop.signum)
    return rows.summaries(counts, vocab_size, {"compile": compiles.summary(),
                                               "startup_sec": starting.startup_sec,
                                               "measure_sec": rows.measure.sec})


def run_steps(program: Program, state: core.TrainState, start: int, rows: Rows,
              batches: "Prefetch", stop: "StopRequest",
              dispatched: Callable[[], None]) -> int | None:
  """The loop from step `start`; returns the step a signal stopped the runs after (checkpointed),
  or None once they ended or all diverged."""
  t, measure = rows.lanes[0].config.train, rows.measure
  for step in range(start, t.steps):
    done = step + 1
    due = Due.at(done, t, program.evaluators.sharpness)
    state, metrics = (program.log_step if due.row else program.train_step)(
        state, batches.take(step))
    if step == start:
      dispatched()
    if program.plan.sync_each_step:  # simulated CPU devices: parallel.Plan.sync_each_step
      jax.block_until_ready(metrics)
    rows.add(metrics)  # After step k − 1's plain row, fetched while step k runs.
    if all(rows.stopped):
      return None
    stopping = stop.signum is not None  # Read once: a signal during the host work below is
    # acted on after the next step, never between deciding to save and stopping.
    if not (due.evaluate or due.sharpness or due.checkpoint or stopping):
      if due.row:
        rows.behind = done  # Written once the next step is dispatched.
      continue
    # What reads the state, now: the next step donates it. The loop waits for this step.
    written = rows.fetch(done, log=due.row)
    healthy = any(rows.diverged_at[r] is None for r in written)
    evals = measure.evaluation(state.params, due.last) if due.evaluate and healthy else None
    sharpness = measure.sharpness(state.params) if due.sharpness and healthy else None
    rows.write(done, written, evals, sharpness)
    if due.checkpoint or stopping:
      rows.checkpoint(done, program.parts(state))
    if due.row:
      rows.start_clock()  # After the host work: evaluation, sharpness, the checkpoint.
    if all(rows.stopped):
      return None
    if stopping:
      return done
  return None


@dataclasses.dataclass(frozen=True)
class Due:
  """What the step ending at `done` is due for: a row (with `log_step`'s diagnostics), an
  evaluation, a sharpness estimate, a checkpoint; `last`: it is the last step."""
  row: bool
  evaluate: bool
  sharpness: bool
  checkpoint: bool
  last: bool

  @classmethod
  def at(cls, done: int, t, sharpness) -> "Due":
    last = done == t.steps
    evaluate = done % t.eval_every == 0 or last
    sharp = sharpness is not None and done % sharpness.every == 0
    return cls(row=done % t.log_every == 0 or evaluate or sharp, evaluate=evaluate,
               sharpness=sharp, checkpoint=done % t.checkpoint_every == 0 or last, last=last)


class Start:
  """A run's start, overlapped: `init`'s and the first step's programs (on a GPU or TPU, the
  sharpness program's too) compile in threads while the first arrays go to the devices; the rest
  once the first step is dispatched (`dispatched`), as `Program.compile_ahead` says."""

  def __init__(self, program: Program, lanes: list[Lane], start: int, batches: "Prefetch",
               began: float | None, then: Callable[[], None] | None):
    t = lanes[0].config.train
    self.pool = concurrent.futures.ThreadPoolExecutor(max_workers=4)
    # The sharpness program: 40-100 s to compile on an H200, most of a cold run's wait, while
    # its host is idle; on a CPU its compile would take the first step's cores.
    self.rest = program.compile_ahead(
        self.pool, batches.batch(start, like=True),
        init_args([lane.config for lane in lanes], program.runs) if start == 0 else None,
        first_logged=Due.at(start + 1, t, program.evaluators.sharpness).row,
        sharpness_first=(program.sharpness_batch(lanes[0].dataset, like=True)
                         if program.plan.accelerated else None))
    self.began, self.then, self.startup_sec = began, then, None

  def dispatched(self, measure) -> None:
    """Once the first step is dispatched: `startup_sec`, the other programs compiling for
    `measure`'s batches, and the caller's `then`."""
    self.startup_sec = seconds_since(self.began)
    self.rest(measure.val_batches[0], measure.sharpness_batch)
    if self.then:
      self.then()


class Prefetch:
  """Batch k + 1 built and sent to the devices (this host's rows) by a thread while step k runs."""

  def __init__(self, program: Program, lanes: list[Lane], steps: int):
    self.program, self.lanes, self.steps = program, lanes, steps
    self.pool, self.next = concurrent.futures.ThreadPoolExecutor(max_workers=1), None

  def batch(self, k: int, like: bool = False):
    """Batch k on the devices (with `like`, what it would be there, as abstract arrays); None
    past the last step."""
    if k >= self.steps:
      return None
    return self.program.put_batches([lane.dataset.train_batch(k) for lane in self.lanes], like)

  def take(self, k: int):
    batch = (self.next or self.pool.submit(self.batch, k)).result()
    self.next = self.pool.submit(self.batch, k + 1)
    return batch


class StopRequest:
  """SIGINT/SIGTERM set a flag the loop checks between steps (it then checkpoints and exits)."""

  def __init__(self):
    self.signum = None
    self._previous = {s: signal.signal(s, self._handle) for s in (signal.SIGINT, signal.SIGTERM)}

  def _handle(self, signum, frame):
    self.signum = signum

  def restore(self):
    for s, handler in self._previous.items():
      signal.signal(s, handler)


class Interrupted(UserError):
  """Raised after SIGINT/SIGTERM, once the checkpoint is written; exits with 128 + signal."""

  def __init__(self, message: str, signum: int):
    super().__init__(message)
    self.exit_code = 128 + signum


def seconds_since(began: float | None) -> float | None:
  """Seconds since `began` (a `time.perf_counter()`) or, for None, since this process started
  (None where there is no Linux /proc)."""
  if began is not None:
    return time.perf_counter() - began
  try:
    ticks = int(pathlib.Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
    uptime = float(pathlib.Path("/proc/uptime").read_text().split()[0])
  except (OSError, ValueError, IndexError):
    return None
  return uptime - ticks / os.sysconf("SC_CLK_TCK")


def start_line(lanes: list[Lane], counts: dict, start: int) -> str:
  """What `train_lanes` prints first: the model, its size, the runs and where they start."""
  model = f"{lanes[0].task.name} {lanes[0].config.model.activation}"
  size = (f"{counts['non_embedding'] / 1e6:.2f}M parameters without the token embedding "
          f"({counts['total'] / 1e6:.2f}M total)")
  resuming = f"resuming at step {start}" if start else None
  if len(lanes) == 1:
    return f"actlab: {model}, {size}; {resuming or 'fresh run'}"
  return (f"actlab: {len(lanes)} vectorized runs of {model}, {size}; "
          f"lr {', '.join(f'{l.config.optim.lr:g}' for l in lanes)}; "
          f"seeds {', '.join(str(l.config.train.seed) for l in lanes)}; {resuming or 'fresh runs'}")
