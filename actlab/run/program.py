"""The program a run trains: a config's `core.Step` jitted, sharded and compiled ahead, for one
run or for R vectorized runs of one config.

`Program` jits the core's pure `Step` with explicit shardings (infra/parallel.py): for one run
as it is, for R > 1 runs vectorized (`over_runs`: their states stacked on a leading run axis). The
runs may differ in `optim.lr` and `train.seed`, which live in the state, so a sweep's cells share
one program (tests/test_vectorized.py: R runs equal R single runs). The programs a run compiles,
each once (infra/compile_cache.py keeps them for the next run): `init`; `train_step`; `log_step`,
the same step with the diagnostics of a logged step; `eval_step`, every validation evaluator in
one forward pass; `sharpness_step`, the power iteration (when on); for R > 1, `split`, each run's
part of the state for its checkpoint; `checksums`, a checkpoint's sums. Each is an `Ahead`,
compiled in a thread for the arguments it will get. A fresh run's `init` and the first step's
program (on a GPU or TPU, the sharpness program too) compile while the run's first arrays go to
the devices (on a GPU, their memory pool is allocated then), the others once the first step is
dispatched (tracing holds Python's lock: a program traced beside the first step's delays it); a
sweep may have started them all while the group before trained (`Program.compile_all`).
"""

import concurrent.futures
import dataclasses
import functools
import json
import threading
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

from actlab import config as config_lib, core, tasks
from actlab.infra import checkpoint as checkpoint_lib, compile_cache, parallel, workdir
from actlab.infra.errors import UserError
from actlab.measure import evaluators as evaluators_lib


def over_runs(fn: Callable, runs: int, in_axes: tuple | int = 0, name: str | None = None):
  """One run's `fn` for `runs` runs: itself for one run; for R > 1, `jax.vmap`ped over the leading
  run axis of its arguments (`in_axes`: 0, or None for an argument the runs share) and results.
  `name`: the program's name in JAX's logs and the compile tally."""
  mapped = jax.vmap(fn, in_axes=in_axes) if runs > 1 else fn

  def program(*args):
    return mapped(*args)
  program.__name__ = program.__qualname__ = name or getattr(fn, "__name__", "program")
  return program


def part(tree: Any, r: int, runs: int) -> Any:
  """Run r's part of a tree of `runs` runs (a state, metrics or device results): for one run, the
  tree itself."""
  return jax.tree.map(lambda x: x[r], tree) if runs > 1 else tree


class Ahead:
  """A jitted function compiled in a thread (`start`) for the arguments it will be called with;
  a call waits for it. Before `start` it is the jitted function."""

  def __init__(self, jitted: Callable):
    self.jitted, self.compiled, self.args = jitted, None, None

  def start(self, pool: concurrent.futures.Executor, *like) -> None:
    """Compiles for arguments like `like` in `pool`, unless that is under way or done (a sweep's
    next group starts its programs while another group trains)."""
    args = compile_cache.abstract(like)
    if self.compiled and self.args == args and not (
        self.compiled.cancelled() or self.compiled.done() and self.compiled.exception()):
      return
    self.args = args
    self.compiled = pool.submit(compile_cache.carried(lambda: self.jitted.lower(*args).compile()))

  @property
  def done(self) -> bool:
    """Whether a call would not wait for a compilation under way."""
    return self.compiled is None or self.compiled.done()

  def ready(self) -> "Ahead":
    """Waits for the compilation under way, if any."""
    if self.compiled:
      self.compiled.result()
    return self

  def __call__(self, *args):
    """The program compiled ahead, once compiled; the jitted function where none was started or
    its compilation was cancelled (its pool shut down first)."""
    if self.compiled is None or self.compiled.cancelled():
      return self.jitted(*args)
    return self.compiled.result()(*args)


@dataclasses.dataclass(frozen=True)
class Program:
  """A config's `core.Step` jitted for R runs (their LRs and seeds may differ). For R > 1, states,
  batches, metrics and device results have a leading, unsplit run axis of R, and the validation
  and sharpness batches are shared by the runs; one run's have none."""
  step: core.Step
  plan: parallel.Plan
  runs: int
  shardings: core.TrainState  # of the program's state
  run_state_like: core.TrainState  # one run's state as abstract arrays with their shardings:
                                   # what a checkpoint restores into
  init: Ahead           # ([R] seeds, [R] peak LRs) -> core.TrainState
  train_step: Ahead     # (state, batch) -> (state, metrics); donates the state
  log_step: Ahead       # the same step with `diagnostics`: for the steps the loop logs
  evaluators: evaluators_lib.Evaluators
  eval_step: Ahead      # (params, batch) -> the validation evaluators' device values
  sharpness_step: Ahead | None  # (params, batch) -> top Hessian eigenvalues; None when off
  split: Ahead | None   # R > 1: state -> each run's part (`parts`)
  checksums: Ahead      # one run's state -> its checkpoint's checksums (`checkpoint.sums`)

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
    run_state_like = jax.tree.map(
        lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), shape, run_shardings)
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
    def split(s):
      return [part(s, r, runs) for r in range(runs)]
    return cls(step, plan, runs, state, run_state_like,
               init=Ahead(jax.jit(init, out_shardings=state)),
               train_step=jit_step(False, "train_step"), log_step=jit_step(True, "log_step"),
               evaluators=evaluators,
               eval_step=on_params(evaluators.validation_step, "eval_step"),
               sharpness_step=evaluators.sharpness and on_params(evaluators.sharpness,
                                                                 "sharpness_step"),
               split=(Ahead(jax.jit(split, out_shardings=[run_shardings] * runs))
                      if runs > 1 else None),
               checksums=Ahead(checkpoint_lib.sums))

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

  def parts(self, state: core.TrainState) -> list[core.TrainState]:
    """Each run's part of the program's state (for R > 1, by `split`)."""
    return self.split(state) if self.split else [state]

  def part(self, tree: Any, r: int) -> Any:
    """Run r's part of this program's states, metrics or device results."""
    return part(tree, r, self.runs)

  def put_batches(self, batches: list, like: bool = False) -> Any:
    """One host batch per run → the devices (stacked for R > 1); with `like`, what they would be
    there, as abstract arrays (`Plan.batch_like`)."""
    put = self.plan.batch_like if like else self.plan.shard_batch
    if self.runs == 1:
      return put(batches[0])
    return put(jax.tree.map(lambda *xs: np.stack(xs), *batches), stacked=True)

  @property
  def state_like(self) -> core.TrainState:
    """The program's state as abstract arrays with their shardings (for R > 1, R runs stacked)."""
    if self.runs == 1:
      return self.run_state_like
    return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct((self.runs, *x.shape), x.dtype,
                                                          sharding=s),
                        self.run_state_like, self.shardings)

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
    state = self.state_like
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
      if self.split:
        self.split.start(pool, state)
      self.checksums.start(pool, self.run_state_like)
      checkpoint_lib.use_compiled(self.run_state_like, self.checksums)
    return rest

  def compile_all(self, pool, dataset, fresh: Sequence[ml_collections.ConfigDict] = ()) -> None:
    """Starts compiling every program in `pool`'s threads for batches of `dataset`, `init` where
    `fresh` holds the configs of a group of fresh runs (a sweep's next group, while another
    trains: the loop's `compile_ahead` then finds them)."""
    batch = self.put_batches([dataset.train_batch(0)] * self.runs, like=True)
    val_batch = self.plan.batch_like(dataset.val_batches()[0])
    fresh_args = init_args(fresh[:self.runs], self.runs) if len(fresh) >= self.runs else None
    self.compile_ahead(pool, batch, fresh_args, False)(val_batch,
                                                       self.sharpness_batch(dataset, like=True))

  def sharpness_batch(self, dataset, like: bool = False) -> Any:
    """The sharpness estimates' batch (None when off): training batch 0 of seed 0, the same for
    every run of a sweep, on the devices; with `like`, what it would be there, as abstract arrays
    (`Plan.batch_like`)."""
    if self.sharpness_step is None:
      return None
    batch = dataclasses.replace(dataset, seed=0).train_batch(0)
    return self.plan.batch_like(batch) if like else self.plan.shard_batch(batch)


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
  """The config as the compiled functions see it: every field but the initial state's (the peak LR
  and the seed, values in the state; `train.init_from`, where the parameters come from) and the
  runtime fields the programs never read (marked `runtime="harness"`: config/schema.py)."""
  ignored = {"optim.lr", "train.seed", "train.init_from",
             *(key for key, how in config_lib.marked("runtime").items() if how == "harness")}
  c = {k: v for k, v in workdir.dotted(config.to_dict()).items() if k not in ignored}
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

