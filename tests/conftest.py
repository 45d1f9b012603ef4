"""Shared fixtures: a tiny decoder config on the embedded corpus; session data and XLA caches;
the set-up for a CPU or a GPU host (`GPUS`)."""

import atexit
import gc
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile

from actlab.sweep import workers  # Imports JAX (starts no backend): see `jax.config` below.


def gpus() -> list[str]:
  """The GPUs the tests run on, found without starting CUDA (`actlab.sweep.workers`: /dev/nvidia*,
  CUDA_VISIBLE_DEVICES): none where JAX_PLATFORMS puts another platform first, so that
  `JAX_PLATFORMS=cpu pytest` runs the suite on the CPU of a GPU host."""
  first = os.environ.get("JAX_PLATFORMS", "").split(",")[0]
  return workers.visible_gpus() if first in ("", "cuda", "gpu") else []


GPUS = gpus()
# Subprocesses whose claim is about XLA:CPU (simulated devices, bitwise results, CPU workers) run
# on the CPU on any host: JAX_PLATFORMS for JAX, an empty CUDA_VISIBLE_DEVICES for
# `actlab.sweep --workers`, which otherwise hands each worker a GPU.
CPU_ONLY = {"JAX_PLATFORMS": "cpu", "CUDA_VISIBLE_DEVICES": ""}


def session_dir(variable: str, prefix: str) -> None:
  """Sets `variable` to a new temporary directory unless it is set (pytest-xdist's workers and the
  subprocesses the tests start inherit the session's), and removes the directory when this
  process, which made it, exits: a run of the suite leaves nothing in /tmp but pytest's own."""
  if variable not in os.environ:
    os.environ[variable] = tempfile.mkdtemp(prefix=prefix)
    atexit.register(shutil.rmtree, os.environ[variable], ignore_errors=True)


# One token cache for the whole session (and for subprocesses the tests start).
session_dir("ACTLAB_DATA_DIR", "actlab-test-data-")
# One persistent XLA compilation cache likewise: tests build the same tiny programs many times
# (every `loop.Program` is a new jit), and subprocesses (resume after SIGKILL, simulated
# devices) compile what an earlier process already did. Set before anything imports JAX.
session_dir("JAX_COMPILATION_CACHE_DIR", "actlab-test-xla-")
# tiktoken keeps a copy of each GPT-2 file it reads, by its path, in its cache (by default
# /tmp/data-gym-cache): the tests' copies lie in temporary directories, a new path each session.
session_dir("TIKTOKEN_CACHE_DIR", "actlab-test-tiktoken-")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
# Compiling, not running, is most of the suite's time: its programs are tiny and run a few steps.
# So the tests compile at XLA's backend optimisation level 0 (the same HLO, unoptimised machine
# code; a few times slower per step: half the compile time of the default level) and, where this
# jaxlib accepts them, with XLA:CPU's classic fusion emitters (a further third off the compile time
# at level 0) and its machine code generated in one piece rather than split for parallel threads
# (with two pytest workers on two cores, the threads only add overhead: 214-218 s for the suite
# against 228-236 s, 2026-11-23). Equivalence tests compare programs compiled alike, so their
# tolerances mean what they did. XLA_FLAGS that set the level already are kept; the subprocesses
# the tests start inherit them (`production_env` takes them out again).
def _xla_accepts(flags: list[str]) -> bool:
  """Whether this jaxlib's XLA starts with `flags` (an unknown flag in XLA_FLAGS aborts the
  process; a flag's name in its library is no proof: jaxlib 0.11's holds the fusion emitters'
  flag and refuses it). Asked once per session, of a subprocess; workers and subprocesses inherit
  the answer."""
  if "ACTLAB_TEST_XLA_ACCEPTS" not in os.environ:
    env = {**os.environ, **CPU_ONLY, "XLA_FLAGS": " ".join(flags)}
    probe = subprocess.run([sys.executable, "-c", "import jax; jax.devices()"], env=env,
                           capture_output=True)
    os.environ["ACTLAB_TEST_XLA_ACCEPTS"] = str(int(probe.returncode == 0))
  return os.environ["ACTLAB_TEST_XLA_ACCEPTS"] == "1"


def _add_xla_flags(*flags: str) -> None:
  os.environ["XLA_FLAGS"] = " ".join([os.environ.get("XLA_FLAGS", ""), *flags]).strip()


CPU_FAST_COMPILE = ["--xla_cpu_use_fusion_emitters=false",
                    "--xla_cpu_parallel_codegen_split_count=1"]
FAST_COMPILE = ["--xla_backend_optimization_level=0"] + (
    CPU_FAST_COMPILE if _xla_accepts(CPU_FAST_COMPILE) else [])
# On a GPU the tests compile as real runs do (level 0 is for XLA:CPU here; on XLA:GPU it would be
# LLVM's -O0 for every kernel), and each pytest-xdist worker sees one GPU (worker k GPU k mod their
# number): the tests assume one device, as on a CPU. A test process allocates GPU memory as it needs
# it rather than 75% of it at once, so that the workers and their subprocesses share the GPU;
# float32 matmuls run in float32 rather than TF32 (XLA:GPU's default: a 10-bit mantissa), so that
# the tests' float32 tolerances mean what they do on a CPU; and XLA's deterministic GPU ops (no
# atomics, no timed autotuning) keep their bitwise claims (a step is pure, a resumed run equals an
# uninterrupted one) true on a GPU as on a CPU.
if GPUS:
  if "PYTEST_XDIST_WORKER" in os.environ:  # "gw<k>"; the parent leaves it to them
    worker = int(os.environ["PYTEST_XDIST_WORKER"][2:])
    os.environ["CUDA_VISIBLE_DEVICES"] = GPUS[worker % len(GPUS)]
  os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
  os.environ.setdefault("JAX_DEFAULT_MATMUL_PRECISION", "float32")
  if "xla_gpu_deterministic_ops" not in os.environ.get("XLA_FLAGS", ""):
    _add_xla_flags("--xla_gpu_deterministic_ops=true")
elif "xla_backend_optimization_level" not in os.environ.get("XLA_FLAGS", ""):
  _add_xla_flags(*FAST_COMPILE)

# JAX read its configuration from the environment when `actlab.sweep` imported it, before the
# settings above: this process takes them here (its subprocesses from the environment). XLA_FLAGS
# and CUDA_VISIBLE_DEVICES are read later, when a backend starts.
import jax  # noqa: E402

jax.config.update("jax_compilation_cache_dir", os.environ["JAX_COMPILATION_CACHE_DIR"])
jax.config.update("jax_persistent_cache_min_compile_time_secs",
                  float(os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"]))
if "JAX_DEFAULT_MATMUL_PRECISION" in os.environ:
  jax.config.update("jax_default_matmul_precision", os.environ["JAX_DEFAULT_MATMUL_PRECISION"])

# Tracing makes a few hundred thousand short-lived Python objects per program, and the cyclic
# collector's passes over them (every 700 new objects) were 5-7% of a worker's time: every 10,000
# here, as a run does (`train.fewer_collections`).
gc.set_threshold(10_000, *gc.get_threshold()[1:])

import ml_collections  # noqa: E402 -- after the environment above
import pytest  # noqa: E402

from actlab import config as config_lib  # noqa: E402
from actlab.config import sizes  # noqa: E402
from tiny_config import get_config as tiny_config_file  # noqa: E402


def production_env(*xla_flags: str, **variables: str) -> dict:
  """This environment with XLA:CPU compiling as in real runs (not `FAST_COMPILE`), on the CPU on
  any host (`CPU_ONLY`), plus `xla_flags` and `variables`: for subprocesses whose claim depends
  on the code XLA:CPU compiles, e.g. that results are bitwise the same on any number of threads,
  or equal across (simulated) device counts to 1e-6."""
  kept = [f for f in os.environ.get("XLA_FLAGS", "").split() if f not in FAST_COMPILE]
  return {**os.environ, **CPU_ONLY, "XLA_FLAGS": " ".join([*kept, *xla_flags]), **variables}


def pytest_xdist_auto_num_workers(config):
  """`-n auto` (pyproject.toml) on a GPU host: two workers per GPU (one compiles while the other
  runs; more would share a GPU's memory and time for nothing), at most one per CPU. Elsewhere
  (None) pytest-xdist's own choice, one per core; PYTEST_XDIST_AUTO_NUM_WORKERS wins on both."""
  del config
  found = gpus()
  if found and not os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS"):
    return min(2 * len(found), len(os.sched_getaffinity(0)))
  return None


# The files whose tests take longest, longest first (their tests' total time in `pytest
# --durations=0` on the 2-core machine, 2026-11-27; only the order matters, roughly). pytest-xdist
# hands out whole files (`--dist loadfile`) in the order below, so that these start first and the
# last files handed out are short ones: the suite ends when its last file does, and a file of one
# long test handed out last (as xdist's own order, by number of tests, does) keeps one worker busy
# alone for its whole length. Files not listed follow in collection order.
LONGEST_FIRST = [
    "test_sweep.py", "test_compile_cache.py", "test_train.py", "test_resume.py",
    "test_model_execution.py", "test_hf_llama.py", "test_export.py", "test_distributed.py",
    "test_parallel.py", "test_classify.py", "test_bench.py", "test_vectorized.py", "test_model.py",
    "test_encoder.py", "test_hf_import.py", "test_sample.py", "test_kernels.py",
    "test_modern_block_runs.py", "test_mup.py", "test_config.py", "test_optim_recipe.py",
    "test_metrics.py", "test_mlm.py", "test_modern_block.py", "test_core.py", "test_report.py",
    "test_tracking.py",
    "test_user_errors.py", "test_suite_setup.py", "test_tokenizer.py", "test_entry_points.py",
    "test_evaluators.py"]


def pytest_configure(config):
  """pytest-xdist in the order of `LONGEST_FIRST`: its reordering by number of tests is off."""
  if hasattr(config.option, "loadscopereorder"):  # pytest-xdist >= 3.6
    config.option.loadscopereorder = False


def pytest_collection_modifyitems(items):
  """The files of `LONGEST_FIRST` first, in its order (a stable sort: a file's tests keep theirs)."""
  rank = {name: k for k, name in enumerate(LONGEST_FIRST)}
  items.sort(key=lambda item: rank.get(item.path.name, len(rank)))


REPO = pathlib.Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"


# The tiny model has one block: most of a test's time is compiling, which grows with the blocks.
# A claim about how blocks stack (their order and names, scan over them, a mapping to another
# library's layers, statistics per layer and pooled over layers) is tested on two: `tiny(**DEEP)`.
DEEP = {"model.num_layers": 2}


def tiny(activation: str = "gelu", **overrides):
  """tests/tiny_config.py with `section.field` overrides (`config.override`)."""
  return config_lib.override(tiny_config_file(activation), overrides)


def tiny_encoder(task: str = "mlm", **overrides):
  """The encoder's smoke config (`task` "mlm" or "classify") at the tiny decoder's model shape and
  context, with `section.field` overrides."""
  shape = {k: v for k, v in sizes.SIZES["tiny"].items()
           if k.startswith("model.") or k == "data.seq_len"}
  smoke = config_lib.encoder("gelu", "smoke_classify" if task == "classify" else "smoke")
  return config_lib.override(smoke, {**shape, **overrides})


@pytest.fixture
def tiny_config():
  return tiny()


def data_config(data_dir, batch_size: int = 8, **data_overrides):
  """Only the fields `actlab.data.load` reads: a byte-level synthetic corpus by default."""
  c = ml_collections.ConfigDict()
  c.train = ml_collections.ConfigDict(dict(batch_size=batch_size, seed=1337, progress=False))
  c.data = ml_collections.ConfigDict(dict(
      source="synthetic", tokenizer="byte", dir=str(data_dir), seq_len=32, val_batches=3, test_batches=0,
      tinystories_version="v2", manual_dir="", gpt2_dir=""))
  c.data.update(data_overrides)
  return c
