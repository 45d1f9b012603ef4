"""What XLA's compile options cost and buy, program by program:
`python benchmarks/compile_options.py --config=<config>[:variant] [--config.x=y …] [--runs=R]
[--options=default,no_triton_gemm,autotune_0] [--programs=train_step,sharpness_step]
[--calls=10]` (BENCHMARKS.md, "GPU: the six-run study").

Each option set in `--options` runs in a process of its own (XLA:GPU keeps the kernels it timed
for the rest of a process, which would flatter the option sets that come later). There each
program of `program.Program` named in `--programs` is lowered and compiled afresh (JAX's persistent
cache off) with those options, then called `--calls` times on the config's first batches, on a
state of zeros of the program's shapes (timing only: no `init` to compile), each call waited for.
One markdown row per pair: the compile's seconds and the median call's milliseconds. The option
sets (XLA's `DebugOptions`; a CPU accepts and ignores the GPU ones, so the script runs anywhere):
  default          XLA's own settings
  no_triton_gemm   matmuls through cuBLAS, not Triton kernels that XLA:GPU compiles and times
  autotune_0       no timing of candidate kernels at all (`xla_gpu_autotune_level=0`)
The question it answers on a GPU: whether a program that runs rarely (`sharpness_step`, every
`metrics.sharpness_every` steps) should be compiled with less autotuning, where its compile is
most of a cold run's wait (about 100-125 s on an H100) and its calls a small share of the run.
"""

import statistics
import subprocess
import sys
import time

import jax
import numpy as np
from absl import flags

from actlab import tasks
from actlab.infra import errors
from actlab.run import program as program_lib

OPTIONS = {
    "default": {},
    "no_triton_gemm": {"xla_gpu_enable_triton_gemm": False},
    "autotune_0": {"xla_gpu_autotune_level": 0},
}
PROGRAMS = ("train_step", "log_step", "eval_step", "sharpness_step")
HEADER = "| program | options | compile (s) | call (ms, median) |\n|---|---|---|---|"


def arguments(name: str, state, batch, val_batch, sharpness_batch) -> tuple:
  """The arguments `name` is called with: for a step, a copy of the state, which it donates."""
  if name in ("train_step", "log_step"):
    return jax.tree.map(lambda x: x.copy(), state), batch
  return state.params, val_batch if name == "eval_step" else sharpness_batch


def main(argv):
  del argv
  F = flags.FLAGS
  for given, known, flag in ((F.options, OPTIONS, "options"), (F.programs, PROGRAMS, "programs")):
    if unknown := sorted(set(given) - set(known)):
      raise errors.UserError(f"--{flag}: unknown {', '.join(unknown)}; choose from "
                             f"{', '.join(known)}")
  if len(F.options) > 1:  # One process per option set (this one leaves the device alone).
    for i, option in enumerate(F.options):
      argv = [a for a in sys.argv if not a.startswith("--options")] + [f"--options={option}"]
      out = subprocess.run([sys.executable, *argv], capture_output=True, text=True)
      if out.returncode:
        last = (out.stderr.strip() or out.stdout.strip() or "no output").splitlines()[-1]
        raise errors.UserError(f"--options={option}: {last.removeprefix('error: ')}")
      device, rows = out.stdout.split(HEADER, 1)
      if i == 0:
        print(device + HEADER)
      print(rows.strip(), flush=True)
    return
  jax.config.update("jax_enable_compilation_cache", False)  # Every compile is a compile.
  config = _CONFIG.value
  dataset = tasks.get(config).dataset(config)
  program = program_lib.Program.create(config, dataset.tokenizer.vocab_size, F.runs)
  if missing := [name for name in F.programs if getattr(program, name) is None]:
    raise errors.UserError(f"the config has no {', '.join(missing)}: metrics.sharpness_every is 0 "
                           "or more than train.steps")
  state = jax.tree.map(lambda x: jax.device_put(np.zeros(x.shape, x.dtype), x.sharding),
                       program.state_like)
  batch = program.put_batches([dataset.train_batch(0)] * F.runs)
  val_batch = program.plan.shard_batch(dataset.val_batches()[0])
  sharpness_batch = program.sharpness_batch(dataset)
  print(f"{jax.devices()[0].device_kind}; jax {jax.__version__}; runs {F.runs}\n{HEADER}")
  for name in F.programs:
    ahead = getattr(program, name)
    for option in F.options:
      args = arguments(name, state, batch, val_batch, sharpness_batch)
      t0 = time.perf_counter()
      compiled = ahead.jitted.lower(*args).compile(compiler_options=OPTIONS[option])
      compile_s = time.perf_counter() - t0
      calls = []
      for _ in range(F.calls):
        args = arguments(name, state, batch, val_batch, sharpness_batch)
        jax.block_until_ready(args)
        t0 = time.perf_counter()
        jax.block_until_ready(compiled(*args))
        calls.append(time.perf_counter() - t0)
      print(f"| {name} | {option} | {compile_s:.1f} | {1e3 * statistics.median(calls):.2f} |",
            flush=True)


if __name__ == "__main__":
  _CONFIG = errors.define_config_file("config", "Config file, e.g. configs/x.py:smoke.")
  errors.require("config")
  flags.DEFINE_integer("runs", 1, "vectorized runs per program (program.Program)")
  flags.DEFINE_list("options", list(OPTIONS), f"option sets, of {', '.join(OPTIONS)}")
  flags.DEFINE_list("programs", ["train_step", "sharpness_step"], f"of {', '.join(PROGRAMS)}")
  flags.DEFINE_integer("calls", 10, "calls timed per program and option set")
  errors.run(main)
