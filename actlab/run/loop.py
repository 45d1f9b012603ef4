"""The training loop: R ≥ 1 runs of one program (`compiled.Program`), each a `Lane` (lane.py: its
run directory's files), trained step by step with logging, evaluation, checkpoints and signals.

The loop's only host syncs are at log, evaluation and checkpoint steps. A run whose loss or
parameters turn non-finite stops being logged and checkpointed (its divergence is its result);
the others go on. SIGINT/SIGTERM: the step under way finishes, is checkpointed, and `Interrupted`
says which step.
"""

import concurrent.futures
import contextlib
import dataclasses
import signal
import time

import jax
import numpy as np
import tqdm

from actlab import core
from actlab.infra.errors import UserError
from actlab.measure import evaluators
from actlab.measure import metrics as metrics_lib
from actlab.run import compiled
from actlab.run.lane import Lane


def train_lanes(program: compiled.Program, lanes: list[Lane], state, start: int,
                vocab_size: int) -> list[dict]:
  """Trains `lanes` (run r of `program` is `lanes[r]`) from step `start` (all at the same step,
  with the same schedule) and writes and returns their summaries, in order."""
  with contextlib.ExitStack() as closing:  # The trackers last: W&B logs the summary.
    for lane in lanes:
      closing.callback(lane.close_writers)
    return _train(program, lanes, state, start, vocab_size)


def _train(program: compiled.Program, lanes: list[Lane], state, start: int,
           vocab_size: int) -> list[dict]:
  """The loop itself: one step, then whatever that step is due for (`Due`)."""
  t = lanes[0].config.train
  counts = core.count_params(program.run_like.params)
  print(start_line(lanes, counts, start), flush=True)
  work = Periodic(program, lanes, start)
  stop = StopRequest()
  batches = Prefetch(program, lanes, t.steps)
  stopped_at = None
  try:
    if start == 0:
      work.first_row(state)
    work.start_clock()
    for step in range(start, t.steps):
      done = step + 1
      due = work.due(done)
      state, metrics = (program.log_step if due.log else program.train_step)(
          state, batches.take(step))
      work.dispatched(metrics)
      work.write_row_behind()  # The last row's metrics, fetched while this step runs.
      if work.all_stopped:
        break
      stopping = stop.signum is not None  # Read once: a signal during the host work below
      # is acted on after the next step, never between deciding to save and stopping.
      save = due.checkpoint or stopping
      if save or due.evaluate or due.sharpness:  # What reads the state now; a plain row waits.
        work.write_row_now(state, done, due, save)
        if work.all_stopped:
          break
        if stopping:
          stopped_at = done
          break
      elif due.log:
        work.defer_row(done)
  finally:
    work.bar.close()
    batches.pool.shutdown(wait=True)
    stop.restore()
    with contextlib.ExitStack() as closing:  # Every lane, whatever one of them raises.
      for lane in lanes:  # Waits for the checkpoint being written (and raises its error).
        closing.callback(lane.checkpoints.close)

  if stopped_at is not None:
    saved = {lane.checkpoints.latest_step() for lane in lanes if not lane.stopped}
    what = (f"checkpoint of step {stopped_at} saved" if saved == {stopped_at}
            else f"latest checkpoints: {sorted(saved)}")
    raise Interrupted(f"stopped by signal {stop.signum} after step {stopped_at}; {what}; "
                      "rerun the same command to resume", stop.signum)
  return [lane.finish(counts, vocab_size, work.wall_time(), len(lanes)) for lane in lanes]


@dataclasses.dataclass(frozen=True)
class Due:
  """What a step is due for: a row, an evaluation (the last: and the test windows), a sharpness
  estimate, a checkpoint."""
  log: bool
  evaluate: bool
  sharpness: bool
  checkpoint: bool
  last: bool


class Prefetch:
  """Batch k + 1, built and sent to the devices (this host's rows only) by a thread while step k
  runs."""

  def __init__(self, program: compiled.Program, lanes: list[Lane], steps: int):
    self.pool, self.next = concurrent.futures.ThreadPoolExecutor(max_workers=1), None
    self.fetch = lambda k: self.pool.submit(lambda: program.put_batches(
        [lane.dataset.train_batch(k) for lane in lanes])) if k < steps else None

  def take(self, k: int):
    batch = (self.next or self.fetch(k)).result()
    self.next = self.fetch(k + 1)
    return batch


class Periodic:
  """The loop's work besides the step: what a step is due for, the step metrics since the last
  row (fetched only at rows and checkpoints), rows with evaluations and sharpness, checkpoints."""

  def __init__(self, program: compiled.Program, lanes: list[Lane], start: int):
    config = lanes[0].config
    self.program, self.lanes, self.t = program, lanes, config.train
    self.tokens_per_step = config.train.batch_size * config.data.seq_len
    plan, self.evaluators = program.plan, program.evaluators
    self.val_batches = [plan.shard_batch(b) for b in lanes[0].dataset.val_batches()]  # Once.
    self.test_batches = [plan.shard_batch(b) for b in lanes[0].dataset.val_batches(test=True)]
    # The sharpness batch: training batch 0 of seed 0, the same for every run of a sweep.
    self.sharpness_batch = (
        plan.shard_batch(dataclasses.replace(lanes[0].dataset, seed=0).train_batch(0))
        if program.sharpness_step else None)
    if config.metrics.sharpness_every and self.evaluators.sharpness is None:
      print(f"actlab: no sharpness estimates: metrics.sharpness_every "
            f"({config.metrics.sharpness_every}) is more than train.steps ({self.t.steps}), so "
            "none would follow step 0's (docs/metrics.md §5)", flush=True)
    # A bar for a single run; its description says what it does (evaluation can take long).
    self.bar = tqdm.tqdm(total=self.t.steps, initial=start, unit="step", dynamic_ncols=True,
                         disable=not self.t.progress or len(lanes) > 1)
    self.pending = []     # the device metrics of the steps since the last row
    self.row_due = None   # (step, its pending): a row written once the next step is under way
    self.t0 = self.wall0 = None

  def due(self, done: int) -> Due:
    t, sharpness = self.t, self.evaluators.sharpness
    last = done == t.steps
    evaluate = done % t.eval_every == 0 or last
    sharp = sharpness is not None and done % sharpness.every == 0
    return Due(log=done % t.log_every == 0 or evaluate or sharp, evaluate=evaluate,
               sharpness=sharp, checkpoint=done % t.checkpoint_every == 0 or last, last=last)

  @property
  def all_stopped(self) -> bool:
    return all(lane.stopped for lane in self.lanes)

  def start_clock(self):
    self.bar.set_description("training")
    self.t0 = self.wall0 = time.perf_counter()

  def wall_time(self) -> float:
    return time.perf_counter() - self.wall0

  def dispatched(self, metrics):
    if self.program.plan.sync_each_step:  # simulated CPU devices: parallel.Plan.sync_each_step
      jax.block_until_ready(metrics)
    self.pending.append(metrics)  # Kept on the device until its row.

  def first_row(self, state):
    """Step 0's row: the evaluations at initialisation."""
    evals = self.evaluate(state.params)
    sharp = self.sharpness(state.params) if self.program.sharpness_step else None
    for r, lane in enumerate(self.lanes):
      lane.write({"step": 0, **evals[r], **({} if sharp is None else
                                              {"sharpness": float(sharp[r])})})

  def defer_row(self, done: int):
    """A plain row: written after the next step is dispatched (`write_row_behind`)."""
    self.row_due, self.pending = (done, self.pending), []

  def write_row_behind(self):
    if self.row_due is None:
      return
    done, pending = self.row_due
    _, logged = self.fetch_rows(done, pending, True)
    now = time.perf_counter()
    self.write_rows(done, logged, len(pending), now - self.t0)
    self.row_due, self.t0 = None, now

  def write_row_now(self, state, done: int, due: Due, save: bool):
    """The step's row (if due) with its evaluation and sharpness, and its checkpoint (`save`)."""
    since_row, logged = self.fetch_rows(done, self.pending, due.log)
    elapsed = time.perf_counter() - self.t0
    healthy = any(self.lanes[r].diverged_at is None for r in logged)
    evals = self.evaluate(state.params, test=due.last) if due.evaluate and healthy else None
    sharp = self.sharpness(state.params) if due.sharpness and healthy else None
    self.bar.set_description("training", refresh=False)
    self.write_rows(done, logged, len(self.pending), elapsed, evals, sharp)
    if due.log:
      self.pending = []
    for r, lane in enumerate(self.lanes):
      if save and not lane.stopped:
        lane.save(done, core.one_run(state, r), [] if due.log else since_row[r])
    if not self.pending:  # Restart the clock after host work (logging, eval, checkpoint).
      self.t0 = time.perf_counter()

  def evaluate(self, params, test: bool = False) -> list[dict]:
    """Every lane's validation metrics (one pass); with `test`, also the test windows', `test_*`."""
    self.bar.set_description("evaluating")
    outs = jax.device_get([self.program.eval_step(params, b) for b in self.val_batches])
    evals = [self.evaluators.pool(core.one_run(outs, r)) for r in range(len(self.lanes))]
    if test and self.test_batches:
      outs = jax.device_get([self.program.eval_step(params, b)["loss"]
                             for b in self.test_batches])
      for r, ev in enumerate(evals):
        pooled = evaluators.Loss().pool(core.one_run(outs, r))
        ev.update({"test_" + k.removeprefix("val_"): v for k, v in pooled.items()})
    return evals

  def sharpness(self, params) -> np.ndarray:
    self.bar.set_description("sharpness")
    return jax.device_get(self.program.sharpness_step(params, self.sharpness_batch))

  def fetch_rows(self, done: int, pending: list, log_now: bool) -> tuple[dict, dict]:
    """Each running lane's step metrics since its last row (`pending` fetched to the host: the
    loop's only host sync), and those it logs now: up to its first non-finite step, if any."""
    fetched = jax.device_get(pending)
    since_row, logged = {}, {}
    for r, lane in enumerate(self.lanes):
      if lane.stopped:
        continue
      rows = since_row[r] = lane.carried + [core.one_run(x, r) for x in fetched]
      bad = metrics_lib.first_nonfinite(rows)
      if bad is not None:  # Log the rows up to the first bad step, then stop.
        lane.diverged_at, logged[r] = done - len(rows) + bad + 1, rows[:bad + 1]
      elif log_now:
        logged[r] = rows
    return since_row, logged

  def write_rows(self, done: int, logged: dict, steps: int, elapsed: float, evals=None,
                 sharp=None) -> None:
    """The rows of `logged` (`fetch_rows`) with evaluations and sharpness where due; a lane that
    diverged stops: no more rows, no more checkpoints (its last good one stays the latest)."""
    for r, rows in logged.items():
      lane = self.lanes[r]
      lane.train_time += elapsed
      # Each run's rate as it experiences it: its tokens over the loop's wall time.
      lane.rates.append(steps * self.tokens_per_step / elapsed)
      row = {"step": lane.diverged_at or done, **metrics_lib.interval(rows),
             "tokens_per_sec": lane.rates[-1]}
      if lane.log.rows[-1]["step"] == 0:  # The run's first row: rows[0] is step 0's.
        row["grad_norm_init"] = float(rows[0]["grad_norm"])
      if evals is not None and lane.diverged_at is None:
        row.update(evals[r])
        if not metrics_lib.finite(row["val_loss"]):
          lane.diverged_at = done
      if sharp is not None and lane.diverged_at is None:
        row["sharpness"] = float(sharp[r])
      lane.write(row)
      lane.carried = []
      self.bar.set_postfix(loss=f"{row['train_loss']:.3f}", tok_s=f"{lane.rates[-1]:,.0f}",
                           refresh=False)
      self.bar.update(steps)
    for lane in self.lanes:
      lane.stopped |= lane.diverged_at is not None


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


