"""Every entry point that trains (main, sweep, bench) sets up devices and hosts
(`parallel.initialize`) before anything asks JAX for a device: a JAX backend, once made, can no
longer be split into CPU devices or join a distributed run. Each runs in a fresh process under
`GUARD`, which ends the process (exit 99, with the stack) when a backend is made before
`parallel.initialize` has run, with `--config.parallel.cpu_devices=2`, and must use 2 devices.
Sampling and export run on one device of one process (this one), whatever the run trained on.
CPU devices are a CPU property: on a GPU host too, the entry points run on the CPU
(`conftest.CPU_ONLY`)."""

import json
import os
import subprocess
import sys

import pytest

from actlab import export, sample
from conftest import CPU_ONLY, REPO

GUARD = """
import os, runpy, sys, traceback
from jax._src import xla_bridge
from actlab.run import parallel
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
TWO_DEVICES = "--config.parallel.cpu_devices=2"
SHORT = ["--config.train.steps=2", "--config.optim.warmup_steps=1", "--config.train.eval_every=2", "--config.train.log_every=1"]


def guarded(module: str, *args: str, guard: bool = True) -> subprocess.CompletedProcess:
  command = ["-c", GUARD, module] if guard else ["-m", module]
  proc = subprocess.run([sys.executable, *command, *args], cwd=REPO,
                        capture_output=True, text=True, timeout=600,
                        env={**os.environ, **CPU_ONLY})
  assert proc.returncode == 0, f"{module}: exit {proc.returncode}\n{proc.stderr[-4000:]}"
  return proc


def devices_recorded(workdir) -> int:
  (segment,) = json.loads((workdir / "provenance.json").read_text())["segments"]
  return segment["device_count"]


@pytest.mark.slow
def test_main_sets_up_devices_first_and_its_run_samples_and_exports_on_one(tmp_path):
  run = tmp_path / "run"
  guarded("actlab.main", TINY, TWO_DEVICES, *SHORT, f"--workdir={run}")
  assert devices_recorded(run) == 2
  sample.continue_prompt(run, "", 4, 0.8, 40, 0)  # in this process, on one device
  pytest.importorskip("transformers")
  pytest.importorskip("safetensors")
  export.write(run, tmp_path / "hf")


@pytest.mark.slow
def test_sweep_sets_up_devices_first(tmp_path):
  sweep = tmp_path / "sweep.py"
  sweep.write_text("def get_sweep(arg=None):\n  return {'axes': {}, 'seeds': [0]}\n")
  guarded("actlab.sweep", TINY, TWO_DEVICES, *SHORT, f"--sweep={sweep}",
          f"--workdir={tmp_path / 'sweep'}")
  assert devices_recorded(tmp_path / "sweep" / "seed=0") == 2


@pytest.mark.slow
def test_bench_sets_up_devices_first(tmp_path):
  out = tmp_path / "rows.jsonl"
  guarded("actlab.bench", TINY, TWO_DEVICES, "--steps=2", "--warmup=1", f"--json_out={out}")
  (row,) = [json.loads(line) for line in out.read_text().splitlines()]
  assert row["env"]["devices"] == 2 and "cpu_devices=2" in row["config"]


def test_the_guard_fails_a_process_that_asks_for_a_device_first(tmp_path):
  (tmp_path / "eager.py").write_text("import jax\njax.devices()\n")
  proc = subprocess.run([sys.executable, "-c", GUARD, "eager"], cwd=tmp_path, capture_output=True,
                        text=True, timeout=120, env={**os.environ, **CPU_ONLY})
  assert proc.returncode == 99 and "before parallel.initialize" in proc.stderr
