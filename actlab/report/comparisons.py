"""The report's paired comparisons (docs/metrics.md §9): the paired t interval and tests (t test,
TOST), the minimum detectable difference, Holm's adjustment, the verdicts, the simultaneous
intervals and the claim they make against a margin, and which pairs are compared on which seeds
at which LR. Pure functions of numbers and of a sweep's runs (stats.py)."""

import dataclasses
import functools
import math
from typing import Any, Mapping, Sequence

import numpy as np
from scipy import optimize
from scipy import stats as sps

from actlab.report.stats import LR_KEY, Run, activation_axis, finite, other_axes, pivot

A_BETTER, B_BETTER, EQUIVALENT, NOT_RESOLVED = "A better", "B better", "equivalent", "not resolved"
ALPHA = 0.05  # each family's familywise error rate


def holm(p: Sequence[float]) -> np.ndarray:
  """Holm's step-down adjusted p-values of a family, in the input's order (p̃ ≤ α rejects what
  Holm's procedure rejects at familywise error α); NaN (no test) stays NaN, uncounted."""
  p = np.asarray(p, np.float64)
  out = np.full(p.shape, np.nan)
  idx = np.flatnonzero(~np.isnan(p))
  order = idx[np.argsort(p[idx], kind="stable")]
  k = order.size
  out[order] = np.maximum.accumulate(np.minimum(1.0, (k - np.arange(k)) * p[order]))
  return out


@dataclasses.dataclass(frozen=True)
class Paired:
  """A paired comparison of A against B; NaN where undefined (mean: n = 0; the rest: n < 2)."""
  n: int
  mean: float           # d̄, the mean of A − B
  sd: float             # sample sd of the differences
  ci_low: float         # the 95% paired t interval of the mean difference
  ci_high: float
  p: float              # two-sided p-value of the paired t test of a mean difference of 0
  p_equiv: float        # TOST p-value for the margin (NaN without one)

  @property
  def mdd(self) -> float:
    """`min_detectable(sd, n)` (NaN below 2 pairs)."""
    return min_detectable(self.sd, self.n) if self.n >= 2 else math.nan


def paired_power(n: int, sd: float, delta: float, alpha: float = ALPHA) -> float:
  """The power of a two-sided paired t-test of n pairs at `alpha` against a mean difference
  `delta` when the differences' sd is `sd` (noncentral t)."""
  if sd == 0:
    return 1.0
  df, shift = n - 1, delta / (sd / math.sqrt(n))
  t = sps.t.ppf(1 - alpha / 2, df)
  # Both tails as upper tails: scipy's nct.cdf is NaN far out in the lower one.
  return float(sps.nct.sf(t, df, shift) + sps.nct.sf(t, df, -shift))


def seeds_needed(sd: float, delta: float, alpha: float, power: float, least: int) -> int:
  """The smallest n ≥ `least` whose paired t-test has `power` against `delta`."""
  n = least
  while paired_power(n, sd, delta, alpha) < power:
    n += 1
  return n


def min_detectable(sd: float, n: int, alpha: float = ALPHA, power: float = 0.8) -> float:
  """The mean difference n ≥ 2 pairs whose differences' sd is `sd` detect with `power` at
  `alpha` (docs/metrics.md §9): where `paired_power` is `power`."""
  if sd == 0:
    return 0.0
  most = (sps.t.ppf(1 - alpha / 2, n - 1) + 10) * sd / math.sqrt(n)
  return float(optimize.brentq(lambda d: paired_power(n, sd, d, alpha) - power, 0.0, most))


def sd_upper(sd: float, n: int, confidence: float = 0.8) -> float:
  """The upper one-sided `confidence` bound of the sd of normal values whose sample sd over n of
  them is `sd`: sd · √((n − 1) / χ²), χ² the chi-square quantile at 1 − confidence, n − 1 df."""
  return sd * np.sqrt((n - 1) / sps.chi2.ppf(1 - confidence, n - 1))


SIGN_FLIP_MAX = 44  # pairs: 2 × 2^22 half sums in memory


def sign_flip_p(diffs: Sequence[float]) -> float:
  """The exact two-sided p of the sign-flip test of no difference: the share of the 2^n sign
  patterns of the n values whose |sum| is at least the observed one (float ties within 1e-9 of
  it count), exact under the sole assumption that each value is symmetric about 0 under the null.
  Every pattern, counted in halves: the 2^(n/2) sums of each half, sorted; the sums are
  symmetric about 0 (a pattern's negation negates its sum, exactly in floating point), so the
  lower tail counts as many as the upper."""
  d = np.asarray(diffs, np.float64)
  if not 1 <= d.size <= SIGN_FLIP_MAX or not np.all(np.isfinite(d)):
    raise ValueError(f"sign_flip_p: 1 to {SIGN_FLIP_MAX} finite values, got {d.size}")
  observed = _observed_sum(d)
  if observed <= 0:
    return 1.0
  # Each half's sums, built sorted: s − x and s + x are sorted runs, which a stable sort merges.
  sums = lambda xs: functools.reduce(
      lambda s, x: np.sort(np.concatenate([s - x, s + x]), kind="stable"), np.abs(xs), np.zeros(1))
  left, right = sums(d[: d.size // 2]), sums(d[d.size // 2:])
  above = right.size - np.searchsorted(right, observed - left, "left")   # sum ≥ observed
  return float(2 * above.sum() / 2.0 ** d.size)


def _observed_sum(d: np.ndarray) -> float:
  """|Σd| less the tolerance within which a pattern's sum ties it (1e-9 of Σ|d|)."""
  return abs(d.sum()) - 1e-9 * np.abs(d).sum()


def sign_flip_bound(diffs: Sequence[float]) -> float:
  """An upper bound of `sign_flip_p` (Hoeffding's, for a sum of random signs): 2·exp(−s²/(2Σd²)),
  s the observed |sum| less its tolerance; at most 1."""
  d = np.asarray(diffs, np.float64)
  observed = _observed_sum(d)
  return 1.0 if observed <= 0 else float(min(1.0, 2 * np.exp(-observed ** 2 / (2 * d @ d))))


def paired_difference(a: Sequence[float], b: Sequence[float],
                      margin: float | None = None) -> Paired:
  """A against B from finite values paired by position (a seed), with the TOST p for an
  equivalence `margin` > 0. An sd of 0 makes each statistic ±∞ (or 0 for a numerator of 0)."""
  a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
  if a.ndim != 1 or a.shape != b.shape or not np.all(np.isfinite(a - b)):
    raise ValueError("paired_difference: a and b must be finite sequences of the same length")
  if margin is not None and not (finite(margin) and margin > 0):
    raise ValueError(f"paired_difference: the margin must be a finite number > 0, got {margin}")
  d = a - b
  n = d.size
  if n < 2:
    return Paired(n, float(d[0]) if n else math.nan, *[math.nan] * 5)
  mean, sd = float(d.mean()), float(d.std(ddof=1))
  se, df = sd / math.sqrt(n), n - 1
  tstat = lambda x: x / se if se > 0 else math.copysign(math.inf, x) if x else 0.0
  half = float(sps.t.ppf(0.975, df)) * se
  p = float(2 * sps.t.sf(abs(tstat(mean)), df))
  p_equiv = (math.nan if margin is None else
             float(max(sps.t.sf(tstat(mean + margin), df), sps.t.cdf(tstat(mean - margin), df))))
  return Paired(n, mean, sd, mean - half, mean + half, p, p_equiv)


def verdict(mean: float, p_holm: float, p_equiv_holm: float, alpha: float = ALPHA) -> str:
  """A_BETTER / B_BETTER (lower is better) when the adjusted test of no difference rejects at
  `alpha`, else EQUIVALENT when the adjusted TOST rejects, else NOT_RESOLVED (NaN never rejects)."""
  if p_holm <= alpha:
    return A_BETTER if mean < 0 else B_BETTER
  return EQUIVALENT if p_equiv_holm <= alpha else NOT_RESOLVED


def simultaneous_interval(d: Paired, k: int, alpha: float = ALPHA) -> tuple[float, float]:
  """The paired t interval of d at level 1 − α/k: k such intervals cover their mean differences
  together with probability ≥ 1 − α (Bonferroni, the first step of Holm's procedure; Holm's
  step-down has no sharper intervals that still bound a difference's size). NaN below 2 pairs."""
  if d.n < 2:
    return math.nan, math.nan
  half = float(sps.t.ppf(1 - alpha / (2 * k), d.n - 1)) * d.sd / math.sqrt(d.n)
  return d.mean - half, d.mean + half


@dataclasses.dataclass(frozen=True)
class Verdict:
  """What a simultaneous interval of a contrast says against ±`margin`, by construction one of:
  `side` (−1: below 0, +1: above 0) by at least δ (`BEYOND`: the interval lies beyond ∓δ), by
  less than δ (`WITHIN`: it lies between ∓δ and 0), a side whose size is not resolved against δ
  (`UNSIZED`: it excludes 0 and spans ∓δ); else `EQUIVALENT` (the Holm-adjusted TOST rejects)
  or `NOT_RESOLVED`. `note` says why a side the interval shows was withheld."""
  kind: str
  side: int
  margin: float
  note: str = ""

  def words(self, below: str, above: str) -> str:
    """The verdict as a sentence, `below`/`above` saying what a value on each side means."""
    said = {BEYOND: "{} by at least {:g}", WITHIN: "{} by less than {:g}",
            UNSIZED: "{}; its size not resolved against {:g}",
            EQUIVALENT: "equivalent within ±{1:g}", NOT_RESOLVED: NOT_RESOLVED}[self.kind]
    return said.format(below if self.side < 0 else above, self.margin) + (
        f" ({self.note})" if self.note else "")


BEYOND, WITHIN, UNSIZED = "beyond", "within", "unsized"


def judge(interval: tuple[float, float], margin: float, p_equiv_holm: float,
          p_sign_holm: float | None = None, alpha: float = ALPHA) -> Verdict:
  """The `Verdict` of a simultaneous `interval` against ±`margin`. With `p_sign_holm` (the
  Holm-adjusted exact sign-flip p), a side is claimed only where the interval excludes 0 and the
  sign-flip test rejects at `alpha`; where one finds a side and the other does not, none is
  claimed (equivalence, the TOST's, may stand) and the note says which disagrees."""
  low, high = interval
  side = -1 if high < 0 else 1 if low > 0 else 0
  note = ""
  if p_sign_holm is not None and bool(side) != (p_sign_holm <= alpha):
    note = ("the t interval excludes 0, the sign-flip test does not reject it" if side else
            "the sign-flip test rejects 0, the t interval does not exclude it")
    side = 0
  if side:
    near, far = sorted((abs(low), abs(high)))
    kind = BEYOND if near > margin else WITHIN if far < margin else UNSIZED
    return Verdict(kind, side, margin)
  return Verdict(EQUIVALENT if p_equiv_holm <= alpha else NOT_RESOLVED, 0, margin, note)


@dataclasses.dataclass(frozen=True)
class Comparison:
  """One paired comparison of the report's family, with its Holm-adjusted p-values and verdict."""
  key: tuple            # the other axes' values: `pivot`'s keys per LR, else of `best_lr_keys`
  a: Any
  b: Any
  lr_a: Any             # at each one's best LR: the LRs chosen on the selection seeds; else None
  lr_b: Any
  paired: Paired
  p_holm: float
  p_equiv_holm: float
  verdict: str


def compared_pairs(manifest: Mapping, baseline) -> list[tuple]:
  """(A, `baseline`) for every other activation (grid order), then the manifest's `pairs` not
  already among them (in either order)."""
  axis = activation_axis(manifest)
  out = [(a, baseline) for a in (manifest["axes"][axis] if axis else []) if a != baseline]
  for a, b in manifest.get("pairs") or []:
    if (a, b) not in out and (b, a) not in out:
      out.append((a, b))
  return out


def _paired_by_seed(loss_a: Mapping, loss_b: Mapping, seeds: Sequence, margin) -> Paired:
  """`paired_difference` over the `seeds` where both {seed: loss or None} have a loss."""
  both = [s for s in seeds if loss_a.get(s) is not None and loss_b.get(s) is not None]
  return paired_difference([loss_a[s] for s in both], [loss_b[s] for s in both], margin)


def selection_split(seeds: Sequence) -> tuple[list, list]:
  """The first ⌊n/2⌋ seeds, which choose each activation's LR, and the others, which test it."""
  half = len(seeds) // 2
  return list(seeds[:half]), list(seeds[half:])


def selection(manifest: Mapping, runs: Sequence[Run]) -> tuple[list, list, str]:
  """(seeds choosing each activation's LR, seeds testing it, the loss tested): all seeds and
  `final_test_loss` when every run with values has one; else `selection_split`, val loss."""
  scored = [r for r in runs if r.value("final_val_loss") is not None]
  if scored and all(r.value("final_test_loss") is not None for r in scored):
    return list(manifest["seeds"]), list(manifest["seeds"]), "final_test_loss"
  return (*selection_split(manifest["seeds"]), "final_val_loss")


def best_lr_keys(manifest: Mapping) -> list[str]:
  """The axes a best-LR comparison is at: all but the activation, the LR and the seed."""
  axis = activation_axis(manifest)
  return [k for k in other_axes(manifest) if k != axis]


def chosen_lrs(manifest: Mapping, runs: Sequence[Run], seeds: Sequence) -> dict[tuple, Any]:
  """Per combination of the non-LR axes: the LR with the lowest mean final val loss over
  `seeds`, among those where every seed has one (a diverged, unfinished or missing run rules
  its LR out); None if no LR qualifies."""
  out = {}
  for key, cells in pivot(manifest, runs, LR_KEY).items():
    means = {}
    for lr in manifest["axes"][LR_KEY]:
      loss = [cells[lr, s].value("final_val_loss") if (lr, s) in cells else None for s in seeds]
      if seeds and all(x is not None for x in loss):
        means[lr] = float(np.mean(loss))
    out[key] = min(means, key=means.get) if means else None
  return out


def family(manifest: Mapping, runs: Sequence[Run], baseline
           ) -> tuple[list[Comparison], list[Comparison]]:
  """The report's family of paired comparisons (lower loss is better), as two lists: each pair
  of `compared_pairs` per LR over all seeds, and at each one's best LR (`chosen_lrs` on the
  `selection` seeds) over the testing seeds. `holm` adjusts the t and TOST p-values apart."""
  axis, margin = activation_axis(manifest), manifest.get("equivalence_margin")
  pairs = compared_pairs(manifest, baseline) if axis else []
  raw = []  # (per LR?, key, a, b, lr_a, lr_b, Paired)
  for key, cells in pivot(manifest, runs, axis).items() if pairs else ():
    loss = {k: r.value("final_val_loss") for k, r in cells.items()}
    at = lambda act: {s: loss.get((act, s)) for s in manifest["seeds"]}
    for a, b in pairs:
      raw.append((True, key, a, b, None, None,
                  _paired_by_seed(at(a), at(b), manifest["seeds"], margin)))
  select, test, tested = selection(manifest, runs)
  if pairs and len(manifest["axes"].get(LR_KEY, [])) > 1 and select:
    lrs, cells = chosen_lrs(manifest, runs, select), pivot(manifest, runs, LR_KEY)
    i = other_axes(manifest).index(axis)
    by_rest: dict[tuple, dict] = {}
    for key, lr in lrs.items():
      loss = {s: cells[key][lr, s].value(tested) if (lr, s) in cells[key] else None
              for s in test} if lr is not None else {}
      by_rest.setdefault(key[:i] + key[i + 1:], {})[key[i]] = (lr, loss)
    for rest, acts in by_rest.items():
      for a, b in pairs:
        (lr_a, loss_a), (lr_b, loss_b) = acts.get(a, (None, {})), acts.get(b, (None, {}))
        raw.append((False, rest, a, b, lr_a, lr_b, _paired_by_seed(loss_a, loss_b, test, margin)))
  p_holm = holm([c[-1].p for c in raw])
  p_equiv_holm = holm([c[-1].p_equiv for c in raw])
  out = ([], [])
  for (per_lr, *fields, paired), p, q in zip(raw, p_holm, p_equiv_holm):
    out[not per_lr].append(Comparison(*fields, paired, float(p), float(q),
                                      verdict(paired.mean, p, q)))
  return out
