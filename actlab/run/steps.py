"""The pure step functions of a config, and their compiled program for R ≥ 1 runs.

`Steps` holds what the steps close over (model, objective, `optimizer`) and defines one run's pure
`init(seed, peak_lr)` and `train_step(state, batch)`. `Program` jits them for R runs of one
config, the states stacked on a leading run axis (`over_runs`), with explicit shardings
(parallel.py); one run is R = 1. The runs may differ in `optim.lr` and `train.seed`, which live
in the state, not in the compiled code, so a sweep's cells share one compiled program
(tests/test_vectorized.py: R runs equal R single runs, ≤ 1e-6).
"""

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
from actlab.run import parallel, workdir


# --- The optimizer ------------------------------------------------------------------------------

def schedule(optim: ml_collections.ConfigDict, total_steps: int) -> optax.Schedule:
  """The learning-rate multiplier: 0 → 1 over warm-up, then cosine to min_lr_ratio."""
  return optax.warmup_cosine_decay_schedule(
      init_value=0.0, peak_value=1.0, warmup_steps=optim.warmup_steps,
      decay_steps=total_steps, end_value=optim.min_lr_ratio)


def decay_mask(params):
  """True for weight matrices and embeddings; False for biases and LayerNorm scales."""
  return jax.tree_util.tree_map_with_path(
      lambda path, _: getattr(path[-1], "key", None) in ("kernel", "embedding"), params)


def optimizer(optim: ml_collections.ConfigDict,
              total_steps: int) -> optax.GradientTransformation:
  """clip_by_global_norm → AdamW (decay on matrices and embeddings) at `peak_lr · schedule`; the
  peak LR lives in the optimizer state (`optax.inject_hyperparams`), not in the compiled program."""
  unit = schedule(optim, total_steps)

  @optax.inject_hyperparams
  def adamw(peak_lr):
    clip = optax.clip_by_global_norm(optim.clip_norm) if optim.clip_norm else optax.identity()
    return optax.chain(clip, optax.adamw(
        lambda step: peak_lr * unit(step), b1=optim.b1, b2=optim.b2, eps=optim.eps,
        weight_decay=optim.weight_decay, mask=decay_mask))

  return adamw(peak_lr=optim.lr)


# --- One run's steps and their program -------------------------------------------------------


@flax.struct.dataclass
class TrainState:
  step: jax.Array       # completed optimizer steps
  params: Any
  opt_state: Any
  rng: jax.Array        # root key; the key of step k is fold_in(rng, k)


@dataclasses.dataclass(frozen=True)
class Steps:
  """Everything one run's steps close over: the task's model and objective, and the optimizer."""
  model: flax.linen.Module
  tx: optax.GradientTransformation
  lr_multiplier: optax.Schedule  # of the peak LR at a step (for logging)
  objective: Any
  config: ml_collections.ConfigDict

  @classmethod
  def create(cls, config: ml_collections.ConfigDict, vocab_size: int) -> "Steps":
    task = tasks.get(config)
    total = config.train.steps
    return cls(task.model(config, vocab_size), optimizer(config.optim, total),
               schedule(config.optim, total), task.objective(config, vocab_size), config)

  def init(self, seed, peak_lr=None) -> TrainState:
    """The initial state; `seed` and `peak_lr` (default `optim.lr`) may be traced, so one
    compiled init serves every seed and learning rate: the peak LR lives in the optimizer state."""
    init_key, run_key = jax.random.split(jax.random.PRNGKey(seed))
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
    measures its loss (the cross-entropy; the z-loss apart), learning rate and gradient norm;
    with `diagnostics` (static: the loop's log steps) also the update and parameter norms and
    `metrics.stability` (docs/metrics.md §2)."""
    key = jax.random.fold_in(state.rng, state.step)

    def loss_fn(params):
      out = self.objective(self.model, params, batch, key, train=True, stats=diagnostics)
      return out.loss_sum / out.count, out

    (loss, out), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params)
    updates, opt_state = self.tx.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    metrics = {
        "train_loss": loss,
        "lr": state.opt_state.hyperparams["peak_lr"] * self.lr_multiplier(state.step),
        "grad_norm": optax.tree.norm(grads),
    }
    if self.config.optim.z_loss:
      metrics.update(train_loss=(out.loss_sum - out.z_loss_sum) / out.count,
                     z_loss=out.z_loss_sum / out.count)
    if diagnostics:
      metrics.update(update_norm=optax.tree.norm(updates), param_norm=optax.tree.norm(params),
                     **metrics_lib.stability(out))
    return state.replace(step=state.step + 1, params=params, opt_state=opt_state), metrics


@dataclasses.dataclass(frozen=True)
class Program:
  """`Steps` jitted for R runs of one config (their LRs and seeds may differ): states, metrics
  and device results have a leading, unsplit run axis of R; the validation and sharpness
  batches are shared by the runs."""
  steps: Steps
  plan: parallel.Plan
  runs: int
  shardings: TrainState  # of the stacked state
  run_like: TrainState   # one run's state as abstract arrays with their shardings: what a
                         # checkpoint restores into
  init: Callable        # ([R] seeds, [R] peak LRs) -> TrainState
  train_step: Callable  # (state, batch) -> (state, metrics); donates the state
  log_step: Callable    # the same step with `diagnostics`: for the steps the loop logs
  evaluators: evaluators_lib.Evaluators
  eval_step: Callable   # (params, batch) -> the validation evaluators' device values
  sharpness_step: Callable | None  # (params, batch) -> top Hessian eigenvalues; None when off

  @classmethod
  def create(cls, config: ml_collections.ConfigDict, vocab_size: int, runs: int = 1,
             plan: parallel.Plan | None = None) -> "Program":
    steps = Steps.create(config, vocab_size)
    plan = plan or parallel.plan(config)
    shape = jax.eval_shape(steps.init, 0, 1.0)
    run_shardings = plan.state_shardings(shape)
    run_like = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                            shape, run_shardings)
    state = jax.tree.map(lambda s: NamedSharding(plan.mesh, P(None, *s.spec)), run_shardings)
    batch, shared_batch = plan.batch_sharding(2, stacked=True), plan.batch_sharding(1)
    evaluators = evaluators_lib.Evaluators.create(config)
    jit_step = lambda diagnostics: jax.jit(
        over_runs(functools.partial(steps.train_step, diagnostics=diagnostics), runs),
        donate_argnums=0, in_shardings=(state, batch), out_shardings=(state, plan.replicated))
    on_params = lambda fn: jax.jit(over_runs(functools.partial(fn, steps), runs, (0, None)),
                                   in_shardings=(state.params, shared_batch))
    return cls(steps, plan, runs, state, run_like,
               init=jax.jit(over_runs(steps.init, runs), out_shardings=state),
               train_step=jit_step(False), log_step=jit_step(True), evaluators=evaluators,
               eval_step=on_params(evaluators.validation_step),
               sharpness_step=evaluators.sharpness and on_params(evaluators.sharpness))

  def start(self, configs: Sequence[ml_collections.ConfigDict]) -> TrainState:
    """The initial state of the runs of `configs` (their seeds and peak LRs)."""
    return self.init(np.array([c.train.seed for c in configs]),
                     np.array([c.optim.lr for c in configs], np.float32))

  def stack(self, states: Sequence[TrainState]) -> TrainState:
    """Single runs' states (restored checkpoints) as this program's state: stacked in host memory
    where this process holds them whole (no XLA program to compile at a resume), else by XLA."""
    held = lambda x: getattr(x, "is_fully_addressable", True)  # numpy: always
    stack = lambda *xs: np.stack(jax.device_get(xs)) if all(map(held, xs)) else jnp.stack(xs)
    return jax.device_put(jax.tree.map(stack, *states), self.shardings)

  def put_batches(self, batches: list) -> Any:
    """One host batch per run → the devices, stacked."""
    return self.plan.shard_batch(jax.tree.map(lambda *xs: np.stack(xs), *batches), stacked=True)


def over_runs(fn: Callable, runs: int, in_axes: tuple | int = 0) -> Callable:
  """One run's `fn` over the leading run axis of its arguments (`in_axes`: 0, or None for an
  argument the runs share) and results: `jax.vmap` for R > 1 runs; for R = 1 the axis is
  indexed away and put back, so that a single run compiles (and rounds) as `fn` does."""
  if runs > 1:
    return jax.vmap(fn, in_axes=in_axes)

  def one(*args):
    axes = in_axes if isinstance(in_axes, tuple) else (in_axes,) * len(args)
    args = [a if axis is None else one_run(a, 0) for a, axis in zip(args, axes)]
    return jax.tree.map(lambda x: jnp.expand_dims(x, 0), fn(*args))
  return one


def one_run(tree: Any, r: int) -> Any:
  """Run r's part of a stacked tree: a state, metrics or device results."""
  return jax.tree.map(lambda x: x[r], tree)


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
