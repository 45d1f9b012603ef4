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
from actlab.errors import UserError
from actlab.measure import evaluators
from actlab.measure import metrics as metrics_lib
from actlab.run import compiled
from actlab.run.lane import Lane


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
  config = lanes[0].config
  t, plan, evaluators_ = config.train, program.plan, program.evaluators
  counts = core.count_params(program.run_like.params)
  val_batches = [plan.shard_batch(b) for b in lanes[0].dataset.val_batches()]  # Placed once.
  test_batches = [plan.shard_batch(b) for b in lanes[0].dataset.val_batches(test=True)]
  # The sharpness batch: training batch 0 of seed 0, the same for every run of a sweep.
  sharpness_batch = (plan.shard_batch(dataclasses.replace(lanes[0].dataset, seed=0).train_batch(0))
                     if program.sharpness_step else None)

  print(start_line(lanes, counts, start), flush=True)
  if config.metrics.sharpness_every and evaluators_.sharpness is None:
    print(f"actlab: no sharpness estimates: metrics.sharpness_every "
          f"({config.metrics.sharpness_every}) is more than train.steps ({t.steps}), so none "
          "would follow step 0's (docs/metrics.md §5)", flush=True)
  stop = StopRequest()
  prefetch = concurrent.futures.ThreadPoolExecutor(max_workers=1)
  # The next batch is built and sent to the devices (this host's rows only) while a step runs.
  fetch = lambda k: prefetch.submit(
      lambda: program.put_batches([lane.dataset.train_batch(k) for lane in lanes]))
  # A bar for a single run; its description says what it does (evaluation can take long).
  bar = tqdm.tqdm(total=t.steps, initial=start, unit="step", dynamic_ncols=True,
                  disable=not t.progress or len(lanes) > 1)

  def evaluate(params, test: bool = False) -> list[dict]:
    """Every lane's validation metrics (one pass); with `test`, also the test windows', `test_*`."""
    bar.set_description("evaluating")
    outs = jax.device_get([program.eval_step(params, b) for b in val_batches])
    evals = [evaluators_.pool(core.one_run(outs, r)) for r in range(len(lanes))]
    if test and test_batches:
      outs = jax.device_get([program.eval_step(params, b)["loss"] for b in test_batches])
      for r, ev in enumerate(evals):
        pooled = evaluators.Loss().pool(core.one_run(outs, r))
        ev.update({"test_" + k.removeprefix("val_"): v for k, v in pooled.items()})
    return evals

  def sharpness(params) -> np.ndarray:
    bar.set_description("sharpness")
    return jax.device_get(program.sharpness_step(params, sharpness_batch))

  def fetch_rows(done: int, pending: list, log_now: bool) -> tuple[dict, dict]:
    """Each running lane's step metrics since its last row (`pending` fetched to the host: the
    loop's only host sync), and those it logs now: up to its first non-finite step, if any."""
    fetched = jax.device_get(pending)
    since_row, logged = {}, {}
    for r, lane in enumerate(lanes):
      if lane.stopped:
        continue
      rows = since_row[r] = lane.carried + [core.one_run(x, r) for x in fetched]
      bad = metrics_lib.first_nonfinite(rows)
      if bad is not None:  # Log the rows up to the first bad step, then stop.
        lane.diverged_at, logged[r] = done - len(rows) + bad + 1, rows[:bad + 1]
      elif log_now:
        logged[r] = rows
    return since_row, logged

  def write_rows(done: int, logged: dict, steps_: int, elapsed: float, evals=None,
                 sharp=None) -> None:
    """The rows of `logged` (`fetch_rows`) with evaluations and sharpness where due; a lane that
    diverged stops: no more rows, no more checkpoints (its last good one stays the latest)."""
    for r, rows in logged.items():
      lane = lanes[r]
      lane.train_time += elapsed
      # Each run's rate as it experiences it: its tokens over the loop's wall time.
      lane.rates.append(steps_ * t.batch_size * config.data.seq_len / elapsed)
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
      bar.set_postfix(loss=f"{row['train_loss']:.3f}", tok_s=f"{lane.rates[-1]:,.0f}",
                      refresh=False)
      bar.update(steps_)
    for lane in lanes:
      lane.stopped |= lane.diverged_at is not None

  pending = []        # the device metrics of the steps since the last row
  row_due = None      # (step, its pending): a row written once the next step is under way
  stopped_at = None   # the step a signal stopped the loop at
  try:
    if start == 0:
      evals = evaluate(state.params)
      sharp = sharpness(state.params) if program.sharpness_step else None
      for r, lane in enumerate(lanes):
        lane.write({"step": 0, **evals[r], **({} if sharp is None else
                                                {"sharpness": float(sharp[r])})})
    bar.set_description("training")
    t0 = wall0 = time.perf_counter()
    next_batch = fetch(start)
    for step in range(start, t.steps):
      batch = next_batch.result()
      if step + 1 < t.steps:
        next_batch = fetch(step + 1)
      done = step + 1
      is_last = done == t.steps
      evaluate_now = done % t.eval_every == 0 or is_last
      sharpness_now = evaluators_.sharpness is not None and done % evaluators_.sharpness.every == 0
      log_now = done % t.log_every == 0 or evaluate_now or sharpness_now
      state, metrics = (program.log_step if log_now else program.train_step)(state, batch)
      if plan.sync_each_step:  # simulated CPU devices: see parallel.Plan.sync_each_step
        jax.block_until_ready(metrics)
      pending.append(metrics)
      if row_due is not None:  # The last row's metrics, fetched while this step runs.
        _, logged = fetch_rows(row_due[0], row_due[1], True)
        now = time.perf_counter()
        write_rows(row_due[0], logged, len(row_due[1]), now - t0)
        row_due, t0 = None, now
        if all(lane.stopped for lane in lanes):
          break
      stopping = stop.signum is not None  # Read once: a signal during the host work below
      # is acted on after the next step, never between deciding to save and stopping.
      save_now = done % t.checkpoint_every == 0 or is_last or stopping
      if not (log_now or save_now):
        continue
      if not (save_now or evaluate_now or sharpness_now):  # Nothing needs this step's state.
        row_due, pending = (done, pending), []
        continue
      since_row, logged = fetch_rows(done, pending, log_now)
      elapsed = time.perf_counter() - t0
      healthy = any(lanes[r].diverged_at is None for r in logged)
      evals = evaluate(state.params, test=is_last) if evaluate_now and healthy else None
      sharp = sharpness(state.params) if sharpness_now and healthy else None
      bar.set_description("training", refresh=False)
      write_rows(done, logged, len(pending), elapsed, evals, sharp)
      if log_now:
        pending = []
      for r, lane in enumerate(lanes):
        if save_now and not lane.stopped:
          lane.save(done, core.one_run(state, r), [] if log_now else since_row[r])
      if all(lane.stopped for lane in lanes):
        break
      if stopping:
        stopped_at = done
        break
      if not pending:  # Restart the clock after host work (logging, eval, checkpoint).
        t0 = time.perf_counter()
  finally:
    bar.close()
    prefetch.shutdown(wait=True)
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
  wall_time = time.perf_counter() - wall0
  return [lane.finish(counts, vocab_size, wall_time, len(lanes)) for lane in lanes]


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


