"""The sweep report's plots (`write`): final val loss against the LR, and the logged curves of
`CURVES`, one colour per combination of the axes other than the LR and the seed."""

from __future__ import annotations

import pathlib

from actlab import stats
from actlab.stats import LR_KEY, finite


def _colors(manifest, runs) -> dict[tuple, str]:
  """One colour per combination of the non-LR axes, in grid order, the same in every plot."""
  return {lab: f"C{i % 10}" for i, lab in enumerate(stats.groups(manifest, runs,
                                                                 stats.other_axes(manifest)))}


def _save(fig, axes, path: pathlib.Path, ylabel: str, log_y: bool = False) -> bool:
  """Grid, y label and scale, legend; writes the figure to `path` and closes it."""
  import matplotlib.pyplot as plt
  for ax in axes:
    ax.grid(alpha=0.3)
    if log_y:
      ax.set_yscale("log")
  axes[0].set_ylabel(ylabel)
  axes[0].legend(fontsize=8)
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)
  return True


def plot_val_vs_lr(manifest, runs, path: pathlib.Path) -> bool:
  import matplotlib.pyplot as plt
  if LR_KEY not in manifest["axes"]:
    return False
  fig, ax = plt.subplots(figsize=(6, 4))
  colors = _colors(manifest, runs)
  for key, cells in stats.pivot(manifest, runs, LR_KEY).items():
    lrs, means, sds = [], [], []
    for lr in sorted(manifest["axes"][LR_KEY]):
      at = [r for (x, _), r in cells.items() if x == lr]
      vals = [r.value("final_val_loss") for r in at if r.value("final_val_loss") is not None]
      if vals:
        mean, sd = stats.mean_sd(vals)
        lrs.append(lr), means.append(mean), sds.append(sd or 0.0)
      if any(r.status == "diverged" for r in at):
        ax.axvline(lr, color=colors[key], linestyle=":", alpha=0.6)
    ax.errorbar(lrs, means, yerr=sds, marker="o", capsize=4, color=colors[key],
                label=", ".join(map(stats.fmt_value, key)) or "run")
  ax.set_xscale("log")
  ax.set_xlabel("peak learning rate")
  ax.set_title("Val loss vs LR (mean ± sd over seeds; dotted: a seed diverged)")
  return _save(fig, [ax], path, "final val loss (nats)")


def plot_curves(manifest, runs, key: str, ylabel: str, path: pathlib.Path,
                log_y: bool = False) -> bool:
  """One panel per LR (or a single panel), one colour per other-axes value, one line per seed."""
  import matplotlib.pyplot as plt
  series = [(r, [(row["step"], row[key]) for row in r.rows if finite(row.get(key))]) for r in runs]
  series = [(r, pts) for r, pts in series if pts]
  if not series:
    return False
  lrs = sorted(manifest["axes"].get(LR_KEY, [None]))
  colors = _colors(manifest, runs)
  fig, axes = plt.subplots(1, len(lrs), figsize=(4.2 * len(lrs), 3.4), squeeze=False,
                           sharey=True)
  for ax, lr in zip(axes[0], lrs):
    seen = set()
    for run, pts in series:
      if lr is not None and run.overrides.get(LR_KEY) != lr:
        continue
      lab = tuple(run.overrides[k] for k in stats.other_axes(manifest))
      ax.plot(*zip(*pts), color=colors[lab], alpha=0.7, lw=1.2,
              label=", ".join(map(stats.fmt_value, lab)) if lab not in seen else None)
      seen.add(lab)
    ax.set_title(f"LR {lr:g}" if lr is not None else "")
    ax.set_xlabel("step")
  return _save(fig, list(axes[0]), path, ylabel, log_y)


CURVES = [  # (file, metrics key, y label, log y)
    ("train_loss.png", "train_loss", "train loss (nats)", False),
    ("grad_norm.png", "grad_norm", "grad norm (before clipping)", True),
    ("act_zero_frac.png", "act_zero_frac", "act_zero_frac (z ≤ 0)", False),
    ("sharpness.png", "sharpness", "sharpness (top Hessian eigenvalue)", False),
    ("attn_logit_max.png", "attn_logit_max", "max attention logit", True),
]


def write(manifest, runs, directory: pathlib.Path) -> list[str]:
  """Draws every plot into `directory`; returns the report's markdown lines for them."""
  import matplotlib
  matplotlib.use("Agg")
  directory.mkdir(exist_ok=True)
  lines = []
  if plot_val_vs_lr(manifest, runs, directory / "val_loss_vs_lr.png"):
    lines.append(f"![val loss vs LR]({directory.name}/val_loss_vs_lr.png)")
  for file, key, ylabel, log_y in CURVES:
    if plot_curves(manifest, runs, key, ylabel, directory / file, log_y):
      lines.append(f"![{key}]({directory.name}/{file})")
    else:
      lines.append(f"*{key}: not measured in any run.*")
  return lines
