"""The sweep report's plots (`write`; docs/metrics.md §9), drawing what `series` computes; and
one run's curves (`plot_run`)."""

import math
import pathlib

import matplotlib
import matplotlib.pyplot as plt

from actlab.report import stats
from actlab.report.stats import LR_KEY, finite
from actlab.report import series

FOREST_MAX_LRS = 3  # the forest plot is drawn for sweeps with at most this many LRs
_MARKERS = "osD^v<>ph*"


def _styles(manifest, runs) -> dict[tuple, tuple[str, str]]:
  """(colour, line style) per combination of the non-LR axes, in grid order."""
  keys = list(series.groups(manifest, runs))
  return dict(zip(keys, series.styles(len(keys))))


def _label(key: tuple) -> str:
  return ", ".join(map(stats.fmt_value, key)) or "run"


def _save(fig, axes, path: pathlib.Path, ylabel: str = "", log_y: bool = False,
          legend_cols: int | None = None) -> bool:
  """Grid, y label and scale, one legend of every panel's series; saves to `path` and closes."""
  legend = {}  # every panel's series, each once (a panel may lack some)
  for ax in axes:
    ax.grid(alpha=0.3)
    if log_y:
      ax.set_yscale("log")
    legend.update({label: h for h, label in zip(*ax.get_legend_handles_labels())
                   if label not in legend})
  axes[0].set_ylabel(ylabel)
  axes[0].legend(legend.values(), legend.keys(), fontsize=7,
                 ncol=legend_cols or (2 if len(legend) > 6 else 1))
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)
  return True


def plot_val_vs_lr(manifest, runs, path: pathlib.Path) -> bool:
  if LR_KEY not in manifest["axes"]:
    return False
  fig, ax = plt.subplots(figsize=(6, 4))
  styles = _styles(manifest, runs)
  for key, cells in stats.pivot(manifest, runs, LR_KEY).items():
    color, style = styles[key]
    lrs, means, sds = [], [], []
    for lr in sorted(manifest["axes"][LR_KEY]):
      at = [r for (x, _), r in cells.items() if x == lr]
      vals = [r.value("final_val_loss") for r in at if r.value("final_val_loss") is not None]
      if vals:
        mean, sd = stats.mean_sd(vals)
        lrs.append(lr), means.append(mean), sds.append(sd or 0.0)
      if any(r.status == "diverged" for r in at):
        ax.axvline(lr, color=color, linestyle=":", alpha=0.6)
    ax.errorbar(lrs, means, yerr=sds, marker="o", capsize=4, color=color, linestyle=style,
                label=_label(key))
  ax.set_xscale("log")
  ax.set_xlabel("peak learning rate")
  ax.set_title("Val loss vs LR (mean ± sd over seeds; dotted: a seed diverged)", fontsize=9)
  return _save(fig, [ax], path, "final val loss (nats)")


def plot_curves(manifest, runs, key: str, ylabel: str, path: pathlib.Path,
                log_y: bool = False) -> bool:
  """One panel per LR, one line per group: the mean over its seeds with a ± 1 sd band."""
  lrs = series.lr_grid(manifest)
  bands = {(lr, key_): b for lr in lrs for key_, group in series.groups(manifest, runs).items()
           if (b := series.band([r for r in group if lr is None
                                 or r.overrides.get(LR_KEY) == lr], key)) is not None}
  if not bands:
    return False
  styles = _styles(manifest, runs)
  log = log_y or series.log_scale([v for b in bands.values() for v in b.mean])
  cols = min(len(lrs), 3)  # panels sharing y, at most three per row
  rows = math.ceil(len(lrs) / cols)
  fig, grid = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.4 * rows), squeeze=False,
                           sharey=True)
  axes = list(grid.flat)
  for ax in axes[len(lrs):]:
    ax.set_visible(False)
  axes = axes[:len(lrs)]
  for ax, lr in zip(axes, lrs):
    for (at, group), b in bands.items():
      if at != lr:
        continue
      color, style = styles[group]
      ax.plot(b.steps, b.mean, color=color, linestyle=style, lw=1.4,
              marker="o" if len(b.steps) <= 12 else None, ms=3, label=_label(group))
      if b.n > 1:  # on a log axis, not where mean − sd ≤ 0 (it has no place there)
        low, high = series.spread(b.mean, b.sd, key)  # a fraction's cut to [0, 1]
        ax.fill_between(b.steps, low, high, color=color, alpha=0.15, lw=0,
                        where=b.mean - b.sd > 0 if log else None)
    ns = sorted({b.n for (at, _), b in bands.items() if at == lr})
    seeds = f"n = {ns[0]}" + (f"–{ns[-1]}" if len(ns) > 1 else "") if ns else "no runs"
    ax.set_title((f"LR {lr:g}: " if lr is not None else "") + f"mean ± 1 sd over seeds ({seeds})",
                 fontsize=9)
    ax.set_xlabel("step")
  return _save(fig, axes, path, ylabel, log)


def plot_layers(manifest, runs, path: pathlib.Path) -> bool:
  """One panel per `series.LAYER_STATS` against the layer, each group at its best LR: mean ± sd."""
  data = {k: e for k, e in series.layer_stats(manifest, runs).items()
          if len(e[series.LAYER_STATS[0]][0])}
  if not data:
    return False
  styles = _styles(manifest, runs)
  fig, axes = plt.subplots(1, len(series.LAYER_STATS), figsize=(4.2 * len(series.LAYER_STATS),
                                                                 3.6), squeeze=False)
  labels = {"dead_units": "dead units (%)", "act_zero_frac": "zero fraction z ≤ 0 (%)",
            "act_mean": "act mean"}
  width = min(0.08, 0.5 / len(data))
  for ax, stat in zip(axes[0], series.LAYER_STATS):
    scale = 1.0 if stat == "act_mean" else 100.0
    for i, (key, e) in enumerate(data.items()):
      layers, mean, sd = e[stat]
      color, style = styles[key]
      lr = f" @ LR {e['lr']:g}" if e["lr"] is not None else ""
      low, high = series.spread(mean, sd, stat)  # a fraction's cut to [0, 1]: asymmetric
      ax.errorbar(layers + (i - (len(data) - 1) / 2) * width, mean * scale,
                  yerr=None if e["n"] < 2 else [(mean - low) * scale, (high - mean) * scale],
                  color=color, linestyle=style, marker=_MARKERS[i % len(_MARKERS)], ms=4,
                  capsize=3, lw=1, label=f"{_label(key)}{lr} (n={e['n']})")
    ax.set_xticks(sorted({int(x) for e in data.values() for x in e[stat][0]}))
    ax.set_xlabel("layer")
    ax.set_title(labels[stat], fontsize=9)
  fig.suptitle("Last evaluation, each group at its best LR: mean ± sd over seeds", fontsize=10)
  return _save(fig, axes[0], path, legend_cols=1)


def plot_forest(manifest, runs, path: pathlib.Path) -> bool:
  """Final val loss per group (best first), one marker per LR: mean, 95% t interval (`forest`)."""
  lrs = series.lr_grid(manifest)
  rows = [i for i in series.forest(manifest, runs) if i.n]
  if len(lrs) > FOREST_MAX_LRS or not rows:
    return False
  groups = list(dict.fromkeys(i.group for i in rows))
  colors = dict(zip(lrs, (c for c, _ in series.styles(len(lrs)))))
  fig, ax = plt.subplots(figsize=(6.5, 0.9 + 0.38 * len(groups) * max(1, len(lrs) / 2)))
  step = 0.6 / len(lrs)
  seen = set()
  for i in rows:
    j = lrs.index(i.lr)
    y = groups.index(i.group) + (j - (len(lrs) - 1) / 2) * step
    err = None if not finite(i.low) else [[i.mean - i.low], [i.high - i.mean]]
    ax.errorbar([i.mean], [y], xerr=err, color=colors[i.lr], marker=_MARKERS[j], ms=5, capsize=3,
                linestyle="none", label=None if i.lr in seen else
                (f"LR {i.lr:g}" if i.lr is not None else "final val loss"))
    seen.add(i.lr)
    if i.n < len(manifest["seeds"]):
      ax.annotate(f"n={i.n}", (i.high if finite(i.high) else i.mean, y), xytext=(4, -3),
                  textcoords="offset points", fontsize=6, color=colors[i.lr])
  ax.set_yticks(range(len(groups)), [_label(g) for g in groups])
  ax.invert_yaxis()  # the best on top
  ax.set_xlabel("final val loss (nats)")
  ax.set_title("Final val loss: mean and 95% t interval over seeds (best first)", fontsize=9)
  return _save(fig, [ax], path)


def plot_run(rows: list[dict], title: str, path: pathlib.Path) -> bool:
  """One run's loss and gradient norm from its metrics.jsonl `rows`; False where it has none."""
  def points(key):
    pairs = [(r["step"], r[key]) for r in rows
             if isinstance(r.get(key), (int, float)) and math.isfinite(r[key])]
    return [step for step, _ in pairs], [value for _, value in pairs]

  (train_x, train_y), (val_x, val_y), (grad_x, grad_y), (max_x, max_y) = map(
      points, ("train_loss", "val_loss", "grad_norm", "grad_norm_max"))
  if not (train_x or val_x or grad_x):
    return False
  matplotlib.use("Agg")
  fig, (loss, grad) = plt.subplots(1, 2, figsize=(9, 3.6))
  loss.plot(train_x, train_y, lw=1.2, label="train loss")
  loss.plot(val_x, val_y, marker="o", ms=3, lw=1.2, label="val loss")
  loss.set_xlabel("step")
  loss.set_ylabel("loss (nats)")
  grad.plot(grad_x, grad_y, lw=1, color="C2", label="grad norm (before clipping)")
  grad.plot(max_x, max_y, lw=0.8, ls="--", color="C3", label="its largest since the last row")
  grad.set_xlabel("step")
  grad.set_yscale("log")
  for ax in (loss, grad):
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
  fig.suptitle(title, fontsize=10)
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)
  return True


CURVES = [  # (file, metrics key, y label, log y always (else by the data))
    ("val_loss.png", "val_loss", "val loss (nats)", False),
    ("train_loss.png", "train_loss", "train loss (nats)", False),
    ("grad_norm.png", "grad_norm", "grad norm (before clipping)", True),
    ("act_zero_frac.png", "act_zero_frac", "act_zero_frac (z ≤ 0)", False),
    ("sharpness.png", "sharpness", "sharpness (top Hessian eigenvalue)", False),
    ("attn_logit_max.png", "attn_logit_max", "max attention logit", True),
    ("train_attn_logit_max.png", "train_attn_logit_max", "max attention logit (training)", True),
    ("train_logz_mean.png", "train_logz_mean", "mean log Z of the output logits", False),
    ("grad_norm_max.png", "grad_norm_max", "max grad norm since the last row", True),
]

BAND = ("*Curves: per group, the mean over its seeds (n per group in the panel title) with a ± 1 "
        "sd band, at the steps where every seed of the group logged a finite value: a seed that "
        "diverged or has not finished ends its group's curve there. Log y for grad norm and "
        "attention logits, and for any quantity whose plotted means span more than a factor of "
        "30; there, no band where mean − sd ≤ 0. A fraction's band (act_zero_frac) is cut at 0 "
        "and 1.*")


def write(manifest, runs, directory: pathlib.Path) -> list[str]:
  """Draws every plot into `directory`; returns the report's markdown lines for them."""
  matplotlib.use("Agg")
  directory.mkdir(exist_ok=True)
  lines = []
  if plot_val_vs_lr(manifest, runs, directory / "val_loss_vs_lr.png"):
    lines += [f"![val loss vs LR]({directory.name}/val_loss_vs_lr.png)", ""]
  if plot_forest(manifest, runs, directory / "final_val_loss.png"):
    lines += [f"![final val loss]({directory.name}/final_val_loss.png)", "",
              "*Final val loss per group, best first (by its lowest mean over the LRs); one "
              "marker per LR: the mean over the seeds with a value and its 95% t interval "
              "mean ± t₀.₉₇₅,ₙ₋₁·sd/√n; n=k marks fewer seeds than the grid's.*", ""]
  lines += [BAND, ""]
  for file, key, ylabel, log_y in CURVES:
    if plot_curves(manifest, runs, key, ylabel, directory / file, log_y):
      lines.append(f"![{key}]({directory.name}/{file})")
    else:
      lines.append(f"*{key}: not measured in any run.*")
  if plot_layers(manifest, runs, directory / "layers.png"):
    lines += ["", f"![activation statistics by layer]({directory.name}/layers.png)", "",
              "*Activation statistics by layer at the last evaluation of the finished stable or "
              "unstable runs, each group at its best LR (lowest mean final val loss): mean ± sd "
              "over seeds, the bars of the two percentages cut at 0% and 100%.*"]
  return lines
