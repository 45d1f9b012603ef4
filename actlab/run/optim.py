"""The optimizer: clip_by_global_norm → AdamW (decay on matrices and embeddings), with
linear warm-up then cosine decay to `min_lr_ratio · lr`.

The peak learning rate lives in the optimizer state (`optax.inject_hyperparams`), not in the
compiled program, so runs that differ only in learning rate share one compiled step.
"""

import jax
import ml_collections
import optax

DECAYED_LEAVES = ("kernel", "embedding")


def schedule(optim: ml_collections.ConfigDict, total_steps: int) -> optax.Schedule:
  """The learning-rate multiplier: 0 → 1 over warm-up, then cosine to min_lr_ratio."""
  return optax.warmup_cosine_decay_schedule(
      init_value=0.0, peak_value=1.0, warmup_steps=optim.warmup_steps,
      decay_steps=total_steps, end_value=optim.min_lr_ratio)


def decay_mask(params):
  """True for weight matrices and embeddings; False for biases and LayerNorm scales."""
  return jax.tree_util.tree_map_with_path(
      lambda path, _: getattr(path[-1], "key", None) in DECAYED_LEAVES, params)


def make(optim: ml_collections.ConfigDict, total_steps: int) -> optax.GradientTransformation:
  unit = schedule(optim, total_steps)

  @optax.inject_hyperparams
  def adamw(peak_lr):
    clip = optax.clip_by_global_norm(optim.clip_norm) if optim.clip_norm else optax.identity()
    return optax.chain(clip, optax.adamw(
        lambda step: peak_lr * unit(step), b1=optim.b1, b2=optim.b2, eps=optim.eps,
        weight_decay=optim.weight_decay, mask=decay_mask))

  return adamw(peak_lr=optim.lr)


def learning_rate(optim: ml_collections.ConfigDict, total_steps: int, opt_state, step):
  """The learning rate applied at `step` (for logging)."""
  return opt_state.hyperparams["peak_lr"] * schedule(optim, total_steps)(step)
