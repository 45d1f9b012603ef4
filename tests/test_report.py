"""Report: tables as mean ± sd over seeds, status counts, missing cells, paired comparisons, the
largest stable LR, "not learned", LR sensitivity, the baseline option, plots and the numbers they
draw (bands, per-layer statistics, forest intervals, colours), runs.csv, merging several sweeps.

The sweep directories here are written by the test (random curves), so no training is needed;
every expected number is recomputed from what was written.
"""

import csv
import json
import math
import pathlib
import re
import subprocess
import sys

import numpy as np
import pytest

from actlab import report
from actlab.infra.errors import UserError
from actlab.measure import metrics
from actlab.report import comparisons, stats
from actlab.report import load as report_load
from actlab.report import plots
from actlab.report import series as report_series
from actlab.report import tables
from actlab.report import to_csv as report_csv
from conftest import REPO

ACTS, LRS, SEEDS = ["relu", "gelu"], [1e-4, 1e-3, 3e-3], [0, 1, 2]


@pytest.fixture(autouse=True)
def no_plots_unless_drawn(request, monkeypatch):
  """Drawing is most of this file's time: the plots are drawn only in the tests that check them
  (those that ask for `drawn`); elsewhere the report's Plots section stays empty."""
  if "drawn" not in request.fixturenames:
    monkeypatch.setattr(plots, "write", lambda manifest, runs, directory: [])


@pytest.fixture
def drawn():
  """The report draws its plots (see `no_plots_unless_drawn`)."""


def _name(act, lr, seed):
  return f"activation={act},lr={lr:g},seed={seed}"


def _fake_sweep(root, rng, *, acts=ACTS, missing=(), incomplete=(), diverged=(),
                sharpness=False, manifest=True, summary_for=None):
  """A sweep directory as actlab.sweep leaves it; returns {cell name: summary}.
  `summary_for(act, lr, seed)`: entries that replace the random ones of that cell's summary."""
  cells, summaries = [], {}
  for act in acts:
    for lr in LRS:
      for seed in SEEDS:
        name = _name(act, lr, seed)
        overrides = {"model.activation": act, "optim.lr": lr, "train.seed": seed}
        cells.append({"name": name, "overrides": overrides})
        if name in missing:
          continue
        d = root / name
        d.mkdir(parents=True)
        (d / "config.json").write_text(json.dumps(
            {"model": {"activation": act, "d_model": 64}, "optim": {"lr": lr},
             "train": {"seed": seed, "steps": 100}}))
        init = 5.5 + 0.01 * seed
        final = float(rng.uniform(1.0, 3.0))
        rows = [{"step": 0, "val_loss": init, "act_zero_frac": 0.5}]
        for step in range(10, 101, 10):
          row = {"step": step, "train_loss": float(init - (init - final) * step / 100),
                 "grad_norm": float(rng.uniform(0.2, 2.0))}
          if step % 50 == 0:
            row.update(val_loss=row["train_loss"], act_zero_frac=float(rng.uniform(0.3, 0.9)))
            if sharpness:
              row["sharpness"] = float(rng.uniform(1, 50))
          rows.append(row)
        if name in diverged:
          rows[-1] = {"step": 100, "train_loss": None, "param_norm": None}
        (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        if name in incomplete:
          continue
        summary = {"status": "diverged" if name in diverged else "stable",
                   "status_reasons": ["non-finite train_loss at step 100"] if name in diverged
                   else [], "initial_val_loss": init, "final_val_loss": final,
                   "act_zero_frac": float(rng.uniform(0.3, 0.9)),
                   "dead_units": float(rng.uniform(0, 0.2)), "act_mean": float(rng.normal()),
                   "grad_norm": float(rng.uniform(0.2, 2.0)), "params": 1000}
        summary.update(summary_for(act, lr, seed) if summary_for else {})
        (d / "summary.json").write_text(json.dumps(summary))
        summaries[name] = summary
  if manifest:
    (root / "sweep.json").write_text(json.dumps(
        {"sweep": "experiments/x.py", "description": "Test sweep",
         "axes": {"model.activation": list(acts), "optim.lr": LRS}, "seeds": SEEDS,
         "cells": cells}))
  return summaries


def _row(text, act, lr):
  return next(l for l in text.splitlines() if l.startswith(f"| {lr:g} | {act} |")
              or l.startswith(f"| {act} | {lr:g} |"))


def _fmt(values, digits=3, scale=1.0):
  a = np.asarray(values) * scale
  return f"{a.mean():.{digits}f} ± {a.std(ddof=1):.{digits}f}"


@pytest.mark.slow
def test_table_means_status_counts_and_missing_cells(tmp_path, drawn):
  rng = np.random.default_rng(0)
  missing = {_name("relu", 1e-3, 2)}
  incomplete = {_name("gelu", 1e-4, 0)}
  diverged = {_name("relu", 3e-3, 1)}
  s = _fake_sweep(tmp_path, rng, missing=missing, incomplete=incomplete, diverged=diverged)
  text = report.write(tmp_path).read_text()

  full = _row(text, "gelu", 1e-3)
  vals = [s[_name("gelu", 1e-3, k)] for k in SEEDS]
  assert _fmt([v["final_val_loss"] for v in vals]) in full
  assert _fmt([v["act_zero_frac"] for v in vals], 1, 100) + "%" in full
  assert _fmt([v["dead_units"] for v in vals], 1, 100) + "%" in full
  assert _fmt([v["act_mean"] for v in vals]) in full
  assert _fmt([v["grad_norm"] for v in vals]) in full
  assert full.rstrip(" |").endswith("3 stable")

  part = _row(text, "relu", 1e-3)
  assert "(n=2)" in part and part.rstrip(" |").endswith("2 stable, 1 missing")
  div = _row(text, "relu", 3e-3)
  ok = [s[_name("relu", 3e-3, k)]["final_val_loss"] for k in (0, 2)]
  assert _fmt(ok) + " (n=2)" in div  # the diverged seed has no final values
  assert div.rstrip(" |").endswith("2 stable, 1 diverged")
  assert _row(text, "gelu", 1e-4).rstrip(" |").endswith("2 stable, 1 incomplete")
  assert re.search(r"\| activation=relu,lr=0\.001,seed=2 \| missing \|", text)
  assert "16 of 18 runs finished" in text
  assert "*sharpness: not measured in any run.*" in text
  for png in ("val_loss_vs_lr", "final_val_loss", "val_loss", "train_loss", "grad_norm",
              "act_zero_frac"):
    assert (tmp_path / "plots" / f"{png}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f"(plots/{png}.png)" in text
  assert not (tmp_path / "plots" / "sharpness.png").exists()


def test_a_report_without_plots_draws_and_links_none_and_says_how_it_was_written(tmp_path):
  """`--no-plots`: a report committed beside its runs links no file the repository does not keep
  (results/*/plots/ is ignored); its command says so, so that running it again writes it again."""
  _fake_sweep(tmp_path, np.random.default_rng(0))
  assert report.main(["actlab.report", str(tmp_path), "--no-plots"]) == 0
  text = (tmp_path / "report.md").read_text()
  assert not (tmp_path / "plots").exists() and "](" not in text and "png" not in text
  assert f"Written by `python -m actlab.report {tmp_path} --no-plots`" in text
  assert text.split("## Plots")[1].split("## Runs")[0].strip() == report.NO_PLOTS
  assert "/results/*/plots/" in (REPO / ".gitignore").read_text().splitlines()


@pytest.mark.slow
def test_lr_sensitivity_follows_wortsman_definition(tmp_path, drawn):
  rng = np.random.default_rng(1)
  diverged = {_name("gelu", 3e-3, 0)}
  s = _fake_sweep(tmp_path, rng, diverged=diverged, sharpness=True)
  sens = stats.lr_sensitivity(*report_load.load(tmp_path))
  for act in ACTS:
    per_seed = []
    for seed in SEEDS:
      runs = [s[_name(act, lr, seed)] for lr in LRS]
      l0 = runs[0]["initial_val_loss"]
      losses = [l0 if r["status"] == "diverged" else min(r["final_val_loss"], l0) for r in runs]
      per_seed.append(np.mean(np.array(losses) - min(losses)))
    np.testing.assert_allclose(sens[(act,)]["per_seed"], per_seed, rtol=1e-12)
  text = report.write(tmp_path).read_text().split("## LR sensitivity")[1].split("## Plots")[0]
  line = next(l for l in text.splitlines() if l.startswith("| gelu | "))
  assert _fmt(sens[("gelu",)]["per_seed"]) in line
  assert (tmp_path / "plots" / "sharpness.png").exists()


@pytest.mark.slow
def test_without_manifest_axes_are_inferred_and_cli_works(tmp_path):
  rng = np.random.default_rng(2)
  s = _fake_sweep(tmp_path, rng, manifest=False)
  manifest, runs = report_load.load(tmp_path)
  assert manifest["axes"] == {"model.activation": ["gelu", "relu"], "optim.lr": LRS}
  assert manifest["seeds"] == SEEDS and len(runs) == 18
  assert report.main(["actlab.report", str(tmp_path), "--baseline=relu"]) == 0  # the CLI's main
  text = (tmp_path / "report.md").read_text()
  vals = [s[_name("relu", 1e-4, k)]["final_val_loss"] for k in SEEDS]
  assert _fmt(vals) in _row(text, "relu", 1e-4)
  d = [s[_name("gelu", 1e-3, k)]["final_val_loss"] - s[_name("relu", 1e-3, k)]["final_val_loss"]
       for k in SEEDS]  # B = relu by --baseline (else gelu, the first of the sorted axis)
  assert f"| 0.001 | gelu | relu | 3 | {np.mean(d):+.3f} | {np.std(d, ddof=1):.3f} | [" in text
  with pytest.raises(UserError, match="nothing does not exist: not a sweep directory"):
    report_load.load(tmp_path / "nothing")
  # The CLI prints it as one line, exit code 2 (as in test_cli_merges_several_sweeps_...).
  (tmp_path / "empty").mkdir()
  with pytest.raises(UserError, match=f"^{re.escape(str(tmp_path / 'empty'))} has no sweep.json "
                     r"and no \*/config.json: not a sweep directory \(the --workdir of "
                     r"actlab.sweep\)$"):
    report.write(tmp_path / "empty")


@pytest.mark.slow
def test_torn_and_unfinished_runs_are_marked_not_crashed(tmp_path):
  rng = np.random.default_rng(3)
  torn, empty = _name("relu", 1e-3, 0), _name("gelu", 3e-3, 1)
  _fake_sweep(tmp_path, rng)
  log = tmp_path / torn / "metrics.jsonl"
  log.write_text(log.read_text()[:-30] + '\n{"step": 100, "train_lo{"step"\n')
  (tmp_path / empty / "summary.json").write_text("")  # a crash mid-write
  (tmp_path / "sweep.json").write_text((tmp_path / "sweep.json").read_text())
  text = report.write(tmp_path).read_text()
  runs = text.split("## Runs")[1]
  assert re.search(rf"\| {re.escape(torn)} \| stable \| [\d.]+ \| 2 unreadable line\(s\) in "
                   r"metrics.jsonl \|", runs), runs
  assert re.search(rf"\| {re.escape(empty)} \| incomplete \| — \| reached step 100; "
                   r"summary.json unreadable \|", runs), runs
  assert "17 of 18 runs finished" in text


def test_the_console_names_each_run_with_unreadable_lines(tmp_path, capsys):
  """`python -m actlab.report` says on the console, one line per run, what report.md's runs table
  says: the torn lines it skipped, an unreadable summary."""
  _fake_sweep(tmp_path, np.random.default_rng(3))
  torn, empty = _name("relu", 1e-3, 0), _name("gelu", 3e-3, 1)
  log = tmp_path / torn / "metrics.jsonl"
  whole = log.read_text()
  log.write_text(whole[:-30] + '\n{"step": 100, "train_lo{"step"\n')
  (tmp_path / empty / "summary.json").write_text("")
  assert report.main(["actlab.report", str(tmp_path)]) == 0
  err = capsys.readouterr().err.splitlines()
  assert err == [f"actlab.report: {torn}: 2 unreadable line(s) in metrics.jsonl skipped",
                 f"actlab.report: {empty}: summary.json unreadable: the run counts as not "
                 "finished"], err
  log.write_text(whole)
  (tmp_path / empty / "summary.json").unlink()
  assert report.main(["actlab.report", str(tmp_path)]) == 0
  assert capsys.readouterr().err == ""  # nothing unreadable, nothing said


# Designed final val losses: relu = base(LR) + 0.3·seed (seeds differ far more than activations
# do, so only pairing by seed can resolve the differences), the others relu + d(seed).
BASE = {1e-4: 2.3, 1e-3: 2.0, 3e-3: 2.1}
DIFF = {("gelu", 1e-4): [-0.10, -0.12, -0.08], ("gelu", 1e-3): [0.20, 0.25, 0.15],
        ("gelu", 3e-3): [-0.10, -0.12, -0.08]}


def _designed(act, lr, seed):
  relu = 3.05 if (lr, seed) == (3e-3, 2) else BASE[lr] + 0.3 * seed  # 3.05 ≥ unigram: not learned
  d = 0.0 if act == "relu" else DIFF.get((act, lr), [0.3, 0.1, -0.2])[seed]
  out = {"final_val_loss": relu + d, "unigram_loss": 3.0}
  return {**out, "status": "unstable", "status_reasons": [GRAD_REASON]} \
      if (act, lr, seed) == ("tanh", 3e-3, 1) else out


GRAD_REASON = "gradient norm 31.2 by step 40 > 10× its value at initialisation (2.01)"


def _section(text, title):
  return text.split(f"## {title}\n")[1].split("\n## ")[0]


@pytest.mark.slow
def test_paired_comparisons_stability_and_not_learned_end_to_end(tmp_path):
  acts = ["relu", "gelu", "tanh"]
  _fake_sweep(tmp_path, np.random.default_rng(4), acts=acts, missing={_name("relu", 1e-4, 2)},
              summary_for=_designed)
  text = report.write(tmp_path).read_text()
  pairs = _section(text, "Paired comparisons")
  assert "| LR | A | B | n | mean A − B | sd | 95% CI | p (Holm) | verdict | MDD |" in pairs
  # The 95% CIs of gelu at 1e-3 and 3e-3 lie off 0 (unadjusted p 0.0202 and 0.0132), but the
  # family has 8 comparisons (6 per LR, 2 at the best LRs): Holm's 8·0.0132 = 0.105 and
  # 7·0.0202 = 0.141 exceed 0.05, so neither is resolved (before Holm both were).
  for row in [  # relu seed 2 is missing at 1e-4: two pairs there
      "| 0.0001 | gelu | relu | 2 | -0.110 | 0.014 | [-0.237, +0.017] | 0.346 | not resolved "
      "| 0.163 |",
      "| 0.0001 | tanh | relu | 2 | +0.200 | 0.141 | [-1.071, +1.471] | 1.000 | not resolved "
      "| 1.633 |",
      "| 0.001 | gelu | relu | 3 | +0.200 | 0.050 | [+0.076, +0.324] | 0.141 | not resolved "
      "| 0.163 |",
      "| 0.001 | tanh | relu | 3 | +0.067 | 0.252 | [-0.558, +0.692] | 1.000 | not resolved "
      "| 0.821 |",
      "| 0.003 | gelu | relu | 3 | -0.100 | 0.020 | [-0.150, -0.050] | 0.105 | not resolved "
      "| 0.065 |",
      "| 0.003 | tanh | relu | 3 | +0.067 | 0.252 | [-0.558, +0.692] | 1.000 | not resolved "
      "| 0.821 |"]:
    assert row in pairs.splitlines(), (row, pairs)
  assert len([l for l in pairs.splitlines() if l.startswith("| 0.")]) == 6
  assert "has 80% power with their sd" in pairs
  assert "**Family**: the 8 comparison(s) with n ≥ 2" in pairs
  assert "states no `equivalence_margin`, so no comparison can be called equivalent" in pairs
  # Best LRs chosen on seed 0 (relu 1e-3, gelu 3e-3: 2.0 vs 2.2 at 1e-3; tanh 1e-3), tested on
  # seeds 1, 2: gelu − relu = [2.28 − 2.3, 2.97 − 2.6].
  best = _section(text, "At each activation's best LR")
  assert "chosen on seed(s) 0" in best and "compared on seed(s) 1, 2" in best
  assert ("| gelu | 0.003 | relu | 0.001 | 2 | +0.175 | 0.276 | [-2.303, +2.653] | 1.000 | "
          "not resolved | 3.185 |") in best.splitlines()
  assert "| tanh | 0.001 | relu | 0.001 | 2 | -0.050 |" in best

  stable = _section(text, "Largest stable LR")
  assert ("| activation | largest LR where every seed is stable and learned | the next LR up"
          in stable)
  assert ("| relu | 0.001 | 0.003: 1 of 3 not learned (final val loss ≥ the unigram loss) |"
          in stable)  # 1e-4: a seed missing
  assert "| gelu | 0.003 | — (none swept higher) |" in stable
  assert ("| tanh | 0.001 | 0.003: 1 of 3 unstable (gradient norm above 10× its initial value) |"
          in stable)
  assert "not checked" not in stable
  assert _row(text, "relu", 3e-3).endswith("| 3 stable; 1 not learned |")
  assert ("| activation=relu,lr=0.003,seed=2 | stable, not learned | 3.050 | not learned: final "
          "val loss ≥ unigram loss 3.000 |") in text

  # The baseline: the manifest's, else the grid's first; --baseline wins; an unknown one is refused.
  manifest = json.loads((tmp_path / "sweep.json").read_text())
  (tmp_path / "sweep.json").write_text(json.dumps({**manifest, "baseline": "gelu"}))
  pairs = _section(report.write(tmp_path).read_text(), "Paired comparisons")
  assert ("| 0.003 | relu | gelu | 3 | +0.100 | 0.020 | [+0.050, +0.150] | 0.105 | not resolved "
          "| 0.065 |") in pairs
  pairs = _section(report.write(tmp_path, "tanh").read_text(), "Paired comparisons")
  assert ("| 0.001 | gelu | tanh | 3 | +0.133 | 0.225 | [-0.427, +0.693] | 1.000 | not resolved "
          "| 0.736 |") in pairs
  with pytest.raises(UserError, match=r"baseline 'swish' is not one of the swept model.activation "
                     r"values \['relu', 'gelu', 'tanh'\]"):
    report.write(tmp_path, "swish")


@pytest.mark.slow
def test_not_learned_is_not_checked_without_unigram_loss(tmp_path):
  _fake_sweep(tmp_path, np.random.default_rng(5), diverged={_name("gelu", 3e-3, 0)},
              summary_for=lambda act, lr, seed: {"final_val_loss": 9.0})  # above any unigram
  text = report.write(tmp_path).read_text()
  stable = _section(text, "Largest stable LR")
  assert "17 finished run(s) have no `unigram_loss` in their summary: not checked" in stable
  assert "| relu | 0.003 | — (none swept higher) |" in stable
  assert "| gelu | 0.001 | 0.003: 1 of 3 diverged (non-finite train_loss) |" in stable
  assert "not learned" not in _section(text, "Runs")


def _only_lr(root, lr):
  """Rewrites a `_fake_sweep` manifest as a sweep of the activation only, at `lr` (like
  experiments/activation_zoo.py); the other LRs' cells stay on disk, outside the grid."""
  manifest = json.loads((root / "sweep.json").read_text())
  cells = [{"name": c["name"], "overrides": {k: v for k, v in c["overrides"].items()
                                             if k != "optim.lr"}}
           for c in manifest["cells"] if c["overrides"]["optim.lr"] == lr]
  acts = manifest["axes"]["model.activation"]
  (root / "sweep.json").write_text(json.dumps(
      {**manifest, "axes": {"model.activation": acts}, "cells": cells}))


@pytest.mark.slow
def test_a_grid_without_an_lr_axis_compares_activations_only(tmp_path):
  s = _fake_sweep(tmp_path, np.random.default_rng(6), acts=["relu", "gelu", "tanh"],
                  missing={_name("tanh", 1e-3, k) for k in SEEDS})
  _only_lr(tmp_path, 1e-3)
  text = report.write(tmp_path, "gelu").read_text()
  pairs = _section(text, "Paired comparisons")
  d = [s[_name("relu", 1e-3, k)]["final_val_loss"] - s[_name("gelu", 1e-3, k)]["final_val_loss"]
       for k in SEEDS]
  assert "| A | B | n | mean A − B |" in pairs
  assert f"| relu | gelu | 3 | {np.mean(d):+.3f} | {np.std(d, ddof=1):.3f} | [" in pairs
  assert "| tanh | gelu | 0 | — | — | — | — | not resolved | n < 2 |" in pairs  # not run yet
  assert "## Largest stable LR" not in text and "## LR sensitivity" not in text


VERDICT_DIFF = {"lower": [-0.30, -0.31, -0.29], "same": [0.001, 0.003, 0.002],
                "noisy": [0.3, -0.2, 0.1]}  # against base, which is 2.0 + 0.3·seed


@pytest.mark.slow
def test_each_verdict_with_a_margin_and_named_pairs_end_to_end(tmp_path):
  sps = pytest.importorskip("scipy.stats")
  acts = ["base", "lower", "same", "noisy"]
  loss = lambda act, seed: 2.0 + 0.3 * seed + (VERDICT_DIFF[act][seed] if act != "base" else 0)
  _fake_sweep(tmp_path, np.random.default_rng(7), acts=acts,
              summary_for=lambda act, lr, seed: {"final_val_loss": loss(act, seed)})
  _only_lr(tmp_path, 1e-3)
  manifest = json.loads((tmp_path / "sweep.json").read_text())
  (tmp_path / "sweep.json").write_text(json.dumps(
      {**manifest, "baseline": "base", "pairs": [["same", "lower"], ["lower", "base"]],
       "equivalence_margin": 0.05}))
  pairs = _section(report.write(tmp_path).read_text(), "Paired comparisons")
  rows = [l for l in pairs.splitlines() if l.startswith("| ") and "---" not in l][1:]
  compared = [("lower", "base"), ("same", "base"), ("noisy", "base"), ("same", "lower")]
  assert [tuple(r.split(" | ")[:2]) for r in rows] == [(f"| {a}", b) for a, b in compared]
  # Holm's adjusted p-values recomputed from scipy's paired t and one-sided tests.
  d = {(a, b): np.array([loss(a, k) - loss(b, k) for k in SEEDS]) for a, b in compared}
  p = comparisons.holm([sps.ttest_rel(d[c], np.zeros(3)).pvalue for c in compared])
  tost = comparisons.holm([max(sps.ttest_1samp(d[c], -0.05, alternative="greater").pvalue,
                         sps.ttest_1samp(d[c], 0.05, alternative="less").pvalue)
                     for c in compared])
  verdicts = ["lower better", "equivalent within ±0.05", "not resolved", "lower better"]
  for row, c, pv, tv, verdict in zip(rows, compared, p, tost, verdicts):
    fmt = lambda x: "<0.001" if x < 0.001 else f"{x:.3f}"
    assert f" | {fmt(pv)} | {fmt(tv)} | {verdict} | " in row, (c, row)
  assert p[1] > 0.05 and tost[1] < 0.05 and min(p[2], tost[2]) > 0.05
  assert "**Family**: the 4 comparison(s) with n ≥ 2 in this table;" in pairs
  assert "**equivalent within ±0.05** if both one-sided paired t tests against ±0.05" in pairs
  assert "| MDD |" in pairs and "TOST p (Holm)" in pairs


@pytest.mark.slow
def test_best_lr_section_says_why_it_is_missing_with_one_seed(tmp_path):
  _fake_sweep(tmp_path, np.random.default_rng(3))
  manifest = json.loads((tmp_path / "sweep.json").read_text())
  (tmp_path / "sweep.json").write_text(json.dumps(
      {**manifest, "seeds": [0], "cells": [c for c in manifest["cells"]
                                           if c["overrides"]["train.seed"] == 0]}))
  best = _section(report.write(tmp_path).read_text(), "At each activation's best LR")
  assert "*Not shown: with one seed there is none left to choose the LR on" in best


def _verdict(train_losses, grad_norm_max=2.0, val_losses=(4.0,)):
  """The status and reasons `metrics.verdict` gives rows of these values (warm-up 5 steps,
  spikes above 1.5× the best, gradient norm above 10× its initial 2.0, final val loss above
  1.05× the best)."""
  rows = [{"step": 0, "grad_norm_init": 2.0, "val_loss": 5.0}]
  rows += [{"step": 10 * (i + 1), "train_loss": x, "grad_norm_max": grad_norm_max}
           for i, x in enumerate(train_losses)]
  rows += [{"step": 100 + i, "val_loss": v} for i, v in enumerate(val_losses)]
  v = metrics.verdict(rows, warmup_steps=5, uniform_loss=5.5, spike_rel=0.5, final_gap_rel=0.05,
                      uniform_frac=0.9, grad_rel_max=10.0)
  return {"status": v["status"], "status_reasons": v["reasons"]}


def test_the_largest_stable_lr_table_says_which_lr_failed_and_why():
  """Each activation's largest LR with every seed stable, and at the next LR up (the lowest when
  none is) how many seeds failed, how, and the verdict's reasons without each run's numbers."""
  grad = _verdict([4.0, 3.0], grad_norm_max=31.0)
  grad_and_spike = _verdict([4.0, 2.0, 3.5], grad_norm_max=40.0)
  diverged = _verdict([4.0, math.nan])
  assert grad["status"] == grad_and_spike["status"] == "unstable" and len(
      grad_and_spike["status_reasons"]) == 2 and diverged["status"] == "diverged"
  manifest = {"axes": {"model.activation": ["relu", "gelu", "tanh"], "optim.lr": [1e-3, 1e-4]},
              "seeds": [0, 1, 2]}
  good = {"status": "stable", "status_reasons": [], "final_val_loss": 2.0, "unigram_loss": 3.0}
  cells = {("relu", 1e-4): [good] * 3, ("relu", 1e-3): [grad, grad_and_spike, good],
           ("gelu", 1e-4): [{**good, "final_val_loss": 3.5}, diverged, None],  # seed 2: not run
           ("gelu", 1e-3): [grad] * 3, ("tanh", 1e-4): [good] * 3, ("tanh", 1e-3): [good] * 3}
  runs = [stats.Run(_name(a, lr, k), {"model.activation": a, "optim.lr": lr, "train.seed": k},
                    "done", {"final_val_loss": 2.0, "unigram_loss": 3.0, **summary})
          for (a, lr), summaries in cells.items() for k, summary in enumerate(summaries)
          if summary is not None]
  lines = tables.stability_table(manifest, runs).splitlines()
  assert lines[0] == ("| activation | largest LR where every seed is stable and learned | the "
                      "next LR up (every LR, if none is): seeds that failed, and why |")
  assert lines[2:] == [
      "| relu | 0.0001 | 0.001: 2 of 3 unstable (gradient norm above 10× its initial value; "
      "train-loss spike above 1.5× the best earlier loss after warm-up in 1) |",
      "| gelu | none | 0.0001: 3 of 3 failed: 1 not learned (final val loss ≥ the unigram loss), "
      "1 diverged (non-finite train_loss), 1 not run; 0.001: 3 of 3 unstable (gradient norm "
      "above 10× its initial value) |",
      "| tanh | 0.001 | — (none swept higher) |"]
  # Every reason the verdict gives has its short form.
  chance = _verdict([4.0], val_losses=(5.2,))["status_reasons"]
  gap = _verdict([4.0, 3.0], val_losses=(3.0, 3.5))["status_reasons"]
  assert [tables.reason_kind(r) for r in [*chance, *gap]] == [
      "final val loss no better than chance", "final val loss above 1.05× its best"]


# --- The plots' numbers (actlab.report.series) ------------------------------------------------


def _run(act, lr, seed, rows, final=None, status="stable"):
  summary = {} if final is None else {"status": status, "final_val_loss": final}
  return stats.Run(_name(act, lr, seed), {"model.activation": act, "optim.lr": lr,
                                          "train.seed": seed},
                   "done" if summary else "incomplete", summary, rows)


def test_band_is_mean_and_sd_over_seeds_at_shared_steps():
  rows = lambda pts: [{"step": t, "train_loss": v} for t, v in pts]
  runs = [_run("relu", 1e-3, 0, rows([(0, 5.0), (10, 4.0), (20, 3.0), (30, 2.0)])),
          _run("relu", 1e-3, 1, rows([(0, 6.0), (10, 5.0), (20, None), (30, 4.0)])),
          _run("relu", 1e-3, 2, rows([(0, 7.0), (10, 3.0), (30, 3.0), (40, 1.0)])),
          _run("relu", 1e-3, 3, [{"step": 0, "val_loss": 9.0}])]  # no train_loss: not a seed here
  b = report_series.band(runs, "train_loss")
  assert b.n == 3
  np.testing.assert_array_equal(b.steps, [0, 10, 30])  # 20: seed 1 non-finite, 40: seed 2 only
  np.testing.assert_allclose(b.mean, [6.0, 4.0, 3.0])
  np.testing.assert_allclose(b.sd, [1.0, 1.0, 1.0])
  one = report_series.band(runs[:1], "train_loss")
  assert one.n == 1 and np.isnan(one.sd).all()
  assert report_series.band(runs, "sharpness") is None
  assert report_series.log_scale([0.1, 5.0]) and not report_series.log_scale([1.0, 29.0])
  assert not report_series.log_scale([-1.0, 100.0]) and not report_series.log_scale([None])


def _layer_row(step, **per_layer):
  return {"step": step, "val_loss": 3.0, **{f"{k}/layer_{i}": v for k, vs in per_layer.items()
                                            for i, v in enumerate(vs)}}


def test_layer_stats_at_each_groups_best_lr_over_finished_seeds():
  manifest = {"axes": {"model.activation": ["relu", "gelu"], "optim.lr": [1e-3, 1e-2]},
              "seeds": [0, 1, 2]}
  early = _layer_row(50, dead_units=[0.9, 0.9], act_zero_frac=[0.9, 0.9], act_mean=[9, 9])
  runs = [  # relu is best at 1e-2 (mean 2.0 < 3.0), gelu at 1e-3
      *(_run("relu", 1e-3, s, [early], final=3.0) for s in range(3)),
      _run("relu", 1e-2, 0, [early, _layer_row(100, dead_units=[0.0, 0.1], act_zero_frac=[
          0.5, 0.6], act_mean=[0.2, -0.1])], final=1.5),
      _run("relu", 1e-2, 1, [early, _layer_row(100, dead_units=[0.0, 0.3], act_zero_frac=[
          0.5, 0.8], act_mean=[0.4, 0.1])], final=2.5),
      _run("relu", 1e-2, 2, [early, _layer_row(100, dead_units=[0.5, 0.5], act_zero_frac=[
          0.5, 0.5], act_mean=[0.5, 0.5])], status="diverged", final=None),  # not finished
      _run("gelu", 1e-3, 0, [_layer_row(100, dead_units=[0, 0], act_zero_frac=[0.4, 0.3],
                                        act_mean=[0.1, 0.0])], final=2.0),
      _run("gelu", 1e-2, 0, [early], final=4.0)]
  data = report_series.layer_stats(manifest, runs)
  relu, gelu = data[("relu",)], data[("gelu",)]
  assert (relu["lr"], relu["n"], gelu["lr"], gelu["n"]) == (1e-2, 2, 1e-3, 1)
  layers, mean, sd = relu["dead_units"]
  np.testing.assert_array_equal(layers, [0, 1])
  np.testing.assert_allclose(mean, [0.0, 0.2])
  np.testing.assert_allclose(sd, [0.0, math.sqrt(0.02)])
  np.testing.assert_allclose(relu["act_zero_frac"][1], [0.5, 0.7])
  np.testing.assert_allclose(relu["act_mean"][1], [0.3, 0.0], atol=1e-12)
  np.testing.assert_allclose(gelu["act_zero_frac"][1], [0.4, 0.3])
  assert np.isnan(gelu["act_mean"][2]).all()  # one seed: no sd


def _drawn_axes(monkeypatch):
  """The axes the next plot draws, kept (`plots._save` saves nothing)."""
  kept = []
  def save(fig, axes, path, *args, **kwargs):
    kept.extend(axes)
    return True
  monkeypatch.setattr(plots, "_save", save)
  return kept


def test_error_bars_and_bands_of_fractions_stay_within_0_and_1(monkeypatch):
  """A fraction's mean ± sd is cut to [0, 1] (0 and 100%): dead units 0, 0, 0.3 over three seeds
  (mean 0.1, sd 0.17) have a bar from 0%, not −7%; zero fractions 1, 1, 0.7 one to 100%. The act
  mean, not a fraction, keeps its symmetric bar below 0."""
  import matplotlib
  matplotlib.use("Agg")
  manifest = {"axes": {"model.activation": ["relu"], "optim.lr": [1e-3]}, "seeds": [0, 1, 2]}
  values = [(0.0, 1.0, -0.1), (0.0, 1.0, -0.1), (0.3, 0.7, 0.2)]  # dead, zero frac, act mean
  runs = [_run("relu", 1e-3, k, [{**_layer_row(100, dead_units=[d], act_zero_frac=[z],
                                                act_mean=[m]), "act_zero_frac": z}],
               final=2.0) for k, (d, z, m) in enumerate(values)]
  axes = _drawn_axes(monkeypatch)
  assert plots.plot_layers(manifest, runs, None)
  sd = np.std([0.0, 0.0, 0.3], ddof=1)
  ends = []
  for ax in axes:  # dead units, zero fraction, act mean: each panel's one bar
    (bar,) = ax.containers[0].lines[2][0].get_segments()
    ends.append(sorted(bar[:, 1]))
  np.testing.assert_allclose(ends[0], [0.0, 100 * (0.1 + sd)])
  np.testing.assert_allclose(ends[1], [100 * (0.9 - sd), 100.0])
  np.testing.assert_allclose(ends[2], [0.0 - sd, 0.0 + sd], atol=1e-12)
  # The curve of act_zero_frac over steps: its band likewise.
  axes.clear()
  assert plots.plot_curves(manifest, runs, "act_zero_frac", "", None)
  (band,) = [c for c in axes[0].collections if len(c.get_paths())]
  y = band.get_paths()[0].vertices[:, 1]
  assert y.max() == pytest.approx(1.0) and y.min() == pytest.approx(0.9 - sd)
  np.testing.assert_allclose(report_series.spread(np.array([0.1]), np.array([0.2]), "act_mean"),
                             [[-0.1], [0.3]])


def test_forest_intervals_are_95_percent_t_intervals_best_group_first():
  manifest = {"axes": {"model.activation": ["relu", "gelu", "tanh"], "optim.lr": [1e-2, 1e-3]},
              "seeds": [0, 1, 2]}
  finals = {("relu", 1e-3): [2.0, 2.2, 2.4], ("relu", 1e-2): [3.0, None, None],
            ("gelu", 1e-3): [1.9, 2.1, 2.3], ("gelu", 1e-2): [2.5, 2.5]}
  runs = [_run(a, lr, s, [], final=v, status="stable" if v is not None else "diverged")
          for (a, lr), vals in finals.items() for s, v in enumerate(vals)]
  runs.append(_run("tanh", 1e-3, 0, [{"step": 10, "train_loss": 5.0}]))  # unfinished
  out = report_series.forest(manifest, runs)
  assert [(i.group, i.lr, i.n) for i in out] == [
      (("gelu",), 1e-3, 3), (("gelu",), 1e-2, 2), (("relu",), 1e-3, 3), (("relu",), 1e-2, 1),
      (("tanh",), 1e-3, 0), (("tanh",), 1e-2, 0)]
  half = 4.302653 * 0.2 / math.sqrt(3)  # t₀.₉₇₅,₂ · sd / √3
  assert (out[0].mean, out[0].low, out[0].high) == pytest.approx((2.1, 2.1 - half, 2.1 + half))
  assert (out[2].mean, out[2].low, out[2].high) == pytest.approx((2.2, 2.2 - half, 2.2 + half))
  assert (out[1].low, out[1].high) == (2.5, 2.5)  # sd 0
  assert out[3].mean == 3.0 and math.isnan(out[3].low) and math.isnan(out[4].mean)


@pytest.mark.parametrize("n", [3, 10, 12, 20, 25, 40])
def test_series_styles_are_distinct(n):
  styles = report_series.styles(n)
  assert len(styles) == n and len(set(styles)) == n
  assert len({c for c, _ in styles}) == n  # distinct colours, not only colour × line style
  assert all(re.fullmatch(r"#[0-9a-f]{6}", c) for c, _ in styles)
  if n <= 20:
    assert {s for _, s in styles} == {"-"}
  else:
    assert len({s for _, s in styles}) == 4


# --- runs.csv ---------------------------------------------------------------------------------


def test_runs_csv_has_one_row_per_run_and_parses_back(tmp_path):
  diverged, incomplete = _name("gelu", 3e-3, 0), _name("relu", 1e-4, 1)
  s = _fake_sweep(tmp_path, np.random.default_rng(7), diverged={diverged},
                  incomplete={incomplete}, missing={_name("relu", 1e-3, 2)},
                  summary_for=lambda act, lr, seed: {
                      "final_train_loss": 1.5, "unigram_loss": 2.5, "wall_time_sec": 12.5,
                      "best_val_loss": float("nan") if seed == 1 else 1.2})
  s[diverged]["final_val_loss"] = None
  (tmp_path / diverged / "summary.json").write_text(json.dumps(s[diverged]))
  report_csv.write(*report_load.load(tmp_path), tmp_path / "runs.csv")
  with open(tmp_path / "runs.csv", newline="") as f:
    rows = {r["run"]: r for r in csv.DictReader(f)}
  assert len(rows) == 18
  assert list(next(iter(rows.values())))[:8] == [
      "run", "optim.lr", "model.activation", "train.seed", "state", "status", "learned",
      "last_step"]
  name = _name("gelu", 1e-3, 0)
  r, want = rows[name], s[name]
  assert (r["optim.lr"], r["model.activation"], r["train.seed"]) == ("0.001", "gelu", "0")
  assert (r["state"], r["status"], r["last_step"]) == ("done", "stable", "100")
  assert r["learned"] == ("true" if want["final_val_loss"] < 2.5 else "false")
  for key in ("final_val_loss", "initial_val_loss", "act_zero_frac", "dead_units", "act_mean",
              "grad_norm", "wall_time_sec", "best_val_loss"):
    assert float(r[key]) == want[key], key  # full precision
  assert float(r["train_val_gap"]) == want["final_val_loss"] - 1.5
  assert r["act_std"] == r["attn_logit_max"] == ""  # not in the summary
  assert rows[_name("gelu", 1e-3, 1)]["best_val_loss"] == ""  # NaN
  d = rows[diverged]
  assert (d["status"], d["learned"], d["final_val_loss"], d["train_val_gap"]) == (
      "diverged", "", "", "")
  assert (rows[incomplete]["state"], rows[incomplete]["status"], rows[incomplete]["last_step"],
          rows[incomplete]["final_val_loss"]) == ("incomplete", "incomplete", "100", "")
  m = rows[_name("relu", 1e-3, 2)]
  assert (m["state"], m["last_step"], m["initial_val_loss"]) == ("missing", "", "")
  assert d["status_reasons"] == "non-finite train_loss at step 100" and r["status_reasons"] == ""


def test_runs_csv_has_every_measure_of_the_summaries_and_empty_cells_where_one_lacks_it(
    tmp_path):
  """Keys added since (or only some runs') are columns, empty where a run does not have them; a
  task's measures (MLM accuracy) only where some run has them; a number unknown to `COLUMNS` too;
  the spike steps and the verdict's reasons as text."""
  newer = lambda act, lr, seed: {} if seed == 0 else {  # seed 0 predates these keys
      "final_test_loss": 2.25, "grad_norm_init": 1.5, "grad_norm_max_rel": 12.5,
      "attn_entropy_min": 0.75, "spike_steps": [60, 80], "params": 937472, "new_measure": 0.5,
      "note": "text, not a number", "status_reasons": ["a", "b"]}
  _fake_sweep(tmp_path, np.random.default_rng(7), summary_for=newer)
  report_csv.write(*report_load.load(tmp_path), tmp_path / "runs.csv")
  with open(tmp_path / "runs.csv", newline="") as f:
    reader = csv.DictReader(f)
    rows = {r["run"]: r for r in reader}
  header = reader.fieldnames
  assert "note" not in header and "final_val_accuracy" not in header and "provenance" not in header
  assert header[-2:] == ["new_measure", "status_reasons"]
  new, old = rows[_name("gelu", 1e-3, 1)], rows[_name("gelu", 1e-3, 0)]
  assert (new["final_test_loss"], new["grad_norm_init"], new["grad_norm_max_rel"],
          new["attn_entropy_min"], new["new_measure"]) == ("2.25", "1.5", "12.5", "0.75", "0.5")
  assert (new["spike_steps"], new["params"], new["status_reasons"]) == ("60 80", "937472", "a; b")
  assert (old["final_test_loss"], old["grad_norm_init"], old["grad_norm_max_rel"],
          old["attn_entropy_min"], old["spike_steps"], old["new_measure"]) == ("",) * 6


@pytest.mark.parametrize("study", ["primary_relu_gelu", "primary_bert_relu_gelu"])
def test_runs_csv_carries_every_measure_of_a_committed_run(tmp_path, study):
  """What RESULTS.md cites of a run (the decoder's and the encoder's `summary.json`, the test
  and [MASK] losses and accuracies, the gradient norms, the attention entropy): each key but the
  provenance is a column of runs.csv, with its value."""
  summary = json.loads(sorted((REPO / "results" / study).glob("*/summary.json"))[0].read_text())
  (tmp_path / "run").mkdir()
  (tmp_path / "run" / "summary.json").write_text(json.dumps(summary))
  (tmp_path / "sweep.json").write_text(json.dumps(
      {"sweep": "x", "axes": {"model.activation": ["relu"]}, "seeds": [0],
       "cells": [{"name": "run", "overrides": {"model.activation": "relu", "train.seed": 0}}]}))
  report_csv.write(*report_load.load(tmp_path), tmp_path / "runs.csv")
  with open(tmp_path / "runs.csv", newline="") as f:
    (row,) = csv.DictReader(f)
  assert "final_test_loss" in summary and "attn_entropy_min" in summary
  for key, value in summary.items():
    if key == "provenance":
      assert key not in row
    elif key == "status_reasons":
      assert row[key] == "; ".join(value)
    elif key == "status":
      assert row[key] == value
    elif isinstance(value, list):
      assert row[key] == " ".join(map(str, value)), key
    else:
      assert row[key] == ("" if value is None else str(value) if isinstance(value, int)
                          else repr(float(value))), key


# --- Several sweep directories ----------------------------------------------------------------


def test_merging_sweeps_counts_each_run_once(tmp_path):
  a, b = tmp_path / "a", tmp_path / "b"
  _fake_sweep(a, np.random.default_rng(8), missing={_name("gelu", 1e-3, 1)})
  _fake_sweep(b, np.random.default_rng(9), acts=["tanh", "gelu"])
  _only_lr(b, 1e-3)  # b: activations only, at LR 1e-3; its gelu cells are a's too
  manifest, runs, dups = report_load.load_many([a, b])
  assert manifest["axes"] == {"model.activation": ["relu", "gelu", "tanh"], "optim.lr": LRS}
  assert manifest["seeds"] == SEEDS
  assert sorted(dups) == [f"b/{_name('gelu', 1e-3, k)}" for k in SEEDS]
  assert len(runs) == 18 + 3  # a's grid and b's tanh
  by = {(r.overrides["model.activation"], r.overrides["optim.lr"], r.overrides["train.seed"]): r
        for r in runs}
  assert len(by) == len(runs)
  assert by["tanh", 1e-3, 0].name == f"b/{_name('tanh', 1e-3, 0)}"
  assert by["gelu", 1e-3, 0].name == f"a/{_name('gelu', 1e-3, 0)}"  # the first directory's
  assert by["gelu", 1e-3, 1].name == f"b/{_name('gelu', 1e-3, 1)}"  # missing in a, done in b
  assert by["gelu", 1e-3, 1].state == "done"
  _, again, dups = report_load.load_many([a, a])  # a sweep given twice
  assert len(again) == 18 and len(dups) == 18
  # Named pairs are united; equivalence margins must agree where stated.
  for root, extra in [(a, {"pairs": [["gelu", "relu"]], "equivalence_margin": 0.02}),
                      (b, {"pairs": [["relu", "gelu"], ["tanh", "gelu"]]})]:
    m = json.loads((root / "sweep.json").read_text())
    (root / "sweep.json").write_text(json.dumps({**m, **extra}))
  manifest, _, _ = report_load.load_many([a, b])
  assert manifest["pairs"] == [["gelu", "relu"], ["tanh", "gelu"]]
  assert manifest["equivalence_margin"] == 0.02
  m = json.loads((b / "sweep.json").read_text())
  (b / "sweep.json").write_text(json.dumps({**m, "equivalence_margin": 0.05}))
  with pytest.raises(UserError, match=r"state different equivalence margins \[0.02, 0.05\]"):
    report_load.load_many([a, b])


def _set_d_model(root, d_model):
  for path in root.glob("*/config.json"):
    config = json.loads(path.read_text())
    config["model"]["d_model"] = d_model
    path.write_text(json.dumps(config))


def test_sweeps_that_differ_in_a_fixed_setting_are_not_merged(tmp_path):
  a, b = tmp_path / "a", tmp_path / "b"
  _fake_sweep(a, np.random.default_rng(10))
  _fake_sweep(b, np.random.default_rng(11), acts=["tanh"])
  _set_d_model(b, 128)
  with pytest.raises(UserError, match=rf"^cannot merge {re.escape(str(a))} and "
                     rf"{re.escape(str(b))}: their runs differ in model.d_model: 64 → 128, "
                     "which neither sweeps as an axis; report them separately, or compare "
                     "them along it with --axis=model.d_model$"):
    report_load.load_many([a, b])
  with pytest.raises(UserError, match="several sweep directories: say where the report goes "
                     "with --out=DIR"):
    report.write([a, b])


def test_sweeps_that_fix_a_field_differently_merge_along_it_when_asked(tmp_path):
  """`--axis=model.d_model`: the field becomes an axis, each run's value from its config."""
  a, b = tmp_path / "a", tmp_path / "b"
  _fake_sweep(a, np.random.default_rng(10))
  _fake_sweep(b, np.random.default_rng(11))
  _set_d_model(b, 128)
  manifest, runs, duplicates = report_load.load_many([a, b], ["model.d_model"])
  assert manifest["axes"]["model.d_model"] == [64, 128] and not duplicates
  assert len(runs) == 36 and {r.overrides["model.d_model"] for r in runs} == {64, 128}
  text = report.write([a, b], out=tmp_path / "both", axes=["model.d_model"]).read_text()
  assert "--axis=model.d_model --out=" in text and "| d_model |" in text


@pytest.mark.slow
def test_cli_merges_several_sweeps_and_refuses_unmergeable_ones(tmp_path, drawn):
  a, b, c = tmp_path / "a", tmp_path / "b", tmp_path / "c"
  _fake_sweep(a, np.random.default_rng(12))
  _fake_sweep(b, np.random.default_rng(13), acts=["tanh", "gelu"])
  _only_lr(b, 1e-3)
  assert report.main(["actlab.report", str(a), str(b), f"--out={tmp_path / 'both'}",
                      "--baseline=gelu"]) == 0
  text = (tmp_path / "both" / "report.md").read_text()
  assert "21 of 21 runs finished" in text
  assert "3 run(s) were in more than one directory with the same config and count once" in text
  assert "| 0.001 | tanh | gelu | 3 |" in _section(text, "Paired comparisons")
  assert (tmp_path / "both" / "runs.csv").read_text().count("\n") == 22
  assert (tmp_path / "both" / "plots" / "final_val_loss.png").exists()  # 3 LRs: a forest plot
  assert not (a / "report.md").exists()
  _fake_sweep(c, np.random.default_rng(14), acts=["tanh"])
  _set_d_model(c, 128)
  # A refusal, in a process of its own: one line on stderr and exit code 2.
  out = subprocess.run([sys.executable, "-m", "actlab.report", str(a), str(c),
                        f"--out={tmp_path / 'no'}"], cwd=REPO, capture_output=True, text=True,
                       timeout=120)
  assert out.returncode == 2 and out.stderr.count("\n") == 1, out.stderr
  assert out.stderr.startswith("error: cannot merge") and "model.d_model" in out.stderr


def test_an_archive_holds_what_the_report_reads_and_reports_the_same(tmp_path):
  """`--archive` copies sweep.json and each run's config, summary and log (no checkpoints):
  the report written from the copy has the same tables as the one from the sweep."""
  _fake_sweep(tmp_path / "sweep", np.random.default_rng(5), incomplete=(_name("gelu", 1e-3, 1),))
  (tmp_path / "sweep" / _name("relu", 1e-4, 0) / "checkpoints").mkdir()
  report.write([tmp_path / "sweep"])
  assert report.main(["actlab.report", str(tmp_path / "sweep"),
                      f"--archive={tmp_path / 'results'}"]) == 0
  kept = sorted(str(p.relative_to(tmp_path / "results")) for p in (tmp_path / "results").rglob("*")
                if p.is_file() and p.parent.name != "plots")
  assert "sweep.json" in kept and not any("checkpoints" in k for k in kept)
  assert sum(k.endswith("metrics.jsonl") for k in kept) == 18   # every run's log, unfinished too
  body = lambda d: (d / "report.md").read_text().split("\n", 3)[3]  # after the "Written by" line
  assert body(tmp_path / "results") == body(tmp_path / "sweep")
  _fake_sweep(tmp_path / "other", np.random.default_rng(6), acts=("relu",))
  with pytest.raises(UserError, match="holds the archive of another sweep"):
    report.archive(tmp_path / "other", tmp_path / "results")


def test_the_reports_command_names_paths_below_the_working_directory_relatively(tmp_path,
                                                                                 monkeypatch):
  """A committed report.md records `results/<study>`, not the absolute path of the checkout that
  wrote it; a path elsewhere stays absolute."""
  monkeypatch.chdir(tmp_path)
  assert report.relative(tmp_path / "results" / "study") == "results/study"
  assert report.relative("results/study") == "results/study"
  assert report.relative(tmp_path.parent / "other") == str(tmp_path.parent / "other")


def test_results_commits_no_run_state_and_no_machine_path():
  """What git holds under results/ is what reports read and wrote: no run's checkpoints (model
  weights), lock or tokenizer (.gitignore keeps them out), and no absolute path of the machine
  that trained it."""
  try:
    listed = subprocess.run(["git", "ls-files", "-z", "results"], cwd=REPO, check=True,
                            capture_output=True).stdout.decode().split("\0")
  except (OSError, subprocess.CalledProcessError):
    pytest.skip("not a git checkout")
  paths = [pathlib.PurePosixPath(path) for path in listed if path]
  assert len(paths) > 1000  # the committed studies' runs
  assert [str(p) for p in paths
          if {"checkpoints", "tokenizer"} & set(p.parts) or p.name == ".lock"] == []
  machine = re.compile(r"(?<![\w.~])/(?:home|root|tmp|work|Users|mnt|var|private)/")
  assert [str(p) for p in paths
          if machine.search((REPO / p).read_text(errors="replace"))] == []


def test_one_run_directory_gets_its_curves_drawn_into_it(tmp_path, capsys):
  """`python -m actlab.report <run dir>`: the run's train and val loss and gradient norm against
  the step, drawn into `<run>/curves.png` and named on the console; a run with no row yet is one
  line."""
  run = tmp_path / "run"
  _fake_sweep(tmp_path, np.random.default_rng(7), acts=("relu",), manifest=False)
  (tmp_path / _name("relu", 1e-3, 0)).rename(run)
  line = (f"wrote {run / 'curves.png'}: train and val loss and gradient norm to step 100 "
          "(stable)")
  assert report.write_run(run) == line
  (run / "curves.png").unlink()
  assert report.main(["actlab.report", str(run)]) == 0  # the command's: it takes a run directory
  assert capsys.readouterr().out == line + "\n"
  assert (run / "curves.png").read_bytes().startswith(b"\x89PNG")
  (run / "metrics.jsonl").write_text("")
  with pytest.raises(UserError, match=rf"^{re.escape(str(run))} has logged no loss or gradient "
                     r"norm yet \(metrics.jsonl\): nothing to draw$"):
    report.write_run(run)
