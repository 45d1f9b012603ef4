"""The pure step functions of a config, and their compiled program for R ≥ 1 runs.

`Steps` holds what the steps close over (model, objective, optimizer) and defines the pure
`train_step(state, batch) -> (state, metrics)`. `Program` jits it, and the device steps of the
config's evaluators (evaluators.py: validation loss, activation statistics, sharpness), with
explicit shardings (parallel.py) for R runs that differ only in `optim.lr` and
`train.seed`: both live in the train state, not in the compiled code (`optim.py` keeps the peak
LR in the optimizer state; the seed makes the initial parameters, the key and the batches). One
run (R = 1) is the plain jitted step; R > 1 runs are R states stacked on a leading axis and one
`jax.vmap` of the same step (tests/test_vectorized.py: equal to R single runs, ≤ 1e-6).
"""

from __future__ import annotations

import dataclasses
import functools
import json
from typing import Any, Callable, Sequence

import flax
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
from jax.sharding import NamedSharding, PartitionSpec as P

from actlab import tasks
from actlab.errors import UserError
from actlab.measure import evaluators as evaluators_lib
from actlab.measure import metrics as metrics_lib
from actlab.run import optim, parallel, workdir


@flax.struct.dataclass
class TrainState:
  step: jax.Array       # completed optimizer steps
  params: Any
  opt_state: Any
  rng: jax.Array        # root key; the key of step k is fold_in(rng, k)


@dataclasses.dataclass(frozen=True)
class Steps:
  """Everything the steps close over: the task's model and objective, and the optimizer."""
  model: flax.linen.Module
  tx: optax.GradientTransformation
  objective: Any
  config: ml_collections.ConfigDict

  @classmethod
  def create(cls, config: ml_collections.ConfigDict, vocab_size: int) -> "Steps":
    task = tasks.get(config)
    return cls(task.model(config, vocab_size), optim.make(config.optim, config.train.steps),
               task.objective(config, vocab_size), config)

  def init(self, seed, peak_lr=None) -> TrainState:
    """The initial state; `seed` and `peak_lr` (default `optim.lr`) may be traced, so one
    compiled init serves every seed and learning rate: the peak LR lives in the optimizer state."""
    root = jax.random.PRNGKey(seed)
    init_key, run_key = jax.random.split(root)
    tokens = jnp.zeros((1, self.config.data.seq_len), jnp.int32)
    params = self.model.init(init_key, tokens)["params"]
    opt_state = self.tx.init(params)
    if peak_lr is not None:
      opt_state = opt_state._replace(hyperparams={
          **opt_state.hyperparams, "peak_lr": jnp.asarray(peak_lr, jnp.float32)})
    return TrainState(jnp.zeros((), jnp.int32), params, opt_state, run_key)

  def train_step(self, state: TrainState, batch,
                 diagnostics: bool = True) -> tuple[TrainState, dict]:
    """One optimizer step; pure, so it runs under `jax.jit` with the state donated. Every step
    measures its loss (the cross-entropy: the z-loss, when on, is minimised too but logged
    apart as `z_loss`), learning rate and gradient norm (the clipping's, computed once); with
    `diagnostics` (static: the loop's log steps) also the update and parameter norms, which
    cost a reduction per array, and the training forward's stability measures (its largest
    attention logit and mean logZ: `metrics.stability`), all logged only there."""
    key = jax.random.fold_in(state.rng, state.step)

    def loss_fn(params):
      out = self.objective(self.model, params, batch, key, train=True, stats=diagnostics)
      return out["loss_sum"] / out["count"], out

    (loss, out), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params)
    updates, opt_state = self.tx.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    metrics = {
        "train_loss": loss,
        "lr": optim.learning_rate(self.config.optim, self.config.train.steps,
                                  state.opt_state, state.step),
        "grad_norm": optax.tree.norm(grads),
    }
    if "z_loss_sum" in out:
      metrics.update(train_loss=(out["loss_sum"] - out["z_loss_sum"]) / out["count"],
                     z_loss=out["z_loss_sum"] / out["count"])
    if diagnostics:
      metrics.update(update_norm=optax.tree.norm(updates), param_norm=optax.tree.norm(params),
                     **metrics_lib.stability(out))
    return state.replace(step=state.step + 1, params=params, opt_state=opt_state), metrics


@dataclasses.dataclass(frozen=True)
class Program:
  """`Steps` jitted for `runs` runs of one config (their LRs and seeds may differ). With R > 1
  the state, metrics and results have a leading run axis (unsplit: data parallelism splits each
  run's batch, FSDP each run's arrays as it would one run's); the validation and sharpness
  batches are shared by all runs."""
  steps: Steps
  plan: parallel.Plan
  runs: int
  init: Callable        # (seeds, peak_lrs) -> TrainState: scalars, or [R] arrays for R > 1
  train_step: Callable  # (state, batch) -> (state, metrics); donates the state
  log_step: Callable    # the same step with `diagnostics`: for the steps the loop logs
  evaluators: evaluators_lib.Evaluators
  eval_step: Callable   # (params, batch) -> the validation evaluators' device values
  sharpness: Callable | None  # (params, batch) -> top Hessian eigenvalue(s); None when off

  @classmethod
  def create(cls, config: ml_collections.ConfigDict, vocab_size: int, runs: int = 1,
             plan: parallel.Plan | None = None) -> "Program":
    steps = Steps.create(config, vocab_size)
    plan = plan or parallel.plan(config)
    one_run = plan.state_shardings(jax.eval_shape(steps.init, 0, 1.0))
    evaluators = evaluators_lib.Evaluators.create(config)
    eval_step = functools.partial(evaluators.validation_step, steps)
    sharpness = evaluators.sharpness and functools.partial(evaluators.sharpness, steps)
    shared_batch = plan.batch_sharding(1)  # A prefix: every array of a batch, split on axis 0.
    train_step = functools.partial(steps.train_step, diagnostics=False)
    log_step = steps.train_step
    if runs == 1:
      state, batch = one_run, shared_batch
      init = steps.init
    else:
      state = jax.tree.map(lambda s: NamedSharding(plan.mesh, P(None, *s.spec)), one_run)
      batch = plan.batch_sharding(2, stacked=True)
      init, train_step, log_step = map(jax.vmap, (steps.init, train_step, log_step))
      eval_step = jax.vmap(eval_step, in_axes=(0, None))
      sharpness = sharpness and jax.vmap(sharpness, in_axes=(0, None))
    jit_step = functools.partial(jax.jit, donate_argnums=0, in_shardings=(state, batch),
                                 out_shardings=(state, plan.replicated))
    return cls(steps, plan, runs,
               init=jax.jit(init, out_shardings=state),
               train_step=jit_step(train_step),
               log_step=jit_step(log_step),
               evaluators=evaluators,
               eval_step=jax.jit(eval_step, in_shardings=(state.params, shared_batch)),
               sharpness=sharpness and jax.jit(sharpness,
                                               in_shardings=(state.params, shared_batch)))

  def start(self, configs: Sequence[ml_collections.ConfigDict]) -> TrainState:
    """The initial state of the runs of `configs` (their seeds and peak LRs)."""
    seeds = np.array([c.train.seed for c in configs])
    lrs = np.array([c.optim.lr for c in configs], np.float32)
    return self.init(seeds[0], lrs[0]) if self.runs == 1 else self.init(seeds, lrs)

  def run_like(self) -> TrainState:
    """One run's state as abstract arrays with its shardings: what a checkpoint restores into."""
    shape = jax.eval_shape(self.steps.init, 0, 1.0)
    return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                        shape, self.plan.state_shardings(shape))

  def stack(self, states: Sequence[TrainState], like: TrainState) -> TrainState:
    """Restored run states as this program's state, placed like `like` (a state of it)."""
    state = states[0] if self.runs == 1 else jax.tree.map(lambda *xs: jnp.stack(xs), *states)
    return jax.device_put(state, jax.tree.map(lambda x: x.sharding, like))

  def put_batches(self, batches: list) -> Any:
    """One host batch per run → the devices (stacked for R > 1)."""
    if self.runs == 1:
      return self.plan.shard_batch(batches[0])
    return self.plan.shard_batch(np.stack(batches), stacked=True)

  def run_part(self, tree: Any, r: int) -> Any:
    """Run r's part of a state or result."""
    return tree if self.runs == 1 else jax.tree.map(lambda x: x[r], tree)


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


def program(config: ml_collections.ConfigDict, vocab_size: int, runs: int = 1,
            cache: dict | None = None) -> Program:
  """`Program.create`, reused from `cache` (a plain dict the caller owns) when one was made for
  the same `compile_key` and number of runs: a sweep passes one cache to all its runs."""
  if cache is None:
    return Program.create(config, vocab_size, runs)
  key = (runs, compile_key(config, vocab_size))
  if key not in cache:
    cache[key] = Program.create(config, vocab_size, runs)
  return cache[key]
