"""The training loop and the program it runs: one run or R vectorized runs of one config, each a
`Lane` (lane.py: its run directory's files), trained step by step with logging, evaluation,
checkpoints and signals.

`Program` jits the core's pure `Step` with explicit shardings (infra/parallel.py): for one run
as it is, for R > 1 runs vectorized (`over_runs`: their states stacked on a leading run axis). The
runs may differ in `optim.lr` and `train.seed`, which live in the state, so a sweep's cells share
one program (tests/test_vectorized.py: R runs equal R single runs). The programs a run compiles,
each once (infra/compile_cache.py keeps them for the next run): `init`; `train_step`; `log_step`,
the same step with the diagnostics of a logged step; `eval_step`, every validation evaluator in
one forward pass; `sharpness_step`, the power iteration (when on); for R > 1, `unstack`, each
run's state out of R for its checkpoint. A fresh run's `init` and the first step's program (on a
GPU or TPU, the sharpness program too) compile in threads while the run's first arrays go to the
devices (on a GPU, their memory pool is allocated then), the others once the first step is
dispatched (tracing holds Python's lock: a program traced beside the first step's delays it); a
sweep may have started them all while the group before trained (`Program.compile_all`). Step 0's
evaluation and sharpness estimate run on a copy of the initial parameters at the first row that
finds their programs compiled, beside the first steps; rows that come before step 0's wait for
it.

The loop's only host syncs are at log, evaluation and checkpoint steps, each a step behind where it
can be. A run whose loss or parameters turn non-finite stops being logged and checkpointed (its
divergence is its result); the others go on. SIGINT/SIGTERM: the step under way finishes, is
checkpointed, and `Interrupted` says which step.
"""

import concurrent.futures
import contextlib
import dataclasses
import functools
import json
import os
import pathlib
import signal
import threading
import time
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import tqdm
from jax.sharding import NamedSharding, PartitionSpec as P

from actlab import config as config_lib, core, tasks
from actlab.infra import checkpoint as checkpoint_lib, compile_cache, parallel, workdir
from actlab.infra.compile_cache import Ahead
from actlab.infra.errors import UserError
from actlab.measure import evaluators as evaluators_lib
from actlab.measure import metrics as metrics_lib
from actlab.run.lane import Lane


# --- The program --------------------------------------------------------------------------------

def over_runs(fn: Callable, runs: int, in_axes: tuple | int = 0, name: str | None = None):
  """One run's `fn` for `runs` runs: itself for one run; for R > 1, `jax.vmap`ped over the leading
  run axis of its arguments (`in_axes`: 0, or None for an argument the runs share) and results.
  `name`: the program's name in JAX's logs and the compile tally."""
  mapped = jax.vmap(fn, in_axes=in_axes) if runs > 1 else fn

  def program(*args):
    return mapped(*args)
  program.__name__ = program.__qualname__ = name or getattr(fn, "__name__", "program")
  return program


def one_run(tree: Any, r: int) -> Any:
  """Run r's part of a stacked tree: a state, metrics or device results."""
  return jax.tree.map(lambda x: x[r], tree)


@dataclasses.dataclass(frozen=True)
class Program:
  """A config's `core.Step` jitted for R runs (their LRs and seeds may differ). For R > 1, states,
  batches, metrics and device results have a leading, unsplit run axis of R, and the validation
  and sharpness batches are shared by the runs; one run's have none."""
  step: core.Step
  plan: parallel.Plan
  runs: int
  shardings: core.TrainState  # of the program's state
  run_like: core.TrainState   # one run's state as abstract arrays with their shardings: what a
                              # checkpoint restores into
  init: Ahead           # ([R] seeds, [R] peak LRs) -> core.TrainState
  train_step: Ahead     # (state, batch) -> (state, metrics); donates the state
  log_step: Ahead       # the same step with `diagnostics`: for the steps the loop logs
  evaluators: evaluators_lib.Evaluators
  eval_step: Ahead      # (params, batch) -> the validation evaluators' device values
  sharpness_step: Ahead | None  # (params, batch) -> top Hessian eigenvalues; None when off
  unstack: Ahead | None  # R > 1: state -> [R] single runs' states

  @classmethod
  def create(cls, config: ml_collections.ConfigDict, vocab_size: int, runs: int = 1,
             plan: parallel.Plan | None = None) -> "Program":
    step = create_step(config, vocab_size)
    plan = plan or parallel.plan(config)
    # `init`'s shapes from the function the program jits, for arguments like its own: JAX keeps
    # the trace, so that compiling `init` traces nothing again.
    init = over_runs(step.init, runs, name="init")
    shape = jax.eval_shape(init, *compile_cache.abstract(init_args([config] * runs, runs)))
    if runs > 1:  # one run's shapes
      shape = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape[1:], x.dtype), shape)
    run_shardings = plan.state_shardings(shape)
    run_like = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                            shape, run_shardings)
    state = (run_shardings if runs == 1 else
             jax.tree.map(lambda s: NamedSharding(plan.mesh, P(None, *s.spec)), run_shardings))
    shared_batch = plan.batch_sharding(1)  # any rank: its first axis split
    batch = plan.batch_sharding(2, stacked=True) if runs > 1 else shared_batch
    evaluators = evaluators_lib.Evaluators.create(config)
    jit_step = lambda diagnostics, name: Ahead(jax.jit(
        over_runs(functools.partial(step.train_step, diagnostics=diagnostics), runs, name=name),
        donate_argnums=0, in_shardings=(state, batch), out_shardings=(state, plan.replicated)))
    on_params = lambda fn, name: Ahead(jax.jit(
        over_runs(functools.partial(fn, step), runs, (0, None), name=name),
        in_shardings=(state.params, shared_batch)))
    def unstack(s):
      return [one_run(s, r) for r in range(runs)]
    return cls(step, plan, runs, state, run_like,
               init=Ahead(jax.jit(init, out_shardings=state)),
               train_step=jit_step(False, "train_step"), log_step=jit_step(True, "log_step"),
               evaluators=evaluators,
               eval_step=on_params(evaluators.validation_step, "eval_step"),
               sharpness_step=evaluators.sharpness and on_params(evaluators.sharpness,
                                                                 "sharpness_step"),
               unstack=(Ahead(jax.jit(unstack, out_shardings=[run_shardings] * runs))
                        if runs > 1 else None))

  def start(self, configs: Sequence[ml_collections.ConfigDict]) -> core.TrainState:
    """The initial state of the runs of `configs` (their seeds and peak LRs)."""
    return self.init(*init_args(configs, self.runs))

  def stack(self, states: Sequence[core.TrainState]) -> core.TrainState:
    """Single runs' states (restored checkpoints) as this program's state: for R > 1 stacked in
    host memory where this process holds them whole (no XLA program to compile at a resume),
    else by XLA."""
    if self.runs == 1:
      return jax.device_put(states[0], self.shardings)
    held = lambda x: getattr(x, "is_fully_addressable", True)  # numpy: always
    stack = lambda *xs: np.stack(jax.device_get(xs)) if all(map(held, xs)) else jnp.stack(xs)
    return jax.device_put(jax.tree.map(stack, *states), self.shardings)

  def runs_of(self, state: core.TrainState) -> list[core.TrainState]:
    """Each run's state."""
    return self.unstack(state) if self.unstack else [state]

  def part(self, tree: Any, r: int) -> Any:
    """Run r's part of this program's states, metrics or device results."""
    return one_run(tree, r) if self.runs > 1 else tree

  def put_batches(self, batches: list, like: bool = False) -> Any:
    """One host batch per run → the devices (stacked for R > 1); with `like`, what they would be
    there, as abstract arrays (`Plan.batch_like`)."""
    put = self.plan.batch_like if like else self.plan.shard_batch
    if self.runs == 1:
      return put(batches[0])
    return put(jax.tree.map(lambda *xs: np.stack(xs), *batches), stacked=True)

  @property
  def like(self) -> core.TrainState:
    """The program's state as abstract arrays with their shardings (for R > 1, R runs stacked)."""
    if self.runs == 1:
      return self.run_like
    return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct((self.runs, *x.shape), x.dtype,
                                                          sharding=s),
                        self.run_like, self.shardings)

  def compile_ahead(self, pool, batch, init_args: tuple | None, first_logged: bool,
                    sharpness_first=None) -> Callable[[Any, Any], None]:
    """Starts compiling, in `pool`'s threads, `init`'s program for `init_args` (None: the runs
    resume), the first step's (`log_step` if `first_logged`) for batches like `batch` (None: the
    runs are at their last step) and, given its batch as `sharpness_first` (abstract), the
    sharpness program, the longest to compile: the caller then puts the run's first arrays on
    the devices, which on a GPU first allocates their memory pool without holding Python's lock.
    Returns the function that starts the rest for the validation and sharpness batches (the
    step-0 measurements', the other step's), to be called once the first step is dispatched:
    tracing holds Python's lock, so a program traced beside the first step's would delay it."""
    state = self.like
    first, then = ((self.log_step, self.train_step) if first_logged
                   else (self.train_step, self.log_step))
    if init_args is not None:
      self.init.start(pool, *init_args)
    if batch is not None:
      first.start(pool, state, batch)
    if sharpness_first is not None:
      self.sharpness_step.start(pool, state.params, sharpness_first)

    def rest(val_batch, sharpness_batch):
      self.eval_step.start(pool, state.params, val_batch)
      if self.sharpness_step:
        self.sharpness_step.start(pool, state.params, sharpness_batch)
      if batch is not None:
        then.start(pool, state, batch)
      if self.unstack:
        self.unstack.start(pool, state)
      checkpoint_lib.compile_ahead(pool, self.run_like)
    return rest

  def compile_all(self, pool, dataset, fresh: Sequence[ml_collections.ConfigDict] = ()) -> None:
    """Starts compiling every program in `pool`'s threads for batches of `dataset`, `init` where
    `fresh` holds the configs of a group of fresh runs (a sweep's next group, while another
    trains: the loop's `compile_ahead` then finds them)."""
    batch = self.put_batches([dataset.train_batch(0)] * self.runs, like=True)
    val_batch = self.plan.batch_like(dataset.val_batches()[0])
    fresh_args = init_args(fresh[:self.runs], self.runs) if len(fresh) >= self.runs else None
    self.compile_ahead(pool, batch, fresh_args, False)(val_batch,
                                                       self.sharpness_batch(dataset, put=False))

  def sharpness_batch(self, dataset, put: bool = True) -> Any:
    """The sharpness estimates' batch (None when off): training batch 0 of seed 0, the same for
    every run of a sweep; without `put`, as abstract arrays."""
    if self.sharpness_step is None:
      return None
    batch = dataclasses.replace(dataset, seed=0).train_batch(0)
    return self.plan.shard_batch(batch) if put else self.plan.batch_like(batch)


def init_args(configs: Sequence[ml_collections.ConfigDict], runs: int) -> tuple:
  """`init`'s arguments for the runs of `configs` in a program of `runs`: their seeds and peak
  LRs (for one run, scalars)."""
  seeds = np.array([c.train.seed for c in configs])
  lrs = np.array([c.optim.lr for c in configs], np.float32)
  return (seeds, lrs) if runs > 1 else (seeds[0], lrs[0])


def create_step(config: ml_collections.ConfigDict, vocab_size: int) -> core.Step:
  """The config's `core.Step`: its task's objective and the optimizer."""
  return core.Step(tasks.get(config).objective(config, vocab_size),
                   config_lib.build(core.OptimSpec, config.optim, total_steps=config.train.steps),
                   config.data.seq_len)


class GroupError(UserError, ValueError):
  """The runs cannot share one program; the message says why."""


def compile_key(config: ml_collections.ConfigDict, vocab_size: int) -> str:
  """The config as the compiled functions see it: everything but the peak LR, the seed, where
  the initial parameters come from (`train.init_from`) and the runtime fields."""
  c = config.to_dict()
  c["optim"]["lr"] = c["train"]["seed"] = None
  c["train"].pop("init_from", None)
  c["train"].pop("compile_cache", None)
  return json.dumps({"config": c, "vocab_size": vocab_size}, sort_keys=True, default=str)


def check_group(configs: Sequence[ml_collections.ConfigDict]) -> None:
  """Raises unless the configs differ only in `optim.lr` and `train.seed`."""
  base = json.loads(compile_key(configs[0], 0))["config"]
  for c in configs[1:]:
    diffs = workdir.diff_configs(base, json.loads(compile_key(c, 0))["config"])
    if diffs:
      raise GroupError("runs trained as one program may differ only in optim.lr and train.seed; "
                       "these also differ: " + "; ".join(diffs))


_getting = threading.Lock()  # a sweep makes its next group's program in a thread


def get(config: ml_collections.ConfigDict, vocab_size: int, runs: int = 1,
        cache: dict | None = None) -> Program:
  """`Program.create`, reused from `cache` (a plain dict the caller owns) when one was made for
  the same `compile_key` and number of runs: a sweep passes one cache to all its runs."""
  if cache is None:
    return Program.create(config, vocab_size, runs)
  key = (runs, compile_key(config, vocab_size))
  with _getting:
    if key not in cache:
      cache[key] = Program.create(config, vocab_size, runs)
    return cache[key]


# --- The loop -----------------------------------------------------------------------------------

def train_lanes(program: Program, lanes: list[Lane], initial: Callable[[], core.TrainState],
                start: int, vocab_size: int, compiles: compile_cache.Tally,
                began: float | None, then: Callable[[], None] | None = None) -> list[dict]:
  """Trains `lanes` (run r of `program` is `lanes[r]`) from step `start` (all at the same step,
  with the same schedule) from the state `initial()` returns (called once the first step's
  program is compiling), and writes and returns their summaries, in order, with what the process
  compiled for them (`compiles`) and their fixed cost: the seconds from `began` (a
  `time.perf_counter()`; None: the process's start) to their first step's dispatch. `then` is
  called once the first step is dispatched (a sweep starts compiling its next group)."""
  with contextlib.ExitStack() as closing:  # The trackers last: W&B logs the summary.
    for lane in lanes:
      closing.callback(lane.close_writers)
    return _train(program, lanes, initial, start, vocab_size, compiles, began, then)


def _train(program: Program, lanes: list[Lane], initial: Callable[[], core.TrainState],
           start: int, vocab_size: int, compiles: compile_cache.Tally,
           began: float | None, then: Callable[[], None] | None) -> list[dict]:
  """The loop itself: one step, then whatever that step is due for, each a plain `if`."""
  config = lanes[0].config
  t, sharpness = config.train, program.evaluators.sharpness
  counts = core.count_params(program.run_like.params)
  print(start_line(lanes, counts, start), flush=True)
  if config.metrics.sharpness_every and sharpness is None:
    print(f"actlab: no sharpness estimates: metrics.sharpness_every "
          f"({config.metrics.sharpness_every}) is more than train.steps ({t.steps}), so "
          "none would follow step 0's (docs/metrics.md §5)", flush=True)
  stop = StopRequest()
  batches = Prefetch(program, lanes, t.steps)
  compiling = concurrent.futures.ThreadPoolExecutor(max_workers=4)
  # Before the run's first arrays go to the devices. On a GPU or TPU the sharpness program too
  # (40-100 s to compile on an H200, most of a cold run's wait), whose host is idle meanwhile; on
  # a CPU its compile would take the first step's cores.
  compile_rest = program.compile_ahead(
      compiling, batches.batch(start, put=False),
      init_args([lane.config for lane in lanes], program.runs) if start == 0 else None,
      first_logged=is_logged(start + 1, t, sharpness),
      sharpness_first=(program.sharpness_batch(lanes[0].dataset, put=False)
                       if program.plan.accelerated else None))
  rows = Rows(program, lanes, config, start)
  pending, behind, stopped_at = [], None, None  # behind: a plain row, written a step late
  try:
    state = initial()  # A fresh run's `init` compiles (or loads) beside the first step's program.
    if start == 0:
      rows.hold_first(state.params)
    rows.start_clock()
    for step in range(start, t.steps):
      done = step + 1
      last = done == t.steps
      evaluate = done % t.eval_every == 0 or last
      sharp = sharpness is not None and done % sharpness.every == 0
      log = is_logged(done, t, sharpness)
      checkpoint = done % t.checkpoint_every == 0 or last

      state, metrics = (program.log_step if log else program.train_step)(
          state, batches.take(step))
      if step == start:
        rows.startup_sec = seconds_since(began)
        compile_rest(rows.val_batches[0], rows.sharpness_batch)
        if then:
          then()
      if program.plan.sync_each_step:  # simulated CPU devices: parallel.Plan.sync_each_step
        jax.block_until_ready(metrics)
      pending.append(metrics)  # Kept on the device until its row.
      if behind is not None:  # The last plain row, fetched while this step runs.
        rows.write(*behind, log_now=True)
        behind = None
      if rows.all_stopped:
        break
      stopping = stop.signum is not None  # Read once: a signal during the host work below
      # is acted on after the next step, never between deciding to save and stopping.
      save = checkpoint or stopping
      if save or evaluate or sharp:  # What reads the state now; a plain row waits.
        since_row = rows.write(done, pending, log_now=log, state=state,
                               evaluate=evaluate, sharp=sharp, test=last)
        if log:
          pending = []
        if save:
          rows.settle_first()  # A checkpoint keeps the rows: step 0's first.
          runs = program.runs_of(state)
          for r, lane in enumerate(lanes):
            if not lane.stopped:
              lane.save(done, runs[r], [] if log else since_row[r])
        if not pending:
          rows.start_clock()  # After the host work (logging, evaluation, checkpoint).
        if rows.all_stopped:
          break
        if stopping:
          stopped_at = done
          break
      elif log:
        behind, pending = (done, pending), []
    rows.settle_first()
  finally:
    rows.bar.close()
    batches.pool.shutdown(wait=True)
    compiling.shutdown(wait=True, cancel_futures=True)
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
  timing = {"compile": compiles.summary(), "startup_sec": rows.startup_sec,
            "measure_sec": rows.measure_sec}
  return [lane.finish(counts, vocab_size, rows.wall_time(), len(lanes), timing)
          for lane in lanes]


def is_logged(done: int, t: ml_collections.ConfigDict, sharpness) -> bool:
  """Whether the step ending at `done` writes a row (`log_step`): a log, evaluation or sharpness
  step, or the last."""
  return (done % t.log_every == 0 or done % t.eval_every == 0 or done == t.steps
          or (sharpness is not None and done % sharpness.every == 0))


class Prefetch:
  """Batch k + 1, built and sent to the devices (this host's rows only) by a thread while step k
  runs."""

  def __init__(self, program: Program, lanes: list[Lane], steps: int):
    self.program, self.lanes, self.steps = program, lanes, steps
    self.pool, self.next = concurrent.futures.ThreadPoolExecutor(max_workers=1), None

  def batch(self, k: int, put: bool = True):
    """Batch k on the devices (without `put`, as abstract arrays: what it will be there); None
    past the last step."""
    if k >= self.steps:
      return None
    return self.program.put_batches([lane.dataset.train_batch(k) for lane in self.lanes],
                                    like=not put)

  def take(self, k: int):
    batch = (self.next or self.pool.submit(self.batch, k)).result()
    self.next = self.pool.submit(self.batch, k + 1)
    return batch


class Rows:
  """What the loop writes: each lane's rows of step metrics (fetched at rows and checkpoints only),
  with evaluations and sharpness where due, their cost (`measure_sec`), the clock and the bar."""

  def __init__(self, program: Program, lanes: list[Lane], config: ml_collections.ConfigDict,
               start: int):
    self.program, self.lanes, self.evaluators = program, lanes, program.evaluators
    self.tokens_per_step = config.train.batch_size * config.data.seq_len
    plan, dataset = program.plan, lanes[0].dataset
    self.val_batches = [plan.shard_batch(b) for b in dataset.val_batches()]  # Once.
    self.test_batches = [plan.shard_batch(b) for b in dataset.val_batches(test=True)]
    self.sharpness_batch = program.sharpness_batch(dataset)
    # A bar for a single run; its description says what it does (evaluation can take long).
    self.bar = tqdm.tqdm(total=config.train.steps, initial=start, unit="step", dynamic_ncols=True,
                         disable=not config.train.progress or len(lanes) > 1)
    self.measure_sec = {"evaluation": 0.0, "sharpness": 0.0}
    self.startup_sec = None  # from the runs' start (`train_lanes`) to the first step's dispatch
    self.t0 = self.wall0 = None
    # Step 0's row (`hold_first`): the initial parameters until it is dispatched, then its
    # device results until it is written; the rows written meanwhile, held behind it.
    self.first_params = self.first_out = self.held = None
    # Processes of one run launch the same programs in the same order: theirs at the first row.
    self.lockstep = jax.process_count() > 1

  @property
  def all_stopped(self) -> bool:
    return all(lane.stopped for lane in self.lanes)

  def start_clock(self):
    self.bar.set_description("training", refresh=False)
    self.t0 = time.perf_counter()
    self.wall0 = self.wall0 or self.t0

  def wall_time(self) -> float:
    return time.perf_counter() - self.wall0

  def hold_first(self, params):
    """Step 0's row, measured on a copy of the initial `params` (the first step donates them) at
    the first row whose step finds its programs compiled (`measure_first`; in a run of several
    processes, at the first row), while the first steps run; the rows that come before it are
    held, so that metrics.jsonl still starts with it (`settle_first`)."""
    self.first_params = jax.device_put(params, self.program.shardings.params, may_alias=False)
    self.held = []

  def measure_first(self, wait: bool = False):
    """Dispatches step 0's evaluation and sharpness estimate once their programs are compiled
    (with `wait`, now: the wait for each program counts as its measurement's cost) and lets the
    copy of the initial parameters go."""
    programs = {"evaluation": self.program.eval_step, "sharpness": self.program.sharpness_step}
    programs = {kind: p for kind, p in programs.items() if p}
    if wait:
      for kind, p in programs.items():
        t0 = time.perf_counter()
        p.ready()
        self.measure_sec[kind] += time.perf_counter() - t0
    elif not all(p.done for p in programs.values()):
      return
    params, self.first_params = self.first_params, None
    sharpness = self.program.sharpness_step
    self.first_out = (self.dispatch_evaluation(params),
                      None if sharpness is None else sharpness(params, self.sharpness_batch))
    if self.program.plan.sync_each_step:
      jax.block_until_ready(self.first_out)

  def settle_first(self):
    """Writes step 0's row, measured now if it was not yet, and the rows held behind it."""
    if self.first_params is not None:
      self.measure_first(wait=True)
    if self.first_out is None:
      return
    # Their cost: the waits for their results, each computed after the steps dispatched before
    # it (their dispatch may wait for the device's queue of steps: not theirs).
    t0 = time.perf_counter()
    outs = jax.device_get(self.first_out[0])
    t1 = time.perf_counter()
    sharp = None if self.first_out[1] is None else jax.device_get(self.first_out[1])
    self.measure_sec["evaluation"] += t1 - t0
    self.measure_sec["sharpness"] += time.perf_counter() - t1
    evals = self.pool_evaluation(outs)
    for r, lane in enumerate(self.lanes):
      lane.write({"step": 0, **evals[r], **({} if sharp is None else
                                              {"sharpness": float(self.program.part(sharp, r))})})
    for lane, row in self.held:
      lane.write(row)
    self.first_out = self.held = None

  def write(self, done: int, pending: list, log_now: bool, state=None, evaluate=False,
            sharp=False, test=False) -> dict:
    """Fetches `pending` (the loop's only host sync) and writes each running lane's row where it
    logs now (`log_now`) or has diverged, with the evaluation and sharpness of `state` where due;
    returns each lane's step metrics since its last row."""
    if self.first_params is not None:  # Step 0's measurements, dispatched where they can be.
      self.measure_first(wait=self.lockstep)
    since_row, logged = self.fetch(done, pending, log_now)
    elapsed = time.perf_counter() - self.t0
    if self.first_out is not None:  # Step 0's row is measured: it is written first.
      self.settle_first()
    healthy = any(self.lanes[r].diverged_at is None for r in logged)
    evals = self.evaluate(state.params, test) if evaluate and healthy else None
    sharps = self.sharpness(state.params) if sharp and healthy else None
    self.bar.set_description("training", refresh=False)
    for r, rows in logged.items():
      lane = self.lanes[r]
      lane.train_time += elapsed
      first_row = not lane.rates  # The run's first row after step 0's: rows[0] is step 0's.
      # Each run's rate as it experiences it: its tokens over the loop's wall time.
      lane.rates.append(len(pending) * self.tokens_per_step / elapsed)
      row = {"step": lane.diverged_at or done, **metrics_lib.interval(rows),
             "tokens_per_sec": lane.rates[-1]}
      if first_row:
        row["grad_norm_init"] = float(rows[0]["grad_norm"])
      if evals is not None and lane.diverged_at is None:
        row.update(evals[r])
        if not metrics_lib.finite(row["val_loss"]):
          lane.diverged_at = done
      if sharps is not None and lane.diverged_at is None:
        row["sharpness"] = float(self.program.part(sharps, r))
      if self.held is None:
        lane.write(row)
      else:
        self.held.append((lane, row))
      lane.carried = []
      self.bar.set_postfix(loss=f"{row['train_loss']:.3f}", tok_s=f"{lane.rates[-1]:,.0f}",
                           refresh=False)
      self.bar.update(len(pending))
    for lane in self.lanes:
      lane.stopped |= lane.diverged_at is not None
    if log_now and state is None:
      self.start_clock()
    return since_row

  def fetch(self, done: int, pending: list, log_now: bool) -> tuple[dict, dict]:
    """Each running lane's step metrics since its last row, and those it logs now: up to its first
    non-finite step, if any."""
    fetched = jax.device_get(pending)
    since_row, logged = {}, {}
    for r, lane in enumerate(self.lanes):
      if lane.stopped:
        continue
      rows = since_row[r] = lane.carried + [self.program.part(x, r) for x in fetched]
      bad = metrics_lib.first_nonfinite(rows)
      if bad is not None:  # Log the rows up to the first bad step, then stop.
        lane.diverged_at, logged[r] = done - len(rows) + bad + 1, rows[:bad + 1]
      elif log_now:
        logged[r] = rows
    return since_row, logged

  def evaluate(self, params, test: bool = False) -> list[dict]:
    """Every lane's validation metrics (one pass); with `test`, also the test windows', `test_*`."""
    self.bar.set_description("evaluating")
    t0 = time.perf_counter()
    evals = self.pool_evaluation(jax.device_get(self.dispatch_evaluation(params)))
    if test and self.test_batches:
      outs = jax.device_get([self.program.eval_step(params, b)["loss"]
                             for b in self.test_batches])
      for r, ev in enumerate(evals):
        pooled = evaluators_lib.Loss().pool(self.program.part(outs, r))
        ev.update({"test_" + k.removeprefix("val_"): v for k, v in pooled.items()})
    self.measure_sec["evaluation"] += time.perf_counter() - t0
    return evals

  def dispatch_evaluation(self, params) -> list:
    """The validation evaluators' device values on every validation batch (not waited for)."""
    return [self.program.eval_step(params, b) for b in self.val_batches]

  def pool_evaluation(self, outs: list) -> list[dict]:
    """Each lane's validation metrics from `dispatch_evaluation`'s values, fetched."""
    return [self.evaluators.pool(self.program.part(outs, r)) for r in range(len(self.lanes))]

  def sharpness(self, params) -> np.ndarray:
    self.bar.set_description("sharpness")
    t0 = time.perf_counter()
    out = jax.device_get(self.program.sharpness_step(params, self.sharpness_batch))
    self.measure_sec["sharpness"] += time.perf_counter() - t0
    return out


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
  (Linux's /proc; None elsewhere)."""
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
