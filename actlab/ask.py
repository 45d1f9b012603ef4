"""python -m actlab.ask QUESTION[:arg] {plan,run,report}: a pre-registered question from its
declaration to its verdict (docs/asking.md). `plan` freezes the declaration into the question's
directory and prints the design, each stage's runs and their estimated wall time; `run` trains
the stages as sweeps (pilot → the step past an edge → each cell's LR → n → fresh seeds), each
resuming when rerun, and refuses a declaration changed after its pilot began; `report` prints and
writes the verdict table and one figure from the run directories alone."""

import dataclasses
import hashlib
import fnmatch
import json
import math
import pathlib
import re
import subprocess
import sys

import jax
import numpy as np
from absl import flags, logging

from actlab import config as config_lib
from actlab.infra import errors
from actlab.infra import workdir as workdir_lib
from actlab.report import question as Q
from actlab.run import rows, train as run_train
from actlab.sweep import grid
from actlab.sweep.progress import duration

@dataclasses.dataclass(frozen=True)
class Asked:
  """A question and its directory: `question.json` (the frozen declaration) and a sweep
  directory per stage (or, for runs made before actlab.ask, the directories `runs` names)."""
  spec: str
  q: Q.Question
  root: pathlib.Path
  workers: int = 1                         # as actlab.sweep's --workers, --shard
  shard: tuple[int, int] = (0, 1)
  settings: dict = dataclasses.field(default_factory=dict)  # runtime fields for every run
  cells: str = ""                          # globs, comma-separated: train only these cells

  @property
  def mine(self) -> list[str]:
    """The cells this command trains (all, or those a glob of `cells` matches)."""
    globs = self.cells.split(",") if self.cells else ["*"]
    return [c for c in self.q.cells if any(fnmatch.fnmatchcase(c, g) for g in globs)]

  def stage_dir(self, stage: str) -> pathlib.Path:
    """Where this command trains `stage`: `<stage>/`, or `<stage>-<glob>/` for some cells."""
    return self.root / (stage + (f"-{re.sub(r'[^A-Za-z0-9_.-]', '', self.cells)}"
                                 if self.cells else ""))

  def dirs(self, stage: str) -> list[pathlib.Path]:
    """Where the runs of `stage` ("pilot", which includes the edge, or "fresh") are: every
    directory of that stage, whichever cells trained into it."""
    if self.q.runs:
      return [self.root / d for d in self.q.runs.get(stage, ())]
    stages = ("pilot", "edge") if stage == "pilot" else (stage,)
    return sorted(d for s in stages for d in (self.root / s, *self.root.glob(f"{s}-*"))
                  if d.is_dir())

  def runs(self, stage: str) -> dict:
    return Q.cell_runs(self.q, self.dirs(stage))


# --- The declaration

def declaration(q: Q.Question) -> dict:
  """The question as resolved into configs (each cell's fields, less the runtime ones, the LR and
  the seed) and its design: what `plan` freezes."""
  cells = {cell: {k: v for k, v in fields.items()
                  if k not in (Q.LR, Q.SEED) and not k.startswith(config_lib.RUNTIME_FIELDS)}
           for cell, fields in Q.cell_configs(q).items()}
  design = {k: v for k, v in dataclasses.asdict(q).items() if k not in ("name", "text", "runs")}
  return json.loads(json.dumps({"cells": cells, "design": design}, default=str))


def digest(decl: dict) -> str:
  return hashlib.sha256(json.dumps(decl, sort_keys=True).encode()).hexdigest()[:16]


def commit() -> str:
  """The code's commit as a run's provenance has it (with "+dirty" for uncommitted changes), or
  "unknown" outside git."""
  code = rows.code()
  return (code["git_commit"] or "unknown")[:12] + ("+dirty" if code["git_dirty"] else "")


def began(a: Asked) -> bool:
  """Whether the pilot has begun: a run directory under its stage directory."""
  return any(p.is_dir() for d in a.dirs("pilot") if d.is_dir() for p in d.iterdir())


def changes(frozen: dict, decl: dict) -> list[str]:
  """How `decl` differs from a frozen declaration; a config field the frozen one predates counts
  at its value of then (workdir.ADDED_FIELDS), as a run directory's config.json does."""
  added = {f"{section}.{field}": v for (section, field), v in workdir_lib.ADDED_FIELDS.items()}
  cells = {cell: {**{k: added[k] for k in decl["cells"].get(cell, {})
                     if k in added and k not in fields}, **fields}
           for cell, fields in frozen["cells"].items()}
  return workdir_lib.diff_configs({**frozen, "cells": cells}, decl)


def freeze(a: Asked, log=print) -> dict:
  """The frozen declaration (`question.json`), written where there is none, and anew where the
  question changed before any run; a UserError naming what changed where its pilot has begun,
  or where `question.json` is unreadable."""
  path, decl = a.root / "question.json", declaration(a.q)
  frozen = workdir_lib.read_json(path)
  if frozen is None and path.exists():
    raise errors.UserError(f"{path} is unreadable: the question's declaration cannot be checked; "
                           "restore it from where you keep it, or ask in another --workdir")
  changed = changes(frozen["declaration"], decl) if frozen else []
  if frozen is not None and not changed:
    return frozen
  if changed and began(a):
    raise errors.UserError(
        f"{a.root}: the question changed after its pilot began "
        f"({workdir_lib.first_diffs(changed)}); restore it as declared on {frozen['time']} "
        f"(hash {frozen['hash']}), or ask the new one in another --workdir")
  record = {"question": a.spec, "hash": digest(decl), "commit": commit(),
            "time": workdir_lib.now(), "declaration": decl}
  if changed:
    log(f"ask: the question changed before any run ({changed[0]}); frozen anew "
        f"({frozen['hash']} → {record['hash']})")
  a.root.mkdir(parents=True, exist_ok=True)
  workdir_lib.write_json(path, record)
  return record


# --- The stages as sweeps

def stage_sweep(q: Q.Question, stage: str, lrs: dict) -> dict:
  """A stage as a sweep file's dict, its cells an axis `arm` (grid.ARM_KEY) with their fields:
  the pilot each cell of `lrs` (cell -> None) × the pilot's LRs × its seeds; the edge each cell of
  `lrs` at that LR on the pilot's seeds; the fresh seeds each cell of `lrs` (cell -> (LR, n)) at
  its LR on its first n fresh seeds."""
  arm = lambda extra: {grid.ARM_KEY: {c: {**q.cells[c], **extra(c)} for c in lrs}}
  if stage == "pilot":
    return {"axes": {grid.ARM_KEY: list(lrs), Q.LR: list(q.pilot.lrs)},
            "seeds": list(q.pilot.seeds), "fixed": dict(q.fixed), "fixed_by": arm(lambda c: {})}
  if stage == "edge":
    return {"axes": {grid.ARM_KEY: list(lrs)}, "seeds": list(q.pilot.seeds),
            "fixed": dict(q.fixed), "fixed_by": arm(lambda c: {Q.LR: lrs[c]})}
  seeds = Q.fresh_seeds(q, max(n for _, n in lrs.values()))
  return {"axes": {grid.ARM_KEY: list(lrs)}, "seeds": seeds, "fixed": dict(q.fixed),
          "fixed_by": arm(lambda c: {Q.LR: lrs[c][0]}),
          "exclude": [{grid.ARM_KEY: c, grid.SEED_KEY: s} for c, (_, n) in lrs.items()
                      for s in seeds[n:]]}


def train(a: Asked, stage: str, sweep: dict, log=print) -> None:
  """Trains `stage`: its sweep (written beside its directory) with this command's --workers,
  --shard and --set, in this process for one worker (as `actlab.sweep` would), else as
  `python -m actlab.sweep --workers=N`, whose failure ends this command with its exit code."""
  where = a.stage_dir(stage)
  spec = where.with_name(f"{where.name}.sweep.json")
  a.root.mkdir(parents=True, exist_ok=True)
  workdir_lib.write_json(spec, sweep)
  log(f"ask: {stage} → {where}")  # the sweep says how many runs, and how many were done before
  if a.workers == 1:
    from actlab import sweep as sweep_lib  # pylint: disable=import-outside-toplevel
    base = config_lib.override(Q.base_config(a.q), a.settings)
    run_train.initialize(base)
    sweep_lib.run(base, str(spec), where, log=log, shard=a.shard,
                  overridden=list(a.settings), cache=COMPILED)
    return
  command = [sys.executable, "-m", "actlab.sweep", f"--config={a.q.config}", f"--sweep={spec}",
             f"--workdir={where}", f"--workers={a.workers}",
             f"--shard={a.shard[0]}/{a.shard[1]}",
             *(f"--config.{k}={str(v).lower() if isinstance(v, bool) else v}"
               for k, v in a.settings.items())]
  code = subprocess.run(command).returncode
  if code:
    raise errors.UserError(f"ask: the {stage} stage stopped (exit code {code}); rerun the same "
                           "command to resume it")


COMPILED: dict = {}  # the stages' compiled programs, shared within this process


def settings(text: str) -> dict:
  """--set's fields: only runtime ones (how and where runs execute, not what they compute)."""
  out = config_lib.parse_overrides(text)
  wrong = [k for k in out if not k.startswith(config_lib.RUNTIME_FIELDS)]
  if wrong:
    raise errors.UserError(f"--set {wrong[0]}: give only fields that do not change what a run "
                           f"computes ({', '.join(config_lib.RUNTIME_FIELDS)}); the others are "
                           "the question's")
  return out


def run(a: Asked, log=print) -> None:
  """Every stage for this command's cells, each resumed where it stopped: the pilot, the step past
  an edge where a cell's best LR sits there, then (once every cell's pilot is in, wherever it was
  trained) the fresh seeds at the chosen LRs and n; then the report."""
  if a.q.runs or a.q.by_cell and any("pilot" in own for own in a.q.by_cell.values()):
    raise errors.UserError(f"question {a.q.name}: its runs were made before actlab.ask (`runs`) "
                           "or its cells have pilots of their own: `report` reads it, `run` "
                           "trains only questions with one pilot and no `runs`")
  if not a.mine:
    raise errors.UserError(f"--cells={a.cells}: no cell matches; the cells: {', '.join(a.q.cells)}")
  freeze(a, log)
  train(a, "pilot", stage_sweep(a.q, "pilot", dict.fromkeys(a.mine)), log)
  pilot = a.runs("pilot")  # read again only after a stage trains
  found = lambda: {c: Q.choice(a.q, c, pilot.get(c, {})) for c in a.mine}
  if any(kind == "missing" for kind, _ in found().values()):
    log("ask: pilot: another shard is still training it: rerun once it is done")
    return
  edge = {c: lr for c, (kind, lr) in found().items() if kind == "edge"}
  if edge:
    train(a, "edge", stage_sweep(a.q, "edge", edge), log)
    pilot = a.runs("pilot")
    if any(kind == "edge" for kind, _ in found().values()):
      log("ask: edge: another shard is still training it: rerun once it is done")
      return
  try:
    chosen = Q.choose(a.q, pilot)
  except Q.Incomplete as e:
    log(f"ask: {e}: train the other cells' pilots (--cells) and rerun")
    return
  if "edge" in chosen:
    log(f"ask: other cells wait for the step past an edge ({fmt_lrs(chosen['edge'])}): train "
        "them (--cells) and rerun")
    return
  sizing = Q.size(a.q, pilot, chosen["lr"])
  log(f"ask: LRs chosen {fmt_lrs(chosen['lr'])}; n = {max(sizing['cell_n'].values())} "
      f"(asked {sizing['needed']})")
  cells = {c: (chosen["lr"][c], sizing["cell_n"][c]) for c in a.mine if c in sizing["cell_n"]}
  train(a, "fresh", stage_sweep(a.q, "fresh", cells), log)
  report(a, log)


# --- What plan and report print

def fmt_lrs(lrs: dict) -> str:
  return ", ".join(f"{c} {lr:g}" for c, lr in lrs.items())


def signed(x: float) -> str:
  """x to 3 decimals with its sign (more where that would read 0), the page's minus sign."""
  if not math.isfinite(x):
    return "n/a"
  digits = 3 if x == 0 or abs(x) >= 5e-4 else -math.floor(math.log10(abs(x)))
  return f"{x:+.{digits}f}".replace("-", "−")


def weights(c: Q.Contrast) -> str:
  return " ".join(f"{'+' if w > 0 else '−'} {'' if abs(w) == 1 else f'{abs(w):g} '}{cell}"
                  for cell, w in c.weights.items()).removeprefix("+ ")


def design_lines(a: Asked) -> list[str]:
  q, r = a.q, a.q.rule
  grid_ = "LR " + (f"{q.pilot.lrs[0]:g} (fixed)" if len(q.pilot.lrs) == 1 else
                   "{" + ", ".join(f"{x:g}" for x in q.pilot.lrs) + "}")
  bound = ("the pilot sd" if r.sd_confidence is None else
           f"the upper {r.sd_confidence:.0%} bound of the pilot sd")
  lines = [f"question {q.name}" + (f": {q.text}" if q.text else ""),
           f"  {len(q.cells)} cells on {q.config}; K = {q.k} contrasts; simultaneous intervals at "
           f"1 - {r.alpha}/{q.k}, Holm over the K; verdicts at ±"
           + " and ±".join(f"{m:g}" for m in q.margins)
           + ("; an exact sign-flip test beside each" if r.sign_flip else ""),
           f"  pilot: {grid_} × seeds {list(q.pilot.seeds)}"
           + (", one step past an edge (" + ", ".join(f"{k:g} → {v:g}" for k, v in
                                                    q.pilot.edge.items()) + ")"
              if q.pilot.edge else "")
           + (f"; chosen on {q.outcome[0]}" if len(q.pilot.lrs) > 1 else "")
           + f"; tested on {q.outcome[1]}",
           f"  n: power {r.power} against {q.margins[0]:g} at alpha/K = {q.alpha:.4g} with {bound}"
           f"; at least {r.min_seeds}" + (f", at most {q.cap}" if q.cap else "")
           + ("; every cell on the same seeds" if r.shared else "")
           + f"; fresh seeds from {q.first_seed}"]
  for c in q.contrasts:
    lines.append(f"  - {c.name}: {weights(c)}" + (f"  ({c.question})" if c.question else ""))
  return lines


def plan_lines(a: Asked, estimate: bool) -> list[str]:
  """The stages: runs (done of planned) and, with `estimate`, the wall time they take here."""
  q, lines = a.q, []
  runs, found = a.runs("pilot"), a.runs("fresh")
  grid = {c: {(lr, s) for lr in q.pilot_of(c).lrs for s in q.pilot_of(c).seeds} for c in q.cells}
  pilot_total = sum(len(g) for g in grid.values())
  done = sum(len(grid[c] & set(runs.get(c, {}))) for c in q.cells)
  walls = walls_here(a, runs) + walls_here(a, found)
  # A run's wall here: its finished runs' mean, once there are some; else from timed steps.
  step = (float(np.mean(walls)) / a.workers if walls else timed_steps(a)) if estimate else None
  cost = lambda n: "" if step is None else f", about {duration(n * step)} here"
  lines.append(f"  stage pilot: {done} of {pilot_total} runs done{cost(pilot_total - done)}")
  try:
    chosen = Q.choose(q, runs)
  except Q.Incomplete:
    chosen = None
  lo, hi = q.rule.min_seeds, q.cap or q.rule.min_seeds
  if chosen is None:
    if q.pilot.edge:
      edge_most = len(q.cells) * len(q.pilot.seeds)
      lines.append(f"  stage edge: up to {edge_most} runs, where a cell's best LR sits at an edge"
                   + cost(edge_most))
    lines.append(f"  stage fresh: {lo * len(q.cells)} to {hi * len(q.cells)} runs, n from the "
                 f"pilot{cost(lo * len(q.cells))}" + ("" if step is None else
                                                     f" to {duration(hi * len(q.cells) * step)}"))
    return lines
  if "edge" in chosen:
    n = len(chosen["edge"]) * len(q.pilot.seeds)
    lines.append(f"  stage edge: {n} runs ({fmt_lrs(chosen['edge'])}){cost(n)}")
    return lines
  sizing = Q.size(q, runs, chosen["lr"])
  lines.append(f"  LRs chosen: {fmt_lrs(chosen['lr'])}"
               + (f"; again at an edge: {', '.join(chosen['at_edge'])}" if chosen["at_edge"]
                  else ""))
  for c in q.contrasts:
    s = sizing["contrasts"][c.name]
    lines.append(f"  - {c.name}: pilot {', '.join(signed(v) for v in s['values'])}; sd "
                 f"{s['sd']:.4f}" + ("" if q.rule.sd_confidence is None else
                                     f", bound {s['bound']:.4f}")
                 + f" → {s['needed']}" + ("" if s["n"] >= s["needed"] else
                                         f"; at {s['n']}: power {s['power']:.2f}, 80% power "
                                         f"above {s['detectable']:.3f}"))
  count = lambda cells: (
      sum((chosen["lr"][c], s) in found.get(c, {}) for c in cells
          for s in Q.fresh_seeds(q, sizing["cell_n"][c])),
      sum(sizing["cell_n"][c] for c in cells))
  (have, fresh), (mine_have, mine) = count(sizing["cell_n"]), count(a.mine)
  lines.append(f"  stage fresh: {have} of {fresh} runs done (n = "
               f"{max(sizing['cell_n'].values())})" + (
                   f"; --cells: {mine_have} of {mine}" if a.cells else "") + cost(mine - mine_have))
  return lines


def walls_here(a: Asked, runs: dict) -> list[float]:
  """The wall time of each of `runs` that this command's cells finished on this device kind (a
  vectorized program's wall shared among its runs): another device's walls say nothing here."""
  here = jax.devices()[0].device_kind
  return [Q.run_wall(s) for cell in a.mine for s in runs.get(cell, {}).values()
          if Q.has_finite(s, "wall_time_sec")
          and (s.get("provenance") or [{}])[-1].get("device_kind") == here]


def timed_steps(a: Asked) -> float | None:
  """The wall time of one run here, averaged over this command's cells and divided by the workers:
  a few steps of each cell's program timed as actlab.bench times them (vectorized where its sweep
  would be, over the pilot's runs of a cell, and shared among them), a run counted in steps (its
  training steps; an evaluation window or test window a third of a step; a sharpness estimate
  three per power iteration) plus the program's compile once per cell. None for runs made
  elsewhere."""
  from actlab import bench  # pylint: disable=import-outside-toplevel
  from actlab.sweep import vectorized  # pylint: disable=import-outside-toplevel
  if a.q.runs:
    return None
  base, seconds = Q.base_config(a.q), []
  runs = len(a.q.pilot.seeds) * len(a.q.pilot.lrs)
  for cell in a.mine:
    c = config_lib.override(base.copy_and_resolve_references(),
                            {**a.q.cells[cell], Q.LR: a.q.pilot.lrs[0], **a.settings})
    together = vectorized.program_size(c, runs, vectorized.device_memory()) if (
        vectorized.vectorizes(c) and runs > 1) else 1
    b = bench.JaxBench(c, together)
    compile_s = b.setup(1)["compile_s"]
    step = float(np.median(b.timed(5)["times"])) / together
    t, m = c.train, c.metrics
    windows = (t.steps // t.eval_every + 1) * c.data.val_batches + c.data.test_batches
    sharpness = (t.steps // m.sharpness_every + 1) * m.sharpness_iters if m.sharpness_every else 0
    seconds.append(step * (t.steps + windows / 3 + 3 * sharpness) + compile_s / runs)
  return float(np.mean(seconds)) / a.workers


def table(a: Asked, verdicts: dict, sizing: dict, lrs: dict) -> list[str]:
  """The verdict table: a row per contrast, each number rounded once."""
  q = a.q
  head = ["contrast", "question", "LR chosen", "pilot sd → n", "fresh seeds", "mean, 95% interval",
          "simultaneous interval", "p (Holm)", "sign-flip p (Holm)", "below 0 in",
          *(f"verdict at ±{m:g}" for m in q.margins), "the spiking seeds carry"]
  lines = ["| " + " | ".join(head) + " |", "|---" * len(head) + "|"]
  for c in q.contrasts:
    s, r = sizing["contrasts"][c.name], verdicts[c.name]
    pilot = (f"{s['sd']:.3f}" + ("" if q.rule.sd_confidence is None else
                                 f" (bound {s['bound']:.3f})") + f" → {s['needed']}"
             + ("" if s["n"] >= s["needed"] else f", cap {s['n']}"))
    lr = " / ".join(f"{lrs[cell]:g}" for cell in c.weights)
    if len(set(lrs[cell] for cell in c.weights)) == 1:
      lr = f"{lrs[next(iter(c.weights))]:g}"
    if r is None:
      lines.append(f"| `{c.name}` | {c.question} | {lr} | {pilot} | 0 of {s['n']} |"
                   + " |" * (len(head) - 5))
      continue
    d, (low, high), sp = r["paired"], r["interval"], r["spikes"]
    spiked = len(sp["spiking_seeds"])
    carry = ("not measured" if not sp["known"] else "none spike" if not spiked else
             f"all {spiked} seeds spike" if spiked == len(r["seeds"]) else
             f"{signed(sp['carried'])} ({spiked} seed{'s' * (spiked > 1)})")
    sign = f"{r['p_sign']:.2g} ({r['p_sign_holm']:.2g})" if math.isfinite(r["p_sign"]) else "n/a"
    lines.append(
        f"| `{c.name}` | {c.question} | {lr} | {pilot} | {len(r['seeds'])} of {s['n']} | "
        f"{signed(d.mean)} [{signed(d.ci_low)}, {signed(d.ci_high)}] | [{signed(low)}, "
        f"{signed(high)}] | {d.p:.2g} ({r['p_holm']:.2g}) | {sign} | "
        f"{sum(x < 0 for x in r['values'])} of {len(r['seeds'])} | "
        + " | ".join(verdict(r["margins"][m]) for m in q.margins) + f" | {carry} |")
  return lines


def verdict(at: dict) -> str:
  """A verdict as the table prints it, with the TOST's Holm p where it finds equivalence."""
  tost = (f" (TOST Holm p {at['p_equiv_holm']:.2g})" if at["verdict"].startswith("equivalent")
          else "")
  return f"**{at['verdict']}**{tost}"


def descriptive_lines(a: Asked, verdicts: dict) -> list[str]:
  rows = [f"{c.name} {signed(verdicts[c.name]['paired'].mean)} "
          f"[{signed(verdicts[c.name]['paired'].ci_low)}, "
          f"{signed(verdicts[c.name]['paired'].ci_high)}]"
          for c in a.q.descriptive if len(verdicts[c.name]["seeds"]) >= 2]
  return ["descriptive (unadjusted 95% intervals): " + "; ".join(rows)] if rows else []


def answer(a: Asked) -> tuple[dict, dict, dict] | None:
  """(verdicts, sizing, LRs) from the run directories; None before the pilot is complete."""
  pilot = a.runs("pilot")
  try:
    chosen = Q.choose(a.q, pilot)
  except Q.Incomplete:
    return None
  if "edge" in chosen:
    return None
  sizing = Q.size(a.q, pilot, chosen["lr"])
  return Q.verdicts(a.q, a.runs("fresh"), chosen["lr"], sizing), sizing, chosen["lr"]


def order(a: Asked) -> list[str]:
  """When it was declared and when its first fresh run started, as the report says them."""
  frozen = workdir_lib.read_json(a.root / "question.json")
  starts = sorted(p[0]["started"] for cells in a.runs("fresh").values() for s in cells.values()
                  if (p := s.get("provenance")) and p[0].get("started"))
  first = starts[0] if starts else "none yet"
  if frozen is None:
    return [f"declared before its runs in the question file (its git history); first fresh run "
            f"started {first}"]
  return [f"declaration {frozen['hash']}, frozen {frozen['time']} at commit {frozen['commit']}; "
          f"first fresh run started {first}"]


def unanswered(a: Asked, verdicts: dict) -> list[str]:
  """The contrasts with fewer fresh seeds than planned: not answered yet."""
  return [c.name for c in a.q.contrasts if (r := verdicts[c.name]) is None
          or len(r["seeds"]) + len(r["left_out"]) < r["n_planned"]]


def interim(a: Asked, verdicts: dict) -> list[str]:
  """A line while some contrast has fewer fresh seeds than planned, saying what may still move."""
  if not (waiting := unanswered(a, verdicts)):
    return []
  return [f"interim: {len(waiting)} of {len(a.q.contrasts)} contrasts short of their planned fresh "
          "seeds (`fresh seeds`); their rows are not answers yet, and the others' Holm p count "
          "them as 1, so those can only fall as the rest train"]


def report(a: Asked, log=print) -> None:
  """The verdicts: printed, and written with one figure beside the question's directory."""
  found = answer(a)
  if found is None:
    raise errors.UserError(f"question {a.q.name}: its pilot is not complete in {a.root}; run it "
                           f"first: python -m actlab.ask {a.spec} run --workdir={a.root}")
  v, sizing, lrs = found
  lines = [*design_lines(a), *order(a), *interim(a, v), "", *table(a, v, sizing, lrs), "",
           *descriptive_lines(a, v)]
  out = a.root / f"{a.q.name.replace(':', '_')}.md"
  workdir_lib.write_text(out, "\n".join(lines) + "\n")
  figure = figure_of(a, v, out.with_suffix(".png"))
  log("\n".join(lines))
  log(f"wrote {out}" + (f" and {figure}" if figure else ""))


def draw_intervals(ax, rows, margins) -> None:
  """Rows of (label, mean, low, high) on `ax`, top down, each a mean with its interval; 0 marked
  in grey and ±each margin in red (the first dashed, the second dotted, the third dash-dotted)."""
  for y, (_, mean, low, high) in enumerate(rows):
    ax.errorbar(mean, y, xerr=[[mean - low], [high - mean]], fmt="o", color="k", capsize=4)
  ax.set_yticks(range(len(rows)), [label for label, *_ in rows], fontsize=8)
  ax.invert_yaxis()
  for m, style in zip(margins, ("--", ":", "-.")):
    for x in (-m, m):
      ax.axvline(x, color="tab:red", ls=style, lw=1)
  ax.axvline(0, color="0.6", lw=1)


def figure_of(a: Asked, v: dict, path: pathlib.Path) -> pathlib.Path | None:
  """Each contrast's mean and simultaneous interval against ±each margin."""
  rows = [(f"{c.name} ({len(v[c.name]['seeds'])})", v[c.name]["paired"].mean,
           *v[c.name]["interval"]) for c in a.q.contrasts if v[c.name] is not None]
  if not rows:
    return None
  import matplotlib  # pylint: disable=import-outside-toplevel
  matplotlib.use("Agg")
  from matplotlib import pyplot as plt  # pylint: disable=import-outside-toplevel
  fig, ax = plt.subplots(figsize=(6.4, 0.6 * len(rows) + 1.2))
  draw_intervals(ax, rows, a.q.margins)
  ax.set_xlabel(f"{a.q.outcome[1]}: mean, simultaneous interval (α/{a.q.k}); ±"
                + ", ±".join(f"{m:g}" for m in a.q.margins), fontsize=8)
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)
  return path


def plan(a: Asked, estimate: bool = True, log=print) -> None:
  """The design, the declaration frozen (runs made before actlab.ask: none) and the stages."""
  frozen = freeze(a, log) if not a.q.runs else None
  log("\n".join(design_lines(a)))
  if frozen:
    log(f"  declaration {frozen['hash']} frozen {frozen['time']} at {frozen['commit']} "
        f"→ {a.root / 'question.json'}")
  log("\n".join(plan_lines(a, estimate and not a.q.runs)))


# --- The command line

USAGE = "python -m actlab.ask QUESTION[:arg] {plan,run,report} [--workdir=DIR]"


def define_flags() -> None:
  """The command's flags (defined when it runs, not on import: actlab.main has a --workdir)."""
  flags.DEFINE_string("workdir", None, "The question's directory (default: runs/<question>).")
  flags.DEFINE_integer("workers", 1, "Runs trained at once on this host (as actlab.sweep's).",
                       lower_bound=1)
  flags.DEFINE_string("shard", "0/1", "i/N: this job's share of each stage (as actlab.sweep's).")
  flags.DEFINE_string("set", "", "field=value,...: runtime fields for every run "
                      "(data.manual_dir, sweep.vectorize, ...); not part of the declaration.")
  flags.DEFINE_string("cells", "", "A glob of cell names: train only those here (the others on "
                      "another machine, into their own stage directories).")
  flags.DEFINE_bool("estimate", True, "plan: time a few steps of each cell to estimate wall time.")


def main(argv: list[str]) -> None:
  f = flags.FLAGS
  if not f["verbosity"].present:
    logging.set_verbosity(logging.WARNING)  # absl's and JAX's start-up lines
  if len(argv) != 3 or argv[2] not in ("plan", "run", "report"):
    raise errors.UserError(f"usage: {USAGE}")
  spec, verb = argv[1], argv[2]
  q = Q.load(spec)
  root = pathlib.Path(f.workdir or pathlib.Path("runs") / q.name.replace(":", "_"))
  a = Asked(spec, q, root, f.workers, grid.parse_shard(f.shard), settings(f.set), f.cells)
  if verb == "plan":
    plan(a, f.estimate)
  elif verb == "run":
    run(a)
  else:
    report(a)


if __name__ == "__main__":
  define_flags()
  errors.run(main)
