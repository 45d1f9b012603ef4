"""Comparing and measuring pytrees of arrays in the equivalence tests."""

import jax
import numpy as np


def state_bytes_per_device(state) -> int:
  """Bytes of `state` held by the first local device (shows what FSDP saves)."""
  device = jax.local_devices()[0]
  total = 0
  for leaf in jax.tree.leaves(state):
    if isinstance(leaf, jax.Array):
      for shard in leaf.addressable_shards:
        if shard.device == device:
          total += shard.data.size * shard.data.dtype.itemsize
  return total


def tree_max_abs_diff(a, b) -> float:
  """max |a − b| over two pytrees of the same structure (for the equivalence tests)."""
  a, b = jax.device_get(a), jax.device_get(b)  # host copies: any two layouts compare
  diffs = jax.tree.map(lambda x, y: float(np.max(np.abs(np.asarray(x, np.float64)
                                                        - np.asarray(y, np.float64)))), a, b)
  return float(max(jax.tree.leaves(diffs), default=0.0))
