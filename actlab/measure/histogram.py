"""Histograms with fixed bin edges (docs/metrics.md §4): `count` runs in the jitted evaluation
step, `Histogram.pool` adds every batch's counts on the host. The bins are `numpy.histogram`'s,
plus an underflow and an overflow (NaN included)."""

import dataclasses
from typing import Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np


def edges(bins: int, limit: float) -> np.ndarray:
  """`bins` equal bins over [-limit, limit]: bins + 1 float32 edges."""
  return np.linspace(-limit, limit, bins + 1, dtype=np.float32)


def count(x: jax.Array, edges_E: np.ndarray) -> dict:
  """Traced: {"counts": [underflow, bins…, overflow], "min", "max", "sum", "sum_squares"}."""
  x_N = x.reshape(-1).astype(jnp.float32)
  e = jnp.asarray(edges_E, jnp.float32)
  n = len(edges_E) - 1
  lo, hi = edges_E[0], edges_E[-1]
  inside = (x_N >= lo) & (x_N <= hi)                       # False for NaN
  x_in = jnp.where(inside, x_N, lo)
  i = jnp.clip(jnp.floor((x_in - lo) * (n / (hi - lo))), 0, n - 1).astype(jnp.int32)
  i = i - (x_in < e[i])                                    # The guess is off by at most one:
  i = i + ((x_in >= e[i + 1]) & (i < n - 1))               # correct it against the edges.
  slot = jnp.where(inside, i + 1, jnp.where(x_N < lo, 0, n + 1))
  return {"counts": jnp.bincount(slot, length=n + 2).astype(jnp.int32),
          "min": x_N.min(), "max": x_N.max(), "sum": x_N.sum(),
          "sum_squares": jnp.sum(jnp.square(x_N))}


@dataclasses.dataclass(frozen=True)
class Histogram:
  """A pooled histogram: `counts` = [underflow, bins…, overflow] over `edges`."""
  edges: np.ndarray          # [n + 1]
  counts: np.ndarray         # [n + 2], int64
  min: float
  max: float
  sum: float
  sum_squares: float

  @classmethod
  def pool(cls, edges_E: np.ndarray, batches: Sequence[Mapping]) -> "Histogram":
    """The histogram of every entry of the batches (their `count` outputs, on the host)."""
    return cls(edges_E, np.sum([np.asarray(b["counts"], np.int64) for b in batches], axis=0),
               min(float(b["min"]) for b in batches), max(float(b["max"]) for b in batches),
               sum(float(b["sum"]) for b in batches),
               sum(float(b["sum_squares"]) for b in batches))

  @property
  def num(self) -> int:
    return int(self.counts.sum())

  def buckets(self) -> tuple[np.ndarray, np.ndarray]:
    """(edges, counts) for a tracker: the bins, and the under- and overflow as a bucket each."""
    lo, hi = float(self.edges[0]), float(self.edges[-1])
    width = (hi - lo) / (len(self.edges) - 1)
    under, counts, over = self.counts[0], self.counts[1:-1], self.counts[-1]
    edges_ = [float(e) for e in self.edges]
    if under:
      edges_, counts = [self.min if self.min < lo else lo - width] + edges_, np.r_[under, counts]
    if over:
      edges_, counts = edges_ + [self.max if self.max > hi else hi + width], np.r_[counts, over]
    return np.array(edges_), counts
