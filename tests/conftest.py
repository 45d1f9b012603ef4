"""Shared fixtures: a tiny decoder config on the embedded corpus and a session data cache."""

import os
import pathlib
import tempfile

import pytest

from tiny_config import get_config as tiny_config_file

# One token cache for the whole session (and for subprocesses the tests start).
os.environ.setdefault("ACTLAB_DATA_DIR", tempfile.mkdtemp(prefix="actlab-test-data-"))

REPO = pathlib.Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"


def tiny(activation: str = "gelu", **overrides):
  """tests/tiny_config.py with `section.field` overrides."""
  c = tiny_config_file(activation)
  for key, value in overrides.items():
    section, field = key.split(".")
    c[section][field] = value
  return c


@pytest.fixture
def tiny_config():
  return tiny()
