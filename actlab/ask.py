"""python -m actlab.ask QUESTION[:arg] {plan,run,report}: a pre-registered question from its
declaration to its verdict (docs/asking.md). `plan` freezes the declaration and prints the
stages; `run` trains them as sweeps, resuming when rerun; `report` prints and writes verdicts."""

import dataclasses
import fnmatch
import json
import pathlib
import re

import jax
import numpy as np
from absl import flags, logging

from actlab import config as config_lib
from actlab import sweep
from actlab.infra import errors
from actlab.infra import workdir as workdir_lib
from actlab.report import answer as A
from actlab.report import question as Q
from actlab.report import question_page as page
from actlab.run import rows
from actlab.sweep import grid
from actlab.sweep.progress import duration


@dataclasses.dataclass(frozen=True)
class Asked:
  """A question, its directory (`question.json` and a sweep directory per stage) and how this
  command trains: --workers, --shard, --set (runtime fields), --cells (globs) and
  --stop_before_new_stage (`stop_new`)."""
  spec: str
  q: Q.Question
  root: pathlib.Path
  workers: int = 1
  shard: tuple[int, int] = (0, 1)
  settings: dict = dataclasses.field(default_factory=dict)
  cells: str = ""
  stop_new: bool = False

  @property
  def mine(self) -> list[str]:
    """The cells this command trains (all, or those a glob of `cells` matches)."""
    globs = self.cells.split(",") if self.cells else ["*"]
    return [c for c in self.q.cells if any(fnmatch.fnmatchcase(c, g) for g in globs)]

  def stage_dir(self, stage: str) -> pathlib.Path:
    """Where this command trains `stage`: `<stage>/`, or `<stage>-<glob>/` for some cells."""
    return self.root / (stage + (f"-{re.sub(r'[^A-Za-z0-9_.-]', '', self.cells)}"
                                 if self.cells else ""))

  def read(self) -> A.Stages:
    return A.read(self.q, self.root)


def freeze(a: Asked, log=print) -> dict:
  """The frozen declaration (`question.json`), written where there is none or anew where the
  question changed before any run; a UserError where it changed after its pilot began."""
  path, decl = a.root / "question.json", Q.declaration(a.q)
  frozen = workdir_lib.read_json(path)
  if frozen is None and path.exists():
    raise errors.UserError(f"{path} is unreadable: the question's declaration cannot be checked; "
                           "restore it from where you keep it, or ask in another --workdir")
  changed = Q.changes(frozen["declaration"], decl) if frozen else []
  if frozen is not None and not changed:
    return frozen
  if changed and any(p.is_dir() for d in A.dirs(a.q, a.root, "pilot") for p in d.iterdir()):
    raise errors.UserError(
        f"{a.root}: the question changed after its pilot began "
        f"({workdir_lib.first_diffs(changed)}); restore it as declared on {frozen['time']} "
        f"(hash {frozen['hash']}), or ask the new one in another --workdir")
  code = rows.code()
  record = {"question": a.spec, "hash": Q.digest(decl),
            "commit": (code["git_commit"] or "unknown")[:12] + ("+dirty" if code["git_dirty"]
                                                                else ""),
            "time": workdir_lib.now(), "analysis": Q.fingerprint(), "declaration": decl}
  if changed:
    log(f"ask: the question changed before any run ({changed[0]}); frozen anew "
        f"({frozen['hash']} → {record['hash']})")
  a.root.mkdir(parents=True, exist_ok=True)
  workdir_lib.write_json(path, record)
  return record


def stage_sweep(q: Q.Question, stage: str, lrs: dict) -> dict:
  """A stage as a sweep file's dict, its cells an axis `arm`; `lrs`: cell -> None (the pilot's
  LRs × seeds), -> LR (the edge, or the LR a cell takes from another's pilot, on the pilot's
  seeds), -> (LR, n) (its first n fresh seeds)."""
  arm = lambda extra: {grid.ARM_KEY: {c: {**q.cells[c], **extra(c)} for c in lrs}}
  base = {"axes": {grid.ARM_KEY: list(lrs)}, "seeds": list(q.pilot.seeds), "fixed": dict(q.fixed)}
  if stage == "pilot":
    return {**base, "axes": {**base["axes"], Q.LR: list(q.pilot.lrs)},
            "fixed_by": arm(lambda c: {})}
  if stage in ("edge", "transfer"):
    return {**base, "fixed_by": arm(lambda c: {Q.LR: lrs[c]})}
  seeds = A.fresh_seeds(q, max(n for _, n in lrs.values()))
  return {**base, "seeds": seeds, "fixed_by": arm(lambda c: {Q.LR: lrs[c][0]}),
          "exclude": [{grid.ARM_KEY: c, grid.SEED_KEY: s} for c, (_, n) in lrs.items()
                      for s in seeds[n:]]}


COMPILED: dict = {}  # the stages' compiled programs, shared within this process


def train(a: Asked, stage: str, lrs: dict, log=print) -> bool:
  """Trains `stage` of `lrs`' cells as a sweep (its file beside its directory); under
  `a.stop_new`, a stage whose file is new or changed is written, not trained: False."""
  where = a.stage_dir(stage)
  spec = where.with_name(f"{where.name}.sweep.json")
  a.root.mkdir(parents=True, exist_ok=True)
  stated = json.loads(json.dumps(stage_sweep(a.q, stage, lrs)))  # as the file holds it
  if workdir_lib.read_json(spec) != stated:
    workdir_lib.write_json(spec, stated)
    if a.stop_new:
      log(f"ask: {stage}: wrote {spec}, not trained (--stop_before_new_stage): commit it, rerun")
      return False
  log(f"ask: {stage} → {where}")
  flag = lambda v: str(v).lower() if isinstance(v, bool) else v
  argv = [f"--config={a.q.config}", *(f"--config.{k}={flag(v)}" for k, v in a.settings.items())]
  sweep.launch(config_lib.override(Q.base_config(a.q), a.settings), str(spec), where, a.workers,
               a.shard, list(a.settings), argv, COMPILED, log)
  return True


def run(a: Asked, log=print) -> None:
  """Every stage for this command's cells, each resumed where it stopped: the pilot, the step past
  an edge, the pilot's seeds of the cells that take another cell's LR (`transfer`), the fresh
  seeds once every cell's LR is chosen; then the report."""
  if a.q.runs or any("pilot" in own for own in a.q.by_cell.values()):
    raise errors.UserError(f"question {a.q.name}: its runs were made before actlab.ask (`runs`) "
                           "or its cells have pilots of their own: `report` reads it, `run` "
                           "trains only questions with one pilot and no `runs`")
  if not a.mine:
    raise errors.UserError(f"--cells={a.cells}: no cell matches; the cells: {', '.join(a.q.cells)}")
  freeze(a, log)
  if (own := [c for c in a.mine if not a.q.lr_from(c)]) and not train(
      a, "pilot", dict.fromkeys(own), log):
    return
  s = a.read()
  if s.waiting("missing", a.mine):
    log("ask: pilot: another shard is still training it: rerun once it is done")
    return
  if edge := s.waiting("edge", a.mine):
    if not train(a, "edge", edge, log):
      return
    if (s := a.read()).waiting("edge", a.mine):
      log("ask: edge: another shard is still training it: rerun once it is done")
      return
  if transfer := s.waiting("transfer", a.mine):
    if not train(a, "transfer", transfer, log):
      return
    if (s := a.read()).waiting("transfer", a.mine):
      log("ask: transfer: another shard is still training it: rerun once it is done")
      return
  if s.lrs is None:
    waiting = {kind: s.waiting(kind) for kind in ("missing", "edge", "waits", "transfer")}
    log(f"ask: cells {', '.join(c for cells in waiting.values() for c in cells)} wait for their "
        "pilot, the step past an edge, or the LR another cell's pilot chooses: train them "
        "(--cells) and rerun")
    return
  log(f"ask: LRs chosen {page.fmt_lrs(s.lrs)}; n = {max(s.sizing['cell_n'].values())} "
      f"(asked {s.sizing['needed']})")
  if train(a, "fresh", {c: (s.lrs[c], s.sizing["cell_n"][c]) for c in a.mine
                        if c in s.sizing["cell_n"]}, log):
    report(a, log)


def report(a: Asked, log=print) -> None:
  """The verdicts: printed, and written with one figure beside the question's directory."""
  s = a.read()
  if s.lrs is None:
    raise errors.UserError(f"question {a.q.name}: its pilot is not complete in {a.root}; run it "
                           f"first: python -m actlab.ask {a.spec} run --workdir={a.root}")
  v = A.verdicts(s)
  out, text = report_path(a), report_text(a, s, v)
  workdir_lib.write_text(out, text)
  figure = page.figure(a.q, v, out.with_suffix(".png"))
  log(text.removesuffix("\n"))
  log(f"wrote {out}" + (f" and {figure}" if figure else ""))


def report_path(a: Asked) -> pathlib.Path:
  """Where `report` writes the page: `<question>.md` in the question's directory (the project's
  committed questions commit it beside their runs)."""
  return a.root / f"{a.q.name.replace(':', '_')}.md"


def report_text(a: Asked, s: A.Stages, v: dict) -> str:
  """The page `report` prints and writes: the design, the declaration, the verdict table, the
  runs not in the answer."""
  return "\n".join(page.report_lines(s, v, page.declaration_lines(s, a.root))) + "\n"


def plan(a: Asked, estimate: bool = True, log=print) -> None:
  """The design, the declaration frozen (runs made before actlab.ask: none) and the stages."""
  frozen = freeze(a, log) if not a.q.runs else None
  log("\n".join(page.design_lines(a.q)))
  if frozen:
    log(f"  declaration {frozen['hash']} frozen {frozen['time']} at {frozen['commit']} "
        f"→ {a.root / 'question.json'}")
  s = a.read()
  step = seconds_a_run(a, s) if estimate and not a.q.runs else None
  log("\n".join(page.stage_lines(s, a.mine, lambda n: None if step is None else duration(
      n * step / a.workers))))


def walls_here(a: Asked, s: A.Stages) -> list[float]:
  """The wall time of each run of this command's cells finished on this kind of device."""
  here = jax.devices()[0].device_kind
  return [A.run_wall(r) for runs in (s.pilot, s.fresh or {}) for cell in a.mine
          for r in runs.get(cell, {}).values() if A.has_finite(r, "wall_time_sec")
          and (r.get("provenance") or [{}])[-1].get("device_kind") == here]


def seconds_a_run(a: Asked, s: A.Stages) -> float:
  """One run's wall time here: the mean of `walls_here`, else a few steps of each cell timed."""
  if walls := walls_here(a, s):
    return float(np.mean(walls))
  from actlab import bench  # pylint: disable=import-outside-toplevel
  base, runs = Q.base_config(a.q), len(a.q.pilot.seeds) * len(a.q.pilot.lrs)
  configs = [config_lib.override(base.copy_and_resolve_references(),
                                 {**a.q.cells[c], Q.LR: a.q.pilot.lrs[0], **a.settings})
             for c in a.mine]
  return float(np.mean([bench.run_seconds(c, runs, sweep.program_runs(c, runs))
                        for c in configs]))


def settings(text: str) -> dict:
  """--set's fields: only runtime ones (how and where runs execute, not what they compute)."""
  out = config_lib.parse_overrides(text)
  if wrong := [k for k in out if not k.startswith(config_lib.RUNTIME_FIELDS)]:
    raise errors.UserError(f"--set {wrong[0]}: give only fields that do not change what a run "
                           f"computes ({', '.join(config_lib.RUNTIME_FIELDS)}); the others are "
                           "the question's")
  return out


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
  flags.DEFINE_bool("stop_before_new_stage", False, "run: write a stage's sweep file and stop "
                    "before its first run when the file is new or changed (to commit it first); "
                    "rerun to train it.")
  flags.DEFINE_bool("estimate", True, "plan: time a few steps of each cell to estimate wall time.")


def main(argv: list[str]) -> None:
  f = flags.FLAGS
  if not f["verbosity"].present:
    logging.set_verbosity(logging.WARNING)  # absl's and JAX's start-up lines
  if len(argv) != 3 or argv[2] not in ("plan", "run", "report"):
    raise errors.UserError(f"usage: {USAGE}")
  q = Q.load(argv[1])
  root = pathlib.Path(f.workdir or pathlib.Path("runs") / q.name.replace(":", "_"))
  a = Asked(argv[1], q, root, f.workers, grid.parse_shard(f.shard), settings(f.set), f.cells,
            f.stop_before_new_stage)
  {"plan": lambda: plan(a, f.estimate), "run": lambda: run(a), "report": lambda: report(a)}[
      argv[2]]()


if __name__ == "__main__":
  define_flags()
  errors.run(main)
