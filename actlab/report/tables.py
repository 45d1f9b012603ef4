"""The report's markdown tables, each with the rules above it (`sections`, `runs_table`); the
numbers come from `actlab.report.stats` and `actlab.report.comparisons`."""

import collections
import re
from typing import Sequence

from actlab.report import comparisons, stats
from actlab.measure.metrics import STATUSES
from actlab.report.stats import LR_KEY, Run, finite

HEADERS = {"optim.lr": "LR", "model.activation": "activation"}


def _header(key: str) -> str:
  return HEADERS.get(key, key.rsplit(".", 1)[-1])


def markdown_row(cells: Sequence[str]) -> str:
  return "| " + " | ".join(cells) + " |"


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
  return "\n".join([markdown_row(header), "|" + "---|" * len(header), *map(markdown_row, rows)])


def _cell(runs: Sequence[Run], key: str, n_seeds: int, scale: float, digits: int,
          suffix: str) -> str:
  values = [r.value(key) * scale for r in runs if r.value(key) is not None]
  if not values:
    return "—"
  mean, sd = stats.mean_sd(values)
  spread = f" ± {sd:.{digits}f}" if sd else ""  # None: one value; 0: all equal (e.g. params)
  text = f"{mean:,.{digits}f}" + spread + suffix
  return text + (f" (n={len(values)})" if len(values) < n_seeds else "")


def status_counts(runs: Sequence[Run]) -> str:
  counts = {s: sum(r.status == s for r in runs) for s in (*STATUSES, "incomplete", "missing")}
  not_learned = sum(r.learned is False for r in runs)
  return (", ".join(f"{n} {s}" for s, n in counts.items() if n)
          + (f"; {not_learned} not learned" if not_learned else ""))


COLUMNS = [  # (header, summary key, scale, digits, suffix, shown always (else where measured))
    ("val loss", "final_val_loss", 1.0, 3, "", True),
    ("val acc", "final_val_accuracy", 100.0, 1, "%", False),  # MLM, classification
    ("Dead %", "act_zero_frac", 100.0, 1, "%", True),
    ("dead units", "dead_units", 100.0, 1, "%", True),
    ("act mean", "act_mean", 1.0, 3, "", True),
    ("grad norm", "grad_norm", 1.0, 3, "", True),
    ("max grad norm", "grad_norm_max", 1.0, 2, "", False),  # the run's largest (metrics.md §2)
    ("max attn logit", "max:train_attn_logit_max", 1.0, 1, "", False),
    ("max log Z", "max:train_logz_mean", 1.0, 2, "", False),
    ("sharpness", "sharpness_max", 1.0, 1, "", False),
]
PARAMS = ("params", "params", 1.0, 0, "", True)  # shown where the runs differ in size


def results_table(manifest, runs) -> str:
  keys = stats.group_keys(manifest)
  columns = [c for c in COLUMNS if c[5] or any(r.value(c[1]) is not None for r in runs)]
  if len({r.summary.get("params") for r in runs if r.state == "done"}) > 1:
    columns.append(PARAMS)
  rows = [[*map(stats.fmt_value, values),
           *(_cell(group, key, len(manifest["seeds"]), scale, digits, suffix)
             for _, key, scale, digits, suffix, _ in columns), status_counts(group)]
          for values, group in stats.groups(manifest, runs, keys).items()]
  return markdown_table([*map(_header, keys), *(c[0] for c in columns), "status"], rows)


def _p(p: float) -> str:
  return "—" if not finite(p) else "<0.001" if p < 0.001 else f"{p:.3f}"


def comparison_table(manifest, compared: Sequence[comparisons.Comparison], keys: Sequence[str],
                     best_lr: bool = False) -> str:
  """One row per comparison (columns: docs/metrics.md §9), with A's and B's LR when `best_lr`."""
  if not compared:
    return ""
  margin = manifest.get("equivalence_margin")
  num = lambda x, fmt="+.3f": "—" if not finite(x) else format(x, fmt)
  lr = lambda x: [stats.fmt_value(x) if x is not None else "—"] if best_lr else []
  equivalent = {comparisons.EQUIVALENT: f"equivalent within ±{margin:g}"} if margin else {}
  rows = []
  for c in compared:
    p = c.paired
    verdict = {comparisons.A_BETTER: f"{c.a} better", comparisons.B_BETTER: f"{c.b} better",
               **equivalent}.get(c.verdict, c.verdict)
    resolved = c.verdict != comparisons.NOT_RESOLVED
    mdd = "—" if resolved else "n < 2" if p.n < 2 else num(p.mdd, ".3f")
    rows.append([*map(stats.fmt_value, c.key), stats.fmt_value(c.a), *lr(c.lr_a),
                 stats.fmt_value(c.b), *lr(c.lr_b), str(p.n), num(p.mean), num(p.sd, ".3f"),
                 "—" if p.n < 2 else f"[{num(p.ci_low)}, {num(p.ci_high)}]", _p(c.p_holm),
                 *([_p(c.p_equiv_holm)] if margin else []), verdict, mdd])
  return markdown_table([*map(_header, keys), "A", *(["LR A"] if best_lr else []), "B",
                 *(["LR B"] if best_lr else []), "n", "mean A − B", "sd", "95% CI", "p (Holm)",
                 *(["TOST p (Holm)"] if margin else []), "verdict", "MDD"], rows)


def comparison_texts(manifest, runs, per_lr, best) -> tuple[str, str]:
  """The rules above the per-LR and the best-LR comparison tables."""
  margin = manifest.get("equivalence_margin")
  k = sum(finite(c.p_holm) for c in [*per_lr, *best])
  tables = "this table" + (" and *At each activation's best LR*" if best else "")
  equiv = (f"**equivalent within ±{margin:g}** if both one-sided paired t tests against "
           f"±{margin:g} nats reject (TOST, p = the larger one-sided p; unadjusted this is the "
           f"90% CI lying inside (−{margin:g}, {margin:g})), the margin being the sweep file's "
           "`equivalence_margin`, stated before running; "
           if margin else "")
  no_margin = ("" if margin else " The sweep file states no `equivalence_margin`, so no "
               "comparison can be called equivalent: \"not resolved\" does not mean equal.")
  per_lr_text = (
      "Final val loss of A minus that of B at the same LR (and values of the other axes), paired "
      "by seed over the seeds where both finished with a finite value: n pairs, mean and sd of "
      "the differences, 95% paired t interval d̄ ± t₀.₉₇₅,ₙ₋₁·sd/√n (not adjusted). Pairs: each "
      "activation against the baseline B, then the sweep file's `pairs`. **Family**: the "
      f"{k} comparison(s) with n ≥ 2 in {tables}; the paired t tests' two-sided p-values are "
      "adjusted by Holm's step-down method over the family" + (", and the TOST p-values "
      "likewise, separately" if margin else "") + " (familywise error ≤ 0.05 each). Verdict: "
      "**A better** / **B better** if the adjusted p ≤ 0.05 (by the sign of the difference); "
      + equiv + "else **not resolved** (always when n < 2)." + no_margin + " MDD, when not "
      "resolved: the difference at which a paired t test of these n pairs, at two-sided "
      "α = 0.05 without adjustment, has 80% power with their sd (docs/metrics.md §9).")
  select, test, tested = comparisons.selection(manifest, runs)
  seeds = lambda xs: f"seed(s) {', '.join(map(str, xs))}"
  best_text = (
      "A and B each at its own best LR (the lowest mean final val loss among the LRs where each "
      "chosen seed finished with a value), paired by seed, with the same columns, family and "
      "rules as *Paired comparisons*, the LR never chosen on the numbers that then test it: "
      + ("chosen on the validation windows of every seed and compared on the held-out test "
         "windows' final loss (`final_test_loss`, data.test_batches)." if tested != "final_val_loss"
         else f"chosen on {seeds(select)} and compared on {seeds(test)}: the runs record no "
         "held-out test loss (data.test_batches), so the seeds are split; choosing the LR on the "
         "numbers that test it would favour whichever activation's noise happened to be lowest."))
  return per_lr_text, best_text


# The verdict's reasons (`metrics.verdict`) without the run's own numbers, so that seeds that
# failed alike read as one reason: (pattern, the reason as the stability table says it).
REASON_KINDS = [
    (r"non-finite (\S+) at step", r"non-finite \1"),
    (r"final val loss .*: no better than chance", "final val loss no better than chance"),
    (r"train-loss spike\(s\) > (\S+)× the best earlier loss",
     r"train-loss spike above \1× the best earlier loss after warm-up"),
    (r"gradient norm .* > (\S+)× its value at initialisation",
     r"gradient norm above \1× its initial value"),
    (r"final val loss .* > (\S+)× the best", r"final val loss above \1× its best"),
]


def reason_kind(reason: str) -> str:
  """A verdict reason as `REASON_KINDS` shortens it (an unknown one as it is)."""
  for pattern, kind in REASON_KINDS:
    if m := re.search(pattern, reason):
      return m.expand(kind)
  return reason


def _failure(run: Run | None) -> tuple[str, list[str]]:
  """Why a seed does not count as stable: (what happened, its reasons), or ("", []) if it does."""
  if run is None or run.state == "missing":
    return "not run", []
  if run.state != "done":
    return "not finished", []
  bar = "the copy predictor's loss" if "copy_loss" in run.summary else "the unigram loss"
  not_learned = [f"not learned: final val loss ≥ {bar}"] if run.learned is False else []
  if run.status == "stable":
    return ("not learned", [f"final val loss ≥ {bar}"]) if not_learned else ("", [])
  return run.status, [*map(reason_kind, run.summary.get("status_reasons") or []), *not_learned]


def failures(runs: Sequence[Run | None]) -> str:
  """How many of `runs` (one per seed; None: not run) failed, how and why, e.g. "3 of 3 unstable
  (gradient norm above 10× its initial value)"."""
  kinds: dict[str, list[list[str]]] = {}
  for run in runs:
    what, reasons = _failure(run)
    if what:
      kinds.setdefault(what, []).append(reasons)
  parts = []
  for what, reasons in kinds.items():
    counted = collections.Counter(x for seed in reasons for x in dict.fromkeys(seed))
    why = "; ".join(r + ("" if k == len(reasons) else f" in {k}") for r, k in counted.items())
    parts.append(f"{len(reasons)} {what}" + (f" ({why})" if why else ""))
  failed = sum(map(len, kinds.values()))
  if not parts:
    return f"none of {len(runs)} failed"
  if len(parts) == 1:
    return f"{failed} of {len(runs)} " + parts[0].split(" ", 1)[1]
  return f"{failed} of {len(runs)} failed: " + ", ".join(parts)


def stability_table(manifest, runs) -> str:
  if LR_KEY not in manifest["axes"]:
    return ""
  lrs, cells = sorted(manifest["axes"][LR_KEY]), stats.pivot(manifest, runs, LR_KEY)
  rows = []
  for key, lr in stats.largest_stable_lr(manifest, runs).items():
    why = lambda x: (f"{stats.fmt_value(x)}: "
                     f"{failures([cells[key].get((x, seed)) for seed in manifest['seeds']])}")
    up = next((x for x in lrs if lr is None or x > lr), None)
    rows.append([*map(stats.fmt_value, key),
                 "none" if lr is None else stats.fmt_value(lr),
                 "; ".join(map(why, lrs)) if lr is None else
                 "— (none swept higher)" if up is None else why(up)])
  return markdown_table([*map(_header, stats.other_axes(manifest)),
                 "largest LR where every seed is stable and learned",
                 "the next LR up (every LR, if none is): seeds that failed, and why"], rows)


def sensitivity_table(manifest, runs) -> str:
  rows = []
  for key, s in stats.lr_sensitivity(manifest, runs).items():
    value = "— (no seed finished at every LR)"
    if s["per_seed"]:
      mean, sd = stats.mean_sd(s["per_seed"])
      value = f"{mean:.3f}" + (f" ± {sd:.3f}" if sd is not None else "")
    best = stats.fmt_value(s["best_lr"]) if s["best_lr"] is not None else "—"
    rows.append([*map(stats.fmt_value, key), value, best, str(len(s["per_seed"]))])
  return markdown_table([*map(_header, stats.other_axes(manifest)), "LR sensitivity (nats)",
                         "best LR", "seeds"], rows) if rows else ""


def runs_table(runs) -> str:
  """One row per run: how far an incomplete one got, and anything unreadable."""
  rows = []
  for r in runs:
    if r.state != "done":
      why = [f"reached step {r.rows[-1]['step']}" if r.rows else "not started", *r.unreadable]
      rows.append([r.name, r.state, "—", "; ".join(why)])
      continue
    val = r.value("final_val_loss")
    why = r.summary.get("status_reasons", []) + r.unreadable
    if r.learned is False:
      why.append(f"not learned: final val loss ≥ unigram loss {r.summary['unigram_loss']:.3f}")
    rows.append([r.name, r.status + (", not learned" if r.learned is False else ""),
                 "—" if val is None else f"{val:.3f}", "; ".join(why) or "—"])
  return markdown_table(["run", "status", "val loss", "why"], rows)


def sections(manifest, runs, base) -> list[tuple[str, str, str]]:
  """(title, the rules above the table, the table) of each section before the plots."""
  per_lr, best = comparisons.family(manifest, runs, base)
  per_lr_text, best_text = comparison_texts(manifest, runs, per_lr, best)
  axis = stats.activation_axis(manifest)
  keys_per_lr = [k for k in stats.group_keys(manifest) if k != axis]
  best_missing = ("*Not shown: with one seed there is none left to choose the LR on apart from "
                  "the seeds that test it.*" if per_lr and len(manifest["seeds"]) < 2
                  and len(manifest["axes"].get(LR_KEY, [])) > 1 else "")
  unchecked = sum(r.learned is None and r.value("final_val_loss") is not None for r in runs)
  return [  # (title, text, table): a section whose table is empty is left out
      ("Results at the last step",
       "Mean ± sd over seeds. Dead % = `act_zero_frac` (FFN entries with z ≤ 0), dead units = "
       "units with z ≤ 0 on every validation token, act mean = mean FFN hidden activation, all on "
       "the validation windows at the last evaluation; grad norm = mean pre-clipping gradient "
       "norm over the last 10% of steps; max grad norm, max attn logit, max log Z: the largest "
       "over the run of every step's gradient norm, the training forward's largest attention "
       "logit and its output logits' mean log Z (log steps; where measured); status by the rule "
       "in docs/metrics.md §6; not learned: final val loss ≥ the unigram loss (MLM: the "
       "context-free copy predictor's).", results_table(manifest, runs)),
      ("Paired comparisons", per_lr_text, comparison_table(manifest, per_lr, keys_per_lr)),
      ("At each activation's best LR", best_text,
       comparison_table(manifest, best, comparisons.best_lr_keys(manifest), best_lr=True)
       or best_missing),
      ("Largest stable LR",
       "The largest swept LR at which every seed of the grid finished stable (docs/metrics.md §6) "
       "and learned (final val loss below the unigram loss; MLM: the copy predictor's), and why "
       "it is not higher: at the next LR up (at every LR when none qualifies), how many seeds "
       "failed and how (unstable, diverged, not learned, not finished, not run), with the "
       "reasons of the verdict."
       + (f" {unchecked} finished run(s) have no `unigram_loss` in their summary: not checked "
          "for learning." if unchecked else ""), stability_table(manifest, runs)),
      ("LR sensitivity",
       "Mean over the swept LRs of the final val loss minus the best one, a diverged run "
       "counting as the loss at initialisation (Wortsman et al. 2023); lower is more robust. "
       "Mean ± sd over seeds. The best LR here describes all seeds; it is not the one the "
       "best-LR comparisons test (those choose it apart from the numbers they test).",
       sensitivity_table(manifest, runs)),
  ]
