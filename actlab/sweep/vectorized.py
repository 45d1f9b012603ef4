"""Whether a sweep trains a group's cells as one vectorized program (`sweep.vectorize`).
Vectorized runs pay where a run alone leaves the device idle: on a GPU six runs of the reference
config train at 1.86× one run's tokens/s (BENCHMARKS.md); on a CPU the kernels are already
compute-bound, so "auto" trains the cells one by one there."""

import jax
import ml_collections


def vectorizes(config: ml_collections.ConfigDict, backend: str | None = None) -> bool:
  """`sweep.vectorize`: "true" or "false" (or a bool, as a config.json from before "auto" holds
  it) as it says; "auto": where JAX's default backend (or `backend`) is an accelerator."""
  setting = str(config.sweep.vectorize).lower()
  if setting == "auto":
    return (backend or jax.default_backend()) != "cpu"
  return setting == "true"
