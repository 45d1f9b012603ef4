"""Timing on a shared machine: `Window` measures a stretch of code (wall time, this process's CPU
time, other processes' busy cores), `wait_quiet` waits for the others to leave the CPU, and
`side_by_side` times several benches in alternating rounds so that their load hits all alike,
step by step (latency) and `back_to_back` (throughput, as the training loop queues steps)."""

from __future__ import annotations

import os
import resource
import statistics
import time


def _busy_ticks() -> int | None:
  """Busy CPU ticks of the whole machine so far (Linux), for the background load."""
  try:
    with open("/proc/stat") as f:
      fields = [int(x) for x in f.readline().split()[1:]]
    return fields[0] + fields[1] + fields[2] + sum(fields[5:8])
  except (OSError, ValueError, IndexError):
    return None


class Window:
  """Wall time, this process's CPU time and everyone else's busy cores over a stretch of code."""

  def __enter__(self):
    self.ticks, self.t0 = _busy_ticks(), time.perf_counter()
    r = resource.getrusage(resource.RUSAGE_SELF)
    self.cpu0 = r.ru_utime + r.ru_stime
    return self

  def __exit__(self, *exc):
    self.wall = time.perf_counter() - self.t0
    r = resource.getrusage(resource.RUSAGE_SELF)
    self.cpu = r.ru_utime + r.ru_stime - self.cpu0
    ticks = _busy_ticks()
    self.busy = (None if ticks is None or self.ticks is None
                 else (ticks - self.ticks) / os.sysconf("SC_CLK_TCK"))


def wait_quiet(max_wait_s: float, threshold: float = 0.2, window_s: float = 5.0) -> float | None:
  """Waits (up to `max_wait_s`) until other processes keep fewer than `threshold` CPU cores busy
  over a `window_s` window; returns the last load seen (None where it cannot be measured)."""
  deadline = time.time() + max_wait_s
  while True:
    with Window() as w:  # This process sleeps: the machine's busy time is everyone else's.
      time.sleep(window_s)
    if w.busy is None:
      return None
    load = w.busy / window_s
    if load < threshold or time.time() > deadline:
      return load


def _alternating(count: int, steps: int, rounds: int):
  """(bench index, steps per round) in `rounds` alternating rounds over `count` benches, ABBA
  order: every other round runs them backwards, so neither goes first every time."""
  per_round = max(1, -(-steps // rounds))
  for r in range(rounds):
    order = range(count)
    yield from ((i, per_round) for i in (reversed(order) if r % 2 else order))


def side_by_side(benches, steps: int, rounds: int) -> list[dict]:
  """Times `steps` steps of every bench in `rounds` alternating rounds (ABBA order); with
  rounds = steps they alternate step by step, so that load from other processes, which comes
  and goes, hits all of them alike."""
  out = [{"times": [], "cpu": 0.0, "wall": 0.0, "busy": 0.0, "busy_known": True}
         for _ in benches]
  for i, per_round in _alternating(len(benches), steps, rounds):
    with Window() as w:
      res = benches[i].timed(per_round)
    o = out[i]
    o["times"] += res["times"]
    o["cpu"] += res["cpu"]
    o["wall"] += w.wall
    if w.busy is None:
      o["busy_known"] = False
    else:
      # The worker's own CPU shows up in the machine's busy time: subtract it as well.
      o["busy"] += w.busy - res["cpu"] - (w.cpu if benches[i].name.startswith("PyTorch") else 0)
  return out


def back_to_back(benches, steps: int, rounds: int) -> list[dict]:
  """Times `steps` steps of every bench queued back to back, one wait per round, in `rounds`
  alternating rounds (ABBA): the throughput the training loop gets, which does not wait for a
  step before it queues the next. Returns each bench's `queued_s` per step."""
  walls = [[] for _ in benches]
  for i, per_round in _alternating(len(benches), steps, rounds):
    walls[i].append(benches[i].queued(per_round)["wall"] / per_round)
  return [{"queued_s": statistics.median(w)} for w in walls]
