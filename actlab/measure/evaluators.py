"""What a run measures besides its training metrics (docs/metrics.md §3–§5). The validation
evaluators share one forward pass: each `read`s its output on the device and `pool`s every
batch's reads on the host. A new measurement is one class here and one line in `create`."""

import dataclasses
from typing import Any, Mapping, Sequence

import jax

from actlab import core
from actlab.measure import histogram, metrics


@dataclasses.dataclass(frozen=True)
class Loss:
  """The validation loss (and accuracy) pooled over every batch: Σ loss / Σ count."""
  name = "loss"
  sown = False

  def read(self, out: core.Sums) -> core.Sums:
    return out.replace(sown=None)

  def pool(self, outs: Sequence[core.Sums]) -> dict[str, float]:
    result = {}
    for prefix, sums in (("", outs), ("mask_", [o.mask for o in outs])):
      count = sum(s.count for s in sums) if sums[0] is not None else 0
      if count:
        result[f"val_{prefix}loss"] = float(sum(s.loss_sum for s in sums) / count)
        if sums[0].correct is not None:
          result[f"val_{prefix}accuracy"] = float(sum(s.correct for s in sums) / count)
    return result


@dataclasses.dataclass(frozen=True)
class ActivationStats:
  """The FFN and attention statistics of docs/metrics.md §4 (`metrics.batch_sums`, `pool`)."""
  name = "act_stats"
  sown = True

  def read(self, out: core.Sums) -> dict:
    return metrics.batch_sums(out.sown)

  def pool(self, outs: Sequence[Mapping]) -> dict[str, float]:
    return metrics.pool(outs)


@dataclasses.dataclass(frozen=True)
class PreactHistogram:
  """Per layer, the histogram of the FFN pre-activation z over [-limit, limit] (`histogram`)."""
  bins: int
  limit: float
  name = "ffn_hist"
  sown = True

  def read(self, out: core.Sums) -> list:
    edges = histogram.edges(self.bins, self.limit)
    return [histogram.count(s.z, edges) for s in core.per_layer(out.sown, core.FFNStats)]

  def pool(self, outs: Sequence[Sequence]) -> dict[str, histogram.Histogram]:
    edges = histogram.edges(self.bins, self.limit)
    return {f"ffn_preact/layer_{i}": histogram.Histogram.pool(edges, [o[i] for o in outs])
            for i in range(len(outs[0]))}


@dataclasses.dataclass(frozen=True)
class Sharpness:
  """The top Hessian eigenvalue of the loss on a fixed batch, every `every` steps (§5)."""
  every: int
  iters: int

  def __call__(self, step: core.Step, params, batch) -> jax.Array:
    def loss_fn(p):
      out = step.eval_step(p, batch)
      return out.loss_sum / out.count
    return metrics.top_hessian_eigenvalue(loss_fn, params, jax.random.PRNGKey(1), self.iters)


@dataclasses.dataclass(frozen=True)
class Evaluators:
  """The evaluators of a config: those on the validation pass, and sharpness (or None)."""
  validation: tuple[Any, ...]
  sharpness: Sharpness | None

  @classmethod
  def create(cls, m, steps: int) -> "Evaluators":
    """The evaluators the `metrics` section `m` asks for, in a run of `steps`."""
    tracked = m.tensorboard or m.wandb_project  # Histograms go to the trackers only.
    validation = ((Loss(),) + ((ActivationStats(),) if m.act_stats else ())
                  + ((PreactHistogram(m.ffn_hist_bins, m.ffn_hist_range),)
                     if m.ffn_hist_bins and tracked else ()))
    # Not in a run too short for an estimate after step 0 (docs/metrics.md §5; `loop` says so).
    sharpness = (Sharpness(m.sharpness_every, m.sharpness_iters)
                 if 0 < m.sharpness_every <= steps else None)
    return cls(validation, sharpness)

  def validation_step(self, step: core.Step, params, batch) -> dict:
    """Pure: one validation batch's `{evaluator name: its read of the output}` (no dropout)."""
    out = step.eval_step(params, batch, stats=any(e.sown for e in self.validation))
    return {e.name: e.read(out) for e in self.validation}

  def pool(self, outs: Sequence[Mapping]) -> dict[str, Any]:
    """Every validation batch's `validation_step` values (on the host) → the row's entries."""
    row = {}
    for e in self.validation:
      row.update(e.pool([o[e.name] for o in outs]))
    return row
