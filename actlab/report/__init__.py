"""Sweep directories → `report.md`, `runs.csv` and `plots/*.png` (`python -m actlab.report
--help`; what the report holds: docs/sweeps.md, "The report"; each number: docs/metrics.md §8,
§9); one run directory → its curves, `curves.png` (`write_run`)."""

import argparse
import pathlib
import shutil
import sys
from typing import Sequence

from actlab.infra import workdir
from actlab.infra.errors import UserError, reported
from actlab.report import load as report_load
from actlab.report import stats
from actlab.report import to_csv as report_csv


def pick_baseline(manifest, given: str | None = None) -> str | None:
  """The activation the others are compared against: `given`, the manifest's, or the first."""
  axis = stats.activation_axis(manifest)
  values = manifest["axes"][axis] if axis else []
  base = given or manifest.get("baseline") or next(iter(values), None)
  if base is not None and base not in values:
    raise UserError(f"baseline {base!r} is not one of the swept {axis or 'activation'} values "
                    f"{values}")
  return base


def relative(path) -> str:
  """`path` from the working directory where it lies below it (as a report's command names it)."""
  path, cwd = pathlib.Path(path).absolute(), pathlib.Path.cwd()
  return str(path.relative_to(cwd) if path.is_relative_to(cwd) else path)


def _consequence(unreadable: str) -> str:
  """What `report_load.load` could not read of a run, with what the report does about it."""
  if unreadable.endswith("metrics.jsonl"):
    return unreadable + " skipped"
  if unreadable.startswith("summary.json"):
    return unreadable + ": the run counts as not finished"
  return unreadable


NO_PLOTS = ("*Not drawn (`--no-plots`: a report committed beside its runs, whose `plots/` the "
            "repository does not keep); the same command without the flag draws them into "
            "`plots/` and links them here.*")


def write(roots, baseline: str | None = None, out=None, axes: Sequence[str] = (),
          plots: bool = True) -> pathlib.Path:
  """Writes the report of the sweep directory `roots` (or several merged, `axes` the fields they
  fix apart) into `out`; returns the path of its report.md."""
  # Here, not at the top: matplotlib and scipy take about a second to import, and the sweep
  # imports this package for `stats` alone (its grid checks), in every worker it starts.
  from actlab.report import plots as report_plots, tables
  roots = [roots] if isinstance(roots, (str, pathlib.Path)) else list(roots)
  if out is None and len(roots) > 1:
    raise UserError("several sweep directories: say where the report goes with --out=DIR")
  out = pathlib.Path(out if out is not None else roots[0])
  manifest, runs, duplicates = report_load.load_many(roots, axes)
  for run in runs:  # the runs table says it too; the console, so that it is not missed
    if run.unreadable:
      print(f"actlab.report: {run.name}: {'; '.join(map(_consequence, run.unreadable))}",
            file=sys.stderr)
  out.mkdir(parents=True, exist_ok=True)
  done = sum(r.state == "done" for r in runs)
  not_done = f" ({len(runs) - done} not: see *Runs*)" if done < len(runs) else ""
  named = ", ".join(duplicates[:3]) + (", …" if len(duplicates) > 3 else "")
  counted_once = (f"{len(duplicates)} run(s) were in more than one directory with the same "
                  f"config and count once ({named}). " if duplicates else "")
  command = " ".join(["python -m actlab.report", *map(relative, roots),
                      *(f"--axis={a}" for a in axes),
                      *([f"--out={relative(out)}"] if len(roots) > 1 else []),
                      *([] if plots else ["--no-plots"])])
  lines = [f"# {manifest.get('description') or 'Sweep report'}", "",
           f"Sweep `{manifest['sweep']}`: {done} of {len(runs)} runs finished{not_done}; seeds "
           f"{', '.join(map(str, manifest['seeds']))}. {counted_once}Per-run numbers: "
           f"`runs.csv`. Written by `{command}`.", ""]
  if block := report_load.block(roots):  # not GPT-2's, in every run
    lines += ["Block: " + ", ".join(f"{k}={v!r}" for k, v in block.items()) + " in every run "
              "(the other block fields at their defaults: docs/running.md, \"The block, field by "
              "field\").", ""]
  for title, text, table in tables.sections(manifest, runs, pick_baseline(manifest, baseline)):
    if table:
      lines += [f"## {title}", "", text, "", table, ""]
  drawn = report_plots.write(manifest, runs, out / "plots") if plots else [NO_PLOTS]
  lines += ["## Plots", "", *drawn, "", "## Runs", "", tables.runs_table(runs), ""]
  report_csv.write(manifest, runs, out / "runs.csv")
  path = out / "report.md"
  workdir.write_text(path, "\n".join(lines))
  return path


def write_run(run) -> str:
  """Draws the curves of the run directory `run` into `<run>/curves.png`; says what it drew."""
  from actlab.report import plots as report_plots  # matplotlib: see `write`
  run = pathlib.Path(run)
  rows, torn = workdir.read_rows(run / "metrics.jsonl")
  summary = workdir.read_summary(run, warn=False)
  status = summary["status"] if summary else "not finished"
  path = run / "curves.png"
  if not report_plots.plot_run(rows, f"{run.name} ({status})", path):
    raise UserError(f"{run} has logged no loss or gradient norm yet (metrics.jsonl): nothing to "
                    "draw")
  skipped = f"; {torn} unreadable line(s) of metrics.jsonl skipped" if torn else ""
  return (f"wrote {path}: train and val loss and gradient norm to step {rows[-1]['step']} "
          f"({status}){skipped}")


ARCHIVED = ("config.json", "summary.json", "metrics.jsonl")  # what a report reads of a run


def archive(root, out) -> pathlib.Path:
  """Copies what a report reads of the sweep in `root` into `out`, small enough to commit."""
  root, out = pathlib.Path(root), pathlib.Path(out)
  manifest = workdir.read_json(root / "sweep.json")
  if manifest is None:
    raise UserError(f"{root} has no readable sweep.json: archive a sweep's --workdir")
  held = workdir.read_json(out / "sweep.json")
  if held is not None and held.get("cells") != manifest.get("cells"):
    raise UserError(f"{out} holds the archive of another sweep; choose another --archive")
  for cell in manifest["cells"]:
    for name in ARCHIVED:
      if (root / cell["name"] / name).is_file():
        (out / cell["name"]).mkdir(parents=True, exist_ok=True)
        shutil.copyfile(root / cell["name"] / name, out / cell["name"] / name)
  workdir.write_json(out / "sweep.json", manifest)
  return out


def main(argv: Sequence[str]) -> int:
  parser = argparse.ArgumentParser(prog="python -m actlab.report", description="Sweep "
                                   "directories → report.md, runs.csv and plots/; one run "
                                   "directory → its curves, curves.png.")
  parser.add_argument("workdirs", nargs="+", help="the sweeps' --workdir: one, or several to "
                      "merge into one report (each run counted once); or one run's --workdir "
                      "(actlab.main), whose loss and gradient norm are drawn into it")
  parser.add_argument("--out", help="where the report goes (default: the only sweep directory; "
                      "required with several)")
  parser.add_argument("--baseline", help="the activation the others are compared against "
                      "(default: the manifest's `baseline`, else the grid's first activation)")
  parser.add_argument("--axis", action="append", default=[], help="with several sweep "
                      "directories: a field they fix at different values (e.g. model.qk_norm), "
                      "compared as an axis (repeatable)")
  parser.add_argument("--archive", help="copy the sweep's per-run data (sweep.json; each run's "
                      "config.json, summary.json, metrics.jsonl) here, and write the report "
                      "from the copy (one sweep directory)")
  parser.add_argument("--no-plots", dest="plots", action="store_false", help="draw and link no "
                      "plots: a report committed beside its runs, whose plots/ is not kept")
  args = parser.parse_args(argv[1:])
  with reported():
    if len(args.workdirs) == 1 and workdir.is_run(pathlib.Path(args.workdirs[0])):
      print(write_run(args.workdirs[0]))
      return 0
    if args.archive and len(args.workdirs) > 1:
      raise UserError("--archive takes one sweep directory")
    roots = [archive(args.workdirs[0], args.archive)] if args.archive else args.workdirs
    path = write(roots, args.baseline, args.out, args.axis, args.plots)
  print(f"wrote {path} and {path.parent / 'runs.csv'}"
        + (f" and {path.parent / 'plots'}/" if args.plots else ""))
  return 0
