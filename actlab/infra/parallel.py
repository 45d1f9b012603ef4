"""Device mesh and shardings: one 1-D mesh `"data"` over every device of every process, data
parallel or FSDP. Every process builds the whole batch and feeds only its own rows."""

import dataclasses
import math
import os
from typing import Any

import jax
import numpy as np
from jax._src import xla_bridge
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from actlab.infra.errors import UserError

AXIS = "data"


class ParallelError(UserError, ValueError):
  """The parallel set-up cannot work (e.g. the batch does not split across the devices)."""


DETERMINISTIC_OPS = "--xla_gpu_deterministic_ops"


def initialize(cpu_devices: int = 0, distributed: bool = False, coordinator: str = "",
               num_processes: int = 0, process_id: int = -1,
               deterministic_ops: bool = False) -> None:
  """Sets up this process's devices and XLA's deterministic GPU ops, before JAX makes a backend;
  repeated calls are no-ops."""
  if deterministic_ops:
    ask_deterministic_ops()
  if cpu_devices and jax.config.jax_num_cpu_devices != cpu_devices:
    try:
      jax.config.update("jax_num_cpu_devices", cpu_devices)
    except RuntimeError:  # JAX refuses once its backends exist.
      raise ParallelError(f"parallel.cpu_devices={cpu_devices}: JAX's devices already exist in "
                          "this process; set it before anything uses JAX (e.g. on the command "
                          "line of actlab.main / actlab.bench)") from None
  if distributed and not jax.distributed.is_initialized():
    env = os.environ.get
    coordinator = coordinator or env("JAX_COORDINATOR_ADDRESS") or None
    count = num_processes or int(env("JAX_NUM_PROCESSES", 0)) or None
    index = process_id if process_id >= 0 else int(env("JAX_PROCESS_ID", -1))
    try:
      jax.distributed.initialize(coordinator, count, None if index < 0 else index)
    except (RuntimeError, ValueError) as e:
      raise ParallelError(f"parallel.distributed: {e} (set parallel.coordinator, "
                          "parallel.num_processes and parallel.process_id, or JAX_COORDINATOR_"
                          "ADDRESS, JAX_NUM_PROCESSES and JAX_PROCESS_ID)") from None


def deterministic_ops() -> bool:
  """Whether this process's XLA_FLAGS ask for deterministic GPU ops (the last setting counts)."""
  flags = [f.partition("=") for f in os.environ.get("XLA_FLAGS", "").split()]
  given = [value for name, _, value in flags if name == DETERMINISTIC_OPS]
  return bool(given) and given[-1].lower() in ("", "true", "1")


def ask_deterministic_ops() -> None:
  """Adds `--xla_gpu_deterministic_ops=true` to XLA_FLAGS unless a backend started already."""
  if deterministic_ops():
    return
  if xla_bridge.backends_are_initialized():
    if jax.default_backend() == "cpu":
      return  # Nothing to ask: a CPU's programs are deterministic already.
    raise ParallelError("train.deterministic_ops=true, but JAX's backend started in this process "
                        f"without {DETERMINISTIC_OPS}; train this config in a process of its own "
                        "(its own command, or a sweep worker: --workers)")
  kept = [f for f in os.environ.get("XLA_FLAGS", "").split()
          if f.partition("=")[0] != DETERMINISTIC_OPS]
  os.environ["XLA_FLAGS"] = " ".join([*kept, f"{DETERMINISTIC_OPS}=true"])


@dataclasses.dataclass(frozen=True)
class Plan:
  """Where every array of a run lives (`plan`)."""
  mesh: Mesh
  mode: str = "dp"
  fsdp_min_size: int = 1 << 14

  @property
  def num_devices(self) -> int:
    return self.mesh.size

  @property
  def sync_each_step(self) -> bool:
    """Wait for every step on several CPU devices: in jaxlib 0.10.2 their collectives can deadlock
    when many steps are queued."""
    return self.num_devices > 1 and not self.accelerated

  @property
  def replicated(self) -> NamedSharding:
    return NamedSharding(self.mesh, P())

  def batch_sharding(self, ndim: int = 2, stacked: bool = False) -> NamedSharding:
    """The batch axis (the first, or the second when runs are `stacked`) across the devices."""
    lead = (None,) if stacked else ()
    return NamedSharding(self.mesh, P(*lead, AXIS, *([None] * (ndim - 1 - len(lead)))))

  def leaf_sharding(self, shape) -> NamedSharding:
    """A state array's sharding: replicated (dp), or split along its largest divisible axis."""
    n = self.num_devices
    if self.mode == "dp" or n == 1 or math.prod(shape) < self.fsdp_min_size:
      return self.replicated
    for i in sorted(range(len(shape)), key=lambda i: (-shape[i], i)):
      if shape[i] % n == 0:
        return NamedSharding(self.mesh, P(*[AXIS if j == i else None for j in range(len(shape))]))
    return self.replicated

  def state_shardings(self, abstract_state) -> Any:
    """`leaf_sharding` per leaf of a pytree of arrays (AdamW moments share their parameters')."""
    return jax.tree.map(lambda x: self.leaf_sharding(np.shape(x)), abstract_state)

  def check_batch(self, batch_size: int) -> None:
    if batch_size % self.num_devices:
      raise ParallelError(
          f"train.batch_size={batch_size} does not split across {self.num_devices} devices; use a "
          f"multiple of {self.num_devices}")

  def shard_batch(self, batch, stacked: bool = False) -> Any:
    """The global batch (the same on every process) → jax.Arrays split along the batch axis; each
    process puts only its own devices' rows."""
    def put(x):
      x = np.asarray(x)
      sharding = self.batch_sharding(x.ndim, stacked)
      return jax.make_array_from_process_local_data(sharding, x, x.shape)
    return jax.tree.map(put, batch)

  @property
  def accelerated(self) -> bool:
    """Whether the devices are accelerators (GPUs, TPUs), whose host is idle while they step."""
    return self.mesh.devices.flat[0].platform != "cpu"

  def batch_like(self, batch, stacked: bool = False) -> Any:
    """`shard_batch`'s result as abstract arrays, to compile a program before the first batch."""
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(
        np.shape(x), jax.dtypes.canonicalize_dtype(np.asarray(x).dtype),
        sharding=self.batch_sharding(np.ndim(x), stacked)), batch)


def plan(batch_size: int, mode: str = "dp", num_devices: int = 0, fsdp_min_size: int = 1 << 14,
         devices=None) -> Plan:
  """The plan of a batch of `batch_size` over `devices` (default: the first `num_devices`)."""
  if devices is None:
    devices = jax.devices()
    if num_devices > len(devices):
      raise ParallelError(f"parallel.num_devices={num_devices}, but only {len(devices)} "
                          "devices exist")
    devices = devices[:num_devices or None]
  p = Plan(Mesh(np.array(list(devices)), (AXIS,)), mode, fsdp_min_size)
  p.check_batch(batch_size)
  return p
