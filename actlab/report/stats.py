"""A sweep's runs (`Run`), its grid (axes, groups, `pivot`), and the rules over them
(docs/metrics.md §8, §9): "not learned", the largest stable LR, the LR sensitivity. No IO."""

import dataclasses
from typing import Any, Mapping, Sequence

import numpy as np

from actlab.measure.metrics import finite

LR_KEY, SEED_KEY = "optim.lr", "train.seed"


def mean_sd(values: Sequence[float]) -> tuple[float, float | None]:
  """Mean and sample standard deviation (None for a single value)."""
  x = np.asarray(values, np.float64)
  return float(x.mean()), (float(x.std(ddof=1)) if x.size > 1 else None)


def learned(final_val_loss: float | None, unigram_loss: float | None) -> bool | None:
  """Whether the final val loss is below the unigram loss (docs/metrics.md §9); None if unknown."""
  if finite(final_val_loss) and finite(unigram_loss):
    return final_val_loss < unigram_loss
  return None


def capped_losses(final: Sequence[float | None], initial: float) -> np.ndarray:
  """min(ℓ(η), ℓ₀) of the final val loss at each LR and the initial one; None (diverged) is ℓ₀."""
  return np.array([initial if x is None else min(x, initial) for x in final], np.float64)


def sensitivity(capped: Sequence[float]) -> float:
  """One seed's LR sensitivity (Wortsman et al. 2023) from its `capped_losses`."""
  c = np.asarray(capped, np.float64)
  return float(np.mean(c - c.min()))


@dataclasses.dataclass
class Run:
  """One cell of a sweep as `report_load.load` read it."""
  name: str
  overrides: dict[str, Any]          # axis key -> value, seed included
  state: str                         # "done", "incomplete" (metrics but no summary), "missing"
  summary: dict = dataclasses.field(default_factory=dict)
  rows: list = dataclasses.field(default_factory=list)
  unreadable: list = dataclasses.field(default_factory=list)  # what could not be read, said

  @property
  def status(self) -> str:
    return self.summary.get("status", self.state) if self.state == "done" else self.state

  def value(self, key: str) -> float | None:
    """A finite summary value of a finished, non-diverged run, else None; `max:<row key>`: the
    largest over the rows."""
    finished = self.status in ("stable", "unstable")
    ok = finished or (key == "initial_val_loss" and self.state == "done")
    if key.startswith("max:"):
      logged = [r[key[4:]] for r in self.rows if finite(r.get(key[4:]))]
      v = max(logged) if ok and logged else None
    else:
      v = self.summary.get(key) if ok else None
    return v if finite(v) else None

  @property
  def learned(self) -> bool | None:
    # The MLM's bar is the context-free copy predictor's loss, below the unigram's.
    bar = self.summary.get("copy_loss", self.summary.get("unigram_loss"))
    return learned(self.value("final_val_loss"), bar)

  @property
  def stable(self) -> bool:
    return self.status == "stable" and self.learned is not False


def group_keys(manifest: Mapping) -> list[str]:
  """The axes other than the seed, the LR first (as in the reference table)."""
  return sorted((k for k in manifest["axes"] if k != SEED_KEY), key=lambda k: k != LR_KEY)


def other_axes(manifest: Mapping) -> list[str]:
  """The axes a table row or a plot colour is for: all but the LR and the seed."""
  return [k for k in group_keys(manifest) if k != LR_KEY]


def fmt_value(v) -> str:
  """An axis value as tables and legends print it."""
  return f"{v:g}" if isinstance(v, float) else str(v)


def activation_axis(manifest: Mapping) -> str | None:
  """The compared axis: the first named `*activation`, else the first but the LR and the seed."""
  others = other_axes(manifest)
  return next((k for k in others if k.endswith("activation")), others[0] if others else None)


def groups(manifest: Mapping, runs: Sequence[Run], keys: Sequence[str]) -> dict[tuple, list[Run]]:
  """Runs by their values of `keys`, in grid order; by the LR grid first when keys[0] is the LR."""
  out: dict[tuple, list[Run]] = {}
  for run in runs:
    out.setdefault(tuple(run.overrides[k] for k in keys), []).append(run)
  if keys and keys[0] == LR_KEY:  # A stable sort: grid order within an LR.
    return dict(sorted(out.items(), key=lambda kv: manifest["axes"][LR_KEY].index(kv[0][0])))
  return out


def pivot(manifest: Mapping, runs: Sequence[Run], axis: str) -> dict[tuple, dict[tuple, Run]]:
  """{(value of `axis`, seed): Run} per combination of the other axes but the seed (`groups`)."""
  keys = [k for k in group_keys(manifest) if k != axis]
  return {key: {(r.overrides[axis], r.overrides[SEED_KEY]): r for r in group}
          for key, group in groups(manifest, runs, keys).items()}


def largest_stable_lr(manifest: Mapping, runs: Sequence[Run]) -> dict[tuple, Any]:
  """Per combination of the non-LR axes: the largest LR with every seed `Run.stable`, or None."""
  if LR_KEY not in manifest["axes"]:
    return {}
  return {key: max((lr for lr in manifest["axes"][LR_KEY] if all(
              (lr, s) in cells and cells[lr, s].stable for s in manifest["seeds"])), default=None)
          for key, cells in pivot(manifest, runs, LR_KEY).items()}


def lr_sensitivity(manifest: Mapping, runs: Sequence[Run]) -> dict[tuple, dict]:
  """Per combination of the non-LR axes: {"per_seed": `sensitivity` of each seed finished at
  every LR, "best_lr": the LR of lowest mean capped loss, or None}."""
  lrs = manifest["axes"].get(LR_KEY, [])
  if len(lrs) < 2:
    return {}
  out = {}
  for key, cells in pivot(manifest, runs, LR_KEY).items():
    capped = []
    for seed in manifest["seeds"]:
      done = [cells.get((lr, seed)) for lr in lrs]
      init = [r.value("initial_val_loss") for r in done if r is not None and r.state == "done"]
      if len(init) == len(lrs) and any(v is not None for v in init):
        ell0 = min(v for v in init if v is not None)  # the same at every LR: it is the seed's
        capped.append(capped_losses([r.value("final_val_loss") for r in done], ell0))
    best = lrs[int(np.argmin(np.mean(capped, axis=0)))] if capped else None
    out[key] = {"per_seed": [sensitivity(c) for c in capped], "best_lr": best}
  return out
