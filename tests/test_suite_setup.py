"""The suite's set-up for the host it runs on (conftest.py), checked on a CPU with a GPU faked
through CUDA_VISIBLE_DEVICES: how many pytest-xdist workers, what a worker's environment holds,
and that the subprocesses whose claims are about XLA:CPU run on the CPU."""

import json
import os
import subprocess
import sys

import jax
import pytest

import conftest
from conftest import FAST_COMPILE, REPO, production_env
from test_parallel import four_device_env


def test_workers_are_two_per_gpu_and_one_per_core_without_one(monkeypatch):
  monkeypatch.delenv("JAX_PLATFORMS", raising=False)
  monkeypatch.delenv("PYTEST_XDIST_AUTO_NUM_WORKERS", raising=False)
  cores = len(os.sched_getaffinity(0))
  monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
  assert conftest.pytest_xdist_auto_num_workers(None) == min(2, cores)
  monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2,3,4,5,6,7")
  assert conftest.pytest_xdist_auto_num_workers(None) == min(16, cores)
  monkeypatch.setenv("PYTEST_XDIST_AUTO_NUM_WORKERS", "3")  # the user's number: xdist's to read
  assert conftest.pytest_xdist_auto_num_workers(None) is None
  monkeypatch.delenv("PYTEST_XDIST_AUTO_NUM_WORKERS")
  monkeypatch.setenv("JAX_PLATFORMS", "cpu")  # the suite on the CPU of a GPU host
  assert conftest.pytest_xdist_auto_num_workers(None) is None
  monkeypatch.delenv("JAX_PLATFORMS")
  monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # no GPU: xdist's one per core
  assert conftest.pytest_xdist_auto_num_workers(None) is None


# conftest.session_dir's
SESSION_DIRS = ("ACTLAB_DATA_DIR", "JAX_COMPILATION_CACHE_DIR", "TIKTOKEN_CACHE_DIR")


def worker_env(tmp_path, starts_session: bool = False, **variables: str) -> dict:
  """The environment conftest.py gives a pytest-xdist worker (gw3) that starts with `variables`
  (and no XLA_FLAGS, JAX_PLATFORMS or GPU settings of this process), with TMPDIR at `tmp_path`.
  It inherits the session's directories, and makes none; or, if it `starts_session` (as the
  process that runs pytest does), makes them and removes them when it exits."""
  mine = ("XLA_FLAGS", "JAX_PLATFORMS", "CUDA_VISIBLE_DEVICES", "XLA_PYTHON_CLIENT_PREALLOCATE",
          "JAX_DEFAULT_MATMUL_PRECISION", *(SESSION_DIRS if starts_session else ()))
  env = {k: v for k, v in os.environ.items() if k not in mine}
  tmp_path.mkdir(exist_ok=True)
  env["TMPDIR"] = str(tmp_path)
  code = ("import json, os, sys; sys.path.insert(0, 'tests'); import conftest, jax; "
          "print(json.dumps(dict(os.environ))); "
          "print(json.dumps([jax.config.jax_compilation_cache_dir, "
          "jax.config.jax_persistent_cache_min_compile_time_secs, "
          "jax.config.jax_default_matmul_precision]))")
  out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                       timeout=120, env={**env, "PYTEST_XDIST_WORKER": "gw3", **variables})
  assert out.returncode == 0, out.stderr
  environment, (cache_dir, min_compile_secs, precision) = map(json.loads, out.stdout.splitlines())
  assert list(tmp_path.iterdir()) == []  # nothing left behind
  for variable in SESSION_DIRS:
    assert (os.path.dirname(environment[variable]) == str(tmp_path) if starts_session
            else environment[variable] == os.environ[variable])
  # JAX, imported before conftest set these, uses them: one compilation cache for the session.
  assert cache_dir == environment["JAX_COMPILATION_CACHE_DIR"] and min_compile_secs == 0
  assert precision == environment.get("JAX_DEFAULT_MATMUL_PRECISION")
  return environment


@pytest.mark.slow
def test_a_worker_compiles_fast_on_the_cpu_and_shares_one_gpu_as_real_runs_compile(tmp_path):
  env = worker_env(tmp_path / "session", starts_session=True, CUDA_VISIBLE_DEVICES="0,1")
  assert env["CUDA_VISIBLE_DEVICES"] == "1"  # gw3: worker 3 of GPUs 0 and 1
  assert env["XLA_PYTHON_CLIENT_PREALLOCATE"] == "false"
  assert env["JAX_DEFAULT_MATMUL_PRECISION"] == "float32"
  assert env["XLA_FLAGS"].split() == ["--xla_gpu_deterministic_ops=true"]
  no_gpu = {"CUDA_VISIBLE_DEVICES": ""}
  pinned = {"JAX_PLATFORMS": "cpu", "CUDA_VISIBLE_DEVICES": "0"}  # the CPU of a GPU host
  for variables in (no_gpu, pinned):
    env = worker_env(tmp_path / "worker", **variables)
    assert env["XLA_FLAGS"].split() == FAST_COMPILE, variables
    assert env.get("CUDA_VISIBLE_DEVICES") == variables.get("CUDA_VISIBLE_DEVICES"), variables
    assert not {"XLA_PYTHON_CLIENT_PREALLOCATE", "JAX_DEFAULT_MATMUL_PRECISION"} & set(env)


def test_subprocesses_about_xla_cpu_run_on_the_cpu():
  """The simulated devices and the real-run compile settings pin the CPU, and hide the GPUs
  from `actlab.sweep --workers`; real runs' settings drop the tests' fast compile."""
  for env in (four_device_env(), production_env()):
    assert env["JAX_PLATFORMS"] == "cpu" and env["CUDA_VISIBLE_DEVICES"] == ""
  assert not set(FAST_COMPILE) & set(production_env()["XLA_FLAGS"].split())
  assert "--xla_force_host_platform_device_count=4" in four_device_env()["XLA_FLAGS"].split()


def test_the_longest_files_listed_first_are_files_of_the_suite():
  """conftest.LONGEST_FIRST (pytest-xdist's order) names test files that exist, once each."""
  names = [p.name for p in (REPO / "tests").glob("test_*.py")]
  assert set(conftest.LONGEST_FIRST) <= set(names)
  assert len(set(conftest.LONGEST_FIRST)) == len(conftest.LONGEST_FIRST)


def test_this_process_compiles_into_the_sessions_cache():
  """The tests' own JAX, imported before conftest.py set the cache up, uses it (a run points it at
its kind of host's folder inside: run/program.py)."""
  assert jax.config.jax_compilation_cache_dir.startswith(os.environ["JAX_COMPILATION_CACHE_DIR"])
  assert jax.config.jax_persistent_cache_min_compile_time_secs == 0
