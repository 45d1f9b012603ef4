"""Every entry point that trains (main, sweep, bench) sets up devices and hosts
(`parallel.initialize`) before anything asks JAX for a device: a JAX backend, once made, can no
longer be split into CPU devices or join a distributed run. Each runs in a fresh process under
`GUARD`, which ends the process (exit 99, with the stack) when a backend is made before
`parallel.initialize` has run. The guarded runs of main and sweep are runs the suite makes anyway:
test_distributed.py's one-process reference (`--config.parallel.cpu_devices=2`: it must use 2
devices) and test_sweep.py's one-process sweep; bench's is here. CPU devices are a CPU property:
on a GPU host too, the entry points run on the CPU (`conftest.CPU_ONLY`)."""

import json
import os
import subprocess
import sys

import pytest

from conftest import CPU_ONLY, REPO

GUARD = """
import os, runpy, sys, traceback
from jax._src import xla_bridge
from actlab.infra import parallel
set_up = []
initialize, backends = parallel.initialize, xla_bridge.backends
def guarded_initialize(*args, **kwargs):
  set_up.append(True)
  return initialize(*args, **kwargs)
def guarded_backends():
  if not set_up:
    traceback.print_stack()
    print("GUARD: a JAX backend was made before parallel.initialize", file=sys.stderr, flush=True)
    os._exit(99)
  return backends()
parallel.initialize, xla_bridge.backends = guarded_initialize, guarded_backends
sys.argv = sys.argv[1:]
runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)
"""
TINY = f"--config={REPO / 'tests' / 'tiny_config.py'}"


def guarded(module: str) -> list[str]:
  """The command line that runs `python -m module` under `GUARD`."""
  return [sys.executable, "-c", GUARD, module]


@pytest.mark.slow
def test_bench_sets_up_devices_first(tmp_path):
  out = tmp_path / "rows.jsonl"
  proc = subprocess.run([*guarded("actlab.bench"), TINY, "--config.parallel.cpu_devices=2",
                         "--steps=2", "--warmup=1", f"--json_out={out}"], cwd=REPO,
                        capture_output=True, text=True, timeout=600, env={**os.environ, **CPU_ONLY})
  assert proc.returncode == 0, proc.stderr[-4000:]
  (row,) = [json.loads(line) for line in out.read_text().splitlines()]
  assert row["env"]["devices"] == 2 and "cpu_devices=2" in row["config"]


def test_the_guard_fails_a_process_that_asks_for_a_device_first(tmp_path):
  (tmp_path / "eager.py").write_text("import jax\njax.devices()\n")
  proc = subprocess.run(guarded("eager"), cwd=tmp_path, capture_output=True, text=True,
                        timeout=120, env={**os.environ, **CPU_ONLY})
  assert proc.returncode == 99 and "before parallel.initialize" in proc.stderr
