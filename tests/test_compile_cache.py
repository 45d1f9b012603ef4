"""The persistent compilation cache (run/program.py): a second cell of a sweep (another
seed and LR, the same shapes) compiles no program of its own, read from JAX's monitoring events
(summary.json's `timing.compile`), and compiles them all with the cache off; a damaged entry is
one line and a recompile, with the same numbers; a resumed run compiles nothing new. Each run is
its own process, as a sweep's cells across workers and sessions are, with its own cache folder:
no test leans on a warm cache."""

import json
import os
import pathlib
import signal
import subprocess
import sys

import pytest

from actlab.run import program as compile_cache
from conftest import REPO, production_env
import test_resume

CONFIG_FILE = str(REPO / "tests" / "tiny_config.py")


def train(workdir, cache, *flags) -> tuple[dict, str]:
  """A 12-step tiny run in its own process; its summary and what it printed."""
  out = subprocess.run(
      [sys.executable, "-m", "actlab.main", f"--config={CONFIG_FILE}", f"--workdir={workdir}",
       "--config.train.steps=12", "--config.train.log_every=4", "--config.train.eval_every=6",
       "--config.metrics.sharpness_every=6", "--config.metrics.sharpness_iters=2",
       f"--config.train.compile_cache={cache}", *flags],
      cwd=REPO, capture_output=True, text=True, timeout=300)
  assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
  return json.loads((pathlib.Path(workdir) / "summary.json").read_text()), out.stdout


PROGRAMS = {"jit(init)", "jit(train_step)", "jit(log_step)", "jit(eval_step)",
            "jit(sharpness_step)"}  # and a group's `split`: one run has no run axis


@pytest.fixture(scope="module")
def first_cell(tmp_path_factory):
  """The sweep's first cell, trained with an empty cache: its summary and the cache it filled,
  which the tests below share (JAX's cache keys name the folder: a copy elsewhere would miss). The
  damaged-entry test leaves it repaired, as its last assertion shows."""
  tmp = tmp_path_factory.mktemp("first_cell")
  summary, _ = train(tmp / "a", tmp / "xla")
  assert PROGRAMS <= set(summary["timing"]["compile"]["compiled"])
  return summary, tmp / "xla"


@pytest.mark.slow
def test_a_second_cell_compiles_no_program_of_its_own(first_cell, tmp_path):
  second, printed = train(tmp_path / "b", first_cell[1],
                          "--config.train.seed=7", "--config.optim.lr=3e-3")
  compiled = second["timing"]["compile"]
  assert compiled["programs_compiled"] == 0, compiled
  assert PROGRAMS <= set(compiled["cached"])
  assert "0 programs compiled" in printed
  assert second["final_val_loss"] != first_cell[0]["final_val_loss"]  # another run, not a copy


@pytest.mark.slow
def test_with_the_cache_off_the_second_cell_compiles_every_program(tmp_path):
  """The claim above rests on the cache: without it every program compiles again."""
  compiled = train(tmp_path / "b", "off", "--config.train.seed=7",
                   "--config.optim.lr=3e-3")[0]["timing"]["compile"]
  assert PROGRAMS <= set(compiled["compiled"]) and not compiled["cached"]


@pytest.mark.slow
def test_a_damaged_entry_is_one_line_and_a_recompile_with_the_same_numbers(first_cell, tmp_path):
  folder = first_cell[1]
  entries = sorted((folder / compile_cache.host_kind()).glob("*-cache"))
  assert len(entries) >= len(PROGRAMS)
  train_step = next(p for p in entries if p.name.startswith("jit_train_step-"))
  train_step.write_bytes(train_step.read_bytes()[:100])  # a writer killed mid-file
  garbage = next(p for p in entries if p.name.startswith("jit_eval_step-"))
  garbage.write_bytes(b"\x00not an executable" * 50)
  again, printed = train(tmp_path / "again", folder)
  damaged = [l for l in printed.splitlines() if "damaged compilation-cache entry" in l]
  assert len(damaged) == 2, printed
  assert set(again["timing"]["compile"]["compiled"]) == {"jit(train_step)", "jit(eval_step)"}
  assert again["final_val_loss"] == first_cell[0]["final_val_loss"]
  third, printed = train(tmp_path / "third", folder)  # Replaced: all from the cache again.
  assert third["timing"]["compile"]["programs_compiled"] == 0
  assert "compilation-cache entry" not in printed


def test_the_setting_names_a_folder_per_kind_of_host(monkeypatch, tmp_path):
  monkeypatch.setenv("JAX_COMPILATION_CACHE_DIR", str(tmp_path))
  assert compile_cache.cache_directory("auto") == tmp_path
  monkeypatch.delenv("JAX_COMPILATION_CACHE_DIR")
  assert compile_cache.cache_directory("auto") == pathlib.Path(compile_cache.DEFAULT_CACHE).expanduser()
  assert compile_cache.cache_directory("off") is None
  assert compile_cache.cache_directory("~/x") == pathlib.Path.home() / "x"
  assert compile_cache.host_kind() == compile_cache.host_kind()


# A program with a training step's parts (matmuls, GELU, a gradient summed over a batch of 2,048
# positions), through actlab's cache: its results' bits and what it compiled or loaded.
PROBE = """
import json, sys
import jax, jax.numpy as jnp, numpy as np
from actlab.run import program as compile_cache
compile_cache.enable_cache(sys.argv[1])
x = np.random.default_rng(0).standard_normal((16, 128, 512), np.float32)
w = np.random.default_rng(1).standard_normal((512, 2048), np.float32) / 22
def step(x, w):
  loss = lambda w: jnp.einsum("btf,df->btd", jax.nn.gelu(jnp.einsum("btd,df->btf", x, w)), w).var()
  return jax.value_and_grad(loss)(w)
with compile_cache.tally() as compiled:
  out = jax.jit(step)(x, w)
bits = [np.asarray(a).view(np.uint32).ravel().tolist() for a in out]
print(json.dumps({"bits": bits, **compiled.summary()}))
"""


@pytest.mark.slow
def test_a_program_compiled_with_two_cpus_computes_as_one_compiled_with_one(tmp_path):
  """Why the CPU count is not in the cache's folder name: XLA:CPU's float order follows the
  threads of the process that runs a program, not of the one that compiled it."""
  def pinned(cache, cpus):
    taskset = ["taskset", "-c", ",".join(map(str, sorted(os.sched_getaffinity(0))[:cpus]))]
    out = subprocess.run([*taskset, sys.executable, "-c", PROBE, str(cache)], cwd=REPO,
                         capture_output=True, text=True, timeout=300,
                         env=production_env())  # as real runs compile: threads and all
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout)
  if len(os.sched_getaffinity(0)) < 2:
    pytest.skip("needs two CPUs")
  one = pinned("off", 1)
  two = pinned(tmp_path / "xla", 2)
  loaded = pinned(tmp_path / "xla", 1)
  assert (two["programs_compiled"], loaded["programs_cached"]) == (1, 1), (two, loaded)
  assert loaded["bits"] == one["bits"]
  assert two["bits"] != one["bits"], "two threads round as one here: the test shows nothing"


@pytest.mark.slow
def test_a_resumed_run_compiles_nothing_new(tmp_path):
  """A run stopped by SIGTERM after a checkpoint resumes in a new process from the programs the
  first process compiled: none of its own (the state is restacked on the host, not by XLA)."""
  flags = [f"--config.train.compile_cache={tmp_path / 'xla'}"]
  proc = test_resume.start(tmp_path / "run", *flags)
  test_resume.wait_for_checkpoint(proc, tmp_path / "run", test_resume.KILL_AFTER)
  proc.send_signal(signal.SIGTERM)
  out, _ = proc.communicate(timeout=120)
  assert proc.returncode == 128 + signal.SIGTERM, out
  resumed = subprocess.run(test_resume.cli(tmp_path / "run", *flags), cwd=REPO,
                           capture_output=True, text=True, timeout=300)
  assert resumed.returncode == 0, resumed.stdout[-2000:] + resumed.stderr[-2000:]
  assert "resuming at step" in resumed.stdout
  compiled = json.loads((tmp_path / "run" / "summary.json").read_text())["timing"]["compile"]
  assert compiled["programs_compiled"] == 0 and compiled["programs_cached"] > 0, compiled


def test_abstract_arrays_hold_the_dtypes_jax_would():
  """`abstract` (what `Ahead` compiles for) gives a NumPy int64 seed the int32 JAX holds it in
  without x64, as a call would: no truncation warning (jax 0.11 warns at every run otherwise)."""
  import jax
  import numpy as np
  seed, lr = compile_cache.abstract((np.array([7])[0], np.float32(1e-3)))
  assert (seed.dtype, lr.dtype) == (jax.dtypes.canonicalize_dtype(np.int64), np.float32)
  assert seed.dtype == (np.int64 if jax.config.jax_enable_x64 else np.int32)
