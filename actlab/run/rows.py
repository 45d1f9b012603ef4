"""What the training loop writes: each lane's rows of step metrics, fetched from the devices at
rows and checkpoints only, with the evaluation and sharpness estimate where due; step 0's row,
measured beside the first steps; the checkpoints that keep the rows; and what a person watching
sees: a line per evaluation and the progress bar.

A row's state lives in `Rows` alone: the step metrics still on the devices, a plain row waiting
for the next step's dispatch, each lane's fetched metrics since its last row (restored from its
checkpoint on resume), and the clock with the steps it times.
"""

import time

import jax
import ml_collections
import numpy as np
import tqdm

from actlab.measure import evaluators as evaluators_lib
from actlab.measure import metrics as metrics_lib
from actlab.run.lane import Lane
from actlab.run.program import Program


class Console:
  """What a person watching a run sees besides its first line: a line at each evaluation (as
  nanoGPT's `step N: train loss …, val loss …`) and, for a single run, the progress bar, whose
  description says what the loop waits for."""

  def __init__(self, config: ml_collections.ConfigDict, lanes: list[Lane], start: int):
    self.lanes = lanes
    self.bar = tqdm.tqdm(total=config.train.steps, initial=start, unit="step",
                         dynamic_ncols=True, disable=not config.train.progress or len(lanes) > 1)

  def doing(self, what: str, refresh: bool = True) -> None:
    self.bar.set_description(what, refresh=refresh)

  def advance(self, steps: int, row: dict) -> None:
    """The bar `steps` further, at a row's train loss and rate."""
    self.bar.set_postfix(loss=f"{row['train_loss']:.3f}", tok_s=f"{row['tokens_per_sec']:,.0f}",
                         refresh=False)
    self.bar.update(steps)

  def evaluated(self, step: int, rows: dict[int, dict]) -> None:
    """A line per lane whose row at `step` has a validation loss (a group's runs named by LR and
    seed), above the bar."""
    for r, row in rows.items():
      if "val_loss" not in row:
        continue
      c = self.lanes[r].config
      run = f" (lr {c.optim.lr:g}, seed {c.train.seed})" if len(self.lanes) > 1 else ""
      losses = [f"{k.removesuffix('_loss')} loss {row[k]:.4f}"
                for k in ("train_loss", "val_loss", "test_loss") if k in row]
      tqdm.tqdm.write(f"step {step}{run}: {', '.join(losses)}")

  def close(self) -> None:
    self.bar.close()


class Measure:
  """A row's measurements, each of every lane in one pass on the devices, and their cost
  (`sec`): the validation evaluators (with the test windows' loss at the last step) and the
  sharpness estimate."""

  def __init__(self, program: Program, dataset, console: Console):
    self.program, self.console = program, console
    self.val_batches = [program.plan.shard_batch(b) for b in dataset.val_batches()]  # Once.
    self.test_batches = [program.plan.shard_batch(b) for b in dataset.val_batches(test=True)]
    self.sharpness_batch = program.sharpness_batch(dataset)
    self.sec = {"evaluation": 0.0, "sharpness": 0.0}

  def evaluation(self, params, test: bool = False) -> list[dict]:
    """Each run's validation metrics; with `test`, also the test windows', `test_*`."""
    self.console.doing("evaluating")
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
    self.console.doing("sharpness")
    t0 = time.perf_counter()
    out = jax.device_get(self.program.sharpness_step(params, self.sharpness_batch))
    self.sec["sharpness"] += time.perf_counter() - t0
    return [float(self.program.part(out, r)) for r in range(self.program.runs)]


class StepZero:
  """Step 0's row, measured beside the first steps: its evaluation and sharpness estimate run on a
  copy of the initial parameters (the first step donates them) at the first row that finds their
  programs compiled (in a run of several processes, at the first row: its processes launch the
  same programs in the same order); the rows written meanwhile wait behind it (`held`), so that
  metrics.jsonl still starts with it."""

  def __init__(self, measure: Measure, params):
    self.measure = measure
    self.params = jax.device_put(params, measure.program.shardings.params, may_alias=False)
    self.out = None
    self.held: list[tuple[int, dict[int, dict]]] = []  # (step, each lane's row), in order
    self.lockstep = jax.process_count() > 1

  def dispatch(self, wait: bool = False) -> None:
    """Dispatches the measurements once their programs are compiled (with `wait`, now: the wait
    for each program counts as its measurement's cost) and lets the copy of the parameters go."""
    program, measure = self.measure.program, self.measure
    programs = {"evaluation": program.eval_step, "sharpness": program.sharpness_step}
    programs = {kind: p for kind, p in programs.items() if p}
    if wait or self.lockstep:
      for kind, p in programs.items():
        t0 = time.perf_counter()
        p.ready()
        measure.sec[kind] += time.perf_counter() - t0
    elif not all(p.done for p in programs.values()):
      return
    params, self.params = self.params, None
    self.out = (measure.dispatch_evaluation(params), None if program.sharpness_step is None
                else program.sharpness_step(params, measure.sharpness_batch))
    if program.plan.sync_each_step:
      jax.block_until_ready(self.out)

  def rows(self) -> dict[int, dict]:
    """Each lane's step-0 row, measured now if it was not yet dispatched."""
    if self.params is not None:
      self.dispatch(wait=True)
    # Their cost: the waits for their results, each computed after the steps dispatched before
    # it (their dispatch may wait for the device's queue of steps: not theirs).
    t0 = time.perf_counter()
    evals = self.measure.pool_evaluation(jax.device_get(self.out[0]))
    t1 = time.perf_counter()
    sharp = None if self.out[1] is None else jax.device_get(self.out[1])
    self.measure.sec["evaluation"] += t1 - t0
    self.measure.sec["sharpness"] += time.perf_counter() - t1
    part = self.measure.program.part
    return {r: {"step": 0, **ev, **({} if sharp is None else {"sharpness": float(part(sharp, r))})}
            for r, ev in enumerate(evals)}


class Rows:
  """Each lane's rows: its step metrics since its last row (`carried`: fetched, or restored from
  its checkpoint) and those still on the devices (`pending`, fetched together at a row or a
  checkpoint: the loop's only host sync), a plain row that waits for the next step's dispatch
  (`behind`), and the clock that times the steps since the last row."""

  def __init__(self, program: Program, lanes: list[Lane], measure: Measure, console: Console):
    self.program, self.lanes, self.measure, self.console = program, lanes, measure, console
    config = lanes[0].config
    self.tokens_per_step = config.train.batch_size * config.data.seq_len
    self.pending, self.behind = [], None
    self.carried = [lane.unlogged for lane in lanes]
    self.zero: StepZero | None = None
    self.steps, self.t0, self.wall0, self.elapsed = 0, None, None, None

  @property
  def all_stopped(self) -> bool:
    return all(lane.stopped for lane in self.lanes)

  def start_clock(self) -> None:
    """The clock and the count of the steps it times, from now (after a row's host work)."""
    self.console.doing("training", refresh=False)
    self.steps, self.t0 = 0, time.perf_counter()
    self.wall0 = self.wall0 or self.t0

  def wall_time(self) -> float:
    return time.perf_counter() - self.wall0

  def measure_step_zero(self, params) -> None:
    """Step 0's row, measured on `params` beside the first steps (`StepZero`)."""
    self.zero = StepZero(self.measure, params)

  def add(self, metrics) -> None:
    """A step's metrics, kept on the devices until its row."""
    self.pending.append(metrics)

  def defer(self, done: int) -> None:
    """The steps so far make step `done`'s plain row, written by `write_behind` once the next step
    is dispatched."""
    self.behind, self.pending = (done, self.pending), []

  def write_behind(self) -> None:
    """The deferred plain row, if any, fetched while the next step runs; the clock then
    restarts."""
    if self.behind is None:
      return
    (done, pending), self.behind = self.behind, None
    self.write(done, self.fetch(done, pending))
    self.start_clock()

  def fetch(self, done: int, pending: list | None = None, log: bool = True) -> dict[int, list]:
    """Fetches `pending` (the steps on the devices since the last fetch) to each running lane's
    `carried`; returns the metrics of the lanes that write a row now: every one where `log`, and
    one whose step metrics turned non-finite, up to its first such step (it then stops)."""
    if pending is None:
      pending, self.pending = self.pending, []
    if self.zero and self.zero.params is not None:  # Step 0's measurements, where they can be.
      self.zero.dispatch()
    fetched = jax.device_get(pending)
    self.steps += len(fetched)
    self.elapsed = time.perf_counter() - self.t0
    if self.zero and self.zero.out is not None:  # Step 0's row is measured: it is written first.
      self.settle_step_zero()
    due = {}
    for r, lane in enumerate(self.lanes):
      if lane.stopped:
        continue
      steps = self.carried[r] = self.carried[r] + [self.program.part(x, r) for x in fetched]
      bad = metrics_lib.first_nonfinite(steps)
      if bad is not None:  # Log the rows up to the first bad step, then stop.
        lane.diverged_at, due[r] = done - len(steps) + bad + 1, steps[:bad + 1]
      elif log:
        due[r] = steps
    return due

  def healthy(self, due: dict[int, list]) -> bool:
    """Whether a lane writing a row now (`due`, from `fetch`) has not diverged: its state is worth
    measuring."""
    return any(self.lanes[r].diverged_at is None for r in due)

  def write(self, done: int, due: dict[int, list], evals: list[dict] | None = None,
            sharpness: list[float] | None = None) -> None:
    """Writes the rows `fetch` found `due` at step `done`, with each lane's evaluation (a
    non-finite validation loss: it has diverged) and sharpness estimate where given."""
    self.console.doing("training", refresh=False)
    rows = {}
    for r, steps in due.items():
      lane = self.lanes[r]
      lane.train_time += self.elapsed
      # Each run's rate as it experiences it: its tokens over the loop's wall time.
      lane.rates.append(self.steps * self.tokens_per_step / self.elapsed)
      row = {"step": lane.diverged_at or done, **metrics_lib.interval(steps),
             "tokens_per_sec": lane.rates[-1]}
      if len(lane.rates) == 1:  # The run's first row after step 0's: steps[0] is step 0's.
        row["grad_norm_init"] = float(steps[0]["grad_norm"])
      if evals is not None and lane.diverged_at is None:
        row.update(evals[r])
        if not metrics_lib.finite(row["val_loss"]):
          lane.diverged_at = done
      if sharpness is not None and lane.diverged_at is None:
        row["sharpness"] = sharpness[r]
      rows[r] = row
      self.carried[r] = []
      self.console.advance(self.steps, row)
    self.emit(done, rows)
    for lane in self.lanes:
      lane.stopped |= lane.diverged_at is not None

  def emit(self, step: int, rows: dict[int, dict]) -> None:
    """The rows of `step` to their lanes and the console, or held behind step 0's."""
    if self.zero:
      self.zero.held.append((step, rows))
      return
    for r, row in rows.items():
      self.lanes[r].write(row)
    self.console.evaluated(step, rows)

  def settle_step_zero(self) -> None:
    """Writes step 0's row, measured now if it was not yet, and the rows held behind it."""
    if self.zero is None:
      return
    zero, self.zero = self.zero, None
    self.emit(0, zero.rows())
    for step, rows in zero.held:
      self.emit(step, rows)

  def checkpoint(self, done: int, states: list) -> None:
    """Checkpoints each running lane's state (`states`, one per lane) with its rows, step 0's
    first, and its step metrics since its last row."""
    self.settle_step_zero()
    for r, lane in enumerate(self.lanes):
      if not lane.stopped:
        lane.save(done, states[r], self.carried[r])
