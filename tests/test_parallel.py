"""Data parallelism and FSDP on 4 simulated CPU devices equal one device (≤ 1e-6), for GPT-2's
block and the LLaMA-style one, and checkpoints move between device counts. The cases live in
tests/parallel_cases.py and run in one subprocess: the device count must be fixed before JAX
starts, and a hung collective must not hang the test run (the subprocess has a timeout). One
process for all the cases: the suite keeps both cores busy, and a process per case would only
add its start-up and tracing."""

import json
import os
import pathlib
import subprocess
import sys

import jax
import pytest

from actlab import config as config_lib
from actlab.infra import parallel
from actlab.run import train
from conftest import CPU_ONLY, FAST_COMPILE, tiny

HERE = pathlib.Path(__file__).parent
TOL = 1e-6
CASES = ("step", "modern", "checkpoint", "run", "vectorized")


def four_device_env() -> dict:
  """This environment with 4 simulated CPU devices, on the CPU on any host. The cases compile at
  the tests' settings (`conftest.FAST_COMPILE`, which parallel_cases.py takes from conftest like
  every test process): the 4-device and the 1-device programs are compiled alike, so the bound
  is about how the state and batch are split, not about XLA's optimisations."""
  flags = [*os.environ.get("XLA_FLAGS", "").split(), "--xla_force_host_platform_device_count=4"]
  return {**os.environ, **CPU_ONLY, "XLA_FLAGS": " ".join(flags)}


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> dict:
  """Every case of tests/parallel_cases.py, run in one subprocess with 4 CPU devices: case → what
  it measured."""
  tmp = tmp_path_factory.mktemp("parallel")
  proc = subprocess.run([sys.executable, str(HERE / "parallel_cases.py"), str(tmp), *CASES],
                        env=four_device_env(), capture_output=True, text=True, timeout=900)
  assert proc.returncode == 0, proc.stderr[-3000:]
  out = {}
  for line in proc.stdout.splitlines():
    if line.startswith("RESULT "):
      name, _, result = line[len("RESULT "):].partition(" ")
      out[name] = json.loads(result)
  assert set(out) == set(CASES), proc.stdout[-3000:]
  return out


@pytest.mark.slow
def test_dp_and_fsdp_steps_equal_one_device(results):
  r = results["step"]
  assert r["devices"] == 4
  assert set(FAST_COMPILE) <= set(r["xla_flags"]), r["xla_flags"]  # compiled alike
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


@pytest.mark.slow
def test_the_modern_block_under_dp_and_fsdp_equals_one_device(results):
  """The LLaMA-style block (RMSNorm, RoPE, an untied head, a plain relu2 FFN) split as GPT-2's
  is: every logged metric (the attention logits after RoPE among them), the parameters and
  Adam's moments after 3 steps within 1e-6 of one device."""
  r = results["modern"]
  for mode in ("dp", "fsdp"):
    assert r[mode]["metrics"] <= TOL and r[mode]["params"] <= TOL, r
    assert r[mode]["opt_state"] <= TOL, r
    assert "train_attn_logit_max" in r[mode]["logged"], r[mode]["logged"]
  assert r["dp"]["head_spec"] == "P()" and r["fsdp"]["head_spec"] == "P('data', None)"


@pytest.mark.slow
def test_checkpoints_restore_across_device_counts(results):
  """Saved by FSDP on 4 devices, restored bit-exactly on 2 and 1; the next step equals 4's."""
  r = results["checkpoint"]
  for name, devices in (("dp2", 2), ("single", 1)):
    assert r[name]["restored"] == 0.0, r          # bit-exact, whatever the layout
    assert r[name]["devices"] == devices
    assert r[name]["step"] == 3
    assert r[name]["next_step_metrics"] <= TOL, r
    assert r[name]["next_step_params"] <= TOL, r


@pytest.mark.slow
def test_train_run_on_four_devices_and_resume_on_one(results):
  """`train.run` on 4 devices (FSDP) equals 1 device, and resumes on 1."""
  r = results["run"]
  assert r["steps"] == [0, 2, 3, 4, 6]
  assert r["fsdp"] <= TOL, r
  assert r["resume_steps"] == r["steps"] and r["resume"] <= TOL, r


@pytest.mark.slow
def test_vectorized_group_on_four_devices(results):
  """A vectorized group of 2 runs on 4 devices (DP, FSDP) equals 1 device."""
  r = results["vectorized"]
  for mode in ("dp", "fsdp"):
    assert r[mode]["params"] <= TOL and r[mode]["metrics"] <= TOL, r
    assert r[mode]["runs_differ"] > 1e-3, r


def test_cpu_devices_after_jax_started_is_refused():
  jax.devices()  # this process's backend exists now
  with pytest.raises(parallel.ParallelError, match="already exist"):
    parallel.initialize(cpu_devices=3)


def test_deterministic_ops_reach_xla_flags_before_the_backend_starts():
  """`train.deterministic_ops` adds XLA's flag to XLA_FLAGS in `train.initialize`, before the
  backend starts (a fresh process), replacing a setting of it there."""
  script = (
      "import os\nfrom jax._src import xla_bridge\nfrom actlab import config\n"
      "from actlab.run import train\n"
      "c = config.base()\nc.train.deterministic_ops = True\n"
      "os.environ['XLA_FLAGS'] = '--xla_gpu_deterministic_ops=false'\n"
      "train.initialize(c)\nfrom actlab.infra import parallel\n"
      "assert not xla_bridge.backends_are_initialized()\n"
      "print(os.environ['XLA_FLAGS'], parallel.deterministic_ops())\n")
  proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                        timeout=120, env={**os.environ, **CPU_ONLY})
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert proc.stdout.split() == ["--xla_gpu_deterministic_ops=true", "True"]


def test_deterministic_ops_are_refused_once_a_gpu_backend_started_without_them(monkeypatch):
  """In a process whose backend started without the flag (a sweep or `ask` training several
  configs in one process), a config that asks for it is refused in one line, unless the backend
  is the CPU's; with the flag there it passes."""
  jax.devices()
  monkeypatch.setenv("XLA_FLAGS", "--xla_cpu_enable_fast_math=false")
  parallel.initialize(deterministic_ops=True)  # the CPU's: nothing to ask
  monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
  with pytest.raises(parallel.ParallelError, match=r"train.deterministic_ops=true.*own"):
    train.initialize(tiny(**{"train.deterministic_ops": True}))
  assert os.environ["XLA_FLAGS"] == "--xla_cpu_enable_fast_math=false"
  monkeypatch.setenv("XLA_FLAGS", "--xla_gpu_deterministic_ops")
  parallel.initialize(deterministic_ops=True)
  parallel.initialize()  # not asked: whatever the backend


def test_one_device_plan_replicates_everything():
  p = parallel.plan(8, "fsdp", fsdp_min_size=0)
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
  with pytest.raises(parallel.ParallelError, match="only 1 devices"):
    parallel.plan(8, num_devices=2)
  p = parallel.plan(8)
  p.check_batch(8)
  fake = parallel.Plan.__new__(parallel.Plan)
  object.__setattr__(fake, "mesh", type("M", (), {"size": 3})())
  with pytest.raises(parallel.ParallelError, match="does not split across 3 devices"):
    fake.check_batch(8)
