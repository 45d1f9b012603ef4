"""provenance.json: one segment per start of a run (fresh or resumed) with what it ran with
(docs/design.md §3.5)."""

from __future__ import annotations

import contextlib
import functools
import importlib.metadata
import json
import os
import pathlib
import socket
import subprocess
import sys

import jax
import ml_collections

from actlab.run import workdir


PACKAGES = ("actlab", "jax", "jaxlib", "flax", "optax", "orbax-checkpoint", "numpy")


def _git(*args: str) -> str | None:
  try:
    out = subprocess.run(["git", *args], cwd=pathlib.Path(__file__).parent, capture_output=True,
                         text=True, timeout=10)
  except (OSError, subprocess.SubprocessError):
    return None
  return out.stdout.strip() if out.returncode == 0 else None


@functools.cache
def _code() -> dict:
  """The PACKAGES' versions, and actlab's git commit and dirty flag when it runs from a checkout."""
  versions = dict.fromkeys(PACKAGES)
  for name in PACKAGES:
    with contextlib.suppress(importlib.metadata.PackageNotFoundError):
      versions[name] = importlib.metadata.version(name)
  commit = _git("rev-parse", "HEAD")
  status = _git("status", "--porcelain", "--untracked-files=no") if commit else None
  return {"versions": versions, "git_commit": commit,
          "git_dirty": None if status is None else bool(status)}


def segment(config: ml_collections.ConfigDict, start_step: int) -> dict:
  """Where, with what and how this process (re)started the run at `start_step`."""
  devices = jax.devices()
  return {
      "start_step": start_step, "started": workdir.now(), **_code(),
      "device_kind": devices[0].device_kind, "device_count": len(devices),
      # XLA:CPU splits reductions over its threads, one per CPU this process may use: float32
      # results differ in rounding between CPU counts (docs/sweeps.md, "Using all the hardware").
      "cpus": len(os.sched_getaffinity(0)),
      "process_count": jax.process_count(), "host": socket.gethostname(),
      "command": [sys.executable, *sys.argv],
      "runtime": {k: v for k, v in workdir.dotted(json.loads(config.to_json())).items()
                  if k.startswith(workdir.RUNTIME_FIELDS)},
  }


def append_segment(logdir: pathlib.Path, seg: dict) -> list[dict]:
  """Appends `seg` to provenance.json; returns every segment so far."""
  path = logdir / "provenance.json"
  segments = (workdir.read_json(path) or {}).get("segments", [])
  segments.append(seg)
  workdir.write_json(path, {"segments": segments})
  return segments
