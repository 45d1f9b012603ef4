"""A pre-registered question's statistics (report/C.py, report/answer.py,
report/question.py) on small hand-made run directories (no training): the seeds a paired t-test's
power asks for, the difference it detects, the upper bound of a pilot's sd, the exact sign-flip p;
each cell's LR chosen on the pilot (one step past an edge first), n from the pilot's sd; the
verdicts over the fresh seeds (Holm over every contrast, a diverged seed left out, the spiking
seeds' share, the sign-flip test beside the interval, the grammar of a verdict, the seed that
moves it); which cell a run is, and the runs that cannot be read; a question file's mistakes.
The command: tests/test_ask.py."""

import itertools
import json
import math

import numpy as np
import pytest
from scipy import stats

from actlab.report import answer as A
from actlab.report import comparisons as C
from actlab.report import question as Q

RELU, GELU = {"model.activation": "relu"}, {"model.activation": "gelu"}
LRS = [1e-3, 3e-3, 1e-2]


def question(**over) -> Q.Question:
  """ReLU − GELU, each cell's LR chosen from `LRS` on seeds 0–2, changed by `over` (the keys of
  a question file)."""
  return Q.parse({"config": "c.py", "cells": {"relu": RELU, "gelu": GELU},
                  "contrasts": {"d": {"relu": 1, "gelu": -1}},
                  "pilot": {"lrs": LRS, "seeds": [0, 1, 2]}, "fresh": {"first_seed": 100},
                  **over}, "toy")


def write_run(root, fields, lr, seed, val=4.0, test=4.0, grad_rel=2.0):
  """A finished run: its config.json (nested) holds `fields`, the LR and the seed (and XLA's
  deterministic GPU ops, as a question asks by default)."""
  config = {}
  for key, value in {Q.DETERMINISTIC: True, **fields, Q.LR: lr, Q.SEED: seed}.items():
    section, name = key.split(".")
    config.setdefault(section, {})[name] = value
  run = root / ",".join(f"{k}={v}" for k, v in {**fields, "lr": lr, "seed": seed}.items())
  run.mkdir(parents=True)
  (run / "config.json").write_text(json.dumps(config))
  (run / "summary.json").write_text(json.dumps(
      {"final_val_loss": val, "final_test_loss": test, "grad_norm_max_rel": grad_rel}))


def pilot(root, q, val, test=lambda cell, lr, seed: 4.0):
  """Every cell of `q` × its pilot's LRs × seeds, at validation loss val[cell][lr] (+ seed/100);
  the cell -> (LR, seed) -> summary that question.cell_runs reads back."""
  for cell, by_lr in val.items():
    for lr, v in by_lr.items():
      for s in q.pilot_of(cell).seeds:
        write_run(root, q.cells[cell], lr, s, v + s / 100, test(cell, lr, s))
  return runs_of(q, [root])


def runs_of(q, where):
  """cell -> (LR, seed) -> summary of the readable runs under `where` (none unreadable here)."""
  runs, unread = A.cell_runs(q, where)
  assert not unread, unread
  return runs


def stages(q, pilot_runs):
  """Where the question stands with these pilot runs (no fresh runs read)."""
  return A.Stages(q, pilot_runs, A.choices(q, pilot_runs), [])


def answered(q, fresh, n, lr=3e-3):
  """The verdicts over `fresh` runs, every cell at `lr` with n fresh seeds planned."""
  return A.verdicts(A.Stages(q, {}, {c: ("lr", lr) for c in q.cells}, [], planned(q, n), fresh))


# --- Sizing


def test_seeds_needed_matches_the_textbook_paired_t_test():
  """G*Power's paired t-test at α 0.05, power 0.8: n 34 for d = 0.5, 15 for d = 0.8."""
  needed = lambda sd, alpha=0.05: C.seeds_needed(sd, 0.1, alpha, 0.8, 10)
  assert needed(0.2) == 34 and needed(0.125) == 15
  assert needed(0.001) == needed(0.0) == 10  # never fewer than the least
  n, alpha = needed(0.167, alpha=0.05 / 7), 0.05 / 7
  assert n > needed(0.167)  # at α/K, more
  assert C.paired_power(n, 0.167, 0.1, alpha) >= 0.8 > C.paired_power(n - 1, 0.167, 0.1, alpha)


def test_the_difference_n_pairs_detect_is_where_their_power_is_the_stated_one():
  d = C.min_detectable(0.485, 10, 0.05 / 7, 0.8)
  assert C.paired_power(10, 0.485, d, 0.05 / 7) == pytest.approx(0.8, abs=1e-9)
  assert C.seeds_needed(0.485, 1.001 * d, 0.05 / 7, 0.8, 10) == 10
  assert C.seeds_needed(0.485, 0.99 * d, 0.05 / 7, 0.8, 10) > 10
  assert C.paired_power(10, 0.0, 0.1, 0.01) == 1.0 and C.min_detectable(0.0, 10, 0.01, 0.8) == 0.0


def test_the_sd_bound_is_the_chi_square_one_and_covers_the_sd_as_often_as_stated():
  """sd · √((n − 1)/χ²₀.₂(n − 1)): 1.5576 × the sd for 5 values; over many pilots of 5 normal
  values the bound is at least the true sd in about 80% of them, the sd itself in under half."""
  assert C.sd_upper(1.0, 5) == pytest.approx(math.sqrt(4 / stats.chi2.ppf(0.2, 4)), rel=1e-12)
  assert C.sd_upper(0.2, 5, 0.8) == pytest.approx(0.2 * 1.5576, rel=1e-4)
  assert C.sd_upper(1.0, 5, 0.5) < C.sd_upper(1.0, 5, 0.9)
  sds = np.std(np.random.default_rng(0).normal(0, 1, (20000, 5)), axis=1, ddof=1)
  assert np.mean(C.sd_upper(sds, 5) >= 1.0) == pytest.approx(0.8, abs=0.01)
  assert np.mean(sds >= 1.0) < 0.5


def test_the_sign_flip_p_counts_every_pattern_exactly():
  def brute(d):
    signs = np.array(list(itertools.product((1, -1), repeat=len(d))))
    return np.mean(np.abs(signs @ d) >= abs(d.sum()) - 1e-9 * np.abs(d).sum())
  rng = np.random.default_rng(3)
  for n in (1, 2, 5, 9, 14):
    d = rng.normal(-0.1, 0.2, n)
    assert C.sign_flip_p(d) == brute(d)
  assert C.sign_flip_p(-np.arange(1.0, 11.0)) == 2 / 1024  # all ten one way
  assert C.sign_flip_p([1.0, 1.0, 1.0, -1.0]) == 10 / 16  # ties: |sum| 2 or 4
  assert C.sign_flip_p([0.3, -0.3]) == 1.0
  # 40 values of one size, 25 positive: |sum| ≥ 10 where at most 15 or at least 25 are positive.
  assert C.sign_flip_p(np.r_[np.ones(25), -np.ones(15)]) == pytest.approx(
      2 * stats.binom.cdf(15, 40, 0.5), rel=1e-12)
  with pytest.raises(ValueError, match="1 to 44 finite values, got 45"):
    C.sign_flip_p(np.ones(45))
  for n in (1, 2, 5, 9, 14):  # Hoeffding's bound holds it from above
    d = rng.normal(-0.1, 0.2, n)
    assert C.sign_flip_p(d) <= C.sign_flip_bound(d) <= 1.0


# --- The pilot


def test_each_cells_lr_is_chosen_on_validation_and_the_sd_taken_on_test(tmp_path):
  """ReLU's validation loss is lowest at 1e-3, GELU's at 3e-3; on the test windows the other LR
  would win, which must not matter."""
  q = question(rule={"sd_confidence": None})
  test = {"relu": [4.0, 4.2, 3.9], "gelu": [4.1, 4.0, 4.3]}
  best = {"relu": 1e-3, "gelu": 3e-3}
  runs = pilot(tmp_path, q, {"relu": {1e-3: 3.0, 3e-3: 3.5, 1e-2: 3.6},
                             "gelu": {1e-3: 3.5, 3e-3: 3.0, 1e-2: 3.6}},
               lambda cell, lr, s: test[cell][s] if lr == best[cell] else 1.0)
  assert stages(q, runs).lrs == best and stages(q, runs).again_at_edge == []
  s = A.size(q, runs, best)["contrasts"]["d"]
  sd = np.std(np.subtract(test["relu"], test["gelu"]), ddof=1)
  assert s["sd"] == s["bound"] == pytest.approx(sd, rel=1e-12)
  assert s["n"] == s["needed"] == C.seeds_needed(sd, 0.1, 0.05, 0.8, 10)


def test_an_incomplete_pilot_is_refused_not_read(tmp_path):
  q = question()
  runs = pilot(tmp_path, q, {"relu": {1e-3: 3.0, 3e-3: 3.1}, "gelu": dict.fromkeys(LRS, 3.0)})
  s = stages(q, runs)
  assert s.lrs is None and s.waiting("missing") == {"relu": [(0.01, 0), (0.01, 1), (0.01, 2)]}


def test_a_cell_best_at_an_edge_runs_the_step_past_it_then_chooses_among_all(tmp_path):
  q = question(pilot={"lrs": LRS, "seeds": [0, 1, 2], "edge": {1e-3: 3e-4, 1e-2: 3e-2}})
  val = {"relu": {1e-3: 3.2, 3e-3: 3.0, 1e-2: 3.1}, "gelu": {1e-3: 3.0, 3e-3: 3.1, 1e-2: 3.2}}
  runs = pilot(tmp_path / "pilot", q, val)
  assert stages(q, runs).waiting("edge") == {"gelu": 3e-4}  # ReLU's best is inside the grid
  assert stages(q, runs).lrs is None
  for step_val, lr, again in ((3.05, 1e-3, []), (2.9, 3e-4, ["gelu"])):
    edge = tmp_path / f"edge_{step_val}"
    for s in (0, 1, 2):
      write_run(edge, GELU, 3e-4, s, step_val)
    s = stages(q, runs_of(q, [tmp_path / "pilot", edge]))
    assert s.lrs == {"relu": 3e-3, "gelu": lr} and s.again_at_edge == again


def test_a_cell_takes_the_lr_another_cells_pilot_chose_then_sizes_n_at_it(tmp_path):
  """`by_cell.<cell>.lr_from`: the wide ReLU cell runs no LR grid; it waits for the narrow ReLU
  cell's choice, then trains that LR on the pilot's seeds (`transfer`), whose values size n with
  the others'; its own best LR elsewhere in the grid never enters."""
  wide = {"model.activation": "relu", "model.d_model": 256}
  q = question(cells={"relu": RELU, "gelu": GELU, "relu_wide": wide},
               contrasts={"d": {"relu": 1, "gelu": -1}, "w": {"relu_wide": 1, "relu": -1}},
               by_cell={"relu_wide": {"lr_from": "relu"}})
  val = {"relu": {1e-3: 3.2, 3e-3: 3.0, 1e-2: 3.1}, "gelu": {1e-3: 3.0, 3e-3: 3.1, 1e-2: 3.2}}
  assert stages(q, pilot(tmp_path / "pilot", q, {"relu": {1e-3: 3.2}, "gelu": val["gelu"]})
                ).waiting("waits") == {"relu_wide": "relu"}
  runs = pilot(tmp_path / "pilot", q, {"relu": {3e-3: 3.0, 1e-2: 3.1}})
  s = stages(q, runs_of(q, [tmp_path / "pilot"]))
  assert s.lrs is None and s.waiting("transfer") == {"relu_wide": 3e-3}
  for lr, v in ((1e-2, 2.0), (3e-3, 2.9)):  # a run at another LR is no transfer run
    for seed in (0, 1, 2):
      write_run(tmp_path / "transfer", wide, lr, seed, v, test=3.9 + seed / 10)
  s = stages(q, runs_of(q, [tmp_path / "pilot", tmp_path / "transfer"]))
  assert s.lrs == {"relu": 3e-3, "gelu": 1e-3, "relu_wide": 3e-3}
  sized = A.size(q, s.pilot, s.lrs)["contrasts"]["w"]
  np.testing.assert_allclose(sized["values"], [3.9 - 4.0, 4.0 - 4.0, 4.1 - 4.0], atol=1e-12)
  assert A.dirs(q, tmp_path, "pilot") == [tmp_path / "pilot", tmp_path / "transfer"]


def test_a_diverged_run_rules_its_lr_out(tmp_path):
  q = question()
  runs = pilot(tmp_path, q, {"relu": {1e-3: 3.0, 3e-3: 3.1, 1e-2: 3.2},
                             "gelu": {1e-3: 3.2, 3e-3: 3.1, 1e-2: 3.0}})
  runs["gelu"][1e-2, 2]["final_val_loss"] = float("nan")  # GELU's best mean, but one diverged
  assert stages(q, runs).lrs == {"relu": 1e-3, "gelu": 3e-3}


def page_like():
  """ReLU − GELU (at most 10 seeds) and tanh − GELU, each sized alone from its pilot's sd."""
  return question(cells={"relu": RELU, "gelu": GELU, "tanh": {"model.activation": "tanh"}},
                  contrasts={"relu_gelu": {"weights": {"relu": 1, "gelu": -1}, "cap": 10},
                             "tanh_gelu": {"tanh": 1, "gelu": -1}},
                  pilot={"lr": 3e-3, "seeds": [0, 1]},
                  rule={"sd_confidence": None, "shared": False})


def test_without_an_sd_bound_each_contrast_asks_its_own_n_under_its_own_cap(tmp_path):
  q = page_like()
  loss = {"relu": (3.61, 3.09), "gelu": (3.21, 3.39), "tanh": (3.35, 3.25)}  # sd 0.49 and 0.20
  runs = pilot(tmp_path, q, {cell: {3e-3: 3.0} for cell in loss},
               lambda cell, lr, s: loss[cell][s])
  sizing = A.size(q, runs, dict.fromkeys(q.cells, 3e-3))
  wide, narrow = sizing["contrasts"]["relu_gelu"], sizing["contrasts"]["tanh_gelu"]
  assert wide["sd"] == wide["bound"] == pytest.approx(np.std([0.40, -0.30], ddof=1))
  assert wide["needed"] > 200 and wide["n"] == 10 and wide["power"] < 0.1
  assert wide["detectable"] == C.min_detectable(wide["sd"], 10, 0.025, 0.8) > 0.5
  assert narrow["n"] == narrow["needed"] == C.seeds_needed(narrow["sd"], 0.1, 0.025, 0.8, 10)
  assert narrow["n"] not in (10, wide["needed"])
  assert sizing["cell_n"] == {"relu": 10, "gelu": max(10, narrow["n"]), "tanh": narrow["n"]}


FACTORIAL = {f"{act}_{clip}": {"model.activation": act, "optim.clip_norm": c}
             for act in ("relu", "gelu") for clip, c in (("none", 0.0), ("clip", 1.0))}
D = lambda clip, sign=1: {f"relu_{clip}": sign, f"gelu_{clip}": -sign}  # ReLU − GELU


def factorial(**over):
  """ReLU − GELU unclipped and its change under clipping, every cell on the same seeds."""
  return question(cells=FACTORIAL,
                  contrasts={"unclipped": D("none"),
                             "change": {"weights": {**D("clip"), **D("none", -1)},
                                        "negative": "clipping moves the gap toward ReLU",
                                        "positive": "clipping moves the gap toward GELU"}},
                  pilot={"lr": 3e-3, "seeds": [0, 1, 2, 3, 4]},
                  fresh={"first_seed": 100, "cap": 30}, rule={"min_seeds": 20}, **over)


def test_with_the_80_percent_bound_every_cell_runs_the_most_any_contrast_asks(tmp_path):
  """Unclipped, ReLU − GELU varies (it asks more than the cap, 30); its change under clipping
  hardly does (it asks the least, 20): both run 30."""
  q = factorial()
  loss = {"relu_none": [4.0, 4.1, 3.9, 4.0, 4.2], "gelu_none": [4.2, 4.1, 4.3, 4.6, 4.2],
          "relu_clip": [3.95, 4.05, 3.85, 3.95, 4.15], "gelu_clip": [4.16, 4.04, 4.27, 4.55, 4.14]}
  runs = pilot(tmp_path, q, {cell: {3e-3: 3.0} for cell in loss},
               lambda cell, lr, s: loss[cell][s])
  lrs = dict.fromkeys(q.cells, 3e-3)
  sizing = A.size(q, runs, lrs)
  unclipped = np.subtract(loss["relu_none"], loss["gelu_none"])
  change = np.subtract(loss["relu_clip"], loss["gelu_clip"]) - unclipped
  for name, values in (("unclipped", unclipped), ("change", change)):
    s = sizing["contrasts"][name]
    assert s["values"] == pytest.approx(values, abs=1e-12)
    assert s["bound"] == pytest.approx(np.std(values, ddof=1) * 1.5576, rel=1e-4)
    assert s["needed"] == C.seeds_needed(s["bound"], 0.1, 0.025, 0.8, 20)
    assert s["n"] == 30 and s["power"] == C.paired_power(30, s["bound"], 0.1, 0.025)
  assert sizing["contrasts"]["change"]["needed"] == 20
  assert sizing["needed"] == sizing["contrasts"]["unclipped"]["needed"] > 30
  assert sizing["cell_n"] == dict.fromkeys(q.cells, 30)
  runs["gelu_clip"][3e-3, 4]["final_test_loss"] = None  # a pilot run without a test loss
  with pytest.raises(Q.QuestionError, match=r"without a finite outcome.*\('gelu_clip', 4\)"):
    A.size(q, runs, lrs)


# --- The verdicts


def planned(q, n):
  """A sizing that plans n fresh seeds for every contrast and cell."""
  return {"contrasts": {c.name: {"n": n} for c in q.contrasts}, "cell_n": dict.fromkeys(q.cells, n)}


def test_a_contrast_without_results_counts_as_p_1_in_holm(tmp_path):
  q = page_like()
  relu, gelu = [3.9, 3.7, 3.8, 3.6], [4.0, 4.1, 3.7, 3.9]
  for seed, r, g in zip(range(100, 104), relu, gelu):
    write_run(tmp_path, RELU, 3e-3, seed, test=r)
    write_run(tmp_path, GELU, 3e-3, seed, test=g)
  v = answered(q, runs_of(q, [tmp_path]), 4)
  d, r = C.paired_difference(relu, gelu, 0.1), v["relu_gelu"]
  assert v["tanh_gelu"] is None and r["seeds"] == [100, 101, 102, 103]
  assert r["paired"].mean == pytest.approx(d.mean, rel=1e-12)
  assert r["p_holm"] == pytest.approx(min(1.0, 2 * d.p), rel=1e-9)  # Holm over K = 2
  assert r["p_sign_holm"] == pytest.approx(min(1.0, 2 * C.sign_flip_p(np.subtract(relu, gelu))))
  assert r["margins"][0.1]["p_equiv_holm"] == pytest.approx(min(1.0, 2 * d.p_equiv), rel=1e-9)
  half = stats.t.ppf(1 - 0.05 / 4, 3) * d.sd / 2  # the interval at α/K, closed form
  assert r["interval"] == pytest.approx((d.mean - half, d.mean + half), rel=1e-9)


def test_a_contrast_short_of_its_planned_seeds_counts_as_p_1_in_holm(tmp_path):
  """tanh − GELU has 2 of its 4 planned seeds, with a p far below ReLU − GELU's: while it is
  short, ReLU − GELU's Holm p is as if tanh − GELU's were 1; once in, it counts."""
  q = page_like()
  relu, gelu, tanh = [3.9, 3.7, 3.8, 3.6], [4.0, 4.1, 3.7, 3.9], [5.0, 5.01, 4.99, 5.02]
  for seed, r, g, h in zip(range(100, 104), relu, gelu, tanh):
    write_run(tmp_path, RELU, 3e-3, seed, test=r)
    write_run(tmp_path, GELU, 3e-3, seed, test=g)
    if seed < 102:
      write_run(tmp_path, {"model.activation": "tanh"}, 3e-3, seed, test=h)
  d = C.paired_difference(relu, gelu, 0.1)
  v = answered(q, runs_of(q, [tmp_path]), 4)
  assert len(v["tanh_gelu"]["seeds"]) == 2
  assert v["relu_gelu"]["p_holm"] == pytest.approx(min(1.0, 2 * d.p), rel=1e-9)
  for seed in (102, 103):
    write_run(tmp_path, {"model.activation": "tanh"}, 3e-3, seed, test=tanh[seed - 100])
  v = answered(q, runs_of(q, [tmp_path]), 4)
  assert v["relu_gelu"]["p_holm"] == pytest.approx(d.p, rel=1e-9)  # second in Holm's order


def test_verdicts_leave_a_diverged_seed_out_and_say_what_the_spiking_seeds_carry(tmp_path):
  """Unclipped, ReLU − GELU is −0.3 where GELU spikes (seeds 100–104) and −0.02 elsewhere;
  clipped, −0.02 on every seed. Seed 120 diverged in one cell; 121 is past n."""
  q, rng = factorial(margins=[0.1, 0.05]), np.random.default_rng(5)
  for seed in range(100, 122):
    base, spikes, noise = 4.0 + 0.1 * rng.standard_normal(), seed < 105, rng.normal(0, 5e-3, 3)
    loss = {"relu_none": base, "gelu_none": base + (0.3 if spikes else 0.02) + noise[0],
            "relu_clip": base - 0.05 + noise[1], "gelu_clip": base - 0.03 + noise[2]}
    for cell, x in loss.items():
      write_run(tmp_path, FACTORIAL[cell], 3e-3, seed, test=None if (seed, cell) == (
          120, "gelu_none") else x, grad_rel=40.0 if spikes and cell == "gelu_none" else 2.0)
  v = answered(q, runs_of(q, [tmp_path]), 21)
  unclipped, change = v["unclipped"], v["change"]
  assert unclipped["seeds"] == list(range(100, 120)) and unclipped["left_out"] == [120]
  assert unclipped["p_sign"] == 2 / 2 ** 20  # every seed negative
  verdict = unclipped["margins"][0.1]["verdict"]
  assert (verdict.kind, verdict.side) == (C.UNSIZED, -1)
  assert verdict.words("ReLU lower", "GELU lower") == (
      "ReLU lower; its size not resolved against 0.1")
  assert unclipped["margins"][0.05]["p_equiv_holm"] > unclipped["margins"][0.1]["p_equiv_holm"]
  spikes = unclipped["spikes"]
  assert spikes["spiking_seeds"] == change["spikes"]["spiking_seeds"] == list(range(100, 105))
  assert spikes["without_spikes"] == pytest.approx(-0.02, abs=0.01)
  assert spikes["carried"] == pytest.approx(0.25 * (-0.3 + 0.02), abs=0.01)
  assert change["paired"].mean == pytest.approx(0.25 * 0.28, abs=0.01)


def test_a_side_needs_the_interval_and_the_sign_flip_test_alike():
  judge = lambda interval, p_sign, p_equiv=0.5: C.judge(interval, 0.1, p_equiv, p_sign)
  assert judge((-0.3, -0.12), 0.001) == C.Verdict(C.BEYOND, -1, 0.1)
  withheld = judge((-0.3, -0.12), 0.2)
  assert (withheld.kind, withheld.side) == (C.NOT_RESOLVED, 0)
  assert withheld.words("A lower", "B lower") == (
      "not resolved (the t interval excludes 0, the sign-flip test does not reject it)")
  assert judge((-0.05, -0.01), 0.2, p_equiv=0.001).words("A lower", "B lower").startswith(
      "equivalent within ±0.1 (the t interval excludes 0")
  assert judge((-0.3, 0.02), 0.002).words("A lower", "B lower") == (
      "not resolved (the sign-flip test rejects 0, the t interval does not exclude it)")
  assert judge((-0.3, 0.02), 0.2) == C.Verdict(C.NOT_RESOLVED, 0, 0.1)
  assert C.judge((-0.3, -0.12), 0.1, 0.5) == C.Verdict(C.BEYOND, -1, 0.1)  # no sign-flip test


WORDS = ("ReLU² lower", "SwiGLU lower")
GRAMMAR = [  # (simultaneous interval, Holm TOST p) at δ = 0.1 -> the verdict's sentence
    ((-0.30, -0.12), 0.5, "ReLU² lower by at least 0.1"),
    ((-0.08, -0.01), 0.01, "ReLU² lower by less than 0.1"),
    ((-0.206, -0.081), 0.5, "ReLU² lower; its size not resolved against 0.1"),
    ((0.12, 0.30), 0.5, "SwiGLU lower by at least 0.1"),
    ((0.01, 0.08), 0.01, "SwiGLU lower by less than 0.1"),
    ((0.05, 0.20), 0.5, "SwiGLU lower; its size not resolved against 0.1"),
    ((-0.04, 0.05), 0.01, "equivalent within ±0.1"),
    ((-0.04, 0.05), 0.2, "not resolved"),
    ((-0.30, 0.25), 0.9, "not resolved"),
]


@pytest.mark.parametrize("interval, p_equiv, said", GRAMMAR)
def test_each_verdict_reads_its_interval(interval, p_equiv, said):
  """A branch each, both sides: the ReLU² − SwiGLU question's interval, [−0.206, −0.081], once
  read "ReLU² lower, by less than 0.1 or by an amount not resolved"; its mean is past 0.1 and
  "less than 0.1" is not shown: it reads as what it shows."""
  assert C.judge(interval, 0.1, p_equiv).words(*WORDS) == said


def reads_its_interval(v: C.Verdict, interval) -> bool:
  """Whether a verdict claims only what its interval (or its TOST) shows: a side where the
  interval excludes 0, on that side; "at least δ" where it lies beyond ∓δ; "less than δ" where
  it lies within (−δ, δ); a size unresolved where it spans ∓δ."""
  low, high = interval
  side = -1 if high < 0 else 1 if low > 0 else 0
  near, far = sorted((abs(low), abs(high)))
  return {C.BEYOND: v.side == side != 0 and near > v.margin,
          C.WITHIN: v.side == side != 0 and far < v.margin,
          C.UNSIZED: v.side == side != 0 and near <= v.margin <= far,
          C.EQUIVALENT: v.side == 0, C.NOT_RESOLVED: v.side == 0}[v.kind]


def test_no_verdict_claims_more_than_its_interval_or_joins_two_with_or():
  rng = np.random.default_rng(0)
  for low, width, p_equiv, p_sign in zip(rng.uniform(-0.5, 0.4, 2000), rng.uniform(0, 0.4, 2000),
                                         rng.uniform(0, 0.1, 2000), rng.uniform(0, 0.1, 2000)):
    interval = (low, low + width)
    v = C.judge(interval, 0.1, p_equiv, p_sign)
    assert reads_its_interval(v, interval), (interval, v)
    assert " or " not in v.words(*WORDS)


# --- Runs and the question file


def test_a_run_is_the_most_specific_cell_it_matches_and_a_tie_is_refused(tmp_path):
  clipped = {**RELU, "optim.clip_norm": 1.0}
  q = question(fixed={"model.d_model": 128}, cells={"relu": RELU, "relu_clip": clipped,
                                                    "spike": {"optim.spike_clip": 0.0}},
               contrasts={"clip": {"relu_clip": 1, "relu": -1}})
  write_run(tmp_path / "a", {**clipped, "model.d_model": 128}, 3e-3, 0, test=1.0)
  write_run(tmp_path / "a", {**RELU, "optim.clip_norm": 0.0, "model.d_model": 128,
                             "optim.spike_clip": 1.0}, 3e-3, 1)
  write_run(tmp_path / "a", {**RELU, "model.d_model": 64, "optim.spike_clip": 1.0}, 3e-3, 2)
  write_run(tmp_path / "b", {**clipped, "model.d_model": 128}, 3e-3, 0, test=2.0)
  runs = runs_of(q, [tmp_path / "a", tmp_path / "b"])
  assert {c: sorted(r) for c, r in runs.items()} == {"relu_clip": [(3e-3, 0)],
                                                     "relu": [(3e-3, 1)]}
  assert runs["relu_clip"][3e-3, 0]["final_test_loss"] == 1.0  # the first directory wins
  # A run from before optim.spike_clip existed: at its value of then, 0.
  write_run(tmp_path / "c", {**GELU, "model.d_model": 128}, 3e-3, 0)
  assert list(runs_of(q, [tmp_path / "c"])) == ["spike"]
  # (A config.json holds every field of its day: here each the test needs, clip_norm with them.)
  write_run(tmp_path / "d", {**RELU, "model.d_model": 128, "optim.clip_norm": 0.0}, 3e-3, 0)
  with pytest.raises(Q.QuestionError, match="is a run of cells spike and relu alike"):
    runs_of(q, [tmp_path / "d"])


GOOD = {"config": "c.py", "cells": {"relu": RELU, "gelu": GELU},
        "contrasts": {"d": {"relu": 1, "gelu": -1}}, "pilot": {"lrs": LRS, "seeds": [0, 1]},
        "fresh": {"first_seed": 100}}


@pytest.mark.parametrize("change, field", [
    ({"margin": [0.1]}, r"\['margin'\]: unknown key"),
    ({"cells": {"relu": {**RELU, "optim.lr": 1e-3}, "gelu": GELU}}, "cells.relu: "),
    ({"cells": {"relu": RELU, "gelu": RELU}}, r"cells \[\('relu', 'gelu'\)\]: two cells with"),
    ({"contrasts": {"d": {"relu": 1, "tanh": -1}}}, "contrasts.d.weights: weights over the cells"),
    ({"contrasts": {"d": {"weights": {"relu": 1, "gelu": -1}, "cap": 1}}}, "contrasts.d.cap: "),
    ({"margins": [0.1, -0.05]}, "margins: "),
    ({"fresh": {"cap": 40}}, "fresh: "),
    ({"pilot": {"lrs": LRS, "seeds": [0, 1], "edge": {3e-3: 1e-3}}}, "pilot.edge: "),
    ({"by_cell": {"tanh": {"pilot": {"lr": 1e-3, "seeds": [0, 1]}}}}, "by_cell.tanh: "),
    ({"spike": 1}, "spike: "),
    ({"by_cell": {"relu": {"lr_from": "tanh"}}}, "by_cell.relu.lr_from: another cell"),
    ({"by_cell": {"relu": {"lr_from": "relu"}}}, "by_cell.relu.lr_from: another cell"),
    ({"by_cell": {"relu": {"lr_from": "gelu"}, "gelu": {"lr_from": "relu"}}},
     "by_cell.relu.lr_from: another cell"),
    ({"contrasts": {"x": {"relu": 1, "gelu": -1, "tanh": 1}}, "cells": {**GOOD["cells"], "tanh": {
        "model.activation": "tanh"}}}, "contrasts.x: a contrast of more than two cells says "),
])
def test_a_mistake_in_a_question_is_one_line_naming_the_field(change, field):
  with pytest.raises(Q.QuestionError, match=f"^question toy: {field}") as e:
    Q.parse({**GOOD, **change}, "toy")
  assert "\n" not in str(e.value)
  Q.parse(GOOD, "toy")


def test_while_other_cells_train_a_contrast_whose_cells_are_done_is_answered(tmp_path):
  """Every cell on the same seeds (`shared`): the unclipped cells done and the clipped ones not
  begun answer the unclipped contrast on its 20 seeds; once a clipped run diverges at seed 105,
  that seed leaves every contrast, as it does when all cells are in."""
  q = factorial()
  gap = [-0.3 + 0.01 * i for i in range(20)]
  for i, seed in enumerate(range(100, 120)):
    write_run(tmp_path, FACTORIAL["relu_none"], 3e-3, seed, test=4.0 + gap[i])
    write_run(tmp_path, FACTORIAL["gelu_none"], 3e-3, seed, test=4.0)
  v = answered(q, runs_of(q, [tmp_path]), 20)
  assert v["change"] is None and v["unclipped"]["seeds"] == list(range(100, 120))
  assert v["unclipped"]["paired"].mean == pytest.approx(np.mean(gap), rel=1e-12)
  assert v["unclipped"]["p_holm"] == pytest.approx(min(1.0, 2 * v["unclipped"]["paired"].p))
  for seed in range(100, 120):
    for cell in ("relu_clip", "gelu_clip"):
      write_run(tmp_path, FACTORIAL[cell], 3e-3, seed,
                test=None if (seed, cell) == (105, "gelu_clip") else 4.0)
  v = answered(q, runs_of(q, [tmp_path]), 20)
  assert v["unclipped"]["seeds"] == v["change"]["seeds"] == [s for s in range(100, 120)
                                                              if s != 105]
  assert v["unclipped"]["left_out"] == [105]


def test_a_change_contrast_says_what_each_side_means_and_names_no_arm_as_lower():
  q = factorial()
  change = {c.name: c for c in q.contrasts}["change"]
  assert C.judge((0.03, 0.15), 0.1, 0.5).words(change.negative, change.positive) == (
      "clipping moves the gap toward GELU; its size not resolved against 0.1")
  two = {c.name: c for c in q.contrasts}["unclipped"]
  assert (two.negative, two.positive) == ("relu_none lower", "gelu_none lower")


def test_the_seed_that_alone_moves_a_verdict_is_named(tmp_path):
  """ReLU − GELU is −0.05 ± 0.005 on nine seeds and −0.25 on seed 104: with it the interval
  spans −0.1 (a size not resolved), without it ReLU is lower by less than 0.1."""
  q = question(pilot={"lr": 3e-3, "seeds": [0, 1]})
  gaps = [-0.05 + 0.005 * np.sin(i) for i in range(10)]
  gaps[4] = -0.25
  for i, gap in enumerate(gaps):
    write_run(tmp_path, RELU, 3e-3, 100 + i, test=4.0 + gap)
    write_run(tmp_path, GELU, 3e-3, 100 + i, test=4.0)
  r = answered(q, runs_of(q, [tmp_path]), 10)["d"]
  at = r["margins"][0.1]
  assert (at["verdict"].kind, at["verdict"].side) == (C.UNSIZED, -1)
  assert list(at["moved_by"]) == [104]
  assert (at["moved_by"][104].kind, at["moved_by"][104].side) == (C.WITHIN, -1)


def test_runs_that_cannot_be_read_are_named_and_never_read_as_results(tmp_path):
  q = question(pilot={"lr": 3e-3, "seeds": [0, 1]})
  for seed in (100, 101, 102):
    for fields in (RELU, GELU):
      write_run(tmp_path / "fresh", fields, 3e-3, seed)
  torn = sorted((tmp_path / "fresh").glob("model.activation=gelu,*seed=101"))[0]
  (torn / "summary.json").write_text('{"broken')
  bad = sorted((tmp_path / "fresh").glob("model.activation=relu,*seed=102"))[0]
  (bad / "config.json").write_text("")
  runs, unread = A.cell_runs(q, [tmp_path / "fresh"])
  assert sorted(runs["relu"]) == [(3e-3, 100), (3e-3, 101)]
  assert sorted(runs["gelu"]) == [(3e-3, 100), (3e-3, 102)]
  assert unread == [f"fresh/{torn.name}: its summary.json is unreadable, never read as a result "
                    "(rerun `run` to train it again)",
                    f"fresh/{bad.name}: its config.json is unreadable, never read as a result "
                    "(rerun `run` to train it again)"]
  s = A.Stages(q, {}, {c: ("lr", 3e-3) for c in q.cells}, unread, planned(q, 4), runs)
  assert A.not_in(s) == [
      "relu at LR 0.003: 2 of 4 fresh runs not in (seeds 102–103): `run` trains them",
      "gelu at LR 0.003: 2 of 4 fresh runs not in (seeds 101, 103): `run` trains them",
      *unread]


def test_judging_with_the_sign_flip_bound_first_reads_as_judging_exactly():
  """`judged_without` (Hoeffding's bound on each sign-flip p, exact p only where a side would go
  unclaimed) gives the verdicts `judged` gives, over effects from none to clear."""
  q, rng = factorial(margins=[0.1, 0.05]), np.random.default_rng(7)
  read = lambda out: {name: r and [(at["verdict"].kind, at["verdict"].side)
                                   for at in r["margins"].values()] for name, r in out.items()}
  for mean in np.linspace(-0.15, 0.15, 40):
    n = int(rng.integers(3, 16))
    tested = {name: (list(range(n)), list(rng.normal(mean * (i + 1) / 2, 0.08, n)))
              for i, name in enumerate(("unclipped", "change"))}
    assert read(A.judged_without(q, tested)) == read(A.judged(q, tested)), (mean, n)
