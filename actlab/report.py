"""Turns a sweep directory into `report.md` and PNG plots: `python -m actlab.report runs/<sweep>`.

The grid comes from the sweep's `sweep.json` (written by `actlab.sweep`), so cells that have not
run yet are listed as missing; without it, every subdirectory with a `config.json` is a cell and
the axes are the config fields that differ between them. Works on a partly finished sweep.

Table (one row per combination of the axes other than the seed, the LR first and rows ordered by
it, as in the reference study's table, docs/reference.md §2.2; mean ± sd over the seeds that
finished with a finite value, "(n=k)" when that is fewer than the grid's seeds):

| column | source (summary.json of each run; definitions in docs/metrics.md §7) |
|---|---|
| val loss | `final_val_loss`: validation loss at the last step (encoder: MLM loss over the masked positions) |
| val acc | `final_val_accuracy`, only for runs that measure it: MLM accuracy over the masked positions, or classification accuracy |
| Dead % | `act_zero_frac` at the last evaluation: share of FFN entries with z ≤ 0 |
| dead units | `dead_units` at the last evaluation: share of FFN units with z ≤ 0 on every token |
| act mean | `act_mean` at the last evaluation: mean FFN hidden activation h |
| grad norm | `grad_norm`: mean pre-clipping gradient norm over the last 10% of steps |
| sharpness | `sharpness_max` (when measured): largest top-Hessian-eigenvalue estimate after step 0 |
| status | counts of stable / unstable / diverged runs, then incomplete and missing ones |

LR sensitivity (Wortsman et al. 2023, "Small-scale proxies for large-scale Transformer training
instabilities"), per seed and combination of the other axes: the mean over the swept LRs of
min(ℓ(η), ℓ₀) − min_η ℓ(η), where ℓ(η) is the final val loss at peak LR η (a diverged run counts as
ℓ₀) and ℓ₀ the val loss at initialisation; reported as mean ± sd over seeds complete at every LR
(docs/metrics.md §8).
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
import sys
from typing import Any, Sequence

import numpy as np

from actlab import workdir
from actlab.errors import UserError, reported
from actlab.metrics import STATUSES, finite

LR_KEY, SEED_KEY = "optim.lr", "train.seed"
HEADERS = {"optim.lr": "LR", "model.activation": "activation"}


@dataclasses.dataclass
class Run:
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
    """A finite summary value of a finished, non-diverged run (a diverged run has no values at
    the last step), else None; `initial_val_loss` of any finished run."""
    finished = self.status in ("stable", "unstable")
    ok = finished or (key == "initial_val_loss" and self.state == "done")
    v = self.summary.get(key) if ok else None
    return v if finite(v) else None


def load(root) -> tuple[dict, list[Run]]:
  """The sweep manifest (or one inferred from the cell configs) and every cell's Run."""
  root = pathlib.Path(root)
  manifest = workdir.read_json(root / "sweep.json")
  if manifest is None:
    configs = {p.parent.name: workdir.dotted(c) for p in sorted(root.glob("*/config.json"))
               if (c := workdir.read_json(p)) is not None}
    if not configs:
      what = "does not exist" if not root.exists() else "has no sweep.json and no */config.json"
      raise UserError(f"{root} {what}: not a sweep directory (the --workdir of actlab.sweep)")
    keys = sorted({k for c in configs.values() for k in c})
    axes = [k for k in keys if k != SEED_KEY
            and len({json.dumps(c.get(k)) for c in configs.values()}) > 1]
    values = lambda k: sorted({c.get(k) for c in configs.values()}, key=_order)
    manifest = {"sweep": str(root), "description": "", "seeds": values(SEED_KEY),
                "axes": {k: values(k) for k in axes},
                "cells": [{"name": n, "overrides": {k: c.get(k) for k in [*axes, SEED_KEY]}}
                          for n, c in configs.items()]}
  runs = []
  for cell in manifest["cells"]:
    d = root / cell["name"]
    rows, torn = workdir.read_rows(d / "metrics.jsonl")
    unreadable = [f"{torn} unreadable line(s) in metrics.jsonl"] if torn else []
    summary = workdir.read_summary(d, warn=False)
    if summary is None and (d / "summary.json").exists():
      unreadable.append("summary.json unreadable")
    state = "done" if summary is not None else "incomplete" if rows else "missing"
    runs.append(Run(cell["name"], cell["overrides"], state, summary or {}, rows, unreadable))
  return manifest, runs


def _order(value):
  """Numbers in numeric order, then everything else as text."""
  number = isinstance(value, (int, float)) and not isinstance(value, bool)
  return (0, value, "") if number else (1, 0, str(value))


def _group_keys(manifest) -> list[str]:
  """The axes other than the seed, the LR first (as in the reference table)."""
  keys = [k for k in manifest["axes"] if k != SEED_KEY]
  return sorted(keys, key=lambda k: k != LR_KEY)


def _fmt_value(v) -> str:
  return f"{v:g}" if isinstance(v, float) else str(v)


def _groups(manifest, runs) -> dict[tuple, list[Run]]:
  keys = _group_keys(manifest)
  out: dict[tuple, list[Run]] = {}
  for run in runs:
    out.setdefault(tuple(run.overrides[k] for k in keys), []).append(run)
  return out


def mean_sd(values: Sequence[float]) -> tuple[float, float | None]:
  """Mean and sample standard deviation (None for a single value)."""
  a = np.asarray(values, np.float64)
  return float(a.mean()), (float(a.std(ddof=1)) if a.size > 1 else None)


def _cell(runs: Sequence[Run], key: str, n_seeds: int, scale: float = 1.0, digits: int = 3,
          suffix: str = "") -> str:
  values = [r.value(key) * scale for r in runs if r.value(key) is not None]
  if not values:
    return "—"
  mean, sd = mean_sd(values)
  spread = f" ± {sd:.{digits}f}" if sd else ""  # None: one value; 0: all equal (e.g. params)
  text = f"{mean:,.{digits}f}" + spread + suffix
  return text + (f" (n={len(values)})" if len(values) < n_seeds else "")


def status_counts(runs: Sequence[Run]) -> str:
  order = (*STATUSES, "incomplete", "missing")
  counts = {s: sum(r.status == s for r in runs) for s in order}
  return ", ".join(f"{n} {s}" for s, n in counts.items() if n)


COLUMNS = [  # (header, summary key, scale, digits, suffix)
    ("val loss", "final_val_loss", 1.0, 3, ""),
    ("Dead %", "act_zero_frac", 100.0, 1, "%"),
    ("dead units", "dead_units", 100.0, 1, "%"),
    ("act mean", "act_mean", 1.0, 3, ""),
    ("grad norm", "grad_norm", 1.0, 3, ""),
]


def results_table(manifest, runs) -> str:
  keys = _group_keys(manifest)
  n_seeds = len(manifest["seeds"])
  columns = list(COLUMNS)
  if any(r.value("final_val_accuracy") is not None for r in runs):  # MLM, classification
    columns.insert(1, ("val acc", "final_val_accuracy", 100.0, 1, "%"))
  if any(r.value("sharpness_max") is not None for r in runs):
    columns.append(("sharpness", "sharpness_max", 1.0, 1, ""))
  if len({r.summary.get("params") for r in runs if r.state == "done"}) > 1:
    columns.append(("params", "params", 1.0, 0, ""))
  header = [HEADERS.get(k, k.rsplit(".", 1)[-1]) for k in keys]
  header += [c[0] for c in columns] + ["status"]
  lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
  groups = list(_groups(manifest, runs).items())
  if LR_KEY in manifest["axes"]:  # Rows by LR, then in grid order (a stable sort).
    groups.sort(key=lambda item: manifest["axes"][LR_KEY].index(item[0][0]))
  for values, group in groups:
    cells = [_fmt_value(v) for v in values]
    cells += [_cell(group, key, n_seeds, scale, digits, suffix)
              for _, key, scale, digits, suffix in columns]
    cells.append(status_counts(group))
    lines.append("| " + " | ".join(cells) + " |")
  return "\n".join(lines)


def lr_sensitivity(manifest, runs) -> dict[tuple, dict]:
  """Per combination of the non-LR axes: {"per_seed": [...], "best_lr": η with the lowest mean}."""
  if LR_KEY not in manifest["axes"] or len(manifest["axes"][LR_KEY]) < 2:
    return {}
  lrs = manifest["axes"][LR_KEY]
  others = [k for k in _group_keys(manifest) if k != LR_KEY]
  table: dict[tuple, dict] = {}
  for run in runs:
    key = tuple(run.overrides[k] for k in others)
    table.setdefault(key, {}).setdefault(run.overrides[SEED_KEY], {})[run.overrides[LR_KEY]] = run
  out = {}
  for key, by_seed in table.items():
    per_seed, means = [], {}
    for seed, by_lr in by_seed.items():
      if not all(lr in by_lr and by_lr[lr].state == "done" for lr in lrs):
        continue
      init = [v for v in (by_lr[lr].value("initial_val_loss") for lr in lrs) if v is not None]
      if not init:
        continue
      l0 = min(init)  # the same for every LR: the initialisation depends on the seed only
      losses = {lr: min(by_lr[lr].value("final_val_loss"), l0)
                if by_lr[lr].value("final_val_loss") is not None else l0 for lr in lrs}
      best = min(losses.values())
      per_seed.append(float(np.mean([losses[lr] - best for lr in lrs])))
      for lr in lrs:
        means.setdefault(lr, []).append(losses[lr])
    best_lr = min(means, key=lambda lr: np.mean(means[lr])) if means else None
    out[key] = {"per_seed": per_seed, "best_lr": best_lr}
  return out


def sensitivity_table(manifest, runs) -> str:
  sens = lr_sensitivity(manifest, runs)
  if not sens:
    return ""
  others = [k for k in _group_keys(manifest) if k != LR_KEY]
  header = [HEADERS.get(k, k.rsplit(".", 1)[-1]) for k in others] + [
      "LR sensitivity (nats)", "best LR", "seeds"]
  lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
  for key, s in sens.items():
    if s["per_seed"]:
      mean, sd = mean_sd(s["per_seed"])
      value = f"{mean:.3f}" + (f" ± {sd:.3f}" if sd is not None else "")
    else:
      value = "— (no seed complete at every LR)"
    best = _fmt_value(s["best_lr"]) if s["best_lr"] is not None else "—"
    lines.append("| " + " | ".join([*map(_fmt_value, key), value, best,
                                     str(len(s["per_seed"]))]) + " |")
  return "\n".join(lines)


def runs_table(runs) -> str:
  """One row per run; incomplete ones (in progress, interrupted) say how far they got, and
  anything unreadable is said, never silently dropped."""
  lines = ["| run | status | val loss | why |", "|---|---|---|---|"]
  for r in runs:
    if r.state != "done":
      why = [f"reached step {r.rows[-1]['step']}" if r.rows else "not started", *r.unreadable]
      lines.append(f"| {r.name} | {r.state} | — | {'; '.join(why)} |")
      continue
    val = r.value("final_val_loss")
    why = "; ".join(r.summary.get("status_reasons", []) + r.unreadable) or "—"
    lines.append(f"| {r.name} | {r.status} | {'—' if val is None else f'{val:.3f}'} | {why} |")
  return "\n".join(lines)


# --- Plots ----------------------------------------------------------------------------------


def _colors(manifest, runs) -> dict[tuple, str]:
  """One colour per combination of the non-LR axes, in grid order, the same in every plot."""
  others = [k for k in _group_keys(manifest) if k != LR_KEY]
  labels = list(dict.fromkeys(tuple(r.overrides[k] for k in others) for r in runs))
  return {lab: f"C{i % 10}" for i, lab in enumerate(labels)}


def plot_val_vs_lr(manifest, runs, path: pathlib.Path) -> bool:
  import matplotlib.pyplot as plt
  if LR_KEY not in manifest["axes"]:
    return False
  others = [k for k in _group_keys(manifest) if k != LR_KEY]
  fig, ax = plt.subplots(figsize=(6, 4))
  by_other: dict[tuple, dict] = {}
  for run in runs:
    key = tuple(run.overrides[k] for k in others)
    by_other.setdefault(key, {}).setdefault(run.overrides[LR_KEY], []).append(run)
  for key, by_lr in by_other.items():
    lrs, means, sds, diverged = [], [], [], []
    for lr in sorted(by_lr):
      vals = [r.value("final_val_loss") for r in by_lr[lr] if r.value("final_val_loss") is not None]
      if vals:
        mean, sd = mean_sd(vals)
        lrs.append(lr), means.append(mean), sds.append(sd or 0.0)
      if any(r.status == "diverged" for r in by_lr[lr]):
        diverged.append(lr)
    label = ", ".join(map(_fmt_value, key)) or "run"
    color = _colors(manifest, runs)[key]
    ax.errorbar(lrs, means, yerr=sds, marker="o", capsize=4, label=label, color=color)
    for lr in diverged:
      ax.axvline(lr, color=color, linestyle=":", alpha=0.6)
  ax.set_xscale("log")
  ax.set_xlabel("peak learning rate")
  ax.set_ylabel("final val loss (nats)")
  ax.set_title("Val loss vs LR (mean ± sd over seeds; dotted: a seed diverged)")
  ax.legend()
  ax.grid(alpha=0.3)
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)
  return True


def plot_curves(manifest, runs, key: str, ylabel: str, path: pathlib.Path,
                log_y: bool = False) -> bool:
  """One panel per LR (or a single panel), one colour per other-axes value, one line per seed."""
  import matplotlib.pyplot as plt
  series = [(r, [(row["step"], row[key]) for row in r.rows if finite(row.get(key))]) for r in runs]
  series = [(r, pts) for r, pts in series if pts]
  if not series:
    return False
  lrs = sorted(manifest["axes"].get(LR_KEY, [None]))
  others = [k for k in _group_keys(manifest) if k != LR_KEY]
  colors = _colors(manifest, runs)
  fig, axes = plt.subplots(1, len(lrs), figsize=(4.2 * len(lrs), 3.4), squeeze=False,
                           sharey=True)
  for ax, lr in zip(axes[0], lrs):
    seen = set()
    for run, pts in series:
      if lr is not None and run.overrides.get(LR_KEY) != lr:
        continue
      lab = tuple(run.overrides[k] for k in others)
      steps, values = zip(*pts)
      ax.plot(steps, values, color=colors[lab], alpha=0.7, lw=1.2,
              label=", ".join(map(_fmt_value, lab)) if lab not in seen else None)
      seen.add(lab)
    ax.set_title(f"LR {lr:g}" if lr is not None else "")
    ax.set_xlabel("step")
    if log_y:
      ax.set_yscale("log")
    ax.grid(alpha=0.3)
  axes[0][0].set_ylabel(ylabel)
  axes[0][0].legend(fontsize=8)
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)
  return True


PLOTS = [  # (file, metrics key, y label, log y)
    ("train_loss.png", "train_loss", "train loss (nats)", False),
    ("grad_norm.png", "grad_norm", "grad norm (before clipping)", True),
    ("act_zero_frac.png", "act_zero_frac", "act_zero_frac (z ≤ 0)", False),
    ("sharpness.png", "sharpness", "sharpness (top Hessian eigenvalue)", False),
    ("attn_logit_max.png", "attn_logit_max", "max attention logit", True),
]


def write(root) -> pathlib.Path:
  """Writes `<root>/report.md` and `<root>/plots/*.png`; returns the report's path."""
  import matplotlib
  matplotlib.use("Agg")
  root = pathlib.Path(root)
  manifest, runs = load(root)
  plots = root / "plots"
  plots.mkdir(exist_ok=True)
  done = sum(r.state == "done" for r in runs)
  lines = [f"# {manifest.get('description') or 'Sweep report'}", "",
           f"Sweep `{manifest['sweep']}`: {done} of {len(runs)} runs finished"
           + (f" ({len(runs) - done} not: see *Runs*)" if done < len(runs) else "")
           + f"; seeds {', '.join(map(str, manifest['seeds']))}. "
           f"Written by `python -m actlab.report {root}`.", "",
           "## Results at the last step", "",
           "Mean ± sd over seeds. Dead % = `act_zero_frac` (FFN entries with z ≤ 0), dead units ="
           " units with z ≤ 0 on every validation token, act mean = mean FFN hidden activation, "
           "all on the validation windows at the last evaluation; grad norm = mean pre-clipping "
           "gradient norm over the last 10% of steps; status by the rule in docs/metrics.md §6.",
           "", results_table(manifest, runs), ""]
  sens = sensitivity_table(manifest, runs)
  if sens:
    lines += ["## LR sensitivity", "",
              "Mean over the swept LRs of the final val loss minus the best one, a diverged run "
              "counting as the loss at initialisation (Wortsman et al. 2023); lower is more "
              "robust. Mean ± sd over seeds.", "", sens, ""]
  lines += ["## Plots", ""]
  if plot_val_vs_lr(manifest, runs, plots / "val_loss_vs_lr.png"):
    lines.append("![val loss vs LR](plots/val_loss_vs_lr.png)")
  for file, key, ylabel, log_y in PLOTS:
    if plot_curves(manifest, runs, key, ylabel, plots / file, log_y):
      lines.append(f"![{key}](plots/{file})")
    else:
      lines.append(f"*{key}: not measured in any run.*")
  lines += ["", "## Runs", "", runs_table(runs), ""]
  path = root / "report.md"
  workdir.write_text(path, "\n".join(lines))
  return path


def main(argv: Sequence[str]) -> int:
  if len(argv) != 2 or argv[1].startswith("-"):
    print("usage: python -m actlab.report <sweep workdir>", file=sys.stderr)
    return 2
  with reported():
    path = write(argv[1])
  print(f"wrote {path} and {path.parent / 'plots'}/")
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv))
