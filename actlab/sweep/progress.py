"""A sweep's progress: one line per finished cell and the time left, timed from when the first
`at_once` cells had finished (they carry the compile and the data preparation)."""

import pathlib
import time
from typing import Callable, Mapping, Sequence

from actlab.infra import workdir as workdir_lib


def duration(seconds: float) -> str:
  """12.3 → "12 s", 754 → "12 min 34 s", 7384 → "2 h 03 min"."""
  s = int(round(seconds))
  if s < 60:
    return f"{s} s"
  if s < 3600:
    return f"{s // 60} min {s % 60} s"
  return f"{s // 3600} h {s % 3600 // 60:02d} min"


class Progress:
  """Counts a sweep's cells as they end, a line for each finished here (`at_once`: at a time)."""

  def __init__(self, names: Sequence[str], ended: Sequence[str], log: Callable[[str], None],
               clock: Callable[[], float] = time.perf_counter, at_once: int = 1):
    self.names, self.log, self.clock, self.at_once = list(names), log, clock, at_once
    self.seen = set(ended) & set(names)
    self.finished_here = 0
    self.steady_since = None  # when the first `at_once` cells had finished here
    self._polled = clock()

  def done(self, name: str, summary: Mapping, here: bool = True) -> None:
    """Cell `name` has ended: trained here (a line, and timed), or by another process."""
    if name in self.seen:
      return
    self.seen.add(name)
    if not here:
      return
    self.finished_here += 1
    if self.finished_here == self.at_once:
      self.steady_since = self.clock()
    steady = self.finished_here - self.at_once  # cells finished since
    left = len(self.names) - len(self.seen)
    eta = ((self.clock() - self.steady_since) / steady * left
           if left and steady >= self.at_once else None)
    val, wall = summary.get("final_val_loss"), summary.get("wall_time_sec")
    # e.g. "[3/12] lr=0.001,seed=0: stable, val loss 2.3456, 41 s; ETA 6 min 9 s"
    self.log(f"[{len(self.seen)}/{len(self.names)}] {name}: {summary.get('status')}, val loss "
             f"{'n/a' if val is None else f'{val:.4f}'}, "
             f"{'n/a' if wall is None else duration(wall)}"
             + ("" if eta is None else f"; ETA {duration(eta)}"))

  def poll(self, workdir: pathlib.Path, every: float = 1.0) -> None:
    """`done` for the cells whose summary.json has appeared, at most once every `every` seconds."""
    if self.clock() - self._polled < every:
      return
    self._polled = self.clock()
    for name in self.names:
      if name not in self.seen:
        summary = workdir_lib.read_summary(workdir / name, warn=False)
        if summary is not None:
          self.done(name, summary)
