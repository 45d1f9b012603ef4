"""What actlab measures (docs/metrics.md): the activation statistics at evaluation (§4), a row's
training metrics (§2), sharpness (§5), the stability verdict (§6) and the run's summary (§7)."""

import math
from typing import Any, Callable, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from actlab import core

STATUSES = ("stable", "unstable", "diverged")
TAIL_FRACTION = 0.1  # summary `grad_norm` / `final_train_loss`: mean over the last 10% of steps


def finite(x) -> bool:
  """True for a finite number; False for None (how JSON stores NaN/inf), NaN and inf."""
  return x is not None and math.isfinite(x)


# --- Activation statistics ------------------------------------------------------------------


def batch_sums(sown) -> dict:
  """Per-layer sums of one batch's sown statistics (traced): small enough to fetch every eval."""
  ffn = []
  for stats in core.per_layer(sown, core.FFNStats):
    z_NF = stats.z.reshape(-1, stats.z.shape[-1]).astype(jnp.float32)
    h = stats.h.reshape(-1).astype(jnp.float32)
    mean = h.mean()
    ffn.append({
        "entries": jnp.asarray(z_NF.size, jnp.int32),
        "nonpos": jnp.sum(z_NF <= 0, dtype=jnp.int32),
        "fired_F": jnp.any(z_NF > 0, axis=0),
        "h_mean": mean,
        "h_m2": jnp.sum(jnp.square(h - mean)),            # centred: combined exactly by `pool`
    })
  attn = core.per_layer(sown, core.AttentionStats)
  return {"ffn": ffn, "attn_logit_max": [a.logit_max for a in attn],
          "attn_entropy_H": [a.entropy_H for a in attn]}


def pool(batches: Sequence[Mapping]) -> dict[str, float]:
  """Combines `batch_sums` of every validation batch (fetched to the host) into the metrics."""
  out: dict[str, float] = {}
  layers = []
  for i, layer in enumerate(zip(*(b["ffn"] for b in batches))):
    n = np.array([float(s["entries"]) for s in layer])
    means = np.array([float(s["h_mean"]) for s in layer])
    # Chan et al.: pooled mean, and the pooled sum of squared deviations from it.
    mean = float(np.sum(n * means) / n.sum())
    m2 = float(sum(float(s["h_m2"]) for s in layer) + np.sum(n * (means - mean) ** 2))
    fired = np.logical_or.reduce([np.asarray(s["fired_F"]) for s in layer])
    layers.append({
        "act_zero_frac": sum(float(s["nonpos"]) for s in layer) / n.sum(),
        "dead_units": 1.0 - float(fired.mean()),
        "act_mean": mean,
        "act_std": math.sqrt(max(m2, 0.0) / n.sum()),
    })
    out.update({f"{key}/layer_{i}": value for key, value in layers[-1].items()})
  for key in layers[0] if layers else ():
    out[key] = float(np.mean([values[key] for values in layers]))
  logit_max = [max(map(float, layer)) for layer in zip(*(b["attn_logit_max"] for b in batches))]
  out.update({f"attn_logit_max/layer_{i}": value for i, value in enumerate(logit_max)})
  # Each head's entropy averaged over the batches (equal in size), then the least of the heads.
  entropy = [float(np.min(np.mean(layer, axis=0)))
             for layer in zip(*(b["attn_entropy_H"] for b in batches))]
  out.update({f"attn_entropy_min/layer_{i}": value for i, value in enumerate(entropy)})
  if logit_max:
    out.update(attn_logit_max=max(logit_max), attn_entropy_min=min(entropy))
  return out


# --- Sharpness ------------------------------------------------------------------------------


def _tree_dot(a, b) -> jax.Array:
  return sum(jnp.vdot(x, y) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


def top_hessian_eigenvalue(loss_fn: Callable, params, key: jax.Array, num_iters: int) -> jax.Array:
  """The largest-magnitude eigenvalue of ∇²loss_fn(params), signed, by power iteration (§5)."""
  hvp = lambda v: jax.jvp(jax.grad(loss_fn), (params,), (v,))[1]
  leaves, treedef = jax.tree.flatten(params)
  keys = jax.random.split(key, len(leaves))
  v = treedef.unflatten([jax.random.normal(k, x.shape, jnp.float32) for k, x in zip(keys, leaves)])

  def normalize(t):
    norm = jnp.sqrt(_tree_dot(t, t))
    return jax.tree.map(lambda x: x / jnp.maximum(norm, 1e-30), t)

  def body(_, carry):
    v, _ = carry
    hv = hvp(v)
    return normalize(hv), _tree_dot(v, hv)

  _, eigenvalue = jax.lax.fori_loop(0, num_iters, body, (normalize(v), jnp.zeros((), jnp.float32)))
  return eigenvalue


# --- Summaries and the stability verdict ----------------------------------------------------


def jsonable(row: Mapping[str, Any]) -> dict:
  """A metrics row with non-finite numbers as None (null), so metrics.jsonl stays strict JSON."""
  return {k: (v if not isinstance(v, float) or math.isfinite(v) else None) for k, v in row.items()}


# Per-step metrics a row averages over its steps (the rest: the last step's).
INTERVAL_MEANS = ("train_loss", "z_loss")


def interval(steps: Sequence[Mapping]) -> dict[str, float]:
  """A row's training metrics from its steps' (docs/metrics.md §2)."""
  row = {k: float(v) for k, v in steps[-1].items()}
  for key in INTERVAL_MEANS:
    if key in row:
      row[key] = float(np.mean([s[key] for s in steps]))
  row["grad_norm_max"] = float(np.max([s["grad_norm"] for s in steps]))
  return row


# A run has diverged where one of these is non-finite (docs/metrics.md §6).
DIVERGED_IF_NONFINITE = ("train_loss", "grad_norm", "param_norm", "val_loss")


def first_nonfinite(rows: Sequence[Mapping]):
  """Index of the first row with a non-finite `DIVERGED_IF_NONFINITE` value, or None."""
  for i, row in enumerate(rows):
    if any(k in row and not finite(row[k]) for k in DIVERGED_IF_NONFINITE):
      return i
  return None


def verdict(rows: Sequence[Mapping], *, warmup_steps: int, uniform_loss: float,
            spike_rel: float, final_gap_rel: float, uniform_frac: float,
            grad_rel_max: float = math.inf) -> dict:
  """The stability verdict of a run's rows (docs/metrics.md §6; `uniform_loss`: ln of the number
  of outputs): {"status", "reasons", "spike_steps", "diverged_at" (step or None)}."""
  reasons, spike_steps, diverged_at = [], [], None
  if (i := first_nonfinite(rows)) is not None:
    diverged_at = rows[i]["step"]
    bad = next(k for k in DIVERGED_IF_NONFINITE if k in rows[i] and not finite(rows[i][k]))
    reasons.append(f"non-finite {bad} at step {diverged_at}")
  vals = [r["val_loss"] for r in rows if finite(r.get("val_loss"))]
  if diverged_at is None and vals and vals[-1] >= uniform_frac * uniform_loss:
    reasons.append(f"final val loss {vals[-1]:.3f} ≥ {uniform_frac:g}·ln(outputs) = "
                   f"{uniform_frac * uniform_loss:.3f}: no better than chance")
  if reasons:
    return {"status": "diverged", "reasons": reasons, "spike_steps": [], "diverged_at": diverged_at}

  best = math.inf
  for row in rows:
    loss = row.get("train_loss")
    if loss is None:
      continue
    if row["step"] > warmup_steps and loss > (1 + spike_rel) * best:
      spike_steps.append(row["step"])
    best = min(best, loss)
  if spike_steps:
    reasons.append(f"{len(spike_steps)} train-loss spike(s) > {1 + spike_rel:g}× the best earlier "
                   f"loss after warm-up, first at step {spike_steps[0]}")
  init = grad_norm_init(rows)
  top = max(rows, key=lambda r: r.get("grad_norm_max", -1), default={})
  if grad_rel_max and init and top.get("grad_norm_max", 0) > grad_rel_max * init:
    reasons.append(f"gradient norm {top['grad_norm_max']:.3g} by step {top['step']} > "
                   f"{grad_rel_max:g}× its value at initialisation ({init:.3g})")
  if vals:
    final, best_val = vals[-1], min(vals)
    if final > (1 + final_gap_rel) * best_val:
      reasons.append(f"final val loss {final:.3f} > {1 + final_gap_rel:g}× the best "
                     f"{best_val:.3f}")
  return {"status": "unstable" if reasons else "stable", "reasons": reasons,
          "spike_steps": spike_steps, "diverged_at": None}


def grad_norm_init(rows: Sequence[Mapping]) -> float | None:
  """The gradient norm at the initial parameters (the first row of a run from step 0 has it)."""
  return next((r["grad_norm_init"] for r in rows if "grad_norm_init" in r), None)


SUMMARY_LAST_EVAL = ("act_zero_frac", "dead_units", "act_mean", "act_std", "attn_logit_max")


def summarize(rows: Sequence[Mapping], steps: int) -> dict:
  """A run's final numbers from its metrics rows (docs/metrics.md §7)."""
  vals = [r["val_loss"] for r in rows if finite(r.get("val_loss"))]
  last_step = rows[-1]["step"] if rows else 0
  tail = [r for r in rows if r["step"] > last_step - TAIL_FRACTION * steps and "train_loss" in r]
  stats_rows = [r for r in rows if "act_zero_frac" in r]
  sharp = [r["sharpness"] for r in rows if finite(r.get("sharpness"))]

  def mean(key):
    xs = [r[key] for r in tail if finite(r.get(key))]
    return float(np.mean(xs)) if xs and len(xs) == len(tail) else None

  grad_max = max((r["grad_norm_max"] for r in rows if finite(r.get("grad_norm_max"))),
                 default=None)
  init = grad_norm_init(rows)
  entropy = [r[k] for r in rows for k in ("attn_entropy_min", "train_attn_entropy_min")
             if finite(r.get(k))]
  out = {
      "initial_val_loss": vals[0] if vals else None,
      "final_val_loss": vals[-1] if vals else None,
      "best_val_loss": min(vals) if vals else None,
      "final_train_loss": mean("train_loss"),
      "grad_norm": mean("grad_norm"),
      "grad_norm_max": grad_max,
      "grad_norm_init": init,
      "grad_norm_max_rel": grad_max / init if grad_max is not None and init else None,
      "attn_entropy_min": min(entropy) if entropy else None,
      "sharpness": sharp[-1] if sharp else None,
      "sharpness_max": max((r["sharpness"] for r in rows
                            if r["step"] > 0 and finite(r.get("sharpness"))), default=None),
  }
  # The test windows (data.test_batches: scored once, at the last step); MLM's [MASK] positions.
  out.update({f"final_{k}": v for k, v in (rows[-1] if rows else {}).items()
              if k.startswith(("test_", "val_mask_"))})
  out.update({k: stats_rows[-1].get(k) if stats_rows else None for k in SUMMARY_LAST_EVAL})
  accs = [r["val_accuracy"] for r in rows if finite(r.get("val_accuracy"))]
  if accs:  # Objectives that count correct predictions: MLM and classification.
    out.update(initial_val_accuracy=accs[0], final_val_accuracy=accs[-1],
               best_val_accuracy=max(accs))
  return out

