"""A question's runs to its answer (docs/asking.md): which run is which cell, each cell's LR
chosen on its pilot (one step past an edge first), n from the pilot's sd, where the stages stand
(`read`, once, for `plan`, `run` and `report` alike), the verdicts on the fresh seeds, whether
each survives leaving out one seed, and the runs they leave out and why. Reads run directories;
never trains (actlab.ask does)."""

import dataclasses
import json
import math
import pathlib
from typing import Any, Collection, Mapping, Sequence

import numpy as np

from actlab import config as config_lib
from actlab.infra import workdir as workdir_lib
from actlab.measure.metrics import finite
from actlab.report import comparisons as C
from actlab.report.question import LR, SEED, Contrast, Question, QuestionError

Runs = dict[str, dict[tuple, dict]]  # cell -> (LR, seed) -> a finished run's summary


def dirs(q: Question, root: pathlib.Path, stage: str) -> list[pathlib.Path]:
  """Where the runs of `stage` ("pilot", with the step past an edge and the cells that take
  another's LR, or "fresh") lie: every
  directory of that stage under `root`, whichever cells trained into it (`<stage>-<cells>/`), or
  for runs made before actlab.ask, the directories `runs` names."""
  if q.runs:
    return [root / d for d in q.runs.get(stage, ())]
  stages = ("pilot", "edge", "transfer") if stage == "pilot" else (stage,)
  return sorted(d for s in stages for d in (root / s, *root.glob(f"{s}-*")) if d.is_dir())


def cell_runs(q: Question, where: Sequence[pathlib.Path]) -> tuple[Runs, list[str]]:
  """The finished runs under `where` that are the question's cells: every field `fixed` and the
  cell set at its value (a field a run's config predates at its value of then), the cell setting
  most fields where several match (a tie is refused); the first directory holding a run wins.
  Beside them, a line for each run whose config.json or summary.json could not be read: never
  read as a result."""
  plain = lambda v: json.loads(json.dumps(v))  # tuples as lists, as config.json holds them
  want = {cell: plain({k: v for k, v in {**q.fixed, **fields}.items()
                       if not k.startswith(config_lib.RUNTIME_FIELDS)})
          for cell, fields in q.cells.items()}
  out, unread = {}, []
  for run in (p.parent for d in where for p in sorted(pathlib.Path(d).glob("*/config.json"))):
    config, summary = (workdir_lib.read_json(run / f) for f in ("config.json", "summary.json"))
    if config is None or summary is None and (run / "summary.json").exists():
      bad = "config.json" if config is None else "summary.json"
      unread.append(f"{run.parent.name}/{run.name}: its {bad} is unreadable, never read as a "
                    "result (rerun `run` to train it again)")
      continue
    if summary is None:
      continue  # not finished: the plan counts it, the verdicts list it as not in
    fields = workdir_lib.dotted(workdir_lib.with_added_fields(config))
    match = sorted(((len(w), cell) for cell, w in want.items()
                    if all(k in fields and fields[k] == v for k, v in w.items())), reverse=True)
    if len(match) > 1 and match[0][0] == match[1][0]:
      raise QuestionError(f"question {q.name}: {run} is a run of cells {match[0][1]} and "
                          f"{match[1][1]} alike; give them fields that differ")
    if match:
      out.setdefault(match[0][1], {}).setdefault((float(fields[LR]), int(fields[SEED])), summary)
  return out, unread


def has_finite(summary: dict | None, key: str) -> bool:
  """Whether a run's summary holds a finite `key` (a diverged run's losses are not)."""
  return summary is not None and finite(summary.get(key))


def run_wall(summary: dict) -> float:
  """A run's wall time: a vectorized program's shared among the runs it trained."""
  return summary["wall_time_sec"] / summary.get("vectorized_runs", 1)


# --- The pilot: each cell's LR, and n

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


def transferred(q: Question, cell: str, runs: Mapping[tuple, dict],
                source: tuple[str, Any]) -> tuple[str, Any]:
  """The choice of a cell that takes the LR its `lr_from` cell's pilot chose (`source`, that
  cell's `choice`): ("lr", LR) once its runs at that LR on the pilot's seeds are in (they size
  n, as any cell's pilot runs do); ("transfer", LR) while they are not; ("waits", the source
  cell) while the source's LR is not chosen."""
  kind, lr = source
  if kind not in ("lr", "again at the edge"):
    return "waits", q.lr_from(cell)
  done = all((lr, s) in runs for s in q.pilot_of(cell).seeds)
  return ("lr" if done else "transfer"), lr


def choices(q: Question, pilot: Runs) -> dict[str, tuple[str, Any]]:
  """Each cell's `choice` from its pilot runs; a cell with `lr_from`, its source's (`transferred`)."""
  own = {c: choice(q, c, pilot.get(c, {})) for c in q.cells if not q.lr_from(c)}
  return {c: own[c] if c in own else transferred(q, c, pilot.get(c, {}), own[q.lr_from(c)])
          for c in q.cells}


def values(c: Contrast, runs: Runs, lrs: Mapping[str, float], seeds: Sequence[int],
           outcome) -> list[float]:
  """The contrast at each seed: Σ weight · the cell's outcome (tested on) at its LR."""
  return [float(sum(w * runs[cell][lrs[cell], s][outcome(cell)[1]]
                    for cell, w in c.weights.items())) for s in seeds]


def size(q: Question, pilot: Runs, lrs: Mapping[str, float]) -> dict:
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
           if not has_finite(pilot[cell][lrs[cell], s], q.outcome_of(cell)[1])]
    if bad:
      raise QuestionError(f"question {q.name}: pilot runs without a finite outcome (cell, seed): "
                          f"{bad}; the sizing rule does not say what to do: state it first")
    v = values(c, pilot, lrs, seeds, q.outcome_of)
    sd = float(np.std(v, ddof=1))
    bound = sd if q.rule.sd_confidence is None else C.sd_upper(sd, len(v), q.rule.sd_confidence)
    needed = C.seeds_needed(bound, delta, q.alpha, q.rule.power, q.rule.min_seeds)
    out[c.name] = {"seeds": seeds, "values": v, "sd": sd, "bound": bound, "needed": needed}
  cap = lambda c: min(x for x in (c.cap, q.cap, math.inf) if x is not None)
  most = max(s["needed"] for s in out.values())
  for c in q.contrasts:
    s = out[c.name]
    s["n"] = int(min(most if q.rule.shared else s["needed"], cap(c)))
    s["power"] = C.paired_power(s["n"], s["bound"], delta, q.alpha)
    s["detectable"] = C.min_detectable(s["bound"], s["n"], q.alpha, q.rule.power)
  cell_n = {cell: max(out[c.name]["n"] for c in q.contrasts if cell in c.weights)
            for cell in q.cells if any(cell in c.weights for c in q.contrasts)}
  if q.rule.shared:
    cell_n = dict.fromkeys(q.cells, max(s["n"] for s in out.values()))
  return {"contrasts": out, "cell_n": cell_n, "needed": most}


def fresh_seeds(q: Question, n: int) -> list[int]:
  return list(range(q.first_seed, q.first_seed + n))


@dataclasses.dataclass
class Stages:
  """Where a question stands, read once from its directory: each cell's pilot `choices`; once
  every cell's LR is chosen, the `lrs`, the `sizing` and the `fresh` runs; `unread`, the runs
  whose files could not be read."""
  q: Question
  pilot: Runs
  choices: dict[str, tuple[str, Any]]
  unread: list[str]
  sizing: dict | None = None
  fresh: Runs | None = None

  def waiting(self, kind: str, cells: Sequence[str] | None = None) -> dict[str, Any]:
    """The cells (of `cells`) whose choice is still `kind` ("missing", "edge", "waits" or
    "transfer")."""
    return {c: v for c, (k, v) in self.choices.items()
            if k == kind and c in (cells or self.q.cells)}

  @property
  def lrs(self) -> dict[str, float] | None:
    """Each cell's chosen LR, None while a cell waits for its pilot or its step past an edge."""
    if any(self.waiting(kind) for kind in ("missing", "edge", "waits", "transfer")):
      return None
    return {c: v for c, (_, v) in self.choices.items()}

  @property
  def again_at_edge(self) -> list[str]:
    return [c for c, (k, _) in self.choices.items() if k == "again at the edge"]


def read(q: Question, root: pathlib.Path) -> Stages:
  pilot, unread = cell_runs(q, dirs(q, root, "pilot"))
  s = Stages(q, pilot, choices(q, pilot), unread)
  if s.lrs is not None:
    s.sizing = size(q, pilot, s.lrs)
    s.fresh, more = cell_runs(q, dirs(q, root, "fresh"))
    s.unread += more
  return s


# --- The verdicts

def spiking_share(q: Question, c: Contrast, runs: Runs, lrs, seeds: Sequence[int],
                  v: Sequence[float]) -> dict:
  """How much of the contrast's mean the spiking seeds carry (descriptive): a seed spikes where a
  run of a cell the contrast weighs passes `q.spike` × its initial gradient norm; "carried" is
  the mean over all seeds less the mean over the seeds without a spike."""
  rel = lambda cell, s: runs[cell][lrs[cell], s].get("grad_norm_max_rel")
  known = all(has_finite(runs[cell][lrs[cell], s], "grad_norm_max_rel") for cell in c.weights
              for s in seeds)
  spiking = [s for s in seeds if known and any(rel(cell, s) > q.spike for cell in c.weights)]
  rest = [x for s, x in zip(seeds, v) if s not in spiking]
  rest_mean = float(np.mean(rest)) if rest else math.nan
  return {"known": known, "spiking_seeds": spiking, "without_spikes": rest_mean,
          "carried": float(np.mean(v)) - rest_mean if known else math.nan}


def judged(q: Question, tested: Mapping[str, tuple[list[int], list[float]]],
           sign: Mapping[str, float] | None = None, interim: Collection[str] = ()) -> dict:
  """The family's statistics from each tested contrast's (seeds, values), None where fewer than
  two: the paired statistics, the simultaneous interval at α/K, the Holm-adjusted p, the exact
  sign-flip p (and Holm; `sign`: those p already computed), and at each margin the TOST p (and
  Holm) and the `Verdict`. A contrast without results, or short of its planned seeds (`interim`),
  counts as p = 1 in Holm, so an interim adjusted p never falls below the final (Holm's adjusted
  p rise with each p they adjust over)."""
  has = {c.name: len(tested[c.name][1]) >= 2 for c in q.contrasts}
  paired = {c.name: {m: C.paired_difference(tested[c.name][1], np.zeros(len(tested[c.name][1])),
                                            m) for m in q.margins}
            for c in q.contrasts if has[c.name]}
  counted = lambda name: has[name] and name not in interim
  holm = lambda p: dict(zip((c.name for c in q.contrasts),
                            C.holm([p(c.name) if counted(c.name) else 1.0 for c in q.contrasts])))
  first = lambda name: paired[name][q.margins[0]]
  p_holm = holm(lambda name: first(name).p)
  sign = sign or {name: C.sign_flip_p(tested[name][1]) if len(tested[name][1]) <= C.SIGN_FLIP_MAX
                  else math.nan for name in paired}
  sign_holm = holm(lambda name: 1.0 if math.isnan(sign[name]) else sign[name])
  equiv = {m: holm(lambda name, m=m: paired[name][m].p_equiv) for m in q.margins}
  out = {}
  for name in (c.name for c in q.contrasts):
    if not has[name]:
      out[name] = None
      continue
    interval = C.simultaneous_interval(first(name), q.k, q.rule.alpha)
    at = {m: {"p_equiv": paired[name][m].p_equiv, "p_equiv_holm": float(equiv[m][name]),
              "verdict": C.judge(interval, m, equiv[m][name],
                                 sign_holm[name] if q.rule.sign_flip else None, q.rule.alpha)}
          for m in q.margins}
    out[name] = {"paired": first(name), "interval": interval, "p_holm": float(p_holm[name]),
                 "p_sign": sign[name], "p_sign_holm": float(sign_holm[name]), "margins": at}
  return out


def judged_without(q: Question, tested: Mapping[str, tuple[list[int], list[float]]],
                   interim: Collection[str] = ()) -> dict:
  """`judged` as its verdicts read, at the cost of exact sign-flip p only where they matter:
  first with each sign-flip p's upper bound (a side the bounds let the sign-flip test confirm,
  the exact p confirm too: Holm's p only fall with their inputs), then exactly where a side the
  interval shows is left unclaimed."""
  bound = {name: C.sign_flip_bound(v) for name, (_, v) in tested.items() if len(v) >= 2}
  out = judged(q, tested, bound, interim)
  if any(r and (r["interval"][0] > 0 or r["interval"][1] < 0) and r["p_sign_holm"] > q.rule.alpha
         for r in out.values()):
    out = judged(q, tested, interim=interim)
  return out


def short_of_seeds(f: Mapping) -> bool:
  """Whether a contrast of `verdicts` has fewer fresh seeds (tested or left out) than planned: it
  is not answered yet, and counts as p = 1 in the family's Holm."""
  return len(f["seeds"]) + len(f["left_out"]) < f["n_planned"]


def verdicts(s: Stages, one_out: bool = True) -> dict:
  """The question on its fresh seeds: per contrast (None before two seeds) the seeds it is
  tested on (its first n fresh seeds that every cell it weighs finished with a finite outcome,
  and with `rule.shared` every other cell that ran the seed: while other cells train, a contrast
  whose own cells are done is answered; the seeds left out listed), `judged`'s statistics, each
  cell's mean, the spiking seeds' share, and with `one_out` per margin the seeds whose leaving
  out alone moves the verdict (`moved_by`: seed -> the verdict without it, its note aside; the
  family judged again without each seed). Descriptive contrasts: unadjusted paired statistics."""
  q, fresh, lrs = s.q, s.fresh, s.lrs
  outcome = lambda cell: q.outcome_of(cell)[1]
  ran = lambda cell, seed: (lrs[cell], seed) in fresh.get(cell, {})
  done = lambda cell, seed: ran(cell, seed) and has_finite(fresh[cell][lrs[cell], seed],
                                                            outcome(cell))
  found, n_most = {}, max(s.sizing["cell_n"].values())
  for c in (*q.contrasts, *q.descriptive):
    n = s.sizing["contrasts"][c.name]["n"] if c.name in s.sizing["contrasts"] else n_most
    cells = list(q.cells) if q.rule.shared else list(c.weights)
    seeds = [x for x in fresh_seeds(q, n) if all(ran(cell, x) for cell in c.weights)]
    tested = [x for x in seeds if all(done(cell, x) for cell in cells if ran(cell, x))]
    found[c.name] = {"n_planned": n, "seeds": tested, "left_out": sorted(set(seeds) - set(tested)),
                     "values": values(c, fresh, lrs, tested, q.outcome_of) if tested else []}
  pairs = lambda leave=None: {name: ([x for x in f["seeds"] if x != leave],
                                     [v for x, v in zip(f["seeds"], f["values"]) if x != leave])
                              for name, f in found.items()}
  interim = {c.name for c in q.contrasts if short_of_seeds(found[c.name])}
  out = judged(q, pairs(), interim=interim)
  every = sorted({x for c in q.contrasts for x in found[c.name]["seeds"]})
  without = {x: judged_without(q, pairs(x), interim) for x in every} if one_out else {}
  for c in q.contrasts:
    f, r = found[c.name], out[c.name]
    if r is None:
      continue
    read_ = lambda v: (v.kind, v.side)
    for m, at in r["margins"].items() if one_out else ():
      at["moved_by"] = {x: w[c.name] and dataclasses.replace(w[c.name]["margins"][m]["verdict"],
                                                             note="")
                        for x, w in without.items() if x in f["seeds"] and (
                            w[c.name] is None
                            or read_(w[c.name]["margins"][m]["verdict"]) != read_(at["verdict"]))}
    out[c.name] = {**f, **r, "means": {cell: float(np.mean([fresh[cell][lrs[cell], x][outcome(
        cell)] for x in f["seeds"]])) for cell in c.weights},
                   "spikes": spiking_share(q, c, fresh, lrs, f["seeds"], f["values"])}
  for c in q.descriptive:
    f = found[c.name]
    out[c.name] = {**f, "paired": C.paired_difference(f["values"], np.zeros(len(f["values"])))}
  return out


def not_in(s: Stages) -> list[str]:
  """The fresh runs the verdicts rest on that are not in (each cell's planned seeds at its LR
  without a finished, readable run), a line per cell, and a line per unreadable run: what
  `report` lists."""
  lines = []
  for cell, n in (s.sizing or {}).get("cell_n", {}).items():
    gone = [x for x in fresh_seeds(s.q, n) if (s.lrs[cell], x) not in s.fresh.get(cell, {})]
    if gone:
      lines.append(f"{cell} at LR {s.lrs[cell]:g}: {len(gone)} of {n} fresh runs not in (seeds "
                   f"{spans(gone)}): `run` trains them")
  return lines + s.unread


def spans(xs: Sequence[int]) -> str:
  """Sorted integers as runs: 1000–1004, 1007."""
  out, start = [], None
  for i, x in enumerate(xs):
    start = x if start is None else start
    if i + 1 == len(xs) or xs[i + 1] != x + 1:
      out.append(f"{start}–{x}" if x > start else f"{x}")
      start = None
  return ", ".join(out)
