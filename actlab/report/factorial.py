"""A factorial family of pre-registered contrasts: `Contrast`s, linear combinations of a
`Factorial`'s cells taken seed by seed (differences of differences), every cell trained on the same
seeds at fixed settings; sized by the upper confidence bound of each contrast's pilot sd (`pilot`)
and judged by the claim rule with an exact sign-flip test beside each interval (`verdicts`). Reads
committed run directories (`Results`); never trains. experiments/primary_tests.py states the
project's third family with it.
"""

import dataclasses
import json
import math
from typing import Any, Mapping, Sequence

import numpy as np

from actlab.infra import workdir
from actlab.report import comparisons
from actlab.report.preregistered import (Results, Rule, detectable, paired_power, seeds_needed,
                                          sd_upper, sign_flip_p)


@dataclasses.dataclass(frozen=True)
class Contrast:
  """A linear combination of a factorial's cells, taken seed by seed: Σ weight · outcome. A value
  below 0 says `a` is lower than `b` (the claim's words)."""
  name: str
  question: str
  weights: Mapping[str, float]     # cell -> its weight
  a: str
  b: str


@dataclasses.dataclass(frozen=True)
class Factorial:
  """A family of `contrasts` over the `cells` of one design, every cell trained on the same seeds
  at fixed settings (no LR chosen): a pilot (`pilot_seeds`, study `primary_<name>_pilot`) sizes
  it, the fresh seeds (from `first_seed`, study `primary_<name>`) answer it. n is the largest
  that any contrast asks for: the seeds whose paired t-test has `rule.power` against
  `rule.delta` at α/K with the contrast's sd at its upper one-sided `sd_confidence` bound from the
  pilot, at least `rule.min_seeds` and at most `cap`. Verdicts at every margin of `margins`; a
  seed's run spikes where its largest gradient norm passes `spike` × its initial one."""
  name: str
  cells: Mapping[str, Mapping[str, Any]]  # cell -> the config fields (dotted) that make it
  contrasts: tuple[Contrast, ...]
  pilot_seeds: tuple[int, ...]
  first_seed: int
  cap: int
  rule: Rule = Rule()
  margins: tuple[float, ...] = (0.1, 0.05)
  sd_confidence: float = 0.8
  outcome: str = "final_test_loss"
  spike: float = 10.0
  descriptive: tuple[Contrast, ...] = ()  # reported beside the family, not tested

  @property
  def k(self) -> int:
    return len(self.contrasts)

  @property
  def alpha(self) -> float:
    return self.rule.alpha / self.k

  @property
  def pilot_study(self) -> str:
    return f"primary_{self.name}_pilot"

  @property
  def study(self) -> str:
    return f"primary_{self.name}"

  def fresh_seeds(self, n: int) -> list[int]:
    return list(range(self.first_seed, self.first_seed + n))


def cell_of(fam: Factorial, config: dict) -> str | None:
  """The cell of `fam` a run's nested config.json belongs to (every field of the cell alike, a
  field the config predates at its value of then), or None."""
  fields = workdir.dotted(workdir.with_added_fields(config))
  found = [cell for cell, want in fam.cells.items()
           if all(k in fields and fields[k] == v for k, v in want.items())]
  return found[0] if len(found) == 1 else None


def cell_runs(fam: Factorial, results: Results, study: str) -> dict[str, dict[int, dict]]:
  """cell -> seed -> the summary of each finished run of `study` in one of `fam`'s cells."""
  out = {}
  for summary in (results.root / study).glob("*/summary.json"):
    config = json.loads((summary.parent / "config.json").read_text())
    cell = cell_of(fam, config)
    if cell is not None:
      out.setdefault(cell, {})[config["train"]["seed"]] = json.loads(summary.read_text())
  return out


def shared_seeds(fam: Factorial, runs: Mapping[str, Mapping[int, dict]]) -> list[int]:
  """The seeds every cell of `fam` has finished."""
  seeds = [set(runs.get(cell, {})) for cell in fam.cells]
  return sorted(set.intersection(*seeds))


def has_finite(summary: dict, key: str) -> bool:
  """Whether a run's summary has a finite `key` (a diverged run's losses are not)."""
  value = summary.get(key)
  return isinstance(value, (int, float)) and math.isfinite(value)


def contrast_values(c: Contrast, runs: Mapping[str, Mapping[int, dict]], seeds: Sequence[int],
                    outcome: str) -> list[float]:
  """The contrast's value at each of `seeds`: Σ weight · the cell's outcome."""
  return [float(sum(w * runs[cell][s][outcome] for cell, w in c.weights.items())) for s in seeds]


def pilot(fam: Factorial, results: Results) -> dict | None:
  """The pilot's sizing: per contrast its values, sd, the sd's upper bound and the seeds that
  asks for; n (the most any asks, capped) and each contrast's power at n at its bound. None until
  the pilot is committed, ValueError while it is incomplete (not every cell at every pilot
  seed)."""
  runs = cell_runs(fam, results, fam.pilot_study)
  if not runs:
    return None
  missing = {cell: gap for cell in fam.cells
             if (gap := sorted(set(fam.pilot_seeds) - set(runs.get(cell, {}))))}
  if missing:
    raise ValueError(f"family {fam.name}: its pilot is incomplete (seeds missing per cell: "
                     f"{missing}); commit it when every run has finished")
  seeds, rule, out = list(fam.pilot_seeds), fam.rule, {}
  unfinished = [(cell, s) for cell in fam.cells for s in seeds
                if not has_finite(runs[cell][s], fam.outcome)]
  if unfinished:
    raise ValueError(f"family {fam.name}: pilot runs without a finite {fam.outcome} (cell, seed): "
                     f"{unfinished}; the sizing rule does not say what to do: state it first")
  for c in fam.contrasts:
    values = contrast_values(c, runs, seeds, fam.outcome)
    sd = float(np.std(values, ddof=1))
    upper = sd_upper(sd, len(values), fam.sd_confidence)
    out[c.name] = {"values": values, "sd": sd, "sd_upper": upper,
                   "needed": seeds_needed(upper, rule.delta, fam.alpha, rule.power, rule.min_seeds)}
  needed = max(c["needed"] for c in out.values())
  n = min(needed, fam.cap)
  for c in out.values():
    c["power"] = paired_power(n, c["sd_upper"], rule.delta, fam.alpha)
    c["detectable"] = detectable(n, c["sd_upper"], fam.alpha, rule.power) if c["sd_upper"] else 0.0
  return {"seeds": seeds, "contrasts": out, "needed": needed, "n": n}


def reconciled(claim: str, interval: tuple[float, float], margin: float, p_sign_holm: float,
               alpha: float = comparisons.ALPHA) -> str:
  """The claim rule's verdict (`comparisons.claim` of `interval` against ±`margin`) beside the
  sign-flip test, as stated before the runs: a direction is claimed only where the t interval
  excludes 0 and the Holm-adjusted sign-flip p is at most `alpha`; where one of them finds a
  direction and the other does not, the verdict keeps none (an equivalence, the TOST's, stands)
  and says which one disagrees."""
  low, high = interval
  by_t, by_sign = high < 0 or low > 0, p_sign_holm <= alpha
  if by_t == by_sign:
    return claim
  equivalent = claim.startswith("equivalent")
  kept = f"equivalent within ±{margin:g}" if equivalent else comparisons.NOT_RESOLVED
  if by_t:
    return f"{kept} (the t interval excludes 0, the sign-flip test does not reject it)"
  return f"{kept} (the sign-flip test rejects 0, the t interval does not exclude it)"


def spiking_share(fam: Factorial, c: Contrast, runs: Mapping[str, Mapping[int, dict]],
                  seeds: Sequence[int]) -> dict:
  """How much of the contrast's mean the spiking seeds carry (descriptive): a seed spikes where
  any run of a cell the contrast weighs passes `fam.spike` × its initial gradient norm; "carried"
  is the mean over all seeds less the mean over the seeds without a spike."""
  values = dict(zip(seeds, contrast_values(c, runs, seeds, fam.outcome)))
  spiking = [s for s in seeds if any(runs[cell][s]["grad_norm_max_rel"] > fam.spike
                                     for cell in c.weights)]
  rest = [values[s] for s in seeds if s not in spiking]
  mean = float(np.mean(list(values.values())))
  rest_mean = float(np.mean(rest)) if rest else math.nan
  return {"spiking_seeds": spiking, "mean": mean, "without_spikes": rest_mean,
          "spiking_mean": float(np.mean([values[s] for s in spiking])) if spiking else math.nan,
          "carried": mean - rest_mean}


def verdicts(fam: Factorial, results: Results) -> dict | None:
  """The family on its fresh seeds (those every cell has finished with a finite outcome; a seed
  with a diverged run is left out, and listed; None before one is in): per contrast its values,
  the paired statistics, the simultaneous interval at α/K, the Holm-adjusted p of no difference,
  the exact sign-flip p (and Holm), at each margin the TOST p (Holm) and the claim, the verdict
  beside the sign-flip test (`reconciled`) and the spiking seeds' share."""
  runs = cell_runs(fam, results, fam.study)
  finished = shared_seeds(fam, runs) if runs else []
  seeds = [s for s in finished if all(has_finite(runs[c][s], fam.outcome) for c in fam.cells)]
  if not seeds:
    return None
  values = {c.name: contrast_values(c, runs, seeds, fam.outcome) for c in fam.contrasts}
  zeros = np.zeros(len(seeds))
  paired = {name: {m: comparisons.paired_difference(v, zeros, m) for m in fam.margins}
            for name, v in values.items()}
  first = lambda name: paired[name][fam.margins[0]]
  p_holm = comparisons.holm([first(c.name).p for c in fam.contrasts])
  sign = [sign_flip_p(values[c.name]) for c in fam.contrasts]
  sign_holm = comparisons.holm(sign)
  equiv_holm = {m: comparisons.holm([paired[c.name][m].p_equiv for c in fam.contrasts])
                for m in fam.margins}
  out = {}
  for i, c in enumerate(fam.contrasts):
    interval = comparisons.simultaneous_interval(first(c.name), fam.k, fam.rule.alpha)
    at = {}
    for m in fam.margins:
      claim = comparisons.claim(interval, m, equiv_holm[m][i], c.a, c.b, fam.rule.alpha)
      at[m] = {"p_equiv": paired[c.name][m].p_equiv, "p_equiv_holm": float(equiv_holm[m][i]),
               "claim": claim,
               "verdict": reconciled(claim, interval, m, sign_holm[i], fam.rule.alpha)}
    out[c.name] = {"values": dict(zip(seeds, values[c.name])), "paired": first(c.name),
                   "interval": interval, "p_holm": float(p_holm[i]), "p_sign": sign[i],
                   "p_sign_holm": float(sign_holm[i]), "margins": at,
                   "spikes": spiking_share(fam, c, runs, seeds)}
  return {"seeds": seeds, "left_out": sorted(set(finished) - set(seeds)), "contrasts": out,
          "descriptive": {c.name: comparisons.paired_difference(
              contrast_values(c, runs, seeds, fam.outcome), zeros) for c in fam.descriptive}}
