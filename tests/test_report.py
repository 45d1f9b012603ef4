"""Report: tables as mean ± sd over seeds, status counts, missing cells, paired comparisons, the
largest stable LR, "not learned", LR sensitivity, the baseline option, plots.

The sweep directories here are written by the test (random curves), so no training is needed;
every expected number is recomputed from what was written.
"""

import json
import re
import subprocess
import sys

import numpy as np
import pytest

from actlab import report, stats
from actlab.errors import UserError
from conftest import REPO

ACTS, LRS, SEEDS = ["relu", "gelu"], [1e-4, 1e-3, 3e-3], [0, 1, 2]


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
def test_table_means_status_counts_and_missing_cells(tmp_path):
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
  for png in ("val_loss_vs_lr", "train_loss", "grad_norm", "act_zero_frac"):
    assert (tmp_path / "plots" / f"{png}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f"(plots/{png}.png)" in text
  assert not (tmp_path / "plots" / "sharpness.png").exists()


@pytest.mark.slow
def test_lr_sensitivity_follows_wortsman_definition(tmp_path):
  rng = np.random.default_rng(1)
  diverged = {_name("gelu", 3e-3, 0)}
  s = _fake_sweep(tmp_path, rng, diverged=diverged, sharpness=True)
  sens = stats.lr_sensitivity(*report.load(tmp_path))
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
  manifest, runs = report.load(tmp_path)
  assert manifest["axes"] == {"model.activation": ["gelu", "relu"], "optim.lr": LRS}
  assert manifest["seeds"] == SEEDS and len(runs) == 18
  out = subprocess.run([sys.executable, "-m", "actlab.report", str(tmp_path), "--baseline=relu"],
                       cwd=REPO, capture_output=True, text=True, timeout=120)
  assert out.returncode == 0, out.stderr
  text = (tmp_path / "report.md").read_text()
  vals = [s[_name("relu", 1e-4, k)]["final_val_loss"] for k in SEEDS]
  assert _fmt(vals) in _row(text, "relu", 1e-4)
  d = [s[_name("gelu", 1e-3, k)]["final_val_loss"] - s[_name("relu", 1e-3, k)]["final_val_loss"]
       for k in SEEDS]  # B = relu by --baseline (else gelu, the first of the sorted axis)
  assert f"| 0.001 | gelu | relu | 3 | {np.mean(d):+.3f} | {np.std(d, ddof=1):.3f} | [" in text
  with pytest.raises(UserError, match="nothing does not exist: not a sweep directory"):
    report.load(tmp_path / "nothing")
  out = subprocess.run([sys.executable, "-m", "actlab.report", str(tmp_path / "plots")],
                       cwd=REPO, capture_output=True, text=True, timeout=120)
  assert out.returncode == 2 and out.stderr == (
      f"error: {tmp_path / 'plots'} has no sweep.json and no */config.json: not a sweep "
      "directory (the --workdir of actlab.sweep)\n")


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


# Designed final val losses: relu = base(LR) + 0.3·seed (seeds differ far more than activations
# do, so only pairing by seed can resolve the differences), the others relu + d(seed).
BASE = {1e-4: 2.3, 1e-3: 2.0, 3e-3: 2.1}
DIFF = {("gelu", 1e-4): [-0.10, -0.12, -0.08], ("gelu", 1e-3): [0.20, 0.25, 0.15],
        ("gelu", 3e-3): [-0.10, -0.12, -0.08]}


def _designed(act, lr, seed):
  relu = 3.05 if (lr, seed) == (3e-3, 2) else BASE[lr] + 0.3 * seed  # 3.05 ≥ unigram: not learned
  d = 0.0 if act == "relu" else DIFF.get((act, lr), [0.3, 0.1, -0.2])[seed]
  out = {"final_val_loss": relu + d, "unigram_loss": 3.0}
  return {**out, "status": "unstable"} if (act, lr, seed) == ("tanh", 3e-3, 1) else out


def _section(text, title):
  return text.split(f"## {title}\n")[1].split("\n## ")[0]


@pytest.mark.slow
def test_paired_comparisons_stability_and_not_learned_end_to_end(tmp_path):
  acts = ["relu", "gelu", "tanh"]
  _fake_sweep(tmp_path, np.random.default_rng(4), acts=acts, missing={_name("relu", 1e-4, 2)},
              summary_for=_designed)
  text = report.write(tmp_path).read_text()
  pairs = _section(text, "Paired comparisons")
  assert "| LR | A | B (baseline) | n | mean A − B | sd | 95% CI | verdict | MDD |" in pairs
  for row in [  # relu seed 2 is missing at 1e-4: two pairs there
      "| 0.0001 | gelu | relu | 2 | -0.110 | 0.014 | [-0.237, +0.017] | not resolved | 0.141 |",
      "| 0.0001 | tanh | relu | 2 | +0.200 | 0.141 | [-1.071, +1.471] | not resolved | 1.408 |",
      "| 0.001 | gelu | relu | 3 | +0.200 | 0.050 | [+0.076, +0.324] | relu better | — |",
      "| 0.001 | tanh | relu | 3 | +0.067 | 0.252 | [-0.558, +0.692] | not resolved | 0.779 |",
      "| 0.003 | gelu | relu | 3 | -0.100 | 0.020 | [-0.150, -0.050] | gelu better | — |",
      "| 0.003 | tanh | relu | 3 | +0.067 | 0.252 | [-0.558, +0.692] | not resolved | 0.779 |"]:
    assert row in pairs.splitlines(), (row, pairs)
  assert len([l for l in pairs.splitlines() if l.startswith("| 0.")]) == 6
  assert "(t₀.₉₇₅,ₙ₋₁ + t₀.₈₀,ₙ₋₁)·sd/√n" in pairs

  stable = _section(text, "Largest stable LR")
  assert "| relu | 0.001 | 0.003: 3 stable; 1 not learned |" in stable   # 1e-4: a seed missing
  assert "| gelu | 0.003 | — (the grid's largest) |" in stable
  assert "| tanh | 0.001 | 0.003: 2 stable, 1 unstable |" in stable
  assert "not checked" not in stable
  assert _row(text, "relu", 3e-3).endswith("| 3 stable; 1 not learned |")
  assert ("| activation=relu,lr=0.003,seed=2 | stable, not learned | 3.050 | not learned: final "
          "val loss ≥ unigram loss 3.000 |") in text

  # The baseline: the manifest's, else the grid's first; --baseline wins; an unknown one is refused.
  manifest = json.loads((tmp_path / "sweep.json").read_text())
  (tmp_path / "sweep.json").write_text(json.dumps({**manifest, "baseline": "gelu"}))
  pairs = _section(report.write(tmp_path).read_text(), "Paired comparisons")
  assert "| 0.003 | relu | gelu | 3 | +0.100 | 0.020 | [+0.050, +0.150] | gelu better | — |" in pairs
  pairs = _section(report.write(tmp_path, "tanh").read_text(), "Paired comparisons")
  assert "| 0.001 | gelu | tanh | 3 | +0.133 | 0.225 | [-0.427, +0.693] | not resolved | 0.698 |" \
      in pairs
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
  assert "| relu | 0.003 | — (the grid's largest) |" in stable
  assert "| gelu | 0.001 | 0.003: 2 stable, 1 diverged |" in stable
  assert "not learned" not in _section(text, "Runs")


def test_a_grid_without_an_lr_axis_compares_activations_only(tmp_path):
  s = _fake_sweep(tmp_path, np.random.default_rng(6), acts=["relu", "gelu", "tanh"],
                  missing={_name("tanh", 1e-3, k) for k in SEEDS})
  manifest = json.loads((tmp_path / "sweep.json").read_text())
  cells = [{"name": c["name"], "overrides": {k: v for k, v in c["overrides"].items()
                                             if k != "optim.lr"}}
           for c in manifest["cells"] if c["overrides"]["optim.lr"] == 1e-3]
  (tmp_path / "sweep.json").write_text(json.dumps(  # like experiments/activation_zoo.py
      {**manifest, "axes": {"model.activation": ["relu", "gelu", "tanh"]}, "cells": cells}))
  text = report.write(tmp_path, "gelu").read_text()
  pairs = _section(text, "Paired comparisons")
  d = [s[_name("relu", 1e-3, k)]["final_val_loss"] - s[_name("gelu", 1e-3, k)]["final_val_loss"]
       for k in SEEDS]
  assert "| A | B (baseline) | n | mean A − B |" in pairs
  assert f"| relu | gelu | 3 | {np.mean(d):+.3f} | {np.std(d, ddof=1):.3f} | [" in pairs
  assert "| tanh | gelu | 0 | — | — | — | not resolved | n < 2 |" in pairs  # not run yet
  assert "## Largest stable LR" not in text and "## LR sensitivity" not in text
