"""actlab/report/preregistered.py and curves.py: the seeds a power calculation asks for, the
claim rule's simultaneous intervals and verdicts judged over a family, the rule it replaced, and
what the curves say (the loss excess, the exit below a bar, the late descent, the seed
correlation). The project's own tests' pilots and results: tests/test_primary_tests.py."""

import itertools
import json
import math
import types

import numpy as np
import pytest
from scipy import stats

from actlab.report import comparisons, curves, factorial, preregistered

RULE = preregistered.Rule()
ALPHA_K = RULE.alpha / 7  # a family of seven


def needed(sd, delta=RULE.delta, alpha=ALPHA_K, power=RULE.power):
  return preregistered.seeds_needed(sd, delta, alpha, power, RULE.min_seeds)


def test_seeds_needed_matches_the_textbook_paired_t_test():
  """G*Power's paired t-test at α 0.05, power 0.8: n 34 for d = 0.5, 15 for d = 0.8."""
  assert needed(0.2, alpha=0.05) == 34
  assert needed(0.125, alpha=0.05) == 15
  assert needed(0.001) == RULE.min_seeds  # never fewer
  assert needed(0.0) == RULE.min_seeds
  # At α/K a larger n: its power reaches 0.8, one seed fewer does not.
  n = needed(0.167)
  assert n > needed(0.167, alpha=0.05)
  assert needed(0.167, power=0.79) <= n


def test_a_capped_test_states_its_power_and_the_difference_it_detects():
  d = preregistered.detectable(10, 0.485, ALPHA_K, RULE.power)
  assert preregistered.paired_power(10, 0.485, d, ALPHA_K) == pytest.approx(RULE.power, abs=1e-9)
  assert needed(0.485, delta=1.001 * d) == 10
  assert needed(0.485, delta=0.99 * d) > 10
  assert preregistered.paired_power(10, 0.0, RULE.delta, ALPHA_K) == 1.0


def write_run(root, act, lr, seed, val, test, outcome="loss", curve=None):
  """A finished, stable run's config and summary; with `curve` (metric -> {step: value}), its
  metrics.jsonl too."""
  run = root / f"activation={act},lr={lr},seed={seed}"
  run.mkdir(parents=True)
  config = {"model": {"activation": act}, "optim": {"lr": lr}, "train": {"seed": seed}}
  (run / "config.json").write_text(json.dumps(config))
  (run / "summary.json").write_text(json.dumps({"status": "stable", f"final_val_{outcome}": val,
                                                f"final_test_{outcome}": test}))
  if curve:
    (key, values), = curve.items()
    (run / "metrics.jsonl").write_text("\n".join(
        json.dumps({"step": s, key: v}) for s, v in values.items()))


def test_the_superseded_rule_claimed_a_difference_only_above_the_seed_and_platform_sd():
  d = lambda mean, sd: types.SimpleNamespace(mean=mean, sd=sd)
  claim = preregistered.superseded_claim
  assert claim(d(-0.15, 0.10), 0.01, 1.0, 0.02) == comparisons.A_BETTER
  assert claim(d(0.15, 0.10), 0.01, 1.0, 0.02) == comparisons.B_BETTER
  for mean, sd, platform in ((-0.15, 0.20, 0.02), (-0.15, 0.10, 0.30)):
    assert claim(d(mean, sd), 0.01, 1.0, platform).endswith("is not above the noise)")
  assert claim(d(-0.15, 0.10), 0.01, 1.0, None) == (
      f"{comparisons.NOT_RESOLVED} (p says {comparisons.A_BETTER}; the platform sd is not "
      "measured yet)")
  assert claim(d(-0.15, 0.10), 0.2, 1.0, 0.02) == comparisons.NOT_RESOLVED  # p decides first
  assert claim(d(0.01, 0.05), 1.0, 0.01, None) == comparisons.EQUIVALENT


def test_the_plateau_exit_is_the_first_crossing_interpolated_between_evaluations():
  exit_ = lambda loss: curves.first_below(loss, 4.0)
  assert exit_({0: 6.0, 250: 5.8, 500: 4.5, 750: 3.5, 1000: 4.2, 1250: 3.0}) == 625
  assert exit_({0: 6.0, 250: 4.0, 500: 3.0}) == 250  # at the bar is not below
  assert exit_({0: 6.0, 250: 4.5}) is None


def test_the_late_descent_is_the_fall_over_the_last_steps():
  descent = lambda loss: curves.late_descent(loss, 500)
  assert descent({0: 6.0, 2500: 3.2, 2750: 3.1, 3000: 3.05}) == pytest.approx(0.15)
  assert descent({0: 6.0, 2500: 3.0, 3000: 3.1}) == pytest.approx(-0.1)  # rising
  assert descent({0: 6.0, 2600: 3.2, 3000: 3.0}) is None


def test_the_loss_excess_integrates_each_lrs_curve_above_the_best_lrs(tmp_path):
  """1e-3 is the best LR (lower final loss); 3e-3 is 1 nat above it at steps 0 and 100, 0 at 200:
  the trapezoid gives (1 + 0.5) * 100 / 200 = 0.75 nats."""
  for lr, losses in ((1e-3, (5.0, 3.0, 2.0)), (3e-3, (6.0, 4.0, 2.0 + 1e-6))):
    write_run(tmp_path / "study", "gelu", lr, 0, losses[-1], losses[-1],
              curve={"val_loss": dict(zip((0, 100, 200), losses))})
  excess = curves.loss_excess(preregistered.Results(tmp_path), "study")
  assert excess[("gelu", 1e-3)] == [0.0]
  assert excess[("gelu", 3e-3)] == [pytest.approx(0.75, abs=1e-6)]


def test_the_seed_correlation_removes_the_activations_means():
  """Within each activation a later exit ends higher; between them the opposite."""
  exits = {("relu", 0): (2000, 2.0, 0.1), ("relu", 1): (2200, 2.2, 0.1),
           ("relu", 2): (2100, 2.1, 0.1), ("gelu", 0): (1000, 3.0, 0.1),
           ("gelu", 1): (1200, 3.2, None), ("tanh", 0): (None, 9.0, 0.1),
           ("swiglu", 0): (500, 9.0, 0.1)}
  r, n = curves.seed_correlation(exits)
  assert r == pytest.approx(1.0) and n == 5
  pooled = [v[:2] for v in exits.values() if v[0] is not None]
  assert np.corrcoef(np.array(pooled).T)[0, 1] < 0


def test_the_simultaneous_interval_is_the_paired_t_interval_at_alpha_over_k():
  d = comparisons.paired_difference([1.0, 1.3, 0.8, 1.1, 0.9], [1.0] * 5)
  assert comparisons.simultaneous_interval(d, 1) == pytest.approx((d.ci_low, d.ci_high))
  low, high = comparisons.simultaneous_interval(d, 7)
  half = stats.t.ppf(1 - 0.05 / 14, 4) * d.sd / np.sqrt(5)  # closed form
  assert (low, high) == pytest.approx((d.mean - half, d.mean + half), rel=1e-12)
  assert low < d.ci_low and high > d.ci_high
  # Seven such intervals cover their true differences together in about 95% of families
  # ((1 - 0.05/7)^7 = 0.951), unadjusted 95% intervals in about 70% (0.95^7).
  families = [[comparisons.paired_difference(x, np.zeros(10)) for x in fam]
              for fam in np.random.default_rng(0).normal(0.3, 0.2, (400, 7, 10))]
  cover = lambda k: np.mean([all(lo <= 0.3 <= hi for lo, hi in (
      comparisons.simultaneous_interval(d, k) for d in fam)) for fam in families])
  assert cover(7) > 0.93 and cover(1) < 0.8


def test_the_claim_holds_the_interval_against_the_margin():
  claim = lambda low, high, p_equiv=1.0: comparisons.claim((low, high), 0.1, p_equiv, "relu",
                                                            "gelu")
  assert claim(-0.28, -0.12) == "relu lower by at least 0.1"
  assert claim(0.12, 0.3) == "gelu lower by at least 0.1"
  assert claim(0.019, 0.185) == "gelu lower, by less than 0.1 or by an amount not resolved"
  assert claim(-0.2, -0.01) == "relu lower, by less than 0.1 or by an amount not resolved"
  assert claim(-0.007, 0.035, p_equiv=6e-7) == "equivalent within ±0.1"
  assert claim(0.001, 0.03, p_equiv=1e-4) == "equivalent within ±0.1 (gelu lower by less than 0.1)"
  assert claim(-0.4, 0.6) == claim(-0.007, 0.035, p_equiv=0.2) == comparisons.NOT_RESOLVED


def test_the_claim_rule_resolves_a_small_standardised_effect_with_enough_seeds():
  """The rule it replaced asked |A − B| > the sd of the differences, so a real difference of
  half an sd was never claimed, at any n; held against an interval it is, once n is large."""
  rng = np.random.default_rng(1)
  diffs = 0.15 + 0.3 * rng.standard_normal(200)  # d_z = 0.5
  d = comparisons.paired_difference(diffs, np.zeros(200), RULE.delta)
  assert abs(d.mean) < d.sd and preregistered.superseded_claim(d, 1e-6, 1.0, 0.0).startswith(
      comparisons.NOT_RESOLVED)
  assert comparisons.claim(comparisons.simultaneous_interval(d, 7), 0.1, 1.0) == (
      "B lower, by less than 0.1 or by an amount not resolved")




def test_a_familys_verdicts_adjust_over_every_test_counting_an_unrun_one_as_p_1(tmp_path):
  fam = [preregistered.Test(name, "?", "relu", "gelu", {}, (), k=2, first_seed=100)
         for name in ("run", "unrun")]
  relu, gelu = [3.9, 3.7, 3.8, 3.6], [4.0, 4.1, 3.7, 3.9]
  for seed, (r, g) in enumerate(zip(relu, gelu), start=100):
    write_run(tmp_path / "primary_run", "relu", 3e-3, seed, 0.0, r)
    write_run(tmp_path / "primary_run", "gelu", 3e-3, seed, 0.0, g)
  judged, unrun = preregistered.verdicts(fam, preregistered.Results(tmp_path))
  d = comparisons.paired_difference(relu, gelu, RULE.delta)
  assert unrun is None and judged["paired"] == d
  assert judged["p_holm"] == pytest.approx(min(1.0, 2 * d.p), rel=1e-12)  # Holm over K = 2
  assert judged["p_equiv_holm"] == pytest.approx(min(1.0, 2 * d.p_equiv), rel=1e-12)
  half = stats.t.ppf(1 - 0.05 / 4, 3) * d.sd / np.sqrt(4)  # the interval at α/K, closed form
  assert judged["interval"] == pytest.approx((d.mean - half, d.mean + half), rel=1e-12)
  assert judged["claim"] == comparisons.claim(judged["interval"], RULE.delta,
                                              judged["p_equiv_holm"], "relu", "gelu")


def test_a_curve_is_read_with_the_logs_reader_and_a_torn_log_is_refused(tmp_path):
  log = tmp_path / "metrics.jsonl"
  log.write_text('{"step": 0, "val_loss": 5.0}\n{"step": 10}\n\n{"step": 20, "val_loss": 4.0}\n')
  assert curves.curve(log, "val_loss") == {0: 5.0, 20: 4.0}
  log.write_text('{"step": 0, "val_loss": 5.0}\n{"step": 20, "val_lo\n')  # cut mid-write
  with pytest.raises(ValueError, match="1 unreadable line"):
    curves.curve(log, "val_loss")


def test_the_sd_bound_is_the_chi_square_one_and_covers_the_sd_as_often_as_stated():
  """sd · √((n − 1)/χ²₀.₂(n − 1)): 1.557 × the sd for 5 values; over many pilots of 5 normal
  values, the bound is at least the true sd in about 80% of them, the point estimate in about
  45%."""
  assert preregistered.sd_upper(1.0, 5) == pytest.approx(math.sqrt(4 / 1.6487766), rel=1e-6)
  assert preregistered.sd_upper(0.2, 5, 0.8) == pytest.approx(0.2 * 1.5576, rel=1e-4)
  assert preregistered.sd_upper(1.0, 5, 0.5) < preregistered.sd_upper(1.0, 5, 0.9)
  sds = np.std(np.random.default_rng(0).normal(0, 1, (20000, 5)), axis=1, ddof=1)
  covered = np.mean([preregistered.sd_upper(sd, 5) >= 1.0 for sd in sds])
  assert covered == pytest.approx(0.8, abs=0.01) and np.mean(sds >= 1.0) < 0.5


def brute_sign_flip(d):
  """Every sign pattern, written out."""
  d = np.asarray(d, np.float64)
  signs = np.array(list(itertools.product((1, -1), repeat=d.size)))
  return np.mean(np.abs(signs @ d) >= abs(d.sum()) - 1e-9 * np.abs(d).sum())


def test_the_sign_flip_p_counts_every_pattern_exactly():
  rng = np.random.default_rng(3)
  for n in (1, 2, 5, 9, 14):
    d = rng.normal(-0.1, 0.2, n)
    assert preregistered.sign_flip_p(d) == brute_sign_flip(d)
  assert preregistered.sign_flip_p(-np.arange(1.0, 11.0)) == 2 / 1024  # all ten one way
  assert preregistered.sign_flip_p([1.0, 1.0, 1.0, -1.0]) == 10 / 16  # ties: |sum| 2 or 4
  assert preregistered.sign_flip_p([0.3, -0.3]) == 1.0
  # 40 values of one size, 25 positive: |sum| ≥ 10 where at most 15 or at least 25 are positive.
  assert preregistered.sign_flip_p(np.r_[np.ones(25), -np.ones(15)]) == pytest.approx(
      2 * stats.binom.cdf(15, 40, 0.5), rel=1e-12)
  # One outlier, not the 39 others, makes |sum|: every pattern is as extreme as the observed one.
  assert preregistered.sign_flip_p(np.r_[np.full(39, -0.01), 5.0]) == 1.0
  with pytest.raises(ValueError, match="1 to 44 finite values"):
    preregistered.sign_flip_p(np.ones(45))


CELLS = {f"{act}/{clip}": {"model.activation": act, "optim.clip_norm": c}
         for act in ("relu", "gelu") for clip, c in (("none", 0.0), ("clip", 1.0))}
D = lambda clip: {f"relu/{clip}": 1.0, f"gelu/{clip}": -1.0}  # ReLU − GELU
CHANGE = factorial.Contrast("change", "?", {**D("clip"), **{k: -v for k, v in D("none").items()}},
                                "clipped", "unclipped")
FAMILY = factorial.Factorial(
    "toy", CELLS, (factorial.Contrast("unclipped", "?", D("none"), "relu", "gelu"), CHANGE),
    pilot_seeds=(0, 1, 2, 3, 4), first_seed=100, cap=30,
    rule=preregistered.Rule(min_seeds=20))


def write_cell(root, cell, seed, test, grad_rel=1.5, replace=False):
  """A finished run of `FAMILY`'s `cell`: its config (nested) and summary."""
  fields = CELLS[cell]
  run = root / f"{cell.replace('/', ',')},seed={seed}"
  run.mkdir(parents=True, exist_ok=replace)
  config = {"model": {"activation": fields["model.activation"]},
            "optim": {"lr": 3e-3, "clip_norm": fields["optim.clip_norm"]}, "train": {"seed": seed}}
  (run / "config.json").write_text(json.dumps(config))
  (run / "summary.json").write_text(json.dumps({"status": "stable", "final_test_loss": test,
                                                "grad_norm_max_rel": grad_rel}))


def test_a_factorials_pilot_sizes_it_by_the_bound_on_each_contrasts_sd(tmp_path):
  """Contrasts per seed: ReLU − GELU unclipped, and its change under clipping (a difference of
  differences); n is the most either asks at its sd's upper bound, at least 20, at most 30."""
  root = tmp_path / "primary_toy_pilot"
  loss = {"relu/none": [4.0, 4.1, 3.9, 4.0, 4.2], "gelu/none": [4.2, 4.1, 4.3, 4.6, 4.2],
          "relu/clip": [3.9, 4.0, 3.9, 4.0, 4.0], "gelu/clip": [3.9, 4.1, 3.9, 4.1, 4.0]}
  for cell, values in loss.items():
    for seed, v in enumerate(values):
      if (cell, seed) != ("gelu/clip", 4):
        write_cell(root, cell, seed, v)
  results = preregistered.Results(tmp_path)
  with pytest.raises(ValueError, match=r"pilot is incomplete.*'gelu/clip': \[4\]"):
    factorial.pilot(FAMILY, results)
  write_cell(root, "gelu/clip", 4, float("nan"))
  with pytest.raises(ValueError, match=r"without a finite final_test_loss.*\('gelu/clip', 4\)"):
    factorial.pilot(FAMILY, results)
  write_cell(root, "gelu/clip", 4, 4.0, replace=True)
  plan = factorial.pilot(FAMILY, results)
  unclipped = np.subtract(loss["relu/none"], loss["gelu/none"])
  change = np.subtract(loss["relu/clip"], loss["gelu/clip"]) - unclipped
  for name, values in (("unclipped", unclipped), ("change", change)):
    c = plan["contrasts"][name]
    assert c["values"] == pytest.approx(values, abs=1e-12)
    assert c["sd_upper"] == pytest.approx(np.std(values, ddof=1) * 1.5576, rel=1e-4)
    assert c["needed"] == preregistered.seeds_needed(c["sd_upper"], 0.1, 0.025, 0.8, 20)
  needs = [c["needed"] for c in plan["contrasts"].values()]
  assert min(needs) > 30 and plan["needed"] == max(needs) and plan["n"] == 30  # capped
  assert plan["contrasts"]["change"]["power"] == pytest.approx(preregistered.paired_power(
      30, plan["contrasts"]["change"]["sd_upper"], 0.1, 0.025))
  assert factorial.pilot(FAMILY, preregistered.Results(tmp_path / "none")) is None


def test_a_direction_needs_the_interval_and_the_sign_flip_test_alike():
  reconciled = lambda claim, interval, p: factorial.reconciled(claim, interval, 0.1, p)
  assert reconciled("relu lower by at least 0.1", (-0.3, -0.12), 0.001) == (
      "relu lower by at least 0.1")
  assert reconciled("relu lower by at least 0.1", (-0.3, -0.12), 0.2) == (
      f"{comparisons.NOT_RESOLVED} (the t interval excludes 0, the sign-flip test does not "
      "reject it)")
  assert reconciled("equivalent within ±0.1 (relu lower by less than 0.1)", (-0.05, -0.01),
                    0.2).startswith("equivalent within ±0.1 (the t interval excludes 0")
  assert reconciled(comparisons.NOT_RESOLVED, (-0.3, 0.02), 0.002) == (
      f"{comparisons.NOT_RESOLVED} (the sign-flip test rejects 0, the t interval does not "
      "exclude it)")
  assert reconciled(comparisons.NOT_RESOLVED, (-0.3, 0.02), 0.2) == comparisons.NOT_RESOLVED


def test_a_factorials_verdicts_hold_each_contrast_at_both_margins_beside_the_sign_flip_test(
    tmp_path):
  """Fresh seeds 100–119 in every cell (seed 120 only in two: not shared, not read). Unclipped,
  ReLU − GELU is −0.3 where GELU spikes (seeds 100–104) and −0.02 elsewhere; clipped, −0.02 on
  every seed, so the change under clipping is +0.28 on the spiking seeds and 0 elsewhere."""
  root = tmp_path / "primary_toy"
  rng = np.random.default_rng(5)
  for seed in range(100, 120):
    base, spikes = 4.0 + 0.1 * rng.standard_normal(), seed < 105
    noise = 0.005 * rng.standard_normal(3)
    write_cell(root, "relu/none", seed, base)
    write_cell(root, "gelu/none", seed, base + (0.3 if spikes else 0.02) + noise[0],
               grad_rel=40.0 if spikes else 2.0)
    write_cell(root, "relu/clip", seed, base - 0.05 + noise[1])
    write_cell(root, "gelu/clip", seed, base - 0.03 + noise[2], grad_rel=30.0 if spikes else 2.0)
  write_cell(root, "relu/none", 120, 9.0)
  write_cell(root, "gelu/none", 120, 1.0)
  for cell in CELLS:  # seed 121 diverged in one cell: no finite test loss, left out
    write_cell(root, cell, 121, None if cell == "gelu/none" else 4.0)
  v = factorial.verdicts(FAMILY, preregistered.Results(tmp_path))
  assert v["seeds"] == list(range(100, 120)) and v["left_out"] == [121]
  unclipped, change = v["contrasts"]["unclipped"], v["contrasts"]["change"]
  d = comparisons.paired_difference(list(unclipped["values"].values()), np.zeros(20), 0.1)
  assert unclipped["paired"] == d
  half = stats.t.ppf(1 - 0.05 / 4, 19) * d.sd / np.sqrt(20)
  assert unclipped["interval"] == pytest.approx((d.mean - half, d.mean + half), rel=1e-12)
  assert unclipped["p_sign"] == 2 / 2 ** 20  # every seed negative
  p_signs = [unclipped["p_sign"], change["p_sign"]]
  assert [unclipped["p_sign_holm"], change["p_sign_holm"]] == pytest.approx(
      list(comparisons.holm(p_signs)))
  assert unclipped["margins"][0.1]["verdict"] == unclipped["margins"][0.1]["claim"] == (
      "relu lower, by less than 0.1 or by an amount not resolved")
  assert unclipped["margins"][0.05]["claim"] == (
      "relu lower, by less than 0.05 or by an amount not resolved")
  assert unclipped["margins"][0.05]["p_equiv_holm"] > unclipped["margins"][0.1]["p_equiv_holm"]
  spikes = unclipped["spikes"]
  assert spikes["spiking_seeds"] == [100, 101, 102, 103, 104]
  assert spikes["without_spikes"] == pytest.approx(-0.02, abs=0.01)
  assert spikes["carried"] == pytest.approx(d.mean - spikes["without_spikes"], rel=1e-12)
  assert spikes["carried"] == pytest.approx(0.25 * (-0.3 + 0.02), abs=0.01)
  assert change["spikes"]["spiking_seeds"] == spikes["spiking_seeds"]
  assert change["paired"].mean == pytest.approx(0.25 * 0.28, abs=0.01)
  assert factorial.verdicts(FAMILY, preregistered.Results(tmp_path / "x")) is None
