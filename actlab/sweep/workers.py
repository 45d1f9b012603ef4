"""`actlab.sweep --workers=N`: N child sweeps on this host, each on its own share of the hardware
(docs/sweeps.md, "Using all the hardware"): child k is pinned to block k of the parent's CPUs
(which also sizes its XLA:CPU thread pools) and sees only GPU k where there are GPUs."""

import collections
import itertools
import os
import pathlib
import signal
import socket
import subprocess
import sys
import time
from typing import Callable, Hashable, Mapping, Sequence

import numpy as np

from actlab.infra.errors import UserError

ENV = "ACTLAB_SWEEP_WORKER"  # "k/N" in the environment of child k of N


# cpus: a tuple; gpu: its CUDA_VISIBLE_DEVICES entry, None without GPUs.
Worker = collections.namedtuple("Worker", "index cpus gpu")


class Failed(UserError):
  """A child failed or was stopped; exits with its exit code."""

  def __init__(self, message: str, exit_code: int):
    super().__init__(message)
    self.exit_code = exit_code


def split_cpus(cpus: Sequence[int], n: int,
               core: Callable[[int], Hashable] = lambda cpu: cpu) -> list[list[int]]:
  """`cpus` as `n` blocks of sizes differing by at most one, a core's hyperthreads in one block."""
  if not 1 <= n <= len(cpus):
    raise ValueError(f"cannot split {len(cpus)} CPUs into {n} blocks")
  order = sorted(cpus, key=lambda cpu: (core(cpu), cpu))
  return [block.tolist() for block in np.array_split(order, n)]


def _core(cpu: int) -> tuple[int, ...]:
  """(socket, core) of a CPU as Linux reports it; (cpu,) where it does not."""
  topology = pathlib.Path(f"/sys/devices/system/cpu/cpu{cpu}/topology")
  try:
    return tuple(int((topology / f).read_text()) for f in ("physical_package_id", "core_id"))
  except (OSError, ValueError):
    return (cpu,)


def visible_gpus() -> list[str]:
  """CUDA_VISIBLE_DEVICES' entries, else one per /dev/nvidia<i> (the parent starts no CUDA)."""
  visible = os.environ.get("CUDA_VISIBLE_DEVICES")
  if visible is not None:
    return [d.strip() for d in visible.split(",") if d.strip()]
  count = sum(p.name[6:].isdigit() for p in pathlib.Path("/dev").glob("nvidia*"))
  return [str(i) for i in range(count)]


def ranges(cpus: Sequence[int]) -> str:
  """{0, 1, 2, 5} → "0-2,5"."""
  runs = [[cpu for _, cpu in run]  # in a run of consecutive CPUs, CPU − position is equal
          for _, run in itertools.groupby(enumerate(sorted(cpus)), lambda ic: ic[1] - ic[0])]
  return ",".join(f"{run[0]}-{run[-1]}" if len(run) > 1 else f"{run[0]}" for run in runs)


def plan(n: int) -> list[Worker]:
  """N workers on this process's CPUs (and GPUs); a UserError if there are fewer than N."""
  cpus = sorted(os.sched_getaffinity(0))
  if n > len(cpus):
    raise UserError(f"--workers={n}: this process may use {len(cpus)} CPU(s) ({ranges(cpus)}); "
                    f"use at most --workers={len(cpus)}")
  gpus = visible_gpus()
  if gpus and n > len(gpus):
    raise UserError(f"--workers={n}: {len(gpus)} GPU(s) visible; use at most "
                    f"--workers={len(gpus)}, or set CUDA_VISIBLE_DEVICES= to train on CPUs")
  return [Worker(k, tuple(block), gpus[k] if gpus else None)
          for k, block in enumerate(split_cpus(cpus, n, _core))]


def describe(cpus: Sequence[int], gpu: str | None) -> str:
  return f"CPUs {ranges(cpus)}" + (f", GPU {gpu}" if gpu else "")


def here() -> str:
  """This process as a child reports itself: "pid …, CPUs …[, GPU …]"."""
  gpu = os.environ.get("CUDA_VISIBLE_DEVICES")
  return f"pid {os.getpid()}, {describe(sorted(os.sched_getaffinity(0)), gpu)}"


def sibling(holder: Mapping) -> bool:
  """Whether the holder of a cell's lock (`Lock.Busy.holder`) is another child of our parent."""
  return (ENV in os.environ and holder.get("parent") == os.getppid()
          and holder.get("host") == socket.gethostname())


def whole_lines() -> None:
  """Makes stdout and stderr, which the parent and children share, write a line at a time."""
  for stream in (sys.stdout, sys.stderr):
    stream.reconfigure(write_through=False, line_buffering=True)


# A child is `python -m actlab.sweep` behind a handler set before it imports anything: SIGINT or
# SIGTERM outside the training loop (importing, compiling, between cells) ends it at once with
# 128 + the signal and no traceback (an exception raised in a C extension's import can crash the
# interpreter's exit; whatever it was writing, a rerun resumes past, as after SIGKILL); inside,
# the loop's own handler checkpoints first, then says so in one line.
_CHILD = ("import os, runpy, signal\n"
          "for s in (signal.SIGINT, signal.SIGTERM):\n"
          "  signal.signal(s, lambda signum, _: os._exit(128 + signum))\n"
          "runpy.run_module('actlab.sweep', run_name='__main__', alter_sys=True)\n")


def _start(w: Worker, n: int, argv: Sequence[str]) -> subprocess.Popen:
  env = {**os.environ, ENV: f"{w.index}/{n}"}
  if w.gpu is not None:
    env["CUDA_VISIBLE_DEVICES"] = w.gpu
  allowed = os.sched_getaffinity(0)
  os.sched_setaffinity(0, w.cpus)  # Inherited by the child (preexec_fn is unsafe with threads).
  try:
    # Its own session: a Ctrl-C reaches it once, from `run`. One progress bar per child would
    # garble the terminal; the children's log lines name their cells.
    return subprocess.Popen([sys.executable, "-c", _CHILD, *argv, "--workers=1",
                             "--config.train.progress=false"], env=env, start_new_session=True)
  finally:
    os.sched_setaffinity(0, allowed)


def run(workers: Sequence[Worker], argv: Sequence[str], log: Callable[[str], None],
        poll: Callable[[], None] = lambda: None) -> None:
  """Runs `python -m actlab.sweep *argv` as each worker, passing SIGINT/SIGTERM on, and waits,
  calling `poll()` meanwhile; `Failed` if a child failed or was stopped."""
  stop: list[int] = []
  previous = {s: signal.signal(s, lambda signum, _: stop.append(signum))
              for s in (signal.SIGINT, signal.SIGTERM)}
  try:
    procs = {}
    for w in workers:
      if stop:  # Stopped while starting: start no more.
        break
      procs[w] = _start(w, len(workers), argv)
    codes, forwarded = {}, 0
    while len(codes) < len(procs):
      for signum in stop[forwarded:]:  # Forwarded here, not in the handler: each child once.
        for p in procs.values():
          p.send_signal(signum)  # A no-op for a child that has ended.
      forwarded = len(stop)
      for w, p in procs.items():
        if w not in codes and p.poll() is not None:
          codes[w] = p.returncode if p.returncode >= 0 else 128 - p.returncode
          how = "done" if not codes[w] else (
              f"{'stopped' if stop else 'failed'} with exit code {codes[w]}")
          log(f"worker {w.index}/{len(workers)} ({describe(w.cpus, w.gpu)}): {how}")
      poll()
      time.sleep(0.1)
  finally:
    for s, handler in previous.items():
      signal.signal(s, handler)
  failed = [w for w in workers if codes.get(w)]
  if stop:
    raise Failed(f"stopped by signal {stop[0]}; rerun the same command to resume", 128 + stop[0])
  if failed:
    raise Failed(f"worker(s) {', '.join(str(w.index) for w in failed)} failed (see their output "
                 "above); rerun the same command to retry their unfinished cells",
                 codes[failed[0]])
