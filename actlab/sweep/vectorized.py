"""Whether a sweep trains a group's cells as one vectorized program (`sweep.vectorize`), and how
many one program holds (`program_size`); docs/sweeps.md says when it pays."""

from typing import Callable

import jax
import ml_collections

from actlab import core
from actlab.core import kernels
from actlab.data import tokenizer
from actlab.measure import evaluators
from actlab.run import program

# The share of the device's memory (JAX's `bytes_limit`) the runs of one program may take by
# `run_bytes`; the rest is headroom for what the estimate leaves out.
MEMORY_FRACTION = 0.8
GIB = 1 << 30


def vectorizes(config: ml_collections.ConfigDict, backend: str | None = None) -> bool:
  """`sweep.vectorize` (`switched_on`)."""
  return switched_on(config.sweep.vectorize, backend)


def switched_on(setting, backend: str | None = None) -> bool:
  """An "auto"/"true"/"false" sweep setting (or a bool, from before "auto"); "auto": where JAX's
  default backend (or `backend`) is an accelerator."""
  setting = str(setting).lower()
  if setting == "auto":
    return (backend or jax.default_backend()) != "cpu"
  return setting == "true"


def device_memory() -> int | None:
  """The bytes JAX may allocate on this process's first device; None where it does not say."""
  return (jax.local_devices()[0].memory_stats() or {}).get("bytes_limit")


def run_bytes(config: ml_collections.ConfigDict) -> int:
  """An upper estimate of one run's device memory, nothing compiled: the state exactly, a gradient
  and an update, and a workspace of activations and logits (docs/sweeps.md, "How many runs one
  program holds"; the coefficients are fitted to XLA's plans on a CPU and rounded up)."""
  # The workspace: activations kept for the backward, then the logits, softmax and gradient of
  # `rows` rows; 3× with sharpness estimates (the Hessian-vector products keep more than a step).
  step = program.create_step(config, tokenizer.nominal_vocab_size(config))
  state = jax.eval_shape(step.init, 0, 1.0)
  nbytes = lambda tree: sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(tree))
  spec = step.objective.model.spec
  B, L, V = config.train.batch_size, config.data.seq_len, spec.vocab_size
  D, F, H = spec.d_model, spec.ffn_width, spec.num_heads
  fused = isinstance(step.objective, core.CausalLM) and config.model.loss_impl == "fused"
  rows = B * (kernels.chunk_length(B, L, V) if fused else L)
  workspace = spec.num_layers * B * L * (16 * D + 6 * F + 3 * H * L) * 4 + 3 * rows * V * 4
  if evaluators.Evaluators.create(config.metrics, config.train.steps).sharpness:
    workspace *= 3
  return nbytes(state) + 2 * nbytes(state.params) + workspace


def program_size(config: ml_collections.ConfigDict, cells: int, bytes_limit: int | None,
                 log: Callable[[str], None] | None = None) -> int:
  """The cells of a group of `cells` that one vectorized program trains: at most `sweep.max_runs`
  (> 0) and those whose `run_bytes` fit in `MEMORY_FRACTION` of `bytes_limit` (at least 1);
  `log` hears when the memory splits the group."""
  size = min(cells, config.sweep.max_runs or cells)
  if size == 1 or bytes_limit is None:
    return size
  per_run = run_bytes(config)
  fit = max(1, int(MEMORY_FRACTION * bytes_limit) // per_run)
  if fit >= size:
    return size
  if log:
    log(f"sweep: {fit} cells per program (device memory: {bytes_limit / GIB:.1f} GiB, about "
        f"{per_run / GIB:.1f} GiB a run)")
  return fit
