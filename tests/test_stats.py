"""actlab.report.comparisons and stats: Holm's adjustment, the paired comparison, its tests
(paired t, TOST) and verdicts over a family, the simultaneous interval at α/K and the claim it
makes against a margin, the MDD, "not learned", and the rules over a sweep's runs (largest stable
LR, pairing by seed, the best LR chosen on other seeds), against hand-computed numbers and against
scipy where it has the answer."""

import math

import numpy as np
import pytest
from actlab.report import comparisons, stats
from scipy import stats as sps

A = [2.31, 2.52, 2.18, 2.44]  # hand-made final val losses of four seeds; B is A's baseline
B = [2.40, 2.60, 2.21, 2.56]  # d = A − B = [-0.09, -0.08, -0.03, -0.12]


def _holm_sequential(p, alpha):
  """Holm (1979) as a procedure: step through the p-values from the smallest, reject the i-th
  (0-based) while p ≤ α/(K − i), stop at the first that is not."""
  rejected = set()
  for i, j in enumerate(sorted(range(len(p)), key=lambda j: p[j])):
    if p[j] > alpha / (len(p) - i):
      break
    rejected.add(j)
  return rejected


def test_holm_hand_example_and_sequential_procedure():
  # Sorted: 0.005·4 = 0.02, 0.01·3 = 0.03, 0.03·2 = 0.06, 0.04·1 = 0.04 → max so far 0.06.
  np.testing.assert_allclose(comparisons.holm([0.01, 0.04, 0.03, 0.005]), [0.03, 0.06, 0.06, 0.02])
  np.testing.assert_allclose(comparisons.holm([0.5, 0.9]), [1.0, 1.0])      # capped at 1
  np.testing.assert_allclose(comparisons.holm([np.nan, 0.02, 0.5]), [np.nan, 0.04, 0.5])  # K = 2
  assert comparisons.holm([]).size == 0 and comparisons.holm([0.03]).tolist() == [0.03]
  rng = np.random.default_rng(0)
  for k in [1, 2, 3, 5, 12]:
    for _ in range(200):
      p = rng.uniform(0, 0.1, k) ** rng.uniform(0.5, 2)
      adj = comparisons.holm(p)
      assert np.all(adj >= p) and np.all(adj <= 1)
      order = np.argsort(p)
      assert np.all(np.diff(adj[order]) >= 0)                          # monotone in p
      for alpha in [0.01, 0.05, 0.1]:
        assert set(np.flatnonzero(adj <= alpha)) == _holm_sequential(p, alpha)


def test_paired_interval_matches_scipy_and_hand_numbers():
  p = comparisons.paired_difference(A, B)
  d = np.subtract(A, B)
  ci = sps.ttest_rel(A, B).confidence_interval(0.95)
  assert p.n == 4
  assert p.mean == pytest.approx(-0.08, abs=1e-12)
  assert p.sd == pytest.approx(math.sqrt(0.0042 / 3), abs=1e-12)  # Σ(d − d̄)² = 0.0042
  assert (p.ci_low, p.ci_high) == pytest.approx((ci.low, ci.high), abs=1e-6)
  half = sps.t.ppf(0.975, 3) * d.std(ddof=1) / 2
  assert (p.ci_low, p.ci_high) == pytest.approx((-0.08 - half, -0.08 + half), abs=1e-6)
  assert (round(p.ci_low, 4), round(p.ci_high, 4)) == (-0.1395, -0.0205)


def test_p_values_match_scipy_and_tost_is_the_90_percent_interval_inside_the_margin():
  p = comparisons.paired_difference(A, B, margin=0.15)
  assert p.p == pytest.approx(sps.ttest_rel(A, B).pvalue, rel=1e-9)
  d = np.subtract(A, B)
  lower = sps.ttest_1samp(d, -0.15, alternative="greater").pvalue     # H0: mean ≤ −m
  upper = sps.ttest_1samp(d, 0.15, alternative="less").pvalue         # H0: mean ≥ +m
  assert p.p_equiv == pytest.approx(max(lower, upper), rel=1e-9)
  assert math.isnan(comparisons.paired_difference(A, B).p_equiv)           # no margin, no TOST
  for margin in [0.05, 0.1, 0.13, 0.15, 0.3]:                        # 90% CI [-0.124, -0.036]
    ci = sps.ttest_rel(A, B).confidence_interval(0.90)
    inside = -margin < ci.low and ci.high < margin
    assert (comparisons.paired_difference(A, B, margin).p_equiv < 0.05) == inside, margin
  flat = comparisons.paired_difference([2.1, 2.2], [2.0, 2.1], margin=0.2)  # sd 0: d = 0.1 exactly
  assert (flat.p, flat.p_equiv) == (0.0, 0.0)
  assert comparisons.paired_difference([2.0, 2.2], [2.0, 2.2], margin=0.1).p == 1.0
  with pytest.raises(ValueError, match="margin must be a finite number > 0"):
    comparisons.paired_difference(A, B, margin=0.0)


def test_verdict_rule():
  assert comparisons.verdict(-0.1, 0.01, math.nan) == comparisons.A_BETTER
  assert comparisons.verdict(+0.1, 0.05, 0.01) == comparisons.B_BETTER  # the difference test first
  assert comparisons.verdict(+0.01, 0.2, 0.04) == comparisons.EQUIVALENT
  assert comparisons.verdict(+0.01, 0.2, 0.06) == comparisons.NOT_RESOLVED
  assert comparisons.verdict(math.nan, math.nan, math.nan) == comparisons.NOT_RESOLVED


def _family(diffs, margin=None, acts=None):
  """A grid of the activation only, seeds 0-2: `base` at 2.0 + seed, each other activation at
  its differences from it; {activation: Comparison against base}."""
  acts = ["base", *diffs] if acts is None else acts
  runs = [stats.Run(f"{a},{s}", {"model.activation": a, "train.seed": s}, "done",
                    {"status": "stable", "final_val_loss": 2.0 + s + (diffs[a][s] if a in diffs
                                                                        else 0.0)})
          for a in acts for s in SEEDS]
  manifest = {"axes": {"model.activation": acts}, "seeds": SEEDS, "equivalence_margin": margin}
  per_lr, best = comparisons.family(manifest, runs, "base")
  assert best == []                                                  # no LR axis
  return {c.a: c for c in per_lr}


def test_family_verdicts_each_case_and_holm():
  spread = lambda mu, delta: [mu - delta, mu, mu + delta]
  cases = {"lower": (spread(-0.1, 0.01), comparisons.A_BETTER),
           "higher": (spread(0.1, 0.01), comparisons.B_BETTER),
           "same": (spread(0.005, 0.005), comparisons.EQUIVALENT),        # 90% CI inside ±0.05
           "noisy": (spread(0.02, 0.1), comparisons.NOT_RESOLVED)}
  for act, (d, want) in cases.items():
    (c,) = _family({act: d}, margin=0.05).values()                    # a family of one
    assert (c.verdict, c.p_holm) == (want, pytest.approx(c.paired.p)), act
  # Without a margin nothing is ever "equivalent".
  assert _family({"same": cases["same"][0]})["same"].verdict == comparisons.NOT_RESOLVED
  # Holm: two comparisons each resolved alone (p < 0.05, 95% CI off 0) are not both resolved
  # in a family of two when both p > 0.025.
  d1, d2 = spread(0.1, 0.035), spread(0.1, 0.032)
  for d in (d1, d2):
    alone = _family({"x": d})["x"]
    assert 0.025 < alone.paired.p < 0.05 and alone.paired.ci_low > 0
    assert alone.verdict == comparisons.B_BETTER
  both = _family({"x": d1, "y": d2})
  p = sorted(c.paired.p for c in both.values())
  assert [both["x"].p_holm, both["y"].p_holm] == pytest.approx([max(2 * p[0], p[1])] * 2)
  assert {c.verdict for c in both.values()} == {comparisons.NOT_RESOLVED}


def test_the_mdd_is_where_the_paired_t_test_has_80_percent_power():
  """The one minimum-detectable formula (the report's MDD, a question's "80% power above"): the
  difference whose two-sided paired t-test at α = 0.05 has exactly 80% power (noncentral t)."""
  p = comparisons.paired_difference([2.0, 2.3, 2.6], [2.1, 2.1, 2.5])
  assert p.mdd == comparisons.min_detectable(p.sd, 3)
  for n in (2, 3, 5, 30):
    mdd = comparisons.min_detectable(1.0, n)
    crit, nc = sps.t.ppf(0.975, n - 1), mdd * math.sqrt(n)
    exact = sps.nct.sf(crit, n - 1, nc) + sps.nct.sf(crit, n - 1, -nc)
    assert exact == pytest.approx(0.8, abs=1e-9)
  # above the normal approximation's (t₀.₉₇₅ + t₀.₈₀)·sd/√n, which has 77% power at n = 3
  approximation = (sps.t.ppf(0.975, 2) + sps.t.ppf(0.8, 2)) * 0.1 / math.sqrt(3)
  assert comparisons.min_detectable(0.1, 3) > approximation


def test_learned_rule():
  assert stats.learned(2.0, 3.0) is True
  assert stats.learned(3.0, 3.0) is False      # no better than the unigram model: not learned
  assert stats.learned(3.2, 3.0) is False
  assert stats.learned(2.0, None) is None      # older summaries: not checked
  assert stats.learned(None, 3.0) is None and stats.learned(2.0, float("nan")) is None


def test_lr_sensitivity_of_one_seed():
  capped = stats.capped_losses([2.0, None, 6.0, 3.0], initial=5.0)  # None: diverged, counts as ℓ₀
  np.testing.assert_array_equal(capped, [2.0, 5.0, 5.0, 3.0])
  assert stats.sensitivity(capped) == pytest.approx((0 + 3 + 3 + 1) / 4)
  assert stats.mean_sd([1.0, 2.0, 4.0]) == pytest.approx((7 / 3, math.sqrt(7 / 3)))
  assert stats.mean_sd([1.5]) == (1.5, None)


# --- Over a sweep's runs --------------------------------------------------------------------

LRS, SEEDS = [1e-4, 1e-3, 1e-2], [0, 1, 2]


def _run(act, lr, seed, status="stable", final=2.0, unigram=3.0, state="done"):
  summary = {"status": status, "final_val_loss": final, "initial_val_loss": 5.0}
  if unigram is not None:
    summary["unigram_loss"] = unigram
  return stats.Run(f"{act},{lr},{seed}", {"model.activation": act, "optim.lr": lr,
                                          "train.seed": seed}, state, summary)


def _manifest(acts):
  return {"axes": {"model.activation": acts, "optim.lr": LRS}, "seeds": SEEDS}


def test_largest_stable_lr_needs_every_seed_stable_and_learned():
  special = {
      ("ok", 1e-2, 1): dict(status="unstable"),            # ok: unstable at 1e-2 → 1e-3
      ("bumpy", 1e-3, 0): dict(status="unstable"),         # bumpy: the largest counts → 1e-2
      ("flat", 1e-2, 0): dict(final=3.0),                  # flat: not learned (3.0 ≥ 3.0)
      ("flat", 1e-3, 2): dict(final=3.4),                  # … at 1e-3 too → 1e-4
      ("gap", 1e-3, 1): dict(state="missing"),             # gap: a missing seed at 1e-3 and
      ("gap", 1e-2, 2): dict(status="diverged"),           # a diverged one at 1e-2 → 1e-4
      ("old", 1e-2, 0): dict(final=3.4, unigram=None),     # old: no unigram loss → not checked
      ("none", 1e-4, 0): dict(status="diverged"),          # none: no LR qualifies
      ("none", 1e-3, 0): dict(final=9.0),
      ("none", 1e-2, 0): dict(status="unstable"),
  }
  acts = ["ok", "bumpy", "flat", "gap", "old", "none", "hole"]
  runs = [_run(a, lr, s, **special.get((a, lr, s), {})) for a in acts for lr in LRS
          for s in SEEDS if (a, lr, s) != ("hole", 1e-2, 0)]  # hole: a cell absent altogether
  got = stats.largest_stable_lr(_manifest(acts), runs)
  assert got == {("ok",): 1e-3, ("bumpy",): 1e-2, ("flat",): 1e-4, ("gap",): 1e-4,
                 ("old",): 1e-2, ("none",): None, ("hole",): 1e-3}
  flat = next(r for r in runs if r.name == "flat,0.01,0")
  assert flat.status == "stable" and flat.learned is False and not flat.stable


def test_per_lr_comparisons_pair_by_seed_and_drop_unfinished_pairs():
  losses = {("relu", 0): 2.5, ("relu", 1): 2.9, ("relu", 2): 2.2,
            ("gelu", 0): 2.4, ("gelu", 1): 2.7, ("gelu", 2): 2.1,
            ("tanh", 0): 2.6, ("tanh", 1): 3.0, ("tanh", 2): 2.3}
  runs = [_run(a, lr, s, final=losses[a, s] + lr) for a in ["relu", "gelu", "tanh"]
          for lr in LRS for s in SEEDS]
  runs[[r.name for r in runs].index("relu,0.001,1")].summary["status"] = "diverged"
  runs[[r.name for r in runs].index("tanh,0.01,2")].state = "incomplete"
  manifest = {**_manifest(["relu", "gelu", "tanh"]), "pairs": [["tanh", "gelu"], ["relu", "gelu"]]}
  out, _ = comparisons.family(manifest, runs, "relu")
  got = {(c.key, c.a, c.b): c.paired for c in out}
  pairs = [("gelu", "relu"), ("tanh", "relu"), ("tanh", "gelu")]  # relu-gelu is gelu-relu: once
  assert list(got) == [((lr,), a, b) for lr in LRS for a, b in pairs]  # LR order, then the pairs
  full = got[(1e-4,), "gelu", "relu"]
  ref = comparisons.paired_difference([2.4, 2.7, 2.1], [2.5, 2.9, 2.2])
  assert full.n == 3 and full.mean == pytest.approx(ref.mean) and full.p == pytest.approx(ref.p)
  assert got[(1e-3,), "gelu", "relu"].n == 2                 # relu seed 1 diverged: pair dropped
  assert got[(1e-3,), "gelu", "relu"].mean == pytest.approx(-0.1)
  assert got[(1e-3,), "tanh", "gelu"].n == 3
  assert got[(1e-2,), "tanh", "relu"].n == 2 and got[(1e-2,), "gelu", "relu"].n == 3
  assert got[(1e-2,), "tanh", "relu"].mean == pytest.approx(0.1)


def test_selection_split():
  assert comparisons.selection_split([0, 1, 2]) == ([0], [1, 2])
  assert comparisons.selection_split([3, 4, 5, 6, 7]) == ([3, 4], [5, 6, 7])
  assert comparisons.selection_split([0]) == ([], [0])


def test_best_lr_is_chosen_on_the_selection_seeds_and_tested_on_the_others():
  # relu: seed 0 prefers 1e-3, seeds 1-2 prefer 1e-2 → 1e-3 (the test seeds do not vote);
  # gelu: 1e-2; tanh: seed 0 diverged at 1e-3 (else its best), which rules 1e-3 out → 1e-4.
  final = {("relu", 1e-4): [2.6, 2.6, 2.6], ("relu", 1e-3): [2.0, 2.5, 2.4],
           ("relu", 1e-2): [2.3, 2.1, 2.0],
           ("gelu", 1e-4): [2.9, 2.8, 2.8], ("gelu", 1e-3): [2.5, 2.4, 2.5],
           ("gelu", 1e-2): [2.2, 2.3, 2.25],
           ("tanh", 1e-4): [2.7, 2.6, 2.65], ("tanh", 1e-3): [1.0, 2.0, 2.0],
           ("tanh", 1e-2): [2.8, 2.8, 2.8]}
  runs = [_run(a, lr, s, final=final[a, lr][s],
               status="diverged" if (a, lr, s) == ("tanh", 1e-3, 0) else "stable")
          for a in ["relu", "gelu", "tanh"] for lr in LRS for s in SEEDS]
  manifest = _manifest(["relu", "gelu", "tanh"])
  assert comparisons.chosen_lrs(manifest, runs, [0]) == {("relu",): 1e-3, ("gelu",): 1e-2,
                                                         ("tanh",): 1e-4}
  assert comparisons.chosen_lrs(manifest, runs, [1, 2])[("relu",)] == 1e-2  # the test seeds' say
  assert comparisons.chosen_lrs(manifest, runs, [])[("relu",)] is None
  per_lr, best = comparisons.family(manifest, runs, "gelu")
  assert len(per_lr) == 6 and [(c.key, c.a, c.b, c.lr_a, c.lr_b) for c in best] == [
      ((), "relu", "gelu", 1e-3, 1e-2), ((), "tanh", "gelu", 1e-4, 1e-2)]
  ref = comparisons.paired_difference([2.5, 2.4], [2.3, 2.25])              # seeds 1, 2 only
  assert best[0].paired.n == 2 and best[0].paired.mean == pytest.approx(ref.mean)
  assert best[0].paired.p == pytest.approx(ref.p)
  # Holm over all 8: per-LR and best-LR comparisons are one family.
  np.testing.assert_allclose([c.p_holm for c in per_lr + best],
                             comparisons.holm([c.paired.p for c in per_lr + best]))
  one_seed = {**manifest, "seeds": [0]}                                 # nothing left to choose on
  assert comparisons.family(one_seed, runs, "gelu")[1] == []


def test_an_encoders_bar_is_the_copy_predictors_loss():
  """An MLM run between the copy predictor's loss and the unigram's did not use context."""
  run = lambda final: stats.Run("r", {}, "done", {"status": "stable", "final_val_loss": final,
                                                   "unigram_loss": 5.7, "copy_loss": 5.3})
  assert run(5.4).learned is False and not run(5.4).stable
  assert run(5.2).learned is True and run(5.2).stable


def test_with_held_out_test_windows_every_seed_chooses_on_val_and_compares_on_test():
  """Runs that scored data.test_batches: the LR is chosen on final_val_loss over all seeds and
  the best-LR comparison is of final_test_loss, over all seeds too."""
  final = {("relu", 1e-4): 2.6, ("relu", 1e-3): 2.0, ("relu", 1e-2): 2.3,
           ("gelu", 1e-4): 2.9, ("gelu", 1e-3): 2.5, ("gelu", 1e-2): 2.2}
  runs = [_run(a, lr, s, final=final[a, lr] + 0.01 * s)
          for a in ["relu", "gelu"] for lr in LRS for s in SEEDS]
  for r in runs:
    r.summary["final_test_loss"] = r.summary["final_val_loss"] + 0.1 * (r.overrides["train.seed"]
                                                                         + (r.name[0] == "r"))
  manifest = _manifest(["relu", "gelu"])
  assert comparisons.selection(manifest, runs) == (SEEDS, SEEDS, "final_test_loss")
  diverged = _run("relu", 1e-1, 0, status="diverged")   # stopped before the test windows
  assert comparisons.selection(manifest, [*runs, diverged])[2] == "final_test_loss"
  (best,) = comparisons.family(manifest, runs, "gelu")[1]
  assert (best.lr_a, best.lr_b, best.paired.n) == (1e-3, 1e-2, 3)
  assert best.paired.mean == pytest.approx((2.0 + 0.1) - 2.2)  # test losses, not val
  del runs[0].summary["final_test_loss"]                         # one run without: seed split
  assert comparisons.selection(manifest, runs) == (*comparisons.selection_split(SEEDS),
                                                   "final_val_loss")


def test_the_simultaneous_interval_is_the_paired_t_interval_at_alpha_over_k():
  d = comparisons.paired_difference([1.0, 1.3, 0.8, 1.1, 0.9], [1.0] * 5)
  assert comparisons.simultaneous_interval(d, 1) == pytest.approx((d.ci_low, d.ci_high))
  low, high = comparisons.simultaneous_interval(d, 7)
  half = sps.t.ppf(1 - 0.05 / 14, 4) * d.sd / np.sqrt(5)  # closed form
  assert (low, high) == pytest.approx((d.mean - half, d.mean + half), rel=1e-12)
  # Seven such intervals cover their true differences together in about 95% of families
  # ((1 - 0.05/7)^7 = 0.951), unadjusted 95% intervals in about 70% (0.95^7).
  families = [[comparisons.paired_difference(x, np.zeros(10)) for x in fam]
              for fam in np.random.default_rng(0).normal(0.3, 0.2, (400, 7, 10))]
  cover = lambda k: np.mean([all(lo <= 0.3 <= hi for lo, hi in (
      comparisons.simultaneous_interval(d, k) for d in fam)) for fam in families])
  assert cover(7) > 0.93 and cover(1) < 0.8


def test_the_claim_rule_resolves_a_small_standardised_effect_with_enough_seeds():
  """A real difference of half the differences' sd, never above that sd, is claimed once n is
  large: the interval, not the sd of single differences, is held against the margin."""
  diffs = 0.15 + 0.3 * np.random.default_rng(1).standard_normal(200)  # d_z = 0.5
  d = comparisons.paired_difference(diffs, np.zeros(200), 0.1)
  assert abs(d.mean) < d.sd
  assert comparisons.judge(comparisons.simultaneous_interval(d, 7), 0.1, 1.0).side == 1
