"""Each program compiled once: JAX's persistent compilation cache, on by default
(`train.compile_cache`), and the tally of what a run compiled and what it took from the cache,
in whichever thread (`carried` into a thread that compiles ahead, run/program.py's `Ahead`).

The cache lives in one folder per kind of host (`host_kind`: the platform, the CPU's model and
instruction set), so that a program compiled for one processor is never loaded on another. The
number of CPUs a process may use is not part of it: XLA:CPU splits its work over the threads it
finds when a program runs, not when it compiles, so a program compiled by a process with two CPUs
and loaded by one pinned to one CPU computes exactly what that process would have compiled
(tests/test_compile_cache.py).

Several processes share the folder: each entry is written whole by the process that compiled it,
and one read while it is written, truncated by a killed writer or overwritten fails JAX's
decompression check (zlib's or zstd's own): the program is compiled again, the entry replaced,
and one line says so. JAX's size cap is left off: it rereads every entry's access time at every
write, under one lock. The folder only grows; deleting it costs only compiles.
"""

import contextlib
import contextvars
import dataclasses
import hashlib
import os
import pathlib
import platform
import threading
import warnings
import zlib

import jax
from jax.experimental.compilation_cache import compilation_cache as jax_cache

DEFAULT = "~/.cache/actlab/xla"
_DAMAGED = "Error reading persistent compilation cache entry for '"


def directory(setting: str) -> pathlib.Path | None:
  """`train.compile_cache` as a folder: "off" → None; "auto" → $JAX_COMPILATION_CACHE_DIR, else
  ~/.cache/actlab/xla; else the path given."""
  if setting == "off":
    return None
  if setting == "auto":
    setting = os.environ.get("JAX_COMPILATION_CACHE_DIR") or DEFAULT
  return pathlib.Path(setting).expanduser()


def host_kind() -> str:
  """The folder name of this host's programs: the platform and a hash of the CPU's model and
  instruction-set flags (`/proc/cpuinfo` where there is one)."""
  cpu = platform.machine() + platform.processor()
  with contextlib.suppress(OSError):
    lines = pathlib.Path("/proc/cpuinfo").read_text().splitlines()
    cpu += "".join(sorted({l for l in lines if l.startswith(("model name", "flags"))}))
  return f"{jax.default_backend()}-{hashlib.sha256(cpu.encode()).hexdigest()[:10]}"


def enable(setting: str) -> pathlib.Path | None:
  """Points JAX's persistent cache at `directory(setting)/host_kind()` (every program, however
  fast it compiles), or turns it off; returns the folder. Call before the run compiles."""
  _listen()
  root = directory(setting)
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
  """What a run's process compiled while the tally was open: each program's name (JAX's: `jit(<the
  function's name>)`) and seconds, split into those XLA compiled and those taken from the cache;
  `trace_sec`, the seconds spent tracing and lowering to XLA."""
  compiled: list = dataclasses.field(default_factory=list)   # [(name, seconds)]
  cached: list = dataclasses.field(default_factory=list)     # [(name, seconds)]
  trace_sec: float = 0.0

  def summary(self) -> dict:
    """summary.json's `compile` entry."""
    names = lambda entries: sorted({n for n, _ in entries})
    return {"sec": round(sum(s for _, s in self.compiled + self.cached) + self.trace_sec, 3),
            "programs_compiled": len(self.compiled), "programs_cached": len(self.cached),
            "compiled": names(self.compiled), "cached": names(self.cached)}


_open: list[Tally] = []   # the tallies counting now (a run's, a benchmark's)
_hit = threading.local()  # set by a cache hit, read by the same thread's compile event
_for = contextvars.ContextVar("counted_in", default=None)  # this context's compiles count there
_listening = False


@contextlib.contextmanager
def tally(t: Tally | None = None):
  """A `Tally` (`t`, or a new one) of the programs compiled (or loaded) by any thread until the
  block ends, but those `counted_in` another."""
  t = t or Tally()
  _open.append(t)
  try:
    yield t
  finally:
    _open.remove(t)


@contextlib.contextmanager
def counted_in(t: Tally | None):
  """This thread's compiles count in `t` alone until the block ends (None: in the open tallies):
  a sweep's next group, compiled while another group's tally is open."""
  token = _for.set(t)
  try:
    yield
  finally:
    _for.reset(token)


def carried(fn):
  """`fn`, to run in another thread with this thread's `counted_in` tally (in a copy of this
  thread's context)."""
  context = contextvars.copy_context()
  return lambda: context.run(fn)


def abstract(tree):
  """`tree`'s arrays as shapes, dtypes (as JAX would hold them: a NumPy int64 as int32 without
  x64) and shardings."""
  return jax.tree.map(lambda x: jax.ShapeDtypeStruct(
      x.shape, jax.dtypes.canonicalize_dtype(x.dtype), sharding=getattr(x, "sharding", None)), tree)


def _listen() -> None:
  """Registers JAX's monitoring listeners behind `tally` (once per process) and the handler of a
  damaged entry's warning (again wherever something, e.g. `warnings.catch_warnings`, put back
  another `warnings.showwarning`)."""
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
  """Removes the entries of `module` whose contents fail decompression (JAX then compiles the
  program and writes it anew: it never overwrites an entry) and says so in one line."""
  folder = pathlib.Path(jax.config.jax_compilation_cache_dir)
  for path in folder.glob(f"{module}-*-cache"):
    with contextlib.suppress(OSError):
      if not _readable(path.read_bytes()):
        path.unlink()
        print(f"actlab: a damaged compilation-cache entry ({path.name[:40]}…, in {folder}) was "
              "removed; its program is compiled again", flush=True)


def _readable(data: bytes) -> bool:
  """Whether an entry decompresses as JAX wrote it: zlib, or zstd where Python 3.14's
  `compression.zstd` or the zstandard package is there (each checks its data)."""
  decompressors = [zlib.decompress]
  with contextlib.suppress(ImportError):
    from compression import zstd  # noqa: PLC0415 -- Python 3.14
    decompressors.append(zstd.decompress)
  with contextlib.suppress(ImportError):
    import zstandard  # noqa: PLC0415
    decompressors.append(zstandard.ZstdDecompressor().decompress)
  for decompress in decompressors:
    with contextlib.suppress(Exception):
      decompress(data)
      return True
  return False
