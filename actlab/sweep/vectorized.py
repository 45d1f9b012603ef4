"""Whether a sweep trains a group's cells as one vectorized program (`sweep.vectorize`), and how
many one program holds (`program_size`). Vectorized runs pay where a run alone leaves the device
idle: on a GPU six runs of the reference config train at 1.86× one run's tokens/s (BENCHMARKS.md);
on a CPU the kernels are already compute-bound, so "auto" trains the cells one by one there."""

from typing import Callable

import jax
import ml_collections

from actlab import core
from actlab.core import kernels
from actlab.data import tokenizer
from actlab.measure import evaluators
from actlab.run import program

# The share of the device's memory (JAX's `bytes_limit`) the runs of one program may take by
# `run_bytes`; the rest is headroom for what the estimate leaves out (the batches, the libraries'
# workspace, fragmentation) and for R runs taking more than R × one (six vmapped runs: 6.0-6.4×).
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
  """An estimate of one run's device memory, as one device holds it; nothing compiles. The state
  is exact (`jax.eval_shape` of the step's init: the parameters, AdamW's two moments); the rest
  is an upper estimate of a step's workspace without remat (remat keeps less):
    gradients and updates in flight    2 × the parameters' bytes
    activations kept for the backward  layers · B·L · (16·D + 6·F + 3·H·L) · 4 bytes
    output logits, softmax, gradient   3 · rows · V · 4 bytes; rows = B·L, or one chunk's for
                                       the fused loss (kernels.chunk_length)
  and with sharpness estimates on (`metrics.sharpness_every`), 3× the last two: the power
  iteration's Hessian-vector products (forward over reverse) keep more than a training step.
  B = train.batch_size, L = data.seq_len, D = d_model, F = the FFN's hidden width, H = heads, V =
  the padded vocabulary (`model.vocab_size`, else the most ids the tokenizer can have). The
  coefficients are fitted to XLA's plans for the smoke and reference decoders' programs on a CPU
  and rounded up (the estimate was 1.07-1.7× the larger of the training and sharpness programs'
  plans there); activations count float32, which a bfloat16 run keeps in part (norms, softmax;
  there bfloat16 saved 10-20%)."""
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
