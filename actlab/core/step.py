"""One run's training step, pure: the optimizer (`OptimSpec`: clipping, at a norm or of spikes
only, → AdamW with warm-up and cosine), the `TrainState`, and `Step`: `init(seed, peak_lr)`,
`train_step(state, batch)` and `eval_step(params, batch)` of an `Objective` (model.py).
"""

import dataclasses
import functools
from typing import Any, NamedTuple

import flax
import jax
import jax.numpy as jnp
import optax

from actlab.core.model import (AttentionStats, Objective, Sums, check, non_negative, option,
                               per_layer, positive, within)

# The key of every evaluation (no dropout): every evaluation of every run, and MLM's baselines
# (`tasks/mlm.baselines`), score the same masked positions.
EVAL_SEED = 0


@dataclasses.dataclass(frozen=True)
class OptimSpec:
  """The optimizer and its schedule. Each field with a default is a field of a config's `optim`
  section, written once here with its rule and help (as `Spec`'s); `total_steps` is
  `train.steps`. The fields' relations are checked here, named as the config names them (the
  config checks them by building this). (`Step.init` may give another peak LR than `lr`.)"""
  total_steps: int
  lr: float = option(1e-3, positive, help="peak learning rate, reached after warm-up")
  min_lr_ratio: float = option(0.1, within(0, 1, "[]"), help="cosine decays to min_lr_ratio · lr "
                               "at the last step")
  warmup_steps: int = option(100, help="linear warm-up from 0")
  b1: float = option(0.9, within(0, 1))
  b2: float = option(0.95, within(0, 1))
  eps: float = option(1e-8)
  weight_decay: float = option(0.1, non_negative(), help="decoupled (AdamW); matrices and "
                               "embeddings only")
  clip_norm: float = option(1.0, non_negative(" (0 disables)"), help="clip_by_global_norm "
                            "threshold; 0 disables clipping")
  spike_clip: float = option(0.0, non_negative(" (0 = off)"), help="spike-only clipping: a "
                             "gradient whose global norm is above spike_clip × the run's own at "
                             "its first step is scaled to that norm, any other left as it is (10: "
                             "the stability rule's threshold); 0 = off; not with clip_norm")

  def __post_init__(self):
    steps = self.total_steps
    check(0 <= self.warmup_steps < steps, f"optim.warmup_steps={self.warmup_steps} must be >= 0 "
          f"and < train.steps={steps}: set --config.optim.warmup_steps={steps // 10} (a tenth of "
          "the steps) or another value below train.steps")
    check(not (self.clip_norm and self.spike_clip), f"optim.clip_norm={self.clip_norm} and "
          f"optim.spike_clip={self.spike_clip}: one clipping at a time; set the other to 0")


def schedule(optim: OptimSpec) -> optax.Schedule:
  """The learning-rate multiplier: 0 → 1 over warm-up, then cosine to min_lr_ratio."""
  return optax.warmup_cosine_decay_schedule(
      init_value=0.0, peak_value=1.0, warmup_steps=optim.warmup_steps,
      decay_steps=optim.total_steps, end_value=optim.min_lr_ratio)


# The leaves weight decay applies to, by name: every matrix (a dense layer's kernel, the untied
# LM head) and embedding; never a bias or a norm's scale. By name, not by `ndim >= 2`: under
# `model.scan_layers` biases and scales carry a layer axis too.
DECAYED = ("kernel", "embedding", "lm_head")


def decay_mask(params):
  """True for weight matrices (the untied head `lm_head` included) and embeddings; False for
  biases and norm scales."""
  return jax.tree_util.tree_map_with_path(
      lambda path, _: getattr(path[-1], "key", None) in DECAYED, params)


class SpikeClipState(NamedTuple):
  initial_norm: jax.Array       # the gradient's global norm at the run's first step; 0 before it


def clip_spikes(multiple: float) -> optax.GradientTransformation:
  """Spike-only clipping: a gradient whose global norm is above `multiple` × the run's own at its
  first step is scaled to that norm, as `optax.clip_by_global_norm` scales; any other passes
  unchanged. The first step's norm is kept in the state: a resumed run keeps it, and each run of
  a vectorized program (the state mapped over runs) has its own."""
  def init(params):
    del params
    return SpikeClipState(jnp.zeros((), jnp.float32))

  def update(updates, state, params=None):
    del params
    norm = optax.tree.norm(updates)
    initial = jnp.where(state.initial_norm > 0, state.initial_norm, norm).astype(jnp.float32)
    limit = multiple * initial
    keep = norm <= limit  # also a zero first gradient (limit 0)
    updates = jax.tree.map(lambda t: jnp.where(keep, t, (t / norm.astype(t.dtype)) * limit),
                           updates)
    return updates, SpikeClipState(initial)

  return optax.GradientTransformation(init, update)


def clipping(optim: OptimSpec) -> optax.GradientTransformation:
  """The gradient's clipping before AdamW: at the global norm `clip_norm`, of spikes only above
  `spike_clip` × the first step's norm (`clip_spikes`), or none."""
  if optim.clip_norm:
    return optax.clip_by_global_norm(optim.clip_norm)
  return clip_spikes(optim.spike_clip) if optim.spike_clip else optax.identity()


def optimizer(optim: OptimSpec) -> optax.GradientTransformation:
  """`clipping` → AdamW (decay on matrices and embeddings) at `peak_lr · schedule`; the peak LR
  lives in the optimizer state (`optax.inject_hyperparams`), not in the compiled program."""
  unit = schedule(optim)

  @optax.inject_hyperparams
  def adamw(peak_lr):
    return optax.chain(clipping(optim), optax.adamw(
        lambda step: peak_lr * unit(step), b1=optim.b1, b2=optim.b2, eps=optim.eps,
        weight_decay=optim.weight_decay, mask=decay_mask))

  return adamw(peak_lr=optim.lr)


@flax.struct.dataclass
class TrainState:
  step: jax.Array       # completed optimizer steps
  params: Any
  opt_state: Any
  rng: jax.Array        # root key; the key of step k is fold_in(rng, k)


@dataclasses.dataclass(frozen=True)
class Step:
  """What one run's steps close over: the objective (the model with its loss) and the optimizer;
  `seq_len`, the length of the token rows `init` traces the model with."""
  objective: Objective
  optim: OptimSpec
  seq_len: int

  @functools.cached_property
  def tx(self) -> optax.GradientTransformation:
    return optimizer(self.optim)

  @functools.cached_property
  def lr_multiplier(self) -> optax.Schedule:
    return schedule(self.optim)

  def init(self, seed, peak_lr=None) -> TrainState:
    """The initial state; `seed` and `peak_lr` (default `optim.lr`) may be traced, so one
    compiled init serves every seed and learning rate: the peak LR lives in the optimizer state."""
    init_key, run_key = jax.random.split(jax.random.PRNGKey(seed))
    tokens = jnp.zeros((1, self.seq_len), jnp.int32)
    params = self.objective.model.init(init_key, tokens)["params"]
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
    `stability` (docs/metrics.md §2)."""
    key = jax.random.fold_in(state.rng, state.step)

    def loss_fn(params):
      out = self.objective(params, batch, key, train=True, stats=diagnostics)
      return out.loss_sum / out.count, out

    (loss, out), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params)
    updates, opt_state = self.tx.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    metrics = {
        "train_loss": loss,
        "lr": state.opt_state.hyperparams["peak_lr"] * self.lr_multiplier(state.step),
        "grad_norm": optax.tree.norm(grads),
    }
    if self.objective.z_loss:
      metrics.update(train_loss=(out.loss_sum - out.z_loss_sum) / out.count,
                     z_loss=out.z_loss_sum / out.count)
    if diagnostics:
      metrics.update(update_norm=optax.tree.norm(updates), param_norm=optax.tree.norm(params),
                     **stability(out))
    return state.replace(step=state.step + 1, params=params, opt_state=opt_state), metrics

  def eval_step(self, params, batch, stats: bool = False) -> Sums:
    """The objective's sums on one batch without dropout, under the fixed evaluation key."""
    return self.objective(params, batch, jax.random.PRNGKey(EVAL_SEED), train=False, stats=stats)


def stability(out: Sums) -> dict:
  """The training forward's instability measures (docs/metrics.md §2) from an objective's output
  with `stats`; the attention's only where `AttentionStats` were sown (not by cuDNN attention)."""
  attn = per_layer(out.sown, AttentionStats)
  out = {"train_logz_mean": out.logz_sum / out.count}
  if not attn:
    return out
  return {"train_attn_logit_max": jnp.max(jnp.stack([a.logit_max for a in attn])),
          "train_attn_entropy_min": jnp.min(jnp.stack([a.entropy_H for a in attn])), **out}
