"""One run's training step, pure: the optimizer (`OptimSpec`: clipping, at a norm or of spikes
only, → AdamW, or Muon on the blocks' matrices and AdamW on the rest; warm-up, then cosine or
warm-up–stable–decay), the `TrainState`, and `Step`: `init(seed, peak_lr)`,
`train_step(state, batch)` and `eval_step(params, batch)` of an `Objective` (model.py).
"""

import dataclasses
import functools
import math
from typing import Any, Callable, NamedTuple

import flax
import jax
import jax.numpy as jnp
import optax

from actlab.core.model import (AttentionStats, Objective, Sums, check, choice, lr_factor,
                               non_negative, option, per_layer, positive, within)

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
  name: str = choice("adamw", "muon", help='"adamw", or "muon": Muon on the blocks\' matrices '
                     "(attention and FFN kernels, each layer's own), AdamW on the rest "
                     "(embeddings, the head, biases, norm scales) at muon_adam_lr_ratio · the LR "
                     "(docs/recipe.md)")
  lr: float = option(1e-3, positive, help="peak learning rate, reached after warm-up (muon: the "
                     "blocks' matrices')")
  schedule: str = choice("cosine", "wsd", help='after the warm-up: "cosine" to min_lr_ratio · lr '
                         'at the last step, or "wsd" (warm-up–stable–decay): lr until the last '
                         "decay_fraction of the steps, then down to min_lr_ratio · lr "
                         "(decay_shape)")
  min_lr_ratio: float = option(0.1, within(0, 1, "[]"), help="the schedule decays to "
                               "min_lr_ratio · lr at the last step")
  decay_fraction: float = option(0.2, within(0, 1, "()"), help='schedule "wsd": the last '
                                 "round(decay_fraction · train.steps) steps decay (decay_shape); "
                                 "the warm-up ends before them")
  decay_shape: str = choice("linear", "sqrt", help='schedule "wsd": the decay\'s shape over its '
                            'share x (0 → 1) of the decay steps, 1 − (1 − min_lr_ratio) · x '
                            '("linear") or · √x ("sqrt", Hägele et al. 2024\'s 1 − sqrt)')
  warmup_steps: int = option(100, help="linear warm-up from 0")
  b1: float = option(0.9, within(0, 1))
  b2: float = option(0.95, within(0, 1))
  eps: float = option(1e-8)
  weight_decay: float = option(0.1, non_negative(), help="decoupled (AdamW's, times the LR "
                               "schedule); matrices and embeddings only")
  clip_norm: float = option(1.0, non_negative(" (0 disables)"), help="clip_by_global_norm "
                            "threshold; 0 disables clipping")
  spike_clip: float = option(0.0, non_negative(" (0 = off)"), help="spike-only clipping: a "
                             "gradient whose global norm is above spike_clip × the run's own at "
                             "its first step is scaled to that norm, any other left as it is (10: "
                             "the stability rule's threshold); 0 = off; not with clip_norm")
  muon_momentum: float = option(0.95, within(0, 1), help="muon: the matrices' (Nesterov) "
                                "momentum")
  muon_adam_lr_ratio: float = option(1.0, positive, help="muon: the AdamW part's peak LR is "
                                     "muon_adam_lr_ratio · lr (1: under muon_scale \"rms\" both "
                                     "parts' updates have AdamW's scale)")
  muon_scale: str = choice("rms", "width", help="muon: the orthogonalized update's factor, "
                           '"rms": 0.2 · √max(fan_in, fan_out), AdamW\'s update RMS (Moonlight), '
                           'or "width": √max(1, fan_out / fan_in) (Keller Jordan\'s; optax\'s '
                           "default)")

  def __post_init__(self):
    steps = self.total_steps
    check(0 <= self.warmup_steps < steps, f"optim.warmup_steps={self.warmup_steps} must be >= 0 "
          f"and < train.steps={steps}: set --config.optim.warmup_steps={steps // 10} (a tenth of "
          "the steps) or another value below train.steps")
    check(not (self.clip_norm and self.spike_clip), f"optim.clip_norm={self.clip_norm} and "
          f"optim.spike_clip={self.spike_clip}: one clipping at a time; set the other to 0")
    if self.schedule == "wsd":
      check(self.decay_steps >= 1, f"optim.decay_fraction={self.decay_fraction} of "
            f"train.steps={steps} is no step: raise it to at least {1 / steps:.2g}")
      check(self.warmup_steps <= steps - self.decay_steps, f"optim.warmup_steps="
            f"{self.warmup_steps} and optim.decay_fraction={self.decay_fraction}: the warm-up must "
            f"end before the decay starts, at step {steps - self.decay_steps} of train.steps="
            f"{steps}; lower one of them")

  @property
  def decay_steps(self) -> int:
    """Schedule "wsd": how many of the last steps decay."""
    return round(self.decay_fraction * self.total_steps)


def schedule(optim: OptimSpec) -> optax.Schedule:
  """The learning-rate multiplier: 0 → 1 linearly over the warm-up, then "cosine" to min_lr_ratio
  at step `total_steps`, or "wsd": 1 until the last `decay_steps`, then `decay` to min_lr_ratio
  at step `total_steps`."""
  if optim.schedule == "cosine":
    return optax.warmup_cosine_decay_schedule(
        init_value=0.0, peak_value=1.0, warmup_steps=optim.warmup_steps,
        decay_steps=optim.total_steps, end_value=optim.min_lr_ratio)
  decay_start = optim.total_steps - optim.decay_steps
  return optax.join_schedules(
      [optax.linear_schedule(0.0, 1.0, optim.warmup_steps), optax.constant_schedule(1.0),
       decay(optim)], boundaries=[optim.warmup_steps, decay_start])


def decay(optim: OptimSpec) -> optax.Schedule:
  """WSD's decay, from its first step: 1 − (1 − min_lr_ratio) · x, or · √x (`decay_shape`
  "sqrt"), x the share of `decay_steps` gone (1 from the last on)."""
  if optim.decay_shape == "linear":
    return optax.linear_schedule(1.0, optim.min_lr_ratio, optim.decay_steps)
  return lambda step: 1.0 - (1.0 - optim.min_lr_ratio) * jnp.sqrt(
      jnp.clip(step / optim.decay_steps, 0.0, 1.0))


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


def in_a_block(name: str) -> bool:
  """Whether a top-level parameter name is a block's: `block_<i>` or, with `model.scan_layers`,
  `blocks` (a leading layer axis)."""
  return name == "blocks" or (name.startswith("block_") and name[len("block_"):].isdigit())


def muon_split(params):
  """Each leaf's rule under `optim.name` "muon": "muon" for the blocks' matrices, "adamw" for
  every other leaf (the embeddings, the LM head tied or `lm_head`, the encoder's heads, every
  bias and norm scale), as Keller Jordan's Muon splits them."""
  def rule(path, _):
    keys = [getattr(k, "key", "") for k in path]
    return "muon" if in_a_block(keys[0]) and keys[-1] == "kernel" else "adamw"
  return jax.tree_util.tree_map_with_path(rule, params)


def muon_split_line(params) -> str:
  """`muon_split` in one line, as a run under Muon says it: the matrices (a scanned stack's each
  counted), their names within a block, and the kinds of the AdamW part's leaves."""
  leaves = jax.tree_util.tree_leaves_with_path(params)
  rules = jax.tree.leaves(muon_split(params))
  matrices = [(path, x) for (path, x), r in zip(leaves, rules) if r == "muon"]
  count = sum(math.prod(x.shape[:-2]) for _, x in matrices)
  names = sorted({"/".join(k.key for k in path[1:-1]) for path, _ in matrices})
  rest = [path for (path, _), r in zip(leaves, rules) if r == "adamw"]
  kinds = sorted({path[-1].key for path in rest})
  return (f"optim: muon on {count} matrices ({', '.join(names)} of each block), adamw on "
          f"{len(rest)} other arrays ({', '.join(kinds)})")


def shape_factor(optim: OptimSpec, fan_in: int, fan_out: int) -> float:
  """Muon's factor on an orthogonalized update of a [fan_in, fan_out] matrix (`muon_scale`)."""
  if optim.muon_scale == "rms":
    return 0.2 * math.sqrt(max(fan_in, fan_out))
  return math.sqrt(max(1.0, fan_out / fan_in))


def muon(optim: OptimSpec, lr: optax.Schedule) -> optax.GradientTransformation:
  """Muon on matrices [..., fan_in, fan_out]: optax's Nesterov momentum orthogonalized by its
  quintic Newton–Schulz iteration (5 steps), each leading axis a batch (a scanned stack's layers
  one by one), times `shape_factor`, with AdamW's decoupled decay, at `lr`."""
  per_layer_matrix = optax.contrib.MuonDimensionNumbers(reduction_axis=-2, output_axis=-1)
  return optax.chain(
      optax.contrib.scale_by_muon(
          beta=optim.muon_momentum, nesterov=True,
          weight_dimension_numbers=lambda tree: jax.tree.map(lambda _: per_layer_matrix, tree)),
      optax.stateless(lambda updates, _: jax.tree.map(
          lambda u: shape_factor(optim, *u.shape[-2:]) * u, updates)),
      optax.add_decayed_weights(optim.weight_decay, decay_mask),
      optax.scale_by_learning_rate(lr))


def adamw(optim: OptimSpec, lr: optax.Schedule) -> optax.GradientTransformation:
  """AdamW at `lr`, decaying matrices and embeddings (`decay_mask`)."""
  return optax.adamw(lr, b1=optim.b1, b2=optim.b2, eps=optim.eps,
                     weight_decay=optim.weight_decay, mask=decay_mask)


def update_rule(optim: OptimSpec, lr: optax.Schedule) -> optax.GradientTransformation:
  """The optimizer proper at `lr`: AdamW, or (`name` "muon") Muon on the leaves `muon_split`
  gives it and AdamW on the rest at `muon_adam_lr_ratio` · `lr`."""
  if optim.name == "adamw":
    return adamw(optim, lr)
  adamw_lr = lambda step: optim.muon_adam_lr_ratio * lr(step)
  return optax.partition({"muon": muon(optim, lr), "adamw": adamw(optim, adamw_lr)}, muon_split)


def scale_by_parameter(multiplier: Callable[[tuple[str, ...]], float]
                       ) -> optax.GradientTransformation:
  """Each parameter's update × `multiplier(its names)`, a static number: μP's LR per parameter
  (`model.lr_factor`); a factor of 1 leaves the update as it is."""
  def scale(updates, params=None):
    del params
    return jax.tree_util.tree_map_with_path(
        lambda path, u: u if (f := multiplier(tuple(k.key for k in path))) == 1.0 else u * f,
        updates)
  return optax.stateless(scale)


def optimizer(optim: OptimSpec, per_parameter_lr: Callable[[tuple[str, ...]], float] | None = None
              ) -> optax.GradientTransformation:
  """`clipping` → the optimizer proper (`update_rule`) at `peak_lr · schedule`, each parameter's
  step × `per_parameter_lr(its names)` where one is given (μP); the peak LR lives in the optimizer
  state (`optax.inject_hyperparams`), not in the compiled program."""
  unit = schedule(optim)
  per_parameter = () if per_parameter_lr is None else (scale_by_parameter(per_parameter_lr),)

  @optax.inject_hyperparams
  def at_peak_lr(peak_lr):
    return optax.chain(clipping(optim), update_rule(optim, lambda step: peak_lr * unit(step)),
                       *per_parameter)

  return at_peak_lr(peak_lr=optim.lr)


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
    spec = self.objective.model.spec
    # Under Muon the blocks' matrices take Muon's shape factor, not μP's LR / m (docs/recipe.md).
    mup_adamw = spec.parametrization == "mup" and self.optim.name == "adamw"
    return optimizer(self.optim, functools.partial(lr_factor, spec) if mup_adamw else None)

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
