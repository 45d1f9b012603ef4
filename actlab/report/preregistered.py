"""Pre-registered paired tests: a `Test` states one comparison, A − B paired by seed, before any
of its runs, under its family's `Rule`; its pilot chooses each arm's LR on validation and the
number of fresh seeds by the power of a paired t-test (`pilot`); its fresh seeds answer it
(`result`, `verdicts`: the claim rule of comparisons.py); `sd_upper` bounds a pilot's sd and
`sign_flip_p` tests beside the t (report/factorial.py, a factorial family, uses them). Reads
committed run directories (`Results`); never trains. experiments/primary_tests.py states the
project's tests with it.
"""

import dataclasses
import functools
import json
import math
import pathlib
from typing import Any, Mapping, Sequence

import numpy as np
from scipy import optimize, stats

from actlab.report import comparisons


@dataclasses.dataclass(frozen=True)
class Rule:
  """How a family's tests are sized and judged: Holm and simultaneous intervals at family-wise
  `alpha` (α/K each), power `power` against a difference of `delta`, at least `min_seeds` pairs."""
  alpha: float = comparisons.ALPHA
  power: float = 0.8
  delta: float = 0.1
  min_seeds: int = 10


def paired_power(n: int, sd: float, delta: float, alpha: float) -> float:
  """The power of a two-sided paired t-test of n pairs at `alpha` against a mean difference
  `delta` when the differences' sd is `sd` (noncentral t)."""
  if sd == 0:  # differences without noise
    return 1.0
  df, shift = n - 1, delta / (sd / math.sqrt(n))
  t = stats.t.ppf(1 - alpha / 2, df)
  # Both tails as upper tails: scipy's nct.cdf is NaN far out in the lower one.
  return float(stats.nct.sf(t, df, shift) + stats.nct.sf(t, df, -shift))


def seeds_needed(sd: float, delta: float, alpha: float, power: float, least: int) -> int:
  """The smallest n ≥ `least` whose paired t-test has `power` against `delta`."""
  n = least
  while paired_power(n, sd, delta, alpha) < power:
    n += 1
  return n


def detectable(n: int, sd: float, alpha: float, power: float) -> float:
  """The mean difference n pairs detect with `power` at `alpha` (at most the critical t plus 10
  standard errors, where the power is near 1)."""
  se = sd / math.sqrt(n)
  most = (stats.t.ppf(1 - alpha / 2, n - 1) + 10) * se
  return optimize.brentq(lambda d: paired_power(n, sd, d, alpha) - power, 0.0, most)


@dataclasses.dataclass(frozen=True)
class Test:
  """One question, A − B paired by seed, in a family of `k` tests. Its fresh seeds' runs are the
  study `primary_<name>`, their reruns on the other platform `primary_<name>_two_cores`."""
  name: str
  question: str
  a: str                             # the activations compared
  b: str
  fixed: Mapping[str, Any]           # the settings both arms share (sweep overrides)
  pilot_studies: tuple[str, ...]     # the pilot's studies
  k: int
  first_seed: int                    # the fresh seeds: first_seed, first_seed + 1, …
  cap: int | None = None             # the most seed pairs it runs (None: no cap)
  rule: Rule = Rule()
  outcome: tuple[str, str] = ("final_val_loss", "final_test_loss")  # chosen on, tested on
  grid: tuple[float, ...] = ()       # LRs every arm's pilot must hold; an arm best at one of
  edge_step: Mapping[float, float] = dataclasses.field(default_factory=dict)  # these edges
                                     # runs the step past it before choosing, once

  @property
  def alpha(self) -> float:
    """α/K: the level of its power and of its simultaneous interval."""
    return self.rule.alpha / self.k

  @property
  def study(self) -> str:
    return f"primary_{self.name}"

  @property
  def reruns(self) -> str:
    return f"primary_{self.name}_two_cores"

  def fresh_seeds(self, n: int) -> list[int]:
    return list(range(self.first_seed, self.first_seed + n))


@dataclasses.dataclass(frozen=True)
class Results:
  """Committed studies: `root/<study>/<run>/` with each finished run's config.json and
  summary.json (and metrics.jsonl)."""
  root: pathlib.Path

  def runs(self, *studies: str) -> dict[tuple, pathlib.Path]:
    """(activation, peak LR, seed) -> the directory of each finished run of `studies`."""
    return {run_key(summary.parent): summary.parent
            for study in studies for summary in (self.root / study).glob("*/summary.json")}

  def summaries(self, *studies: str) -> dict[tuple, dict]:
    """(activation, peak LR, seed) -> the summary of each finished run of `studies`."""
    return {key: json.loads((run / "summary.json").read_text())
            for key, run in self.runs(*studies).items()}

  def by_seed(self, study: str) -> dict[tuple, dict]:
    """(activation, seed) -> the summary of each finished run of a single-LR study."""
    return {(act, seed): summary for (act, _, seed), summary in self.summaries(study).items()}


def run_key(run: pathlib.Path) -> tuple:
  """(activation, peak LR, seed) of the run in directory `run`, from its config.json."""
  c = json.loads((run / "config.json").read_text())
  return c["model"]["activation"], c["optim"]["lr"], c["train"]["seed"]


def pilot(test: Test, results: Results) -> dict | None:
  """The test's pilot: each arm's LR chosen on validation and the paired sd of the outcome there,
  with the seeds the power rule asks for; None until the pilot is committed, ValueError while what
  is committed of it is incomplete (not every (activation, LR) cell of the two arms at the same
  seeds, at least two; with a `grid`, not every LR of it). An arm best at an edge of the grid
  waits for the step past it: the plan then has "edge" ({arm: the LR to run}), no LR chosen."""
  a, b = test.a, test.b
  by = {}  # (activation, lr) -> {seed: summary}
  for (act, lr, seed), summary in results.summaries(*test.pilot_studies).items():
    by.setdefault((act, lr), {})[seed] = summary
  if not {a, b} <= {act for act, _ in by}:
    return None
  seed_sets = {cell: sorted(seeds) for cell, seeds in by.items() if cell[0] in (a, b)}
  distinct = {tuple(s) for s in seed_sets.values()}
  missing = [(arm, lr) for arm in (a, b) for lr in test.grid if (arm, lr) not in by]
  if len(distinct) > 1 or len(next(iter(distinct))) < 2 or missing:
    raise ValueError(f"test {test.name}: its pilot is incomplete (seeds per (activation, LR): "
                     f"{seed_sets}); commit it when every run has finished")
  seeds = list(next(iter(distinct)))  # the same in every cell
  select, outcome = test.outcome
  mean = lambda arm, lrs: {lr: np.mean([s[select] for s in by[arm, lr].values()]) for lr in lrs}
  chosen, edge = {}, {}
  for arm in (a, b):
    lrs = mean(arm, [lr for act, lr in by if act == arm])
    if test.grid:
      best = min(on_grid := mean(arm, test.grid), key=on_grid.get)
      if best in test.edge_step and (arm, test.edge_step[best]) not in by:
        edge[arm] = test.edge_step[best]
    chosen[arm] = min(lrs, key=lrs.get)
  if edge:
    return {"edge": edge, "seeds": seeds}
  diffs = [by[(a, chosen[a])][s][outcome] - by[(b, chosen[b])][s][outcome] for s in seeds]
  sd, rule = float(np.std(diffs, ddof=1)), test.rule
  needed = seeds_needed(sd, rule.delta, test.alpha, rule.power, rule.min_seeds)
  n = needed if test.cap is None else min(needed, test.cap)
  return {"lr": chosen, "seeds": seeds, "diffs": diffs, "sd": sd, "needed": needed, "n": n,
          "power": paired_power(n, sd, rule.delta, test.alpha),
          "detectable": detectable(n, sd, test.alpha, rule.power) if sd else 0.0}


def result(test: Test, results: Results) -> dict | None:
  """The test on its fresh seeds (both arms finished): the paired comparison of the outcome, the
  seed sd, and where the reruns on the other platform are committed, the platform's noise: the sd
  of rerun − run over single runs, and the sd of its shift of A − B, (A′ − B′) − (A − B), over
  the seeds whose both arms were rerun; None before any pair has finished."""
  a, b, outcome = test.a, test.b, test.outcome[1]
  runs = results.by_seed(test.study)
  seeds = sorted(s for (act, s) in runs if act == a and (b, s) in runs)
  if not seeds:
    return None
  arm_a, arm_b = ([runs[(arm, s)][outcome] for s in seeds] for arm in (a, b))
  diffs = {s: va - vb for s, va, vb in zip(seeds, arm_a, arm_b)}
  paired = comparisons.paired_difference(arm_a, arm_b, test.rule.delta)
  reruns = results.by_seed(test.reruns)
  platform = [reruns[k][outcome] - runs[k][outcome] for k in reruns if k in runs]
  shift = [(reruns[(a, s)][outcome] - reruns[(b, s)][outcome]) - diffs[s] for s in seeds
           if (a, s) in reruns and (b, s) in reruns]
  unstable = {s for s in seeds  # either arm not stable
              if not runs[(a, s)]["status"] == runs[(b, s)]["status"] == "stable"}
  sd = lambda xs: float(np.std(xs, ddof=1)) if len(xs) > 1 else None
  return {"seeds": seeds, "diffs": diffs, "paired": paired, "unstable_seeds": unstable,
          "means": (float(np.mean(arm_a)), float(np.mean(arm_b))),
          "platform_sd": sd(platform), "platform_n": len(platform),
          "platform_shift_sd": sd(shift), "platform_shift_n": len(shift)}


def verdicts(tests: Sequence[Test], results: Results) -> list[dict | None]:
  """A family's tests judged together: per test (None before any pair) its `result`, its
  simultaneous interval at α/K, the Holm-adjusted p of no difference and of the TOST against ±δ
  (a test without results counting as p = 1, so an interim adjusted p is never smaller than the
  final one would be for that p) and the claim they make."""
  found = [result(t, results) for t in tests]
  p_holm = comparisons.holm([r["paired"].p if r else 1.0 for r in found])
  p_equiv_holm = comparisons.holm([r["paired"].p_equiv if r else 1.0 for r in found])
  out = []
  for t, r, ph, peh in zip(tests, found, p_holm, p_equiv_holm):
    if r is None:
      out.append(None)
      continue
    interval = comparisons.simultaneous_interval(r["paired"], t.k, t.rule.alpha)
    out.append({**r, "interval": interval, "p_holm": ph, "p_equiv_holm": peh,
                "claim": comparisons.claim(interval, t.rule.delta, peh, t.a, t.b)})
  return out


def superseded_claim(d: comparisons.Paired, p_holm: float, p_equiv_holm: float,
                     platform_sd: float | None) -> str:
  """The first families' first rule, replaced by the claim rule and kept to show the re-analysis:
  a Holm verdict, with a difference claimed only where it exceeds both the seed sd and the
  platform sd (unmeasured: not claimed)."""
  verdict = comparisons.verdict(d.mean, p_holm, p_equiv_holm)
  if verdict not in (comparisons.A_BETTER, comparisons.B_BETTER):
    return verdict
  if platform_sd is None:
    return f"{comparisons.NOT_RESOLVED} (p says {verdict}; the platform sd is not measured yet)"
  if abs(d.mean) <= max(d.sd, platform_sd):
    return f"{comparisons.NOT_RESOLVED} (p says {verdict}, but |A - B| is not above the noise)"
  return verdict


def stability(test: Test, results: Results, measures: Sequence[str]) -> dict:
  """arm -> status (docs/metrics.md §6) -> its fresh-seed runs with that status: their number and
  the (least, largest) value of each summary key in `measures`; descriptive."""
  out = {test.a: {}, test.b: {}}
  for (act, _), summary in results.by_seed(test.study).items():
    if act in out:
      out[act].setdefault(summary["status"], []).append(summary)
  return {arm: {status: {"runs": len(runs),
                         **{m: (min(r[m] for r in runs), max(r[m] for r in runs))
                            for m in measures}}
                for status, runs in sorted(by_status.items())}
          for arm, by_status in out.items()}


def by_stability(test: Test, results: Results) -> dict:
  """The paired differences A − B split by whether either arm of the seed is unstable:
  "unstable" / "stable" -> (pairs, mean, sd); descriptive."""
  r = result(test, results)
  groups = {}
  for seed, diff in (r["diffs"] if r else {}).items():
    groups.setdefault("unstable" if seed in r["unstable_seeds"] else "stable", []).append(diff)
  return {g: (len(d), float(np.mean(d)), float(np.std(d, ddof=1)) if len(d) > 1 else None)
          for g, d in sorted(groups.items())}


# --- For a family sized from a short pilot and tested beside the t (report/factorial.py)

def sd_upper(sd: float, n: int, confidence: float = 0.8) -> float:
  """The upper one-sided `confidence` bound of the sd of normal values whose sample sd over n of
  them is `sd`: sd · √((n − 1) / χ²), χ² the chi-square quantile at 1 − confidence, n − 1 df."""
  return sd * math.sqrt((n - 1) / stats.chi2.ppf(1 - confidence, n - 1))


SIGN_FLIP_MAX = 44  # pairs: 2 × 2^22 half sums in memory


def sign_flip_p(diffs: Sequence[float]) -> float:
  """The exact two-sided p of the sign-flip test of no difference: the share of the 2^n sign
  patterns of the n values whose |sum| is at least the observed one (float ties within 1e-9 of
  it count), exact under the sole assumption that each value is symmetric about 0 under the null.
  Every pattern, counted in halves: the 2^(n/2) sums of each half, one sorted."""
  d = np.asarray(diffs, np.float64)
  if not 1 <= d.size <= SIGN_FLIP_MAX or not np.all(np.isfinite(d)):
    raise ValueError(f"sign_flip_p: 1 to {SIGN_FLIP_MAX} finite values, got {d.size}")
  observed = abs(d.sum()) - 1e-9 * np.abs(d).sum()
  if observed <= 0:
    return 1.0
  sums = lambda xs: functools.reduce(lambda s, x: np.concatenate([s + x, s - x]), xs, np.zeros(1))
  left, right = sums(d[: d.size // 2]), np.sort(sums(d[d.size // 2:]))
  above = right.size - np.searchsorted(right, observed - left, "left")   # sum ≥ observed
  below = np.searchsorted(right, -observed - left, "right")              # sum ≤ −observed
  return float((above.sum() + below.sum()) / 2.0 ** d.size)
