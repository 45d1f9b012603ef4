"""The numbers the report's plots draw, and the series' colours (docs/metrics.md §9, "Plots"):
pure functions of a sweep's runs."""

import collections
import math
import re
from typing import Mapping, Sequence

import numpy as np

from actlab.report import comparisons, stats
from actlab.report.stats import LR_KEY, Run, finite

LAYER_STATS = ("dead_units", "act_zero_frac", "act_mean")
FRACTIONS = ("act_zero_frac", "dead_units")  # shares in [0, 1]: mean ± sd is cut to [0, 1]
_LINE_STYLES = ("-", "--", ":", "-.")


def _mean_sd(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """Mean and sd (n − 1) over the rows of a seeds × points array; sd NaN for one seed."""
  one = len(values) < 2
  return values.mean(axis=0), np.full(values.shape[1:], np.nan) if one else values.std(0, ddof=1)


def groups(manifest: Mapping, runs: Sequence[Run]) -> dict[tuple, list[Run]]:
  """The runs per combination of the axes other than the LR and the seed (one series each)."""
  return stats.groups(manifest, runs, stats.other_axes(manifest))


def lr_grid(manifest: Mapping) -> list:
  """The swept LRs in increasing order; [None] without an LR axis."""
  return sorted(manifest["axes"].get(LR_KEY, [None]), key=lambda x: (x is None, x))


# A group's curve: at each step, the mean, the sd (NaN for one seed) over its n seeds.
Band = collections.namedtuple("Band", "steps mean sd n")


def band(runs: Sequence[Run], key: str) -> Band | None:
  """Mean ± sd of `key` over the runs that logged it, at the steps where all are finite; or None."""
  series = [{row["step"]: row[key] for row in r.rows if finite(row.get(key))} for r in runs]
  series = [s for s in series if s]
  if not series:
    return None
  steps = sorted(set.intersection(*(set(s) for s in series)))
  if not steps:
    return None
  values = np.array([[s[t] for t in steps] for s in series], np.float64)
  return Band(np.array(steps), *_mean_sd(values), len(series))


def spread(mean, sd, key: str) -> tuple[np.ndarray, np.ndarray]:
  """The ends of mean ± sd, each cut to [0, 1] where `key` is a fraction (`FRACTIONS`)."""
  low, high = np.asarray(mean) - np.asarray(sd), np.asarray(mean) + np.asarray(sd)
  return (np.clip(low, 0.0, 1.0), np.clip(high, 0.0, 1.0)) if key in FRACTIONS else (low, high)


def log_scale(values: Sequence[float], span: float = 30.0) -> bool:
  """Whether the finite values are all positive and max/min exceeds `span` (about 1.5 decades)."""
  x = np.asarray([v for v in values if finite(v)], np.float64)
  return bool(x.size and x.min() > 0 and x.max() / x.min() > span)


def best_lrs(manifest: Mapping, runs: Sequence[Run]) -> dict[tuple, object]:
  """Per group of the non-LR axes with a final val loss, the LR with the lowest mean over seeds."""
  out = {}
  for key, group in groups(manifest, runs).items():
    by_lr: dict = {}
    for r in group:
      if r.value("final_val_loss") is not None:
        by_lr.setdefault(r.overrides.get(LR_KEY), []).append(r.value("final_val_loss"))
    if by_lr:
      out[key] = min(by_lr, key=lambda lr: np.mean(by_lr[lr]))
  return out


def _layers(row: Mapping, key: str) -> dict[int, float]:
  return {int(m.group(1)): v for k, v in row.items()
          if (m := re.fullmatch(re.escape(key) + r"/layer_(\d+)", k)) and finite(v)}


def layer_stats(manifest: Mapping, runs: Sequence[Run]) -> dict[tuple, dict]:
  """Per group at its best LR: {"lr", "n": seeds, key: (layers, mean, sd) for each of
  `LAYER_STATS`} at the last evaluation of its finished, non-diverged runs."""
  out = {}
  best = best_lrs(manifest, runs)
  for key, group in groups(manifest, runs).items():
    if key not in best:
      continue
    at = [r for r in group if r.overrides.get(LR_KEY) == best[key]
          and r.value("final_val_loss") is not None]
    last = [next((row for row in reversed(r.rows) if _layers(row, LAYER_STATS[0])), {})
            for r in at]
    entry = {"lr": best[key], "n": len(at)}
    for k in LAYER_STATS:
      per_run = [_layers(row, k) for row in last]
      layers = sorted(set.intersection(*map(set, per_run)))  # `at`: at least the best LR's run
      values = np.array([[p[i] for i in layers] for p in per_run], np.float64)
      entry[k] = (np.array(layers), *_mean_sd(values))
    out[key] = entry
  return out


# A group's final val loss at an LR (None without an LR axis): mean (NaN for n = 0) and its 95%
# t interval (NaN for n < 2).
Interval = collections.namedtuple("Interval", "group lr n mean low high")


def forest(manifest: Mapping, runs: Sequence[Run]) -> list[Interval]:
  """Every group's final val loss at every LR with its 95% t interval, the best group first."""
  out = []
  for key, group in groups(manifest, runs).items():
    for lr in lr_grid(manifest):
      vals = [r.value("final_val_loss") for r in group if r.overrides.get(LR_KEY) == lr
              and r.value("final_val_loss") is not None]
      d = comparisons.paired_difference(vals, np.zeros(len(vals)))  # mean ± t₀.₉₇₅,ₙ₋₁·sd/√n
      out.append(Interval(key, lr, d.n, d.mean, d.ci_low, d.ci_high))
  best = lambda group: min((i.mean for i in out if i.group == group and i.n), default=math.inf)
  return sorted(out, key=lambda i: best(i.group))  # stable: LR order kept


def styles(n: int) -> list[tuple[str, str]]:
  """n distinct (colour as #rrggbb, line style), as docs/metrics.md §9 says."""
  import matplotlib
  from matplotlib.colors import to_hex
  if n <= 10:
    colors = matplotlib.colormaps["tab10"].colors[:n]
  elif n <= 20:
    tab20 = matplotlib.colormaps["tab20"].colors
    colors = [*tab20[0::2], *tab20[1::2]][:n]
  else:
    colors = matplotlib.colormaps["turbo"](np.linspace(0.03, 0.97, n))
  return [(to_hex(c), _LINE_STYLES[i % 4] if n > 20 else "-") for i, c in enumerate(colors)]
