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
# LLVM's optimisation passes (at XLA:CPU's default backend level) double the compile time
# and are worth it only for long runs, so the tests compile at level 0 (the same HLO, unoptimised
# machine code; a few times slower per step). Equivalence tests compare programs compiled alike,
# so their tolerances mean what they did. XLA_FLAGS that set the level already are kept; the
# subprocesses the tests start inherit it.
if "xla_backend_optimization_level" not in os.environ.get("XLA_FLAGS", ""):
  os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                             + " --xla_backend_optimization_level=0").strip()

import ml_collections  # noqa: E402 -- after the environment above
import pytest  # noqa: E402

from actlab import config as config_lib  # noqa: E402
from tiny_config import get_config as tiny_config_file  # noqa: E402

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
