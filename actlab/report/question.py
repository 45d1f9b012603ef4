"""A pre-registered question as its file states it (docs/asking.md): cells, contrasts, margins,
the pilot, the fresh seeds and the rule that sizes and judges it, checked field by field
(`load`, `parse`); its declaration, what `actlab.ask` freezes into `question.json`
(`declaration`, `changes`); and the fingerprint of the code that turns its runs into verdicts
(`fingerprint`, `analysis_changes`). Reading runs and judging them: answer.py."""

import dataclasses
import hashlib
import json
import pathlib
import subprocess
from typing import Any, Mapping

from actlab import config as config_lib
from actlab.infra import errors
from actlab.infra import workdir as workdir_lib
from actlab.report import comparisons

LR, SEED = "optim.lr", "train.seed"
DETERMINISTIC = "train.deterministic_ops"  # on unless a question says otherwise: an answer to cite
# reruns to the bit, on a GPU too (docs/asking.md)


@dataclasses.dataclass(frozen=True)
class Rule:
  """How a question is sized and judged: each contrast's simultaneous interval at α/K and Holm
  over the K contrasts at family-wise `alpha`; n the smallest (at least `min_seeds`) whose paired
  t-test has `power` against the first margin at α/K, with the pilot's sd at its upper one-sided
  `sd_confidence` bound (None: the sd itself). `shared`: every cell runs the n the most demanding
  contrast asks (else each cell the most its own contrasts ask). `sign_flip`: a side is claimed
  only where the exact sign-flip test agrees with the interval."""
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
  """Σ weight · outcome over cells, seed by seed; `negative` and `positive` say in words what a
  value below and above 0 means ("ReLU lower"; "clipping moves ReLU − GELU toward GELU").
  `cap` bounds its seeds below the question's."""
  name: str
  weights: Mapping[str, float]
  question: str = ""
  negative: str = ""
  positive: str = ""
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

  def lr_from(self, cell: str) -> str | None:
    """The cell whose pilot chooses this cell's LR (`by_cell.<cell>.lr_from`), or None: its own."""
    return self.by_cell.get(cell, {}).get("lr_from")


class QuestionError(config_lib.ConfigError):
  """A mistake in a question file: one line naming the field."""


KEYS = ("question", "config", "fixed", "cells", "contrasts", "descriptive", "pilot", "fresh",
        "margins", "rule", "outcome", "spike", "by_cell", "runs")
CONTRAST_KEYS = {"weights", "question", "a", "b", "negative", "positive", "cap"}


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

  number = lambda x: isinstance(x, (int, float)) and not isinstance(x, bool)
  need(isinstance(d, dict), "get_question()", "return a dict")
  unknown = sorted(set(d) - set(KEYS))
  need(not unknown, str(unknown), f"unknown key(s); use {', '.join(KEYS)}")
  for key in ("config", "cells", "contrasts", "pilot", "fresh"):
    need(key in d, key, "missing")
  need(isinstance(d["config"], str) and d["config"], "config", "a config file[:arg]")
  fixed = d.get("fixed", {})
  need(isinstance(fixed, dict) and all(isinstance(k, str) and "." in k for k in fixed), "fixed",
       "a dict of section.field -> value")
  fixed = {DETERMINISTIC: True, **fixed}
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
    need(isinstance(c, dict) and set(c) <= CONTRAST_KEYS, field,
         "{cell: weight} or {weights, question, a, b, negative, positive, cap}")
    w = c["weights"]
    need(isinstance(w, dict) and w and all(cell in cells for cell in w), f"{field}.weights",
         f"weights over the cells ({', '.join(cells)})")
    need(all(number(x) and x for x in w.values()), f"{field}.weights", "non-zero numbers")
    a, b = [cell for cell, x in w.items() if x > 0], [cell for cell, x in w.items() if x < 0]
    two = len(a) == len(b) == 1
    need(two or {"negative", "positive"} <= set(c), field, "a contrast of more than two cells "
         "says what its values mean: negative and positive (e.g. 'clipping moves ReLU − GELU "
         "toward ReLU')")
    need(two or not {"a", "b"} & set(c), field, "a and b name a two-cell contrast's arms; this "
         "one states negative and positive")
    cap = c.get("cap")
    need(cap is None or (isinstance(cap, int) and cap >= 2), f"{field}.cap", "an integer >= 2")
    lower = lambda arm, cell: f"{c.get(arm) or cell[0]} lower" if two else ""
    return Contrast(cname, {cell: float(x) for cell, x in w.items()}, c.get("question", ""),
                    c.get("negative") or lower("a", a), c.get("positive") or lower("b", b), cap)

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
         and all(number(x) and x > 0 for x in lrs), f"{field}.lrs", "distinct LRs > 0")
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
  need(number(rule.alpha) and number(rule.power) and isinstance(rule.min_seeds, int)
       and 0 < rule.alpha < 1 and 0 < rule.power < 1 and rule.min_seeds >= 2 and (
           rule.sd_confidence is None or number(rule.sd_confidence)
           and 0.5 <= rule.sd_confidence < 1), "rule",
       "alpha and power in (0, 1), min_seeds >= 2, sd_confidence in [0.5, 1) or None")
  margins = d.get("margins", (0.1,))
  need(isinstance(margins, (list, tuple)) and margins
       and all(number(m) and m > 0 for m in margins), "margins",
       "one or more numbers > 0 (the first sizes n)")
  outcome = tuple(d.get("outcome", Question.outcome))
  need(len(outcome) == 2 and all(isinstance(o, str) for o in outcome), "outcome",
       "[the summary key chosen on, the summary key tested on]")
  by_cell, own_cells = {}, d.get("by_cell", {})
  for cell, own in own_cells.items():
    need(cell in cells and isinstance(own, dict) and set(own) <= {"pilot", "outcome", "lr_from"},
         f"by_cell.{cell}", "a cell's own {pilot, outcome, lr_from}")
    source = own.get("lr_from")
    need(source is None or source in cells and source != cell and "pilot" not in own
         and "lr_from" not in own_cells.get(source, {}), f"by_cell.{cell}.lr_from",
         "another cell, one whose pilot chooses its own LR (this cell then has no pilot of its own)")
    by_cell[cell] = {**({"pilot": pilot(f"by_cell.{cell}.pilot", own["pilot"])}
                        if "pilot" in own else {}),
                     **({"outcome": tuple(own["outcome"])} if "outcome" in own else {}),
                     **({"lr_from": source} if source else {})}
  runs = d.get("runs", {})
  need(isinstance(runs, dict) and set(runs) <= {"pilot", "fresh"}, "runs",
       "{pilot: [directories], fresh: [directories]}")
  spike = d.get("spike", 10.0)
  need(number(spike) and spike > 1, "spike", "a number > 1")
  return Question(name, d["config"], fixed, {c: dict(f) for c, f in cells.items()},
                  contrasts, pilot("pilot", d["pilot"]), fresh["first_seed"], cap,
                  tuple(margins), rule, outcome, float(spike), descriptive,
                  d.get("question", ""), by_cell, {k: tuple(v) for k, v in runs.items()})


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


# --- The declaration

WORDS = ("question", "a", "b", "negative", "positive")  # how a contrast reads, not what it tests


def declaration(q: Question) -> dict:
  """The question as resolved into configs (each cell's fields, less the runtime ones, the LR and
  the seed) and its design: what `actlab.ask` freezes."""
  cells = {cell: {k: v for k, v in fields.items()
                  if k not in (LR, SEED) and not k.startswith(config_lib.RUNTIME_FIELDS)}
           for cell, fields in cell_configs(q).items()}
  design = {k: v for k, v in dataclasses.asdict(q).items() if k not in ("name", "text", "runs")}
  return json.loads(json.dumps({"cells": cells, "design": design}, default=str))


def digest(decl: dict) -> str:
  return hashlib.sha256(json.dumps(decl, sort_keys=True).encode()).hexdigest()[:16]


def changes(frozen: dict, decl: dict) -> list[str]:
  """How `decl` differs from a frozen declaration in what it tests (a contrast's words aside:
  `words_changed`): each cell's config compared as a run directory's config.json is
  (`workdir.diff_configs`: a field the frozen one predates at its value of then), then the
  design (its `fixed` is in every cell's config)."""
  tested = lambda design: {k: [{f: x for f, x in c.items() if f not in WORDS} for c in v]
                           if k in ("contrasts", "descriptive") else v
                           for k, v in design.items() if k != "fixed"}
  cells = [f"cells.{cell}.{diff}" for cell in dict.fromkeys([*frozen["cells"], *decl["cells"]])
           for diff in workdir_lib.diff_configs(frozen["cells"].get(cell, {}),
                                                decl["cells"].get(cell, {}))]
  return cells + [f"design.{diff}" for diff in workdir_lib.diff_configs(tested(frozen["design"]),
                                                                      tested(decl["design"]))]


def words_changed(frozen: dict, decl: dict) -> list[str]:
  """The contrasts whose sides read otherwise than in the frozen declaration (one frozen with a
  two-cell contrast's arms `a` and `b` read "<a> lower" and "<b> lower")."""
  sides = lambda c: (c.get("negative") or f"{c.get('a')} lower",
                     c.get("positive") or f"{c.get('b')} lower")
  said = lambda design: {c["name"]: sides(c) for key in ("contrasts", "descriptive")
                         for c in design.get(key, [])}
  old, new = said(frozen["design"]), said(decl["design"])
  return [name for name in new if old.get(name) != new[name]]


# --- The analysis, fingerprinted

PACKAGE = pathlib.Path(__file__).resolve().parent.parent
ANALYSIS = ("report/question.py", "report/answer.py", "report/comparisons.py")


def fingerprint(package: pathlib.Path | None = None) -> dict:
  """The code that turns runs into verdicts (`ANALYSIS`: choosing LRs, sizing n, judging) as a
  hash of each file of `package` (this one by default), and the rule's defaults."""
  package = package or PACKAGE
  files = {f"actlab/{name}": hashlib.sha256((package / name).read_bytes()).hexdigest()[:16]
           for name in ANALYSIS}
  return {"files": files, "rule_defaults": dataclasses.asdict(Rule())}


def analysis_changes(frozen: dict, package: pathlib.Path | None = None) -> str:
  """One line: whether the analysis is the one frozen with the declaration (`frozen`, a
  question.json record) and, where not, which files changed, and the commits between the
  declaration's and this checkout's that touch them (where git knows both)."""
  package = package or PACKAGE
  now = fingerprint(package)
  was = frozen.get("analysis")
  if was == now:
    return f"analysis: unchanged since the declaration ({', '.join(now['files'])})"
  before = (was or {}).get("files", {})
  changed = sorted(f for f in now["files"] if before.get(f) != now["files"][f])
  if was and was["rule_defaults"] != now["rule_defaults"]:
    changed.append("the rule's defaults")
  since = frozen["commit"].split("+")[0]
  log = git(package, "log", "--format=%h", f"{since}..HEAD", "--",
            *(str(package / name) for name in ANALYSIS))
  commits = (f"; commits since {since} that touch it: {', '.join(log.split()[::-1])}"
             if log else "" if log is not None else f"; git cannot list the commits since {since}")
  if was is None:
    return f"analysis: no fingerprint frozen with the declaration (ask recorded none then){commits}"
  return f"analysis: changed since the declaration in {', '.join(changed)}{commits}"


def git(where: pathlib.Path, *args: str) -> str | None:
  """git's output in the checkout `where` lies in, or None (no git, no checkout, an error)."""
  try:
    out = subprocess.run(["git", *args], cwd=where, capture_output=True, text=True, timeout=10)
  except (OSError, subprocess.SubprocessError):
    return None
  return out.stdout.strip() if out.returncode == 0 else None
