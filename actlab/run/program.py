"""The programs a run trains: a config's `core.Step` jitted for one run, or for R runs that differ
only in LR and seed on a leading run axis (`over_runs`), each compiled ahead in a thread (`Ahead`);
JAX's persistent compilation cache (`train.compile_cache`) and the `Tally` of what was compiled.
"""

import concurrent.futures
import contextlib
import contextvars
import dataclasses
import functools
import hashlib
import json
import os
import pathlib
import platform
import threading
import warnings
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax._src.compilation_cache import decompress_executable  # how JAX reads an entry
from jax.experimental.compilation_cache import compilation_cache as jax_cache
from jax.sharding import NamedSharding, PartitionSpec as P

from actlab import config as config_lib, core, tasks
from actlab.infra import checkpoint as checkpoint_lib, parallel, workdir
from actlab.infra.errors import UserError
from actlab.measure import evaluators as evaluators_lib


def over_runs(fn: Callable, runs: int, in_axes: tuple | int = 0, name: str | None = None):
  """One run's `fn` for `runs` runs, `jax.vmap`ped over the leading run axis where runs > 1
  (`in_axes`: None for an argument the runs share); `name` is the program's in JAX's logs."""
  mapped = jax.vmap(fn, in_axes=in_axes) if runs > 1 else fn

  def program(*args):
    return mapped(*args)
  program.__name__ = program.__qualname__ = name or getattr(fn, "__name__", "program")
  return program


def part(tree: Any, r: int, runs: int) -> Any:
  """Run r's part of a tree of `runs` runs (for one run, the tree itself)."""
  return jax.tree.map(lambda x: x[r], tree) if runs > 1 else tree


def abstract(tree):
  """`tree`'s arrays as shapes, dtypes (as JAX holds them) and shardings."""
  return jax.tree.map(lambda x: jax.ShapeDtypeStruct(
      x.shape, jax.dtypes.canonicalize_dtype(x.dtype), sharding=getattr(x, "sharding", None)), tree)


class Ahead:
  """A jitted function compiled in a thread (`start`) for the arguments it will get; a call waits
  for it."""

  def __init__(self, jitted: Callable):
    self.jitted, self.compiled, self.args = jitted, None, None

  def start(self, pool: concurrent.futures.Executor, *like) -> None:
    """Compiles for arguments like `like` in `pool`, unless that is under way or done."""
    args = abstract(like)
    if self.compiled and self.args == args and not (
        self.compiled.cancelled() or self.compiled.done() and self.compiled.exception()):
      return
    self.args = args
    self.compiled = pool.submit(carried(lambda: self.jitted.lower(*args).compile()))

  @property
  def done(self) -> bool:
    return self.compiled is None or self.compiled.done()

  def ready(self) -> "Ahead":
    if self.compiled:
      self.compiled.result()
    return self

  def __call__(self, *args):
    if self.compiled is None or self.compiled.cancelled():  # none started, or its pool shut
      return self.jitted(*args)
    return self.compiled.result()(*args)


@dataclasses.dataclass(frozen=True)
class Program:
  """A config's `core.Step` jitted for R runs (for R > 1, with a leading run axis but for the
  shared validation and sharpness batches)."""
  step: core.Step
  plan: parallel.Plan
  runs: int
  shardings: core.TrainState  # of the program's state
  run_state_like: core.TrainState  # one run's state, abstract: what a checkpoint restores into
  init: Ahead           # ([R] seeds, [R] peak LRs) -> core.TrainState
  train_step: Ahead     # (state, batch) -> (state, metrics); donates the state
  log_step: Ahead       # the same step with `diagnostics`: for the steps the loop logs
  evaluators: evaluators_lib.Evaluators
  eval_step: Ahead      # (params, batch) -> the validation evaluators' device values
  sharpness_step: Ahead | None  # (params, batch) -> top Hessian eigenvalues; None when off
  split: Ahead | None   # R > 1: state -> each run's part (`parts`)
  checksums: Ahead      # one run's state -> its checkpoint's checksums (`checkpoint.sums`)

  @classmethod
  def create(cls, config, vocab_size: int, runs: int = 1,
             plan: parallel.Plan | None = None) -> "Program":
    config = config_lib.typed(config)
    step = create_step(config, vocab_size)
    p = config.parallel
    plan = plan or parallel.plan(config.train.batch_size, p.mode, p.num_devices, p.fsdp_min_size)
    # `init`'s shapes from the function the program jits: JAX keeps the trace for its compile.
    init = over_runs(step.init, runs, name="init")
    shape = jax.eval_shape(init, *abstract(init_args([config] * runs, runs)))
    if runs > 1:  # one run's shapes
      shape = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape[1:], x.dtype), shape)
    run_shardings = plan.state_shardings(shape)
    run_state_like = jax.tree.map(
        lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), shape, run_shardings)
    state = (run_shardings if runs == 1 else
             jax.tree.map(lambda s: NamedSharding(plan.mesh, P(None, *s.spec)), run_shardings))
    shared_batch = plan.batch_sharding(1)  # any rank: its first axis split
    batch = plan.batch_sharding(2, stacked=True) if runs > 1 else shared_batch
    evaluators = evaluators_lib.Evaluators.create(config.metrics, config.train.steps)
    jit_step = lambda diagnostics, name: Ahead(jax.jit(
        over_runs(functools.partial(step.train_step, diagnostics=diagnostics), runs, name=name),
        donate_argnums=0, in_shardings=(state, batch), out_shardings=(state, plan.replicated)))
    on_params = lambda fn, name: Ahead(jax.jit(
        over_runs(functools.partial(fn, step), runs, (0, None), name=name),
        in_shardings=(state.params, shared_batch)))

    def split(s):
      return [part(s, r, runs) for r in range(runs)]
    return cls(step, plan, runs, state, run_state_like,
               init=Ahead(jax.jit(init, out_shardings=state)),
               train_step=jit_step(False, "train_step"), log_step=jit_step(True, "log_step"),
               evaluators=evaluators,
               eval_step=on_params(evaluators.validation_step, "eval_step"),
               sharpness_step=evaluators.sharpness and on_params(evaluators.sharpness,
                                                                 "sharpness_step"),
               split=(Ahead(jax.jit(split, out_shardings=[run_shardings] * runs))
                      if runs > 1 else None),
               checksums=Ahead(checkpoint_lib.sums))

  def start(self, configs: Sequence) -> core.TrainState:
    """The initial state of the runs of `configs` (their seeds and peak LRs)."""
    return self.init(*init_args(configs, self.runs))

  def stack(self, states: Sequence[core.TrainState]) -> core.TrainState:
    """Single runs' states as this program's, stacked in host memory where this process holds
    them whole (no program to compile at a resume), else by XLA."""
    if self.runs == 1:
      return jax.device_put(states[0], self.shardings)
    held = lambda x: getattr(x, "is_fully_addressable", True)  # numpy: always
    stack = lambda *xs: np.stack(jax.device_get(xs)) if all(map(held, xs)) else jnp.stack(xs)
    return jax.device_put(jax.tree.map(stack, *states), self.shardings)

  def parts(self, state: core.TrainState) -> list[core.TrainState]:
    """Each run's part of the program's state (for R > 1, by `split`)."""
    return self.split(state) if self.split else [state]

  def part(self, tree: Any, r: int) -> Any:
    return part(tree, r, self.runs)

  def put_batches(self, batches: list, like: bool = False) -> Any:
    """One host batch per run → the devices (stacked for R > 1); with `like`, abstract."""
    put = self.plan.batch_like if like else self.plan.shard_batch
    if self.runs == 1:
      return put(batches[0])
    return put(jax.tree.map(lambda *xs: np.stack(xs), *batches), stacked=True)

  @property
  def state_like(self) -> core.TrainState:
    """The program's state as abstract arrays with their shardings (for R > 1, stacked)."""
    if self.runs == 1:
      return self.run_state_like
    return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct((self.runs, *x.shape), x.dtype,
                                                          sharding=s),
                        self.run_state_like, self.shardings)

  def compile_ahead(self, pool, batch, init_args: tuple | None, first_logged: bool,
                    sharpness_first=None) -> Callable[[Any, Any], None]:
    """Starts compiling in `pool` `init` for `init_args` (None: a resume), the first step for
    batches like `batch` (None: no step left) and the sharpness program for `sharpness_first`.
    Returns what starts the rest, to call once the first step is dispatched: tracing holds
    Python's lock, and a program traced beside the first step's would delay it."""
    state = self.state_like
    first, then = ((self.log_step, self.train_step) if first_logged
                   else (self.train_step, self.log_step))
    if init_args is not None:
      self.init.start(pool, *init_args)
    if batch is not None:
      first.start(pool, state, batch)
    if sharpness_first is not None:
      self.sharpness_step.start(pool, state.params, sharpness_first)

    def rest(val_batch, sharpness_batch):
      self.eval_step.start(pool, state.params, val_batch)
      if self.sharpness_step:
        self.sharpness_step.start(pool, state.params, sharpness_batch)
      if batch is not None:
        then.start(pool, state, batch)
      if self.split:
        self.split.start(pool, state)
      self.checksums.start(pool, self.run_state_like)
      checkpoint_lib.use_compiled(self.run_state_like, self.checksums)
    return rest

  def compile_all(self, pool, dataset, fresh: Sequence = ()) -> None:
    """Starts compiling every program for `dataset` (`init` for `fresh` runs' configs): a sweep's
    next group, while another trains."""
    batch = self.put_batches([dataset.train_batch(0)] * self.runs, like=True)
    val_batch = self.plan.batch_like(dataset.val_batches()[0])
    fresh_args = init_args(fresh[:self.runs], self.runs) if len(fresh) >= self.runs else None
    self.compile_ahead(pool, batch, fresh_args, False)(val_batch,
                                                       self.sharpness_batch(dataset, like=True))

  def sharpness_batch(self, dataset, like: bool = False) -> Any:
    """The sharpness estimates' batch, training batch 0 of seed 0 for every run, on the devices
    (with `like`, abstract); None when off."""
    if self.sharpness_step is None:
      return None
    batch = dataclasses.replace(dataset, seed=0).train_batch(0)
    return self.plan.batch_like(batch) if like else self.plan.shard_batch(batch)


def init_args(configs: Sequence, runs: int) -> tuple:
  """`init`'s arguments: the runs' seeds and peak LRs (for one run, scalars)."""
  seeds = np.array([c.train.seed for c in configs])
  lrs = np.array([c.optim.lr for c in configs], np.float32)
  return (seeds, lrs) if runs > 1 else (seeds[0], lrs[0])


def create_step(config, vocab_size: int) -> core.Step:
  """The config's `core.Step`: its task's objective and the optimizer."""
  config = config_lib.typed(config)
  return core.Step(tasks.get(config).objective(config, vocab_size), config.optim_spec,
                   config.data.seq_len)


class GroupError(UserError, ValueError):
  """The runs cannot share one program; the message says why."""


def compile_key(config, vocab_size: int) -> str:
  """The config as the compiled functions see it: all but the initial state's fields (peak LR,
  seed, `train.init_from`) and those no program reads (`runtime="harness"`)."""
  ignored = {"optim.lr", "train.seed", "train.init_from",
             *(key for key, how in config_lib.marked("runtime").items() if how == "harness")}
  fields = config.fields if isinstance(config, config_lib.Config) else config.to_dict()
  c = {k: v for k, v in workdir.dotted(fields).items() if k not in ignored}
  return json.dumps({"config": c, "vocab_size": vocab_size}, sort_keys=True, default=str)


def check_group(configs: Sequence) -> None:
  """Raises unless the configs differ only in `optim.lr` and `train.seed`."""
  base = json.loads(compile_key(configs[0], 0))["config"]
  for c in configs[1:]:
    diffs = workdir.diff_configs(base, json.loads(compile_key(c, 0))["config"])
    if diffs:
      raise GroupError("runs trained as one program may differ only in optim.lr and train.seed; "
                       "these also differ: " + "; ".join(diffs))


_getting = threading.Lock()  # a sweep makes its next group's program in a thread


def get(config, vocab_size: int, runs: int = 1, cache: dict | None = None) -> Program:
  """`Program.create`, reused from `cache` (a sweep's dict) for the same `compile_key` and runs."""
  if cache is None:
    return Program.create(config, vocab_size, runs)
  key = (runs, compile_key(config, vocab_size))
  with _getting:
    if key not in cache:
      cache[key] = Program.create(config, vocab_size, runs)
    return cache[key]


# --- Each program compiled once ------------------------------------------------------------------
# One folder per kind of host (`host_kind`): a program compiled for one processor is never loaded
# on another (the CPU count does not count: tests/test_compile_cache.py). A damaged entry is
# compiled again and replaced, in one line. JAX's size cap is off (it rereads every entry's access
# time at every write).

DEFAULT_CACHE = "~/.cache/actlab/xla"
_DAMAGED = "Error reading persistent compilation cache entry for '"


def cache_directory(setting: str) -> pathlib.Path | None:
  """`train.compile_cache` as a folder: "off" → None; "auto" → $JAX_COMPILATION_CACHE_DIR, else
  ~/.cache/actlab/xla; else the path given."""
  if setting == "off":
    return None
  if setting == "auto":
    setting = os.environ.get("JAX_COMPILATION_CACHE_DIR") or DEFAULT_CACHE
  return pathlib.Path(setting).expanduser()


def host_kind() -> str:
  """This host's folder: the platform and a hash of the CPU's model and instruction-set flags."""
  cpu = platform.machine() + platform.processor()
  with contextlib.suppress(OSError):
    lines = pathlib.Path("/proc/cpuinfo").read_text().splitlines()
    cpu += "".join(sorted({l for l in lines if l.startswith(("model name", "flags"))}))
  return f"{jax.default_backend()}-{hashlib.sha256(cpu.encode()).hexdigest()[:10]}"


def enable_cache(setting: str) -> pathlib.Path | None:
  """Points JAX's persistent cache, for every program, at `cache_directory(setting)/host_kind()`
  or turns it off; returns the folder."""
  _listen()
  root = cache_directory(setting)
  if root is None:
    jax.config.update("jax_enable_compilation_cache", False)
    return None
  path = root / host_kind()
  if jax.config.jax_compilation_cache_dir != str(path):
    jax_cache.reset_cache()
    jax.config.update("jax_enable_compilation_cache", True)
    jax.config.update("jax_compilation_cache_dir", str(path))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
  return path


@dataclasses.dataclass
class Tally:
  """What a process compiled while the tally was open, by name and seconds, and what it loaded from
  the cache; `trace_sec`, tracing and lowering."""
  compiled: list = dataclasses.field(default_factory=list)   # [(name, seconds)]
  cached: list = dataclasses.field(default_factory=list)     # [(name, seconds)]
  trace_sec: float = 0.0

  def summary(self) -> dict:
    """summary.json's `compile` entry."""
    names = lambda entries: sorted({n for n, _ in entries})
    return {"sec": round(sum(s for _, s in self.compiled + self.cached) + self.trace_sec, 3),
            "programs_compiled": len(self.compiled), "programs_cached": len(self.cached),
            "compiled": names(self.compiled), "cached": names(self.cached)}


_open: list[Tally] = []   # the tallies counting now
_hit = threading.local()  # set by a cache hit, read by the same thread's compile event
_for = contextvars.ContextVar("counted_in", default=None)  # this context's compiles count there
_listening = False


@contextlib.contextmanager
def tally(t: Tally | None = None):
  """A `Tally` (`t`, or a new one) of what any thread compiles until the block ends, but for what
  is `counted_in` another."""
  t = t or Tally()
  _open.append(t)
  try:
    yield t
  finally:
    _open.remove(t)


@contextlib.contextmanager
def counted_in(t: Tally | None):
  """This thread's compiles count in `t` alone until the block ends (a sweep's next group)."""
  token = _for.set(t)
  try:
    yield
  finally:
    _for.reset(token)


def carried(fn):
  """`fn`, to run in another thread with this thread's `counted_in` tally."""
  context = contextvars.copy_context()
  return lambda: context.run(fn)


def _listen() -> None:
  """Registers JAX's listeners behind `tally` (once) and the handler of a damaged entry's warning
  (again where another `warnings.showwarning` was put back)."""
  global _listening
  if not _listening:
    _listening = True
    jax.monitoring.register_event_listener(_on_event)
    jax.monitoring.register_event_duration_secs_listener(_on_duration)
  if not getattr(warnings.showwarning, "replaces_damaged", False):
    shown = warnings.showwarning

    def show(message, category, filename, lineno, file=None, line=None):
      if str(message).startswith(_DAMAGED):
        replace_damaged(str(message)[len(_DAMAGED):].split("'")[0])
      else:
        shown(message, category, filename, lineno, file, line)
    show.replaces_damaged = True
    warnings.showwarning = show
  warnings.filterwarnings("always", message=_DAMAGED)


def _on_event(event: str, **_):
  if event == "/jax/compilation_cache/cache_hits":
    _hit.value = True


def _on_duration(event: str, seconds: float, fun_name: str = "?", **_):
  tallies = [t] if (t := _for.get()) else _open
  if event == "/jax/core/compile/backend_compile_duration":
    hit, _hit.value = getattr(_hit, "value", False), False
    for t in tallies:
      (t.cached if hit else t.compiled).append((fun_name, seconds))
  elif event in ("/jax/core/compile/jaxpr_trace_duration",
                 "/jax/core/compile/jaxpr_to_mlir_module_duration"):
    for t in tallies:
      t.trace_sec += seconds


def replace_damaged(module: str) -> None:
  """Removes, in one line, the entries of `module` that fail decompression (JAX then compiles the
  program anew)."""
  folder = pathlib.Path(jax.config.jax_compilation_cache_dir)
  for path in folder.glob(f"{module}-*-cache"):
    with contextlib.suppress(OSError):
      if not _readable(path.read_bytes()):
        path.unlink()
        print(f"actlab: a damaged compilation-cache entry ({path.name[:40]}…, in {folder}) was "
              "removed; its program is compiled again", flush=True)


def _readable(data: bytes) -> bool:
  """Whether an entry decompresses as JAX reads it (zstd or zlib, as JAX has them)."""
  try:
    decompress_executable(data)
  except Exception:  # zlib.error or zstd's: each library raises its own
    return False
  return True
