"""Trains runs in their run directories: `run(config, workdir)` one run, `run_group` runs that
differ only in `optim.lr` and `train.seed` as one program. What can refuse a run is checked before
anything is written; a finished run returns its summary untouched; a run resumes exactly.
"""

import contextlib
import dataclasses
import functools
import gc
import time
from typing import Callable, Sequence

from actlab import config as config_lib
from actlab import data, tasks
from actlab.infra import parallel, workdir
from actlab.infra.checkpoint import Checkpoints
from actlab.infra.workdir import RunDir
from actlab.run import loop, pretrained, program as program_lib
from actlab.run.rows import Lane


def initialize(config) -> config_lib.Config:
  """`config` typed, and this process's devices and XLA flags set up for it (every entry point that
  trains calls this before anything asks JAX for a device)."""
  config = config_lib.typed(config)
  p = config.parallel
  parallel.initialize(p.cpu_devices, p.distributed, p.coordinator, p.num_processes, p.process_id,
                      config.train.deterministic_ops)
  return config


def run(config, workdir, cache: dict | None = None) -> dict:
  """Trains (or resumes) the run of `config` in `workdir`; returns its summary. `cache`: as
  `program.get`'s."""
  return run_group([config], [workdir], cache)[0]


_trained_before = False  # the first run_group's fixed cost counts from the process's start


def run_group(configs: Sequence, workdirs: Sequence, cache: dict | None = None,
              log: Callable[[str], None] = print, compiled: program_lib.Tally | None = None,
              then: Callable[[], None] | None = None) -> list[dict]:
  """Trains (or resumes) the runs `configs[i]` in `workdirs[i]` (paths or `RunDir`s), those that
  resume at the same step as one program, and returns their summaries. A sweep passes what it
  compiled ahead (`compiled`) and what to do once the first step is dispatched (`then`)."""
  global _trained_before
  began = time.perf_counter() if _trained_before else None
  _trained_before = True
  checked = [config_lib.typed(c) for c in configs]
  initialize(checked[0])  # Before anything asks JAX for a device (`RunDir.open` does).
  run_dirs = [RunDir.open(w) for w in workdirs]
  for r in run_dirs:
    workdir.check_usable(r.root)
    if workdir.is_sweep(r.root):
      raise workdir.WorkdirError(f"--workdir {r.root} is a sweep directory (sweep.json); give the "
                                 "run a directory of its own, or continue the sweep with "
                                 "actlab.sweep")
    workdir.check_unused(r.root)
  program_lib.enable_cache(checked[0].train.compile_cache)
  with program_lib.tally(compiled) as compiles, fewer_collections():
    return _run_group(checked, run_dirs, cache, log, compiles, began, then)


@contextlib.contextmanager
def fewer_collections(young: int = 10_000):
  """Python's garbage collector run a fourteenth as often (`young` new objects between passes, not
  700): its passes over tracing's short-lived objects were a tenth of a run's tracing."""
  before = gc.get_threshold()
  gc.set_threshold(young, *before[1:])
  try:
    yield
  finally:
    gc.set_threshold(*before)


def finished(config, run_dir: RunDir) -> dict | None:
  """The summary of the run of `config` in `run_dir` if it has ended; raises for another run."""
  run_dir.check_config(config_lib.typed(config).fields, config_lib.RUNTIME_FIELDS)
  return run_dir.summary()


def _run_group(configs, run_dirs, cache, log, compiles, began, then) -> list[dict]:
  if len(configs) > 1:
    program_lib.check_group(configs)
  unfinished = sum(finished(c, r) is None for c, r in zip(configs, run_dirs))
  if not unfinished:
    return [r.summary() for r in run_dirs]
  c0 = configs[0]
  task = tasks.get(c0)
  dataset = task.dataset(c0)
  vocab_size = dataset.tokenizer.vocab_size
  program = program_lib.get(c0, vocab_size, unfinished, cache)  # Checks the devices.
  source = pretrained.init_from_config(c0, vocab_size) if c0.train.init_from else None
  with contextlib.ExitStack() as held:
    for r in run_dirs:
      held.enter_context(r.lock())
    held.enter_context(workdir.full_disk_reported(run_dirs[0].root))
    summaries = [finished(c, r) for c, r in zip(configs, run_dirs)]  # Again, now they are ours.
    by_start = {}  # start step -> [(run index, its Checkpoints, its restored checkpoint)]
    for i, (c, r) in enumerate(zip(configs, run_dirs)):
      if summaries[i] is not None:
        continue
      r.write_config(c.fields)
      if data.saved_tokenizer(r.tokenizer) is None:
        data.save_tokenizer(dataset.tokenizer, r.tokenizer)
      checkpoints = held.enter_context(Checkpoints(r.checkpoints, c.train.keep_checkpoints))
      restored = checkpoints.restore_latest(program.run_state_like)
      by_start.setdefault(restored[0] if restored else 0, []).append((i, checkpoints, restored))
    if len(by_start) > 1 or (len(configs) > 1 and any(summaries)):
      log(f"runs at steps {sorted(by_start)} (or finished): training them by start step, one "
          "after another")
    for start, members in sorted(by_start.items()):
      if program.runs != len(members):
        program = program_lib.get(c0, vocab_size, len(members), cache)
      group = [configs[i] for i, _, _ in members]
      initial = functools.partial(
          initial_state, program, group, [restored for _, _, restored in members], source,
          vocab_size)
      lanes = [Lane.open(c, task, run_dirs[i],
                         dataclasses.replace(dataset, seed=int(c.train.seed)), ck, start,
                         restored[2] if restored else None)
               for c, (i, ck, restored) in zip(group, members)]
      for (i, _, _), summary in zip(members, loop.train_lanes(program, lanes, initial, start,
                                                              vocab_size, compiles, began, then)):
        summaries[i] = summary
      began, then = time.perf_counter(), None  # The next group's fixed cost counts from here.
  return summaries


def initial_state(program: program_lib.Program, configs: list, restored: list, source,
                  vocab_size: int):
  """The state a group of runs starts from: their `restored` checkpoints', or `init`'s for
  `configs`, with each run's trunk from `source` (`train.init_from`) if any."""
  if restored[0]:
    return program.stack([r[1] for r in restored])
  state = program.start(configs)
  if source is None:
    return state
  return program.stack([run.replace(params=pretrained.params_from(
      configs[0], source, run.params, vocab_size)) for run in program.parts(state)])
