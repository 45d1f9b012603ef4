"""Shared fixtures: a tiny decoder config on the embedded corpus; session data and XLA caches."""

import os
import pathlib
import tempfile

# One token cache for the whole session (and for subprocesses the tests start).
os.environ.setdefault("ACTLAB_DATA_DIR", tempfile.mkdtemp(prefix="actlab-test-data-"))
# One persistent XLA compilation cache likewise: tests build the same tiny programs many times
# (every `steps.Program` is a new jit), and subprocesses (resume after SIGKILL, simulated
# devices) compile what an earlier process already did. Set before anything imports JAX.
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", tempfile.mkdtemp(prefix="actlab-test-xla-"))
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
# Compiling, not running, is most of the suite's time: its programs are tiny and run a few steps.
# So the tests compile at XLA's backend optimisation level 0 (the same HLO, unoptimised machine
# code; a few times slower per step: half the compile time of the default level) and, where this
# jaxlib has them, with XLA:CPU's classic fusion emitters (a further third off the compile time
# at level 0). Equivalence tests compare programs compiled alike, so their tolerances mean what
# they did. XLA_FLAGS that set the level already are kept; the subprocesses the tests start
# inherit them (`production_env` takes them out again).
def _xla_knows(flag: str) -> bool:
  """Whether this jaxlib's XLA defines `flag` (an unknown flag in XLA_FLAGS aborts the process)."""
  import importlib.util
  import mmap
  library = pathlib.Path(importlib.util.find_spec("jaxlib").origin).parent
  for path in filter(lambda p: p.stat().st_size, library.glob("*.so")):
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
      if m.find(flag.encode()) >= 0:
        return True
  return False


FAST_COMPILE = ["--xla_backend_optimization_level=0"] + [
    f"--{flag}=false" for flag in ["xla_cpu_use_fusion_emitters"] if _xla_knows(flag)]
if "xla_backend_optimization_level" not in os.environ.get("XLA_FLAGS", ""):
  os.environ["XLA_FLAGS"] = " ".join([os.environ.get("XLA_FLAGS", ""), *FAST_COMPILE]).strip()

import ml_collections  # noqa: E402 -- after the environment above
import pytest  # noqa: E402

from actlab import config as config_lib  # noqa: E402
from tiny_config import get_config as tiny_config_file  # noqa: E402


def production_env(*xla_flags: str, **variables: str) -> dict:
  """This environment with XLA compiling as in real runs (not `FAST_COMPILE`), plus `xla_flags`
  and `variables`: for subprocesses whose claim depends on the compiled code, e.g. that results
  are bitwise the same on any number of threads, or equal across device counts to 1e-6."""
  kept = [f for f in os.environ.get("XLA_FLAGS", "").split() if f not in FAST_COMPILE]
  return {**os.environ, "XLA_FLAGS": " ".join([*kept, *xla_flags]), **variables}


REPO = pathlib.Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"


def tiny(activation: str = "gelu", **overrides):
  """tests/tiny_config.py with `section.field` overrides (`config.override`)."""
  return config_lib.override(tiny_config_file(activation), overrides)


@pytest.fixture
def tiny_config():
  return tiny()


def data_config(data_dir, batch_size: int = 8, **data_overrides):
  """Only the fields `actlab.data.load` reads: a byte-level synthetic corpus by default."""
  c = ml_collections.ConfigDict()
  c.train = ml_collections.ConfigDict(dict(batch_size=batch_size, seed=1337, progress=False))
  c.data = ml_collections.ConfigDict(dict(
      source="synthetic", tokenizer="byte", dir=str(data_dir), seq_len=32, val_batches=3,
      tinystories_version="v2", manual_dir="", gpt2_dir=""))
  c.data.update(data_overrides)
  return c
