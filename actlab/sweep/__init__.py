"""Runs a grid of configs, one workdir per cell: in this process, in N child processes on this
host (`--workers=N`) or as shard i of N independent jobs (`--shard=i/N`); docs/sweeps.md. Shards
split cells, not compile groups (groups are few and unequal)."""

import concurrent.futures
import contextlib
import functools
import os
import pathlib
import sys
import time
from typing import Callable, Sequence

import ml_collections
from absl import flags, logging
from ml_collections import config_flags

from actlab import tasks
from actlab.infra import errors
from actlab.infra import workdir as workdir_lib
from actlab.measure import metrics
from actlab.run import program as program_lib, tracking, train
from actlab.sweep import progress
from actlab.sweep import vectorized
from actlab.sweep import workers
from actlab.sweep.grid import (SEED_KEY, Cell, cells, load, parse_shard, with_flags,
                               write_manifest)


_say = functools.partial(print, flush=True)


def group(cells_: Sequence[Cell]) -> list[list[Cell]]:
  """Cells that can share compiled functions (configs equal but for LR and seed), in order."""
  groups: dict[str, list[Cell]] = {}
  for cell in cells_:
    groups.setdefault(program_lib.compile_key(cell.config, 0), []).append(cell)
  return list(groups.values())


def run_group(group_: Sequence[Cell], workdir: pathlib.Path, cache: dict,
              log: Callable[[str], None] = _say,
              progress_: progress.Progress | None = None,
              ahead: "CompileNext | None" = None) -> list[dict | None]:
  """Trains the unfinished cells of one group (vectorized: `program_runs` at a time); their
  summaries, None for a cell another process is training. `ahead` compiles the next group."""
  summaries, todo = {}, []
  run_dirs = {cell.name: workdir_lib.RunDir.open(workdir / cell.name) for cell in group_}
  for cell in group_:
    summary = run_dirs[cell.name].summary()
    if summary is not None:
      log(f"{cell.name}: done before ({summary.get('status')}), skipped")
      summaries[cell.name] = summary
    else:
      todo.append(cell)
  size = program_runs(group_[0].config, len(todo), log)
  compiled, then = ahead.hooks(group_) if ahead else (None, None)
  while todo:
    with contextlib.ExitStack() as held:
      chunk = []  # The next cells no other process is training, locked while they train here.
      while todo and len(chunk) < size:
        cell = todo.pop(0)
        try:
          held.enter_context(run_dirs[cell.name].lock())
        except workdir_lib.Lock.Busy as e:
          if not workers.sibling(e.holder):  # Another worker's cell: its parent reports it.
            log(f"{cell.name}: skipped: {e}")
          continue
        summary = run_dirs[cell.name].summary()
        if summary is None:
          chunk.append(cell)
        else:  # Finished by another process since the check above.
          log(f"{cell.name}: done by another process ({summary.get('status')}), skipped")
          summaries[cell.name] = summary
          if progress_:
            progress_.done(cell.name, summary, here=False)
      if not chunk:
        break
      if len(chunk) > 1:
        log(f"sweep: {len(chunk)} cells as one program (vectorized ×{len(chunk)})")
      done = train.run_group([c.config for c in chunk], [run_dirs[c.name] for c in chunk],
                             cache=cache, log=log, compiled=compiled, then=then)
      compiled = then = None
      for cell, summary in zip(chunk, done):
        summaries[cell.name] = summary
        if progress_:
          progress_.done(cell.name, summary)
  return [summaries.get(cell.name) for cell in group_]


def program_runs(config: ml_collections.ConfigDict, todo: int,
                 log: Callable[[str], None] | None = None) -> int:
  """The runs one program of a group with `todo` cells holds (`vectorized.program_size`, or 1)."""
  if not (vectorized.vectorizes(config) and todo > 1):
    return 1
  return vectorized.program_size(config, todo, vectorized.device_memory(), log)


class CompileNext:
  """Compiles a sweep's next compile group in a thread once the one before has dispatched its
  first step, where the two read the same data; where it fails, one line says so."""

  def __init__(self, workdir: pathlib.Path, order: Sequence[Sequence[Cell]], cache: dict,
               log: Callable[[str], None]):
    self.workdir, self.order, self.cache, self.log = workdir, order, cache, log
    self.pool = concurrent.futures.ThreadPoolExecutor(max_workers=4, thread_name_prefix="next")
    self.tallies: dict[str, program_lib.Tally] = {}  # compile key → what was compiled for it
    self.seen: set[str] = set()

  def hooks(self, cells_: Sequence[Cell]):
    """(the tally of what was compiled ahead for `cells_`, the function that starts the next)."""
    key = lambda cells: program_lib.compile_key(cells[0].config, 0)
    self.seen.add(key(cells_))
    later = self.order[self.order.index(cells_) + 1:] if cells_ in self.order else []
    upcoming = [c for c in later if key(c) not in self.seen]
    a, b = cells_[0].config, upcoming[0][0].config if upcoming else None
    then = None
    if b and tasks.name(a) == tasks.name(b) and a.data.to_dict() == b.data.to_dict():
      cells_next = upcoming[0]
      self.seen.add(key(cells_next))
      tally = self.tallies[key(cells_next)] = program_lib.Tally()
      then = lambda: self.pool.submit(self._compile, cells_next, tally).add_done_callback(
          self._failed)
    return self.tallies.pop(key(cells_), None), then

  def _failed(self, job: concurrent.futures.Future) -> None:
    if not job.cancelled() and job.exception():
      self.log(f"sweep: compiling the next group ahead failed ({job.exception()}); it compiles "
               "when it starts")

  def _compile(self, cells_: Sequence[Cell], tally: program_lib.Tally) -> None:
    todo = [c for c in cells_ if workdir_lib.read_summary(self.workdir / c.name) is None]
    if not todo:
      return
    config = cells_[0].config
    with program_lib.counted_in(tally):
      dataset = tasks.get(config).dataset(config)
      program = program_lib.get(config, dataset.tokenizer.vocab_size,
                                program_runs(config, len(todo)), self.cache)
      fresh = [c.config for c in todo if not (self.workdir / c.name / "checkpoints").is_dir()]
      program.compile_all(self.pool, dataset, fresh)

  def close(self) -> None:
    self.pool.shutdown(wait=True, cancel_futures=True)


def plan(base: ml_collections.ConfigDict, spec: str, workdir: pathlib.Path,
         shard: tuple[int, int] = (0, 1), manifest: bool = True, overridden: Sequence[str] = (),
         log: Callable[[str], None] = _say) -> list[Cell]:
  """The cells of `shard` of the sweep `spec` on `base`, the `overridden` flags winning; with
  `manifest` (not in a `--workers` child) also writes and checks `sweep.json`."""
  if where := workdir_lib.in_run(workdir):
    raise errors.UserError(f"--workdir {workdir} {where} a run directory; give the sweep a new "
                           "directory, or an earlier sweep's")
  sweep, replaced = with_flags(load(spec), base, overridden)
  grid = cells(base, sweep)
  if manifest:
    write_manifest(workdir, spec, sweep, grid)
    for line in replaced:
      log(line)
  return grid[shard[0]::shard[1]]


def _at_once(cells_: Sequence[Cell], workers_: int = 1, backend: str | None = None,
             bytes_limit: int | None = None) -> int:
  """Cells training at once: `workers_` × one program's (vectorized: its largest group's)."""
  if not (cells_ and vectorized.vectorizes(cells_[0].config, backend)):
    return workers_
  return workers_ * max(vectorized.program_size(g[0].config, len(g), bytes_limit)
                        for g in group(cells_))


def _ended(cells_: Sequence[Cell], workdir: pathlib.Path) -> dict[str, dict]:
  return {c.name: s for c in cells_ if (s := workdir_lib.read_summary(workdir / c.name))}


def _end(cells_: Sequence[Cell], workdir: pathlib.Path, results: dict,
         log: Callable[[str], None]) -> None:
  """The parent's last words: the cells others still train; TensorBoard's HParams table."""
  if len(results) < len(cells_):
    log(f"sweep: {len(cells_) - len(results)} cell(s) are being trained by another process; "
        "rerun this command once it is done to see every cell finished")
  if cells_ and cells_[0].config.metrics.tensorboard and tracking.write_hparams(workdir):
    log(f"sweep: HParams table in {workdir / 'tb_hparams'} (tensorboard --logdir {workdir})")


def run(base: ml_collections.ConfigDict, spec: str, workdir, log: Callable[[str], None] = _say,
        cache: dict | None = None, shard: tuple[int, int] = (0, 1),
        worker: bool = False, overridden: Sequence[str] = ()) -> dict[str, dict]:
  """Runs (or continues) the cells of `shard` of the sweep `spec` in `workdir`, seed by seed (a
  sweep stopped early pairs every cell on the seeds it finished); {cell name: summary}."""
  workdir = pathlib.Path(workdir)
  mine = plan(base, spec, workdir, shard, manifest=not worker, overridden=overridden, log=log)
  groups = group(mine)
  part = f" (shard {shard[0]}/{shard[1]})" if shard[1] > 1 else ""
  ended = _ended(mine, workdir)
  log(f"sweep: {len(mine)} cells{part} ({len(ended)} done before) in {len(groups)} compile "
      f"group(s) → {workdir}")
  # The parent reports progress; a worker's parent does it for all of them.
  progress_ = None if worker else progress.Progress(
      [c.name for c in mine], list(ended), log,
      at_once=_at_once(mine, bytes_limit=vectorized.device_memory()))
  cache = {} if cache is None else cache
  results = {}
  vectorize = bool(mine) and vectorized.vectorizes(mine[0].config)
  seeds = [None] if vectorize else sorted({c.overrides[SEED_KEY] for c in mine})
  order = [cells_ for seed in seeds for group_ in groups  # the groups' cells, in training order
           if (cells_ := [c for c in group_ if seed is None or c.overrides[SEED_KEY] == seed])]
  ahead = (CompileNext(workdir, order, cache, log)
           if mine and vectorized.switched_on(mine[0].config.sweep.compile_next) else None)
  try:
    for cells_ in order:
      summaries = run_group(cells_, workdir, cache, log, progress_, ahead)
      results.update((c.name, s) for c, s in zip(cells_, summaries) if s is not None)
  finally:
    if ahead:
      ahead.close()
  if not worker:
    _end(mine, workdir, results, log)
  return results


def launch(base: ml_collections.ConfigDict, spec: str, workdir, workers_: int = 1,
           shard: tuple[int, int] = (0, 1), overridden: Sequence[str] = (),
           argv: Sequence[str] = (), cache: dict | None = None,
           log: Callable[[str], None] = _say) -> dict[str, dict]:
  """The sweep `spec` trained in this process (`run`), or by `workers_` children running
  `python -m actlab.sweep *argv`, this process reporting their progress; {cell name: summary}."""
  workdir = pathlib.Path(workdir)
  if workers_ == 1:
    train.initialize(base)  # Devices and hosts first (a parent leaves them to its children).
    return run(base, spec, workdir, log, cache, shard, overridden=overridden)
  if base.parallel.distributed:
    raise errors.UserError("--workers=N starts N independent processes on this host; with "
                           "parallel.distributed use --workers=1 (several hosts: --shard=i/N)")
  workers.plan(workers_)  # Too few CPUs (or GPUs) are refused before anything is written.
  mine = plan(base, spec, workdir, shard, overridden=overridden, log=log)
  ended = _ended(mine, workdir)
  if todo := len(mine) - len(ended):
    team = workers.plan(min(workers_, todo))  # No idle child holding CPUs.
    log(f"sweep: {todo} of {len(mine)} cells to train, {len(team)} workers: " + "; ".join(
        f"worker {w.index} on {workers.describe(w.cpus, w.gpu)}" for w in team))
    # The parent starts no backend (it would take GPU memory): its children's is the GPU's or
    # the CPU's, their memory unknown here.
    backend = "gpu" if team[0].gpu else "cpu"
    progress_ = progress.Progress([c.name for c in mine], list(ended), log,
                                  at_once=_at_once(mine, len(team), backend))
    try:
      workers.run(team, [*argv, f"--sweep={spec}", f"--workdir={workdir}",
                         f"--shard={shard[0]}/{shard[1]}"], log,
                  poll=lambda: progress_.poll(workdir))
    finally:
      progress_.poll(workdir, every=0)  # The cells that ended since the last look.
  results = _ended(mine, workdir)
  _end(mine, workdir, results, log)
  return results


def main(argv):
  del argv
  FLAGS = flags.FLAGS
  if not FLAGS["verbosity"].present:
    logging.set_verbosity(logging.WARNING)  # Orbax logs every save at INFO.
  t0 = time.perf_counter()
  workdir, shard = pathlib.Path(FLAGS.workdir), parse_shard(FLAGS.shard)
  # The keys of the --config.<key> flags: they win over the sweep's fixed values.
  overridden = list(config_flags.get_override_values(FLAGS["config"]))
  workers.whole_lines()  # A parent's and its children's lines share one stream.
  if worker := os.environ.get(workers.ENV):  # A child of `--workers`: its parent reports.
    train.initialize(FLAGS.config)
    log = lambda message: _say(f"worker {worker}: {message}")
    log(workers.here())
    run(FLAGS.config, FLAGS.sweep, workdir, log, shard=shard, worker=True, overridden=overridden)
    return
  results = launch(FLAGS.config, FLAGS.sweep, workdir, FLAGS.workers, shard, overridden,
                   sys.argv[1:])
  counts = {s: sum(r.get("status") == s for r in results.values()) for s in metrics.STATUSES}
  print(f"sweep done in {time.perf_counter() - t0:.0f} s: "
        + ", ".join(f"{n} {s}" for s, n in counts.items())
        + f"; report: python -m actlab.report {FLAGS.workdir}")
