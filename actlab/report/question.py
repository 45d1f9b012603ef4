"""A pre-registered question and its answer: cells (each a set of config overrides), contrasts
(weights over cells, taken seed by seed: A − B, or the change of a gap under a factor), a pilot
that chooses each cell's LR on validation (one step past an edge first) and sizes n from the
pilot's sd (its upper confidence bound), fresh seeds that answer it, and the verdicts:
simultaneous intervals held against each margin, Holm over the contrasts, an exact sign-flip test
beside each, the spiking seeds' share. A question file states it as data (`load`, `parse`;
docs/asking.md); this module reads run directories and never trains (actlab.ask does).
"""

import dataclasses
import functools
import json
import math
import pathlib
from typing import Any, Mapping, Sequence

import numpy as np
from scipy import optimize, stats

from actlab import config as config_lib
from actlab.infra import errors
from actlab.infra import workdir as workdir_lib
from actlab.measure.metrics import finite
from actlab.report import comparisons

LR, SEED = "optim.lr", "train.seed"


@dataclasses.dataclass(frozen=True)
class Rule:
  """How a question is sized and judged: each contrast's simultaneous interval at α/K and Holm
  over the K contrasts at family-wise `alpha`; n the smallest (at least `min_seeds`) whose paired
  t-test has `power` against the first margin at α/K, with the pilot's sd at its upper one-sided
  `sd_confidence` bound (None: the sd itself). `shared`: every cell runs the n the most demanding
  contrast asks (else each cell the most its own contrasts ask). `sign_flip`: a direction is
  claimed only where the sign-flip test agrees with the interval (`reconciled`)."""
  alpha: float = comparisons.ALPHA
  power: float = 0.8
  min_seeds: int = 10
  sd_confidence: float | None = 0.8
  shared: bool = True
  sign_flip: bool = True


@dataclasses.dataclass(frozen=True)
class Pilot:
  """The pilot's seeds and LRs (one LR: fixed, nothing chosen); `edge` maps an LR at the grid's
  edge to the step past it, run once (on the same seeds) for a cell whose best LR sits there."""
  seeds: tuple[int, ...]
  lrs: tuple[float, ...]
  edge: Mapping[float, float] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class Contrast:
  """Σ weight · outcome over cells, seed by seed; below 0 says `a` is lower than `b` (the claim's
  words). `cap` bounds its seeds below the question's."""
  name: str
  weights: Mapping[str, float]
  question: str = ""
  a: str = ""
  b: str = ""
  cap: int | None = None


@dataclasses.dataclass(frozen=True)
class Question:
  """A question as its file states it. `by_cell` gives a cell its own pilot or outcome; `runs`
  names the directories (under the question's directory) of runs made before actlab.ask: "pilot"
  and "fresh" -> directories."""
  name: str
  config: str                              # the base config, "configs/x.py[:arg]"
  fixed: Mapping[str, Any]                 # the fields every cell shares
  cells: Mapping[str, Mapping[str, Any]]   # cell -> its fields
  contrasts: tuple[Contrast, ...]
  pilot: Pilot
  first_seed: int
  cap: int | None
  margins: tuple[float, ...] = (0.1,)
  rule: Rule = Rule()
  outcome: tuple[str, str] = ("final_val_loss", "final_test_loss")  # chosen on, tested on
  spike: float = 10.0
  descriptive: tuple[Contrast, ...] = ()
  text: str = ""
  by_cell: Mapping[str, Mapping[str, Any]] = dataclasses.field(default_factory=dict)
  runs: Mapping[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)

  @property
  def k(self) -> int:
    return len(self.contrasts)

  @property
  def alpha(self) -> float:
    """α/K: the level of the power rule and of each simultaneous interval."""
    return self.rule.alpha / self.k

  def pilot_of(self, cell: str) -> Pilot:
    return self.by_cell.get(cell, {}).get("pilot", self.pilot)

  def outcome_of(self, cell: str) -> tuple[str, str]:
    return self.by_cell.get(cell, {}).get("outcome", self.outcome)


# --- The question file

class QuestionError(config_lib.ConfigError):
  """A mistake in a question file: one line naming the field."""


KEYS = ("question", "config", "fixed", "cells", "contrasts", "descriptive", "pilot", "fresh",
        "margins", "rule", "outcome", "spike", "by_cell", "runs")


def load(spec: str) -> Question:
  """`path/to/question.py[:arg]` → the Question its `get_question(arg)` states."""
  path, _, arg = spec.partition(":")
  try:
    d = errors.call_file(path, "get_question", arg or None, kind="question")
  except ValueError as e:
    raise QuestionError(f"question {spec!r}: {e}") from None
  return parse(d, pathlib.Path(path).stem + (f":{arg}" if arg else ""))


def parse(d: Any, name: str) -> Question:
  """A question file's dict, checked field by field, as a Question."""
  def need(ok: bool, field: str, what: str):
    if not ok:
      raise QuestionError(f"question {name}: {field}: {what}")

  need(isinstance(d, dict), "get_question()", "return a dict")
  unknown = sorted(set(d) - set(KEYS))
  need(not unknown, str(unknown), f"unknown key(s); use {', '.join(KEYS)}")
  for key in ("config", "cells", "contrasts", "pilot", "fresh"):
    need(key in d, key, "missing")
  need(isinstance(d["config"], str) and d["config"], "config", "a config file[:arg]")
  fixed = d.get("fixed", {})
  need(isinstance(fixed, dict) and all(isinstance(k, str) and "." in k for k in fixed), "fixed",
       "a dict of section.field -> value")
  cells = d["cells"]
  need(isinstance(cells, dict) and len(cells) >= 2, "cells", "a dict of at least two cells")
  for cell, fields in cells.items():
    need(isinstance(cell, str) and cell.replace("_", "").replace("-", "").isalnum(),
         f"cells: {cell!r}", "name a cell with letters, digits, _ or -")
    need(isinstance(fields, dict) and all(isinstance(k, str) and "." in k for k in fields)
         and not {LR, SEED} & set(fields), f"cells.{cell}",
         f"a dict of section.field -> value (not {LR} or {SEED}: the pilot chooses those)")
  same = [(a, b) for i, a in enumerate(cells) for b in list(cells)[i + 1:]
          if {**fixed, **cells[a]} == {**fixed, **cells[b]}]
  need(not same, f"cells {same[:1]}", "two cells with the same fields")

  def contrast(key: str, cname: str, c: Any) -> Contrast:
    field = f"{key}.{cname}"
    if isinstance(c, dict) and "weights" not in c:
      c = {"weights": c}
    need(isinstance(c, dict) and set(c) <= {"weights", "question", "a", "b", "cap"}, field,
         "{cell: weight} or {weights, question, a, b, cap}")
    w = c["weights"]
    need(isinstance(w, dict) and w and all(cell in cells for cell in w), f"{field}.weights",
         f"weights over the cells ({', '.join(cells)})")
    need(all(isinstance(x, (int, float)) and not isinstance(x, bool) and x for x in w.values()),
         f"{field}.weights", "non-zero numbers")
    ones = [cell for cell, x in w.items() if x > 0], [cell for cell, x in w.items() if x < 0]
    a, b = (c.get("a") or " + ".join(ones[0]), c.get("b") or " + ".join(ones[1]) or "0")
    cap = c.get("cap")
    need(cap is None or (isinstance(cap, int) and cap >= 2), f"{field}.cap", "an integer >= 2")
    return Contrast(cname, {cell: float(x) for cell, x in w.items()}, c.get("question", ""),
                    a, b, cap)

  for key in ("contrasts", "descriptive"):
    need(isinstance(d.get(key, {}), dict), key, "a dict of name -> weights")
  contrasts = tuple(contrast("contrasts", n, c) for n, c in d["contrasts"].items())
  if len(contrasts) == 1 and not contrasts[0].question:  # a two-arm question's one contrast
    contrasts = (dataclasses.replace(contrasts[0], question=d.get("question", "")),)
  descriptive = tuple(contrast("descriptive", n, c) for n, c in d.get("descriptive", {}).items())
  need(bool(contrasts), "contrasts", "at least one")

  def pilot(field: str, p: Any) -> Pilot:
    need(isinstance(p, dict) and set(p) <= {"seeds", "lrs", "lr", "edge"}
         and ("lrs" in p) != ("lr" in p) and "seeds" in p, field,
         "{seeds, lrs (a grid) or lr (fixed), edge}")
    seeds, lrs = p["seeds"], p["lrs"] if "lrs" in p else [p["lr"]]
    need(isinstance(seeds, (list, tuple)) and len(set(seeds)) == len(seeds) >= 2
         and all(isinstance(s, int) for s in seeds), f"{field}.seeds", "two or more seeds")
    need(isinstance(lrs, (list, tuple)) and lrs and len(set(lrs)) == len(lrs)
         and all(isinstance(x, (int, float)) and x > 0 for x in lrs), f"{field}.lrs",
         "distinct LRs > 0")
    edge = {float(k): float(v) for k, v in p.get("edge", {}).items()}
    need(all(k in (min(lrs), max(lrs)) and v not in lrs and (v < k if k == min(lrs) else v > k)
             for k, v in edge.items()) and len(lrs) > 1 or not edge, f"{field}.edge",
         "{an edge LR of the grid: the LR one step past it}")
    return Pilot(tuple(seeds), tuple(float(x) for x in lrs), edge)

  fresh = d["fresh"]
  need(isinstance(fresh, dict) and set(fresh) <= {"first_seed", "cap"} and "first_seed" in fresh,
       "fresh", "{first_seed, cap}")
  cap = fresh.get("cap")
  need(isinstance(fresh["first_seed"], int), "fresh.first_seed", "an integer")
  need(cap is None or (isinstance(cap, int) and cap >= 2), "fresh.cap", "an integer >= 2")
  rule_fields = {f.name for f in dataclasses.fields(Rule)}
  rule = d.get("rule", {})
  need(isinstance(rule, dict) and set(rule) <= rule_fields, "rule",
       f"a dict of {', '.join(sorted(rule_fields))}")
  rule = Rule(**rule)
  number = lambda x: isinstance(x, (int, float)) and not isinstance(x, bool)
  need(number(rule.alpha) and number(rule.power) and isinstance(rule.min_seeds, int)
       and 0 < rule.alpha < 1 and 0 < rule.power < 1 and rule.min_seeds >= 2 and (
           rule.sd_confidence is None or number(rule.sd_confidence)
           and 0.5 <= rule.sd_confidence < 1), "rule",
       "alpha and power in (0, 1), min_seeds >= 2, sd_confidence in [0.5, 1) or None")
  margins = d.get("margins", (0.1,))
  need(isinstance(margins, (list, tuple)) and margins
       and all(number(m) and m > 0 for m in margins), "margins",
       "one or more numbers > 0 (the first sizes n)")
  margins = tuple(margins)
  outcome = tuple(d.get("outcome", Question.outcome))
  need(len(outcome) == 2 and all(isinstance(o, str) for o in outcome), "outcome",
       "[the summary key chosen on, the summary key tested on]")
  by_cell = {}
  for cell, own in d.get("by_cell", {}).items():
    need(cell in cells and isinstance(own, dict) and set(own) <= {"pilot", "outcome"},
         f"by_cell.{cell}", "a cell's own {pilot, outcome}")
    by_cell[cell] = {**({"pilot": pilot(f"by_cell.{cell}.pilot", own["pilot"])}
                        if "pilot" in own else {}),
                     **({"outcome": tuple(own["outcome"])} if "outcome" in own else {})}
  runs = d.get("runs", {})
  need(isinstance(runs, dict) and set(runs) <= {"pilot", "fresh"}, "runs",
       "{pilot: [directories], fresh: [directories]}")
  spike = d.get("spike", 10.0)
  need(isinstance(spike, (int, float)) and spike > 1, "spike", "a number > 1")
  return Question(name, d["config"], dict(fixed), {c: dict(f) for c, f in cells.items()},
                  contrasts, pilot("pilot", d["pilot"]), fresh["first_seed"], cap, margins, rule,
                  outcome, float(spike), descriptive, d.get("question", ""), by_cell,
                  {k: tuple(v) for k, v in runs.items()})


def base_config(q: Question):
  """The question's base config (its `config` file's `get_config(arg)`) with `fixed` set."""
  path, _, arg = q.config.partition(":")
  config = errors.call_file(path, "get_config", arg or None, kind="config")
  try:
    return config_lib.override(config, q.fixed)
  except config_lib.ConfigError as e:
    raise QuestionError(f"question {q.name}: fixed: {e}") from None


def cell_configs(q: Question) -> dict[str, dict]:
  """cell -> its config as dotted fields, validated (at the pilot's first LR)."""
  base, out = base_config(q), {}
  for cell, fields in q.cells.items():
    try:
      config = config_lib.override(base.copy_and_resolve_references(),
                                   {**fields, LR: q.pilot_of(cell).lrs[0]})
      config_lib.validate(config)
    except config_lib.ConfigError as e:
      raise QuestionError(f"question {q.name}: cells.{cell}: {e}") from None
    out[cell] = workdir_lib.dotted(json.loads(config.to_json()))
  return out


# --- Runs

def cell_runs(q: Question, dirs: Sequence[pathlib.Path]) -> dict[str, dict[tuple, dict]]:
  """cell -> (LR, seed) -> the summary of each finished run under `dirs` that is one of the
  question's cells: every field `fixed` and the cell set at its value (a field a run's config
  predates at its value of then), the cell setting most fields where several match (a cell
  whose fields extend another's); a tie is refused. The first directory holding a run wins."""
  plain = lambda v: json.loads(json.dumps(v))  # tuples as lists, as config.json holds them
  want = {cell: plain({k: v for k, v in {**q.fixed, **fields}.items()
                       if not k.startswith(config_lib.RUNTIME_FIELDS)})
          for cell, fields in q.cells.items()}
  out = {}
  for d in dirs:
    for summary in sorted(pathlib.Path(d).glob("*/summary.json")):
      config = workdir_lib.read_json(summary.parent / "config.json")
      if not config:
        continue
      fields = workdir_lib.dotted(workdir_lib.with_added_fields(config))
      match = sorted(((len(w), cell) for cell, w in want.items()
                      if all(k in fields and fields[k] == v for k, v in w.items())), reverse=True)
      if len(match) > 1 and match[0][0] == match[1][0]:
        raise QuestionError(f"question {q.name}: {summary.parent} is a run of cells "
                            f"{match[0][1]} and {match[1][1]} alike; give them fields that differ")
      if match:
        key = (float(fields[LR]), int(fields[SEED]))
        out.setdefault(match[0][1], {}).setdefault(key, json.loads(summary.read_text()))
  return out


def has_finite(summary: dict | None, key: str) -> bool:
  """Whether a run's summary holds a finite `key` (a diverged run's losses are not)."""
  return summary is not None and finite(summary.get(key))


def run_wall(summary: dict) -> float:
  """A run's wall time: a vectorized program's shared among the runs it trained."""
  return summary["wall_time_sec"] / summary.get("vectorized_runs", 1)


# --- Sizing

def paired_power(n: int, sd: float, delta: float, alpha: float) -> float:
  """The power of a two-sided paired t-test of n pairs at `alpha` against a mean difference
  `delta` when the differences' sd is `sd` (noncentral t)."""
  if sd == 0:
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
  """The mean difference n pairs detect with `power` at `alpha`."""
  if sd == 0:
    return 0.0
  most = (stats.t.ppf(1 - alpha / 2, n - 1) + 10) * sd / math.sqrt(n)
  return optimize.brentq(lambda d: paired_power(n, sd, d, alpha) - power, 0.0, most)


def sd_upper(sd: float, n: int, confidence: float = 0.8) -> float:
  """The upper one-sided `confidence` bound of the sd of normal values whose sample sd over n of
  them is `sd`: sd · √((n − 1) / χ²), χ² the chi-square quantile at 1 − confidence, n − 1 df."""
  return sd * math.sqrt((n - 1) / stats.chi2.ppf(1 - confidence, n - 1))


class Incomplete(ValueError):
  """A stage's runs are not all there yet."""


def choice(q: Question, cell: str, runs: Mapping[tuple, dict]) -> tuple[str, Any]:
  """A cell's LR from its pilot `runs`: the lowest mean of the outcome chosen on over the pilot's
  seeds (a diverged run rules its LR out), among the grid and, where run, the step past its edge:
  ("lr", LR) or ("again at the edge", LR); ("edge", the LR to run) while its best sits at an edge
  whose step is not run; ("missing", [(LR, seed), ...]) while a run of the grid is not in."""
  p, select = q.pilot_of(cell), q.outcome_of(cell)[0]
  gaps = [(lr, s) for lr in p.lrs for s in p.seeds if (lr, s) not in runs]
  if gaps:
    return "missing", gaps
  mean = lambda lr: float(np.mean([runs[lr, s][select] if has_finite(runs[lr, s], select)
                                   else math.inf for s in p.seeds]))
  best = min(p.lrs, key=mean)
  if best not in p.edge:
    return "lr", best
  past = p.edge[best]
  if any((past, s) not in runs for s in p.seeds):
    return "edge", past
  best = min((*p.lrs, past), key=mean)
  return ("again at the edge" if best == past else "lr"), best


def choose(q: Question, pilot_runs: Mapping[str, Mapping[tuple, dict]]) -> dict:
  """Each cell's `choice`: {"edge": {cell: LR to run}} while a cell waits for the step past an
  edge, else {"lr": {cell: LR}, "at_edge": [cells again best at an edge]}; Incomplete while a
  cell lacks a run of its grid."""
  found = {cell: choice(q, cell, pilot_runs.get(cell, {})) for cell in q.cells}
  missing = {cell: v for cell, (kind, v) in found.items() if kind == "missing"}
  if missing:
    cell, gaps = next(iter(missing.items()))
    raise Incomplete(f"the pilot is not complete: {len(missing)} cell(s) lack runs, e.g. "
                     f"{cell} at (LR, seed) {gaps[:3]}")
  edge = {cell: v for cell, (kind, v) in found.items() if kind == "edge"}
  if edge:
    return {"edge": edge}
  return {"lr": {cell: v for cell, (_, v) in found.items()},
          "at_edge": [cell for cell, (kind, _) in found.items() if kind == "again at the edge"]}


def values(c: Contrast, runs: Mapping[str, Mapping[tuple, dict]], lrs: Mapping[str, float],
           seeds: Sequence[int], outcome) -> list[float]:
  """The contrast at each seed: Σ weight · the cell's outcome (tested on) at its LR."""
  return [float(sum(w * runs[cell][lrs[cell], s][outcome(cell)[1]]
                    for cell, w in c.weights.items())) for s in seeds]


def size(q: Question, pilot_runs: Mapping[str, Mapping[tuple, dict]],
         lrs: Mapping[str, float]) -> dict:
  """The pilot's sizing at the chosen LRs: per contrast its values, sd, the bound the rule takes,
  the seeds that asks (`needed`) and at its cap (`n`) the power and the difference detected with
  the rule's power; each cell's n (`cell_n`). A pilot value that is not finite stops it."""
  delta, out = q.margins[0], {}
  for c in q.contrasts:
    seeds = sorted(set.intersection(*(set(q.pilot_of(cell).seeds) for cell in c.weights)))
    if len(seeds) < 2:
      raise QuestionError(f"question {q.name}: contrast {c.name}: its cells share fewer than two "
                          "pilot seeds")
    bad = [(cell, s) for cell in c.weights for s in seeds
           if not has_finite(pilot_runs[cell][lrs[cell], s], q.outcome_of(cell)[1])]
    if bad:
      raise QuestionError(f"question {q.name}: pilot runs without a finite outcome (cell, seed): "
                          f"{bad}; the sizing rule does not say what to do: state it first")
    v = values(c, pilot_runs, lrs, seeds, q.outcome_of)
    sd = float(np.std(v, ddof=1))
    bound = sd if q.rule.sd_confidence is None else sd_upper(sd, len(v), q.rule.sd_confidence)
    needed = seeds_needed(bound, delta, q.alpha, q.rule.power, q.rule.min_seeds)
    out[c.name] = {"seeds": seeds, "values": v, "sd": sd, "bound": bound, "needed": needed}
  cap = lambda c: min(x for x in (c.cap, q.cap, math.inf) if x is not None)
  most = max(s["needed"] for s in out.values())
  for c in q.contrasts:
    s = out[c.name]
    s["n"] = int(min(most if q.rule.shared else s["needed"], cap(c)))
    s["power"] = paired_power(s["n"], s["bound"], delta, q.alpha)
    s["detectable"] = detectable(s["n"], s["bound"], q.alpha, q.rule.power)
  cell_n = {cell: max(out[c.name]["n"] for c in q.contrasts if cell in c.weights)
            for cell in q.cells if any(cell in c.weights for c in q.contrasts)}
  if q.rule.shared:
    cell_n = dict.fromkeys(q.cells, max(s["n"] for s in out.values()))
  return {"contrasts": out, "cell_n": cell_n, "needed": most}


def fresh_seeds(q: Question, n: int) -> list[int]:
  return list(range(q.first_seed, q.first_seed + n))


# --- Verdicts

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


def reconciled(claim: str, interval: tuple[float, float], margin: float, p_sign_holm: float,
               alpha: float = comparisons.ALPHA) -> str:
  """The claim beside the sign-flip test: a direction is claimed only where the t interval
  excludes 0 and the Holm-adjusted sign-flip p is at most `alpha`; where one finds a direction
  and the other does not, the verdict keeps none (an equivalence, the TOST's, stands) and says
  which one disagrees."""
  low, high = interval
  by_t, by_sign = high < 0 or low > 0, p_sign_holm <= alpha
  if by_t == by_sign:
    return claim
  kept = f"equivalent within ±{margin:g}" if claim.startswith("equivalent") else (
      comparisons.NOT_RESOLVED)
  if by_t:
    return f"{kept} (the t interval excludes 0, the sign-flip test does not reject it)"
  return f"{kept} (the sign-flip test rejects 0, the t interval does not exclude it)"


def spiking_share(q: Question, c: Contrast, runs, lrs, seeds: Sequence[int],
                  v: Sequence[float]) -> dict:
  """How much of the contrast's mean the spiking seeds carry (descriptive): a seed spikes where a
  run of a cell the contrast weighs passes `q.spike` × its initial gradient norm; "carried" is
  the mean over all seeds less the mean over the seeds without a spike."""
  rel = lambda cell, s: runs[cell][lrs[cell], s].get("grad_norm_max_rel")
  known = all(has_finite(runs[cell][lrs[cell], s], "grad_norm_max_rel") for cell in c.weights
              for s in seeds)
  spiking = [s for s in seeds if known and any(rel(cell, s) > q.spike for cell in c.weights)]
  by_seed = dict(zip(seeds, v))
  rest = [by_seed[s] for s in seeds if s not in spiking]
  mean = float(np.mean(v))
  rest_mean = float(np.mean(rest)) if rest else math.nan
  return {"known": known, "spiking_seeds": spiking, "without_spikes": rest_mean,
          "carried": mean - rest_mean if known else math.nan}


def verdicts(q: Question, fresh_runs: Mapping[str, Mapping[tuple, dict]],
             lrs: Mapping[str, float], sizing: dict) -> dict:
  """The question on its fresh seeds: per contrast (None before two seeds) the seeds it is
  tested on (its first n fresh seeds that every cell it weighs finished with a finite outcome,
  and with `rule.shared` every other cell that ran the seed: while other cells train, a contrast
  whose own cells are done is answered; those with a diverged run are listed), the paired
  statistics, the simultaneous interval at α/K, the Holm-adjusted p, the exact sign-flip p (and
  Holm), at each margin the TOST p (Holm) and the claim, the verdict and the spiking seeds'
  share. A contrast without results counts as p = 1 in Holm, so an interim adjusted p is never
  smaller than the final one would be. Descriptive contrasts: unadjusted paired statistics."""
  outcome = lambda cell: q.outcome_of(cell)[1]
  done = lambda cell, s: has_finite(fresh_runs.get(cell, {}).get((lrs[cell], s)), outcome(cell))
  ran = lambda cell, s: (lrs[cell], s) in fresh_runs.get(cell, {})
  found, n_most = {}, max(sizing["cell_n"].values())
  for c in (*q.contrasts, *q.descriptive):
    n = sizing["contrasts"][c.name]["n"] if c.name in sizing["contrasts"] else n_most
    cells = list(q.cells) if q.rule.shared else list(c.weights)
    seeds = [s for s in fresh_seeds(q, n) if all(ran(cell, s) for cell in c.weights)]
    tested = [s for s in seeds if all(done(cell, s) for cell in cells if ran(cell, s))]
    v = values(c, fresh_runs, lrs, tested, q.outcome_of) if tested else []
    found[c.name] = {"n_planned": n, "seeds": tested, "left_out": sorted(set(seeds) - set(tested)),
                     "values": v}
  has = lambda c: len(found[c.name]["seeds"]) >= 2
  paired = {c.name: {m: comparisons.paired_difference(found[c.name]["values"],  # at each margin
                                                      np.zeros(len(found[c.name]["values"])), m)
                     for m in q.margins} for c in q.contrasts if has(c)}
  first = {name: at[q.margins[0]] for name, at in paired.items()}
  p_holm = comparisons.holm([first[c.name].p if has(c) else 1.0 for c in q.contrasts])
  sign = [sign_flip_p(found[c.name]["values"]) if has(c) and len(found[c.name]["values"])
          <= SIGN_FLIP_MAX else math.nan if has(c) else 1.0 for c in q.contrasts]
  sign_holm = comparisons.holm([1.0 if math.isnan(p) else p for p in sign])
  equiv = {m: comparisons.holm([paired[c.name][m].p_equiv if has(c) else 1.0
                                for c in q.contrasts]) for m in q.margins}
  out = {}
  for i, c in enumerate(q.contrasts):
    f = found[c.name]
    if not has(c):
      out[c.name] = None
      continue
    d = first[c.name]
    interval = comparisons.simultaneous_interval(d, q.k, q.rule.alpha)
    at = {}
    for m in q.margins:
      claim = comparisons.claim(interval, m, equiv[m][i], c.a, c.b, q.rule.alpha)
      at[m] = {"p_equiv": paired[c.name][m].p_equiv, "p_equiv_holm": float(equiv[m][i]),
               "claim": claim,
               "verdict": reconciled(claim, interval, m, sign_holm[i], q.rule.alpha)
               if q.rule.sign_flip else claim}
    means = {cell: float(np.mean([fresh_runs[cell][lrs[cell], s][outcome(cell)]
                                  for s in f["seeds"]])) for cell in c.weights}
    out[c.name] = {**f, "paired": d, "interval": interval, "p_holm": float(p_holm[i]),
                   "p_sign": sign[i], "p_sign_holm": float(sign_holm[i]), "margins": at,
                   "means": means,
                   "spikes": spiking_share(q, c, fresh_runs, lrs, f["seeds"], f["values"])}
  for c in q.descriptive:
    f = found[c.name]
    out[c.name] = {**f, "paired": comparisons.paired_difference(f["values"],
                                                                np.zeros(len(f["values"])))}
  return out
