"""What a run's logged curves (metrics.jsonl) say beyond its final numbers: the loss excess over
the best LR, the MLM plateau's exit and the late descent. Descriptive; never trains."""

import json
import pathlib

import numpy as np
from scipy import stats

from actlab.infra import workdir


def runs(directory: pathlib.Path) -> dict[tuple, pathlib.Path]:
  """(activation, peak LR, seed) -> each finished run under the sweep `directory`, sorted."""
  out = {}
  for summary in pathlib.Path(directory).glob("*/summary.json"):
    c = json.loads((summary.parent / "config.json").read_text())
    out[c["model"]["activation"], c["optim"]["lr"], c["train"]["seed"]] = summary.parent
  return dict(sorted(out.items()))


def curve(metrics_jsonl: pathlib.Path, key: str) -> dict:
  """step -> `key` from a run's metrics.jsonl; ValueError for a log with torn lines."""
  rows, torn = workdir.read_rows(metrics_jsonl)
  if torn:
    raise ValueError(f"{metrics_jsonl}: {torn} unreadable line(s); its curve is not whole")
  return {r["step"]: r[key] for r in rows if r.get(key) is not None}


def loss_excess(directory: pathlib.Path) -> dict:
  """(activation, lr) -> each seed's mean excess (nats, trapezoid over the evaluations) of its val
  loss over the same activation's and seed's at its best LR (lowest mean final val loss)."""
  curves, finals = {}, {}
  for key, run in runs(directory).items():
    curves[key] = curve(run / "metrics.jsonl", "val_loss")
    finals.setdefault(key[:2], []).append(curves[key][max(curves[key])])
  best = {}
  for act, lr in finals:
    if act not in best or np.mean(finals[act, lr]) < np.mean(finals[act, best[act]]):
      best[act] = lr
  out = {}
  for (act, lr, seed), run in curves.items():
    ref = curves[(act, best[act], seed)]
    steps = sorted(set(run) & set(ref))
    excess = [run[t] - ref[t] for t in steps]
    out.setdefault((act, lr), []).append(np.trapezoid(excess, steps) / steps[-1])
  return out


def first_below(loss: dict, bar: float) -> float | None:
  """The step (interpolated) at which `loss` ({step: value}) first falls below `bar`, or None."""
  points = sorted(loss.items())
  for (s0, l0), (s1, l1) in zip(points, points[1:]):
    if l0 >= bar > l1:
      return s0 + (l0 - bar) / (l0 - l1) * (s1 - s0)
  return None


def late_descent(loss: dict, steps: int) -> float | None:
  """How far `loss` ({step: value}) falls over the last `steps` steps; None if not logged."""
  last = max(loss)
  start = loss.get(last - steps)
  return None if start is None else start - loss[last]


def seed_correlation(exits: dict) -> tuple[float, int]:
  """(Pearson r, n) of the exit step and final loss between seeds ({(activation, seed): (step,
  loss, …)}), each less its activation's means."""
  by_act = {}
  for (act, _), (step, loss, *_) in exits.items():
    if step is not None:
      by_act.setdefault(act, []).append((step, loss))
  centred = [v - v.mean(axis=0) for v in map(np.array, by_act.values()) if len(v) > 1]
  steps, losses = np.concatenate(centred).T
  return float(stats.pearsonr(steps, losses).statistic), len(steps)
