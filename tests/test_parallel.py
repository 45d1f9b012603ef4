"""Data parallelism and FSDP on 4 simulated CPU devices equal one device (≤ 1e-6), and
checkpoints move between device counts. The cases live in tests/parallel_cases.py and run in a
subprocess: the device count must be fixed before JAX starts, and a hung collective must not
hang the test run (each case has a timeout). One subprocess per case, and the cases' tests in
their own files (test_parallel_*.py), so that pytest-xdist (`--dist loadfile`) runs them side by
side; the session's persistent XLA cache (conftest.py) shares what they compile alike."""

import json
import pathlib
import subprocess
import sys

import jax
import pytest

from actlab import config as config_lib
from actlab.run import parallel
from conftest import production_env, tiny

HERE = pathlib.Path(__file__).parent
TOL = 1e-6


def four_device_env() -> dict:
  """This environment with 4 simulated CPU devices, compiling as real runs do (conftest.py
  compiles faster for the other tests): the cases compare 4 devices with 1 at the numerics of
  real runs, which is what their bound is about."""
  return production_env("--xla_force_host_platform_device_count=4")


def run_case(tmp_path_factory, case: str) -> dict:
  """One case of tests/parallel_cases.py, run in a subprocess with 4 CPU devices."""
  tmp = tmp_path_factory.mktemp(f"parallel_{case}")
  proc = subprocess.run([sys.executable, str(HERE / "parallel_cases.py"), str(tmp), case],
                        env=four_device_env(), capture_output=True, text=True, timeout=900)
  assert proc.returncode == 0, proc.stderr[-3000:]
  out = {}
  for line in proc.stdout.splitlines():
    if line.startswith("RESULT "):
      name, _, result = line[len("RESULT "):].partition(" ")
      out[name] = json.loads(result)
  assert set(out) == {case}, proc.stdout[-3000:]
  return out[case]


def case_results(case: str):
  """A module-scoped fixture named `results`: what `run_case` returns for `case`. Each case's
  tests have a file of their own, so that pytest-xdist runs the cases side by side."""
  @pytest.fixture(scope="module")
  def results(tmp_path_factory) -> dict:
    return run_case(tmp_path_factory, case)
  return results


results = case_results("step")


@pytest.mark.slow
def test_dp_and_fsdp_steps_equal_one_device(results):
  r = results
  assert r["devices"] == 4
  for mode in ("dp", "fsdp"):
    assert r[mode]["metrics"] <= TOL, r
    assert r[mode]["params"] <= TOL, r
    assert r[mode]["opt_state"] <= TOL, r
    assert r[mode]["eval"] <= TOL, r  # relative: a loss *sum* over 256 tokens (~1.4e3), where
    # one float32 rounding step (1.2e-4) is already above an absolute 1e-4
    assert r[mode]["batch_spec"] == "P('data', None)"
  # DP replicates the state; FSDP splits it (the embedding and its Adam moment alike) and
  # holds about a quarter of it per device.
  assert r["dp"]["embedding_spec"] == "P()"
  assert r["dp"]["state_bytes_per_device"] == r["state_bytes_single"]
  assert r["fsdp"]["embedding_spec"] == "P('data', None)"
  assert r["fsdp"]["moment_spec"] == "P('data', None)"
  assert r["fsdp"]["state_bytes_per_device"] < 0.3 * r["state_bytes_single"]


def test_cpu_devices_after_jax_started_is_refused():
  jax.devices()  # this process's backend exists now
  c = tiny(**{"parallel.cpu_devices": 3})
  with pytest.raises(parallel.ParallelError, match="already exist"):
    parallel.initialize(c)


def test_one_device_plan_replicates_everything():
  p = parallel.plan(tiny(**{"parallel.mode": "fsdp", "parallel.fsdp_min_size": 0}))
  assert p.num_devices == 1
  assert p.leaf_sharding((64, 8)).spec == jax.sharding.PartitionSpec()


def test_fsdp_picks_the_largest_divisible_axis():
  class FakeMesh:  # leaf_sharding only needs the device count and the mesh for NamedSharding
    size = 4
  p = parallel.Plan.__new__(parallel.Plan)
  object.__setattr__(p, "mesh", FakeMesh())
  object.__setattr__(p, "mode", "fsdp")
  object.__setattr__(p, "fsdp_min_size", 100)
  import unittest.mock as mock
  with mock.patch.object(parallel, "NamedSharding", lambda mesh, spec: spec):
    assert p.leaf_sharding((50304, 384)) == jax.sharding.PartitionSpec("data", None)
    assert p.leaf_sharding((384, 1536)) == jax.sharding.PartitionSpec(None, "data")
    assert p.leaf_sharding((258, 384)) == jax.sharding.PartitionSpec(None, "data")  # 258 % 4
    assert p.leaf_sharding((3, 7, 5)) == jax.sharding.PartitionSpec()  # nothing divides
    assert p.leaf_sharding((8,)) == jax.sharding.PartitionSpec()  # below fsdp_min_size
    object.__setattr__(p, "mode", "dp")
    assert p.leaf_sharding((50304, 384)) == jax.sharding.PartitionSpec()


def test_config_and_batch_validation():
  c = tiny()
  c.parallel.mode = "tp"
  with pytest.raises(config_lib.ConfigError, match="parallel.mode"):
    config_lib.validate(c)
  c = tiny()
  c.parallel.num_devices = 2
  with pytest.raises(parallel.ParallelError, match="only 1 devices"):
    parallel.plan(c)
  p = parallel.plan(tiny())
  p.check_batch(8)
  fake = parallel.Plan.__new__(parallel.Plan)
  object.__setattr__(fake, "mesh", type("M", (), {"size": 3})())
  with pytest.raises(parallel.ParallelError, match="does not split across 3 devices"):
    fake.check_batch(8)
