"""actlab.measure.stats: t quantiles, the paired comparison and its verdict, the MDD, "not learned", and
the rules over a sweep's runs (largest stable LR, pairing by seed), against scipy where it has
the answer and against hand-computed numbers otherwise."""

import math

import numpy as np
import pytest
from scipy import stats as sps

from actlab.measure import stats

A = [2.31, 2.52, 2.18, 2.44]  # hand-made final val losses of four seeds; B is A's baseline
B = [2.40, 2.60, 2.21, 2.56]  # d = A − B = [-0.09, -0.08, -0.03, -0.12]


@pytest.mark.parametrize("p", [0.975, 0.80])
def test_t_table_and_expansion_match_scipy(p):
  for df in [*range(1, 31), 31, 40, 60, 120, 1000]:
    assert stats.t_quantile(p, df) == pytest.approx(sps.t.ppf(p, df), abs=2e-6), df
  assert stats.t_quantile(p, 2) == {0.975: 4.302653, 0.80: 1.060660}[p]


def test_t_quantile_refuses_what_it_does_not_know():
  with pytest.raises(ValueError, match="tabulated for df ≤ 30 only"):
    stats.t_quantile(0.9, 5)
  with pytest.raises(ValueError, match="df must be ≥ 1"):
    stats.t_quantile(0.975, 0)
  assert stats.t_quantile(0.9, 50) == pytest.approx(sps.t.ppf(0.9, 50), abs=2e-6)


def test_t_cdf_closed_forms_symmetry_and_scipy():
  for t in [-1e6, -30.0, -4.3, -1.0, -0.2, 0.0, 0.3, 1.0, 2.9, 12.7, 1e4]:
    assert stats.t_cdf(t, 1) == pytest.approx(0.5 + math.atan(t) / math.pi, abs=1e-12)  # Cauchy
    assert stats.t_cdf(t, 2) == pytest.approx(0.5 + t / (2 * math.sqrt(t * t + 2)), abs=1e-12)
    for df in [1, 2, 3, 4, 7, 19, 30, 120, 1e5]:
      assert stats.t_cdf(t, df) + stats.t_cdf(-t, df) == pytest.approx(1.0, abs=1e-14)
      assert stats.t_cdf(t, df) == pytest.approx(sps.t.cdf(t, df), abs=1e-10), (t, df)
      tail = sps.t.cdf(-abs(t), df)  # small tails to relative precision, not just absolute
      assert stats.t_cdf(-abs(t), df) == pytest.approx(tail, rel=1e-9, abs=1e-300), (t, df)
  assert stats.t_cdf(stats.t_quantile(0.975, 4), 4) == pytest.approx(0.975, abs=1e-6)
  assert (stats.t_cdf(math.inf, 3), stats.t_cdf(-math.inf, 3)) == (1.0, 0.0)
  assert math.isnan(stats.t_cdf(math.nan, 3))
  with pytest.raises(ValueError, match="df must be > 0"):
    stats.t_cdf(1.0, 0)


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
  np.testing.assert_allclose(stats.holm([0.01, 0.04, 0.03, 0.005]), [0.03, 0.06, 0.06, 0.02])
  np.testing.assert_allclose(stats.holm([0.5, 0.9]), [1.0, 1.0])      # capped at 1
  np.testing.assert_allclose(stats.holm([np.nan, 0.02, 0.5]), [np.nan, 0.04, 0.5])  # K = 2
  assert stats.holm([]).size == 0 and stats.holm([0.03]).tolist() == [0.03]
  rng = np.random.default_rng(0)
  for k in [1, 2, 3, 5, 12]:
    for _ in range(200):
      p = rng.uniform(0, 0.1, k) ** rng.uniform(0.5, 2)
      adj = stats.holm(p)
      assert np.all(adj >= p) and np.all(adj <= 1)
      order = np.argsort(p)
      assert np.all(np.diff(adj[order]) >= 0)                          # monotone in p
      for alpha in [0.01, 0.05, 0.1]:
        assert set(np.flatnonzero(adj <= alpha)) == _holm_sequential(p, alpha)


def test_paired_interval_matches_scipy_and_hand_numbers():
  p = stats.paired_difference(A, B)
  d = np.subtract(A, B)
  ci = sps.ttest_rel(A, B).confidence_interval(0.95)
  assert p.n == 4
  assert p.mean == pytest.approx(-0.08, abs=1e-12)
  assert p.sd == pytest.approx(math.sqrt(0.0042 / 3), abs=1e-12)  # Σ(d − d̄)² = 0.0042
  assert (p.ci_low, p.ci_high) == pytest.approx((ci.low, ci.high), abs=1e-6)
  half = sps.t.ppf(0.975, 3) * d.std(ddof=1) / 2
  assert (p.ci_low, p.ci_high) == pytest.approx((-0.08 - half, -0.08 + half), abs=1e-6)
  assert (round(p.ci_low, 4), round(p.ci_high, 4)) == (-0.1395, -0.0205)


def test_verdict_branches():
  assert stats.paired_difference(A, B).verdict == stats.A_BETTER       # CI entirely below 0
  assert stats.paired_difference(B, A).verdict == stats.B_BETTER       # entirely above 0
  p = stats.paired_difference([2.0, 2.3, 2.6], [2.1, 2.1, 2.5])        # d = [-0.1, 0.2, 0.1]
  assert p.verdict == stats.NOT_RESOLVED and p.ci_low < 0 < p.ci_high
  assert sps.ttest_rel([2.0, 2.3, 2.6], [2.1, 2.1, 2.5]).pvalue > 0.05
  assert sps.ttest_rel(A, B).pvalue < 0.05
  one = stats.paired_difference([2.0], [2.5])                          # n < 2: never resolved
  assert (one.n, one.mean, one.verdict) == (1, -0.5, stats.NOT_RESOLVED)
  assert all(math.isnan(x) for x in (one.sd, one.ci_low, one.ci_high, one.mdd))
  none = stats.paired_difference([], [])
  assert none.n == 0 and math.isnan(none.mean) and none.verdict == stats.NOT_RESOLVED
  with pytest.raises(ValueError, match="same length"):
    stats.paired_difference([1.0, 2.0], [1.0])
  with pytest.raises(ValueError, match="finite"):
    stats.paired_difference([1.0, float("nan")], [1.0, 2.0])


def test_mdd_formula_and_its_power():
  # n = 3, sd = 0.1: (t₀.₉₇₅,₂ + t₀.₈₀,₂)·0.1/√3 = (4.302653 + 1.060660)·0.1/1.7320508
  assert stats.min_detectable(0.1, 3) == pytest.approx(0.309651, abs=1e-6)
  p = stats.paired_difference([2.0, 2.3, 2.6], [2.1, 2.1, 2.5])
  assert p.mdd == pytest.approx((sps.t.ppf(0.975, 2) + sps.t.ppf(0.8, 2)) * p.sd / math.sqrt(3))
  for n, power in [(3, 0.766), (5, 0.791), (30, 0.800)]:
    # The paired t test's exact power at a true difference of one MDD (sd known = s).
    crit, nc = sps.t.ppf(0.975, n - 1), stats.min_detectable(1.0, n) * math.sqrt(n)
    exact = sps.nct.sf(crit, n - 1, nc) + sps.nct.cdf(-crit, n - 1, nc)
    assert exact == pytest.approx(power, abs=1e-3)


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


def test_comparisons_pair_by_seed_and_drop_unfinished_pairs():
  losses = {("relu", 0): 2.5, ("relu", 1): 2.9, ("relu", 2): 2.2,
            ("gelu", 0): 2.4, ("gelu", 1): 2.7, ("gelu", 2): 2.1,
            ("tanh", 0): 2.6, ("tanh", 1): 3.0, ("tanh", 2): 2.3}
  runs = [_run(a, lr, s, final=losses[a, s] + lr) for a in ["relu", "gelu", "tanh"]
          for lr in LRS for s in SEEDS]
  runs[[r.name for r in runs].index("relu,0.001,1")].summary["status"] = "diverged"
  runs[[r.name for r in runs].index("tanh,0.01,2")].state = "incomplete"
  out = stats.comparisons(_manifest(["relu", "gelu", "tanh"]), runs, "relu")
  assert {b for _, _, b, _ in out} == {"relu"}
  got = {(key, a): p for key, a, _, p in out}
  assert list(got) == [((lr,), a) for lr in LRS for a in ["gelu", "tanh"]]  # LR order, then A
  full = got[(1e-4,), "gelu"]
  ref = stats.paired_difference([2.4, 2.7, 2.1], [2.5, 2.9, 2.2])
  assert full.n == 3 and full.mean == pytest.approx(ref.mean) and full.verdict == ref.verdict
  assert got[(1e-3,), "gelu"].n == 2                      # relu seed 1 diverged: pair dropped
  assert got[(1e-3,), "gelu"].mean == pytest.approx(-0.1)
  assert got[(1e-2,), "tanh"].n == 2 and got[(1e-2,), "gelu"].n == 3
  assert got[(1e-2,), "tanh"].mean == pytest.approx(0.1)
