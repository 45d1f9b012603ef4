"""A config's compiled program for R ≥ 1 runs: `Program` jits the core's pure `Step` (its
`init`, `train_step` and the evaluators' device steps) for R runs of one config, the states
stacked on a leading run axis (`core.over_runs`), with explicit shardings (infra/parallel.py);
one run is R = 1. The runs may differ in `optim.lr` and `train.seed`, which live in the state,
not in the compiled code, so a sweep's cells share one compiled program
(tests/test_vectorized.py: R runs equal R single runs, ≤ 1e-6).
"""

import dataclasses
import functools
import json
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

from actlab import core, tasks
from actlab.config import specs
from actlab.infra import parallel, workdir
from actlab.infra.errors import UserError
from actlab.measure import evaluators as evaluators_lib


@dataclasses.dataclass(frozen=True)
class Program:
  """A config's `core.Step` jitted for R runs (their LRs and seeds may differ): states, metrics
  and device results have a leading, unsplit run axis of R; the validation and sharpness
  batches are shared by the runs."""
  step: core.Step
  plan: parallel.Plan
  runs: int
  shardings: core.TrainState  # of the stacked state
  run_like: core.TrainState   # one run's state as abstract arrays with their shardings: what a
                         # checkpoint restores into
  init: Callable        # ([R] seeds, [R] peak LRs) -> core.TrainState
  train_step: Callable  # (state, batch) -> (state, metrics); donates the state
  log_step: Callable    # the same step with `diagnostics`: for the steps the loop logs
  evaluators: evaluators_lib.Evaluators
  eval_step: Callable   # (params, batch) -> the validation evaluators' device values
  sharpness_step: Callable | None  # (params, batch) -> top Hessian eigenvalues; None when off

  @classmethod
  def create(cls, config: ml_collections.ConfigDict, vocab_size: int, runs: int = 1,
             plan: parallel.Plan | None = None) -> "Program":
    step = create_step(config, vocab_size)
    plan = plan or parallel.plan(config)
    shape = jax.eval_shape(step.init, 0, 1.0)
    run_shardings = plan.state_shardings(shape)
    run_like = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                            shape, run_shardings)
    state = jax.tree.map(lambda s: NamedSharding(plan.mesh, P(None, *s.spec)), run_shardings)
    batch, shared_batch = plan.batch_sharding(2, stacked=True), plan.batch_sharding(1)
    evaluators = evaluators_lib.Evaluators.create(config)
    jit_step = lambda diagnostics: jax.jit(
        core.over_runs(functools.partial(step.train_step, diagnostics=diagnostics), runs),
        donate_argnums=0, in_shardings=(state, batch), out_shardings=(state, plan.replicated))
    on_params = lambda fn: jax.jit(core.over_runs(functools.partial(fn, step), runs, (0, None)),
                                   in_shardings=(state.params, shared_batch))
    return cls(step, plan, runs, state, run_like,
               init=jax.jit(core.over_runs(step.init, runs), out_shardings=state),
               train_step=jit_step(False), log_step=jit_step(True), evaluators=evaluators,
               eval_step=on_params(evaluators.validation_step),
               sharpness_step=evaluators.sharpness and on_params(evaluators.sharpness))

  def start(self, configs: Sequence[ml_collections.ConfigDict]) -> core.TrainState:
    """The initial state of the runs of `configs` (their seeds and peak LRs)."""
    return self.init(np.array([c.train.seed for c in configs]),
                     np.array([c.optim.lr for c in configs], np.float32))

  def stack(self, states: Sequence[core.TrainState]) -> core.TrainState:
    """Single runs' states (restored checkpoints) as this program's state: stacked in host memory
    where this process holds them whole (no XLA program to compile at a resume), else by XLA."""
    held = lambda x: getattr(x, "is_fully_addressable", True)  # numpy: always
    stack = lambda *xs: np.stack(jax.device_get(xs)) if all(map(held, xs)) else jnp.stack(xs)
    return jax.device_put(jax.tree.map(stack, *states), self.shardings)

  def put_batches(self, batches: list) -> Any:
    """One host batch per run → the devices, stacked."""
    return self.plan.shard_batch(jax.tree.map(lambda *xs: np.stack(xs), *batches), stacked=True)


def create_step(config: ml_collections.ConfigDict, vocab_size: int) -> core.Step:
  """The config's `core.Step`: its task's objective and the optimizer."""
  return core.Step(tasks.get(config).objective(config, vocab_size), specs.optim(config),
                   config.data.seq_len)


class GroupError(UserError, ValueError):
  """The runs cannot share one program; the message says why."""


def compile_key(config: ml_collections.ConfigDict, vocab_size: int) -> str:
  """The config as the compiled functions see it: everything but the peak LR, the seed and where
  the initial parameters come from (`train.init_from`)."""
  c = config.to_dict()
  c["optim"]["lr"] = c["train"]["seed"] = None
  c["train"].pop("init_from", None)
  return json.dumps({"config": c, "vocab_size": vocab_size}, sort_keys=True, default=str)


def check_group(configs: Sequence[ml_collections.ConfigDict]) -> None:
  """Raises unless the configs differ only in `optim.lr` and `train.seed`."""
  base = json.loads(compile_key(configs[0], 0))["config"]
  for c in configs[1:]:
    diffs = workdir.diff_configs(base, json.loads(compile_key(c, 0))["config"])
    if diffs:
      raise GroupError("runs trained as one program may differ only in optim.lr and train.seed; "
                       "these also differ: " + "; ".join(diffs))


def get(config: ml_collections.ConfigDict, vocab_size: int, runs: int = 1,
            cache: dict | None = None) -> Program:
  """`Program.create`, reused from `cache` (a plain dict the caller owns) when one was made for
  the same `compile_key` and number of runs: a sweep passes one cache to all its runs."""
  if cache is None:
    return Program.create(config, vocab_size, runs)
  key = (runs, compile_key(config, vocab_size))
  if key not in cache:
    cache[key] = Program.create(config, vocab_size, runs)
  return cache[key]
