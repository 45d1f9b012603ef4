"""What starting a device costs a process, and whether Python runs meanwhile:
`python benchmarks/device_start.py [CACHE_DIR]` (BENCHMARKS.md, "GPU: a run's cost").

Prints JAX's import, its backend's start (`jax.devices()`), the first transfer to the device (on
a GPU with XLA's default preallocation, the allocation of its memory pool) and a small program
compiled or, at a second call with the same CACHE_DIR, loaded from JAX's cache, each with the
main thread's Python rate while it ran in another thread (as a share of its rate alone: about
100% means it holds no Python lock), and the seconds from the last line to the process's end
(the pool's release and JAX's teardown), measured by the parent. Compare with
XLA_PYTHON_CLIENT_PREALLOCATE=false.
"""

import subprocess
import sys
import tempfile
import threading
import time


def rate(seconds: float = 0.3) -> float:
  """Python loop iterations per second on this thread, alone."""
  n, start = 0, time.perf_counter()
  while time.perf_counter() - start < seconds:
    n += 1
  return n / seconds


def beside(fn, alone: float) -> str:
  """fn's seconds in a thread, and the main thread's loop rate meanwhile as a share of `alone`."""
  out, done = {}, threading.Event()

  def run():
    start = time.perf_counter()
    fn()
    out["s"] = time.perf_counter() - start
    done.set()
  thread, n, start = threading.Thread(target=run), 0, time.perf_counter()
  thread.start()
  while not done.is_set():
    n += 1
    time.perf_counter()
  share = n / (time.perf_counter() - start) / alone
  return f"{out['s']:.2f} s, " + (f"Python beside it at {share:.0%}" if out["s"] > 0.05 else
                                  "too short to tell whether Python ran beside it")


def child(cache: str) -> None:
  t0 = time.perf_counter()
  import jax
  import jax.numpy as jnp
  import numpy as np
  jax.config.update("jax_compilation_cache_dir", cache)
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
  jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
  t1 = time.perf_counter()
  alone = rate()
  jax.devices()
  t2 = time.perf_counter()
  put = beside(lambda: jax.device_put(np.zeros((32, 128), np.int32)).block_until_ready(), alone)
  print(f"import {t1 - t0:.2f} s; backend {t2 - t1:.2f} s; first transfer {put}", flush=True)

  def loss(ws, x):
    for w in ws:
      x = jnp.tanh(x @ w)
    return (x ** 2).mean()
  lowered = jax.jit(jax.grad(loss)).lower([jnp.ones((512, 512))] * 24, jnp.ones((64, 512)))
  print(f"a 24-layer gradient compiled or loaded: {beside(lowered.compile, alone)}", flush=True)


def main() -> None:
  if len(sys.argv) > 2 and sys.argv[1] == "--child":
    return child(sys.argv[2])
  cache = sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp()
  proc = subprocess.Popen([sys.executable, __file__, "--child", cache], stdout=subprocess.PIPE,
                          text=True)
  for line in proc.stdout:
    last = time.perf_counter()
    print(line, end="", flush=True)
  proc.wait()
  print(f"exit: {time.perf_counter() - last:.2f} s after the last line")


if __name__ == "__main__":
  main()
