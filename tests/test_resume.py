"""Checkpoints: exact resume after SIGKILL, SIGTERM saves, bad checkpoints reported, CLI errors."""

import os
import pathlib
import re
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import pytest

from actlab import train
from actlab.checkpoint import CheckpointError, Checkpoints
from conftest import REPO, tiny

CONFIG_FILE = str(REPO / "tests" / "tiny_config.py")
STEPS = 300


def cli(workdir, *flags):
  return [sys.executable, "-m", "actlab.main", f"--config={CONFIG_FILE}", f"--workdir={workdir}",
          f"--config.train.steps={STEPS}", "--config.train.checkpoint_every=20", *flags]


def start(workdir, *flags):
  return subprocess.Popen(cli(workdir, *flags), cwd=REPO, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True)


def wait_for_checkpoint(proc, workdir, step, timeout=240):
  """Polls until Orbax has finalised checkpoint `step` (the tmp dir is renamed at the end)."""
  path = pathlib.Path(workdir) / "checkpoints" / str(step)
  deadline = time.time() + timeout
  while not path.exists():
    assert proc.poll() is None, proc.stdout.read()
    assert time.time() < deadline, "no checkpoint in time"
    time.sleep(0.05)


def final_params(workdir):
  c = tiny()
  task = train.Task.create(c, 257)
  like = jax.eval_shape(task.init, 0)
  ckpt = Checkpoints(pathlib.Path(workdir, "checkpoints").absolute(), 3)
  state = ckpt.restore(STEPS, like)
  ckpt.close()
  return state


@pytest.mark.slow
def test_sigkill_then_resume_is_bitwise_exact(tmp_path):
  reference = tmp_path / "reference"
  c = tiny()
  c.train.update(steps=STEPS, checkpoint_every=20)
  train.run(c, reference)

  resumed = tmp_path / "resumed"
  proc = start(resumed)
  wait_for_checkpoint(proc, resumed, 40)
  proc.send_signal(signal.SIGKILL)
  proc.wait()
  assert not (resumed / "summary.json").exists()
  result = subprocess.run(cli(resumed), cwd=REPO, capture_output=True, text=True, timeout=300)
  assert result.returncode == 0, result.stderr
  assert "resuming at step" in result.stdout

  a, b = final_params(reference), final_params(resumed)
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    np.testing.assert_array_equal(x, y)
  steps = lambda d: [int(l.split('"step": ')[1].split(",")[0].rstrip("}"))
                     for l in (d / "metrics.jsonl").read_text().splitlines()]
  assert steps(resumed) == steps(reference)  # the log holds each step once


@pytest.mark.slow
def test_sigterm_saves_a_checkpoint_and_exits_nonzero(tmp_path):
  proc = start(tmp_path)
  wait_for_checkpoint(proc, tmp_path, 20)
  proc.send_signal(signal.SIGTERM)
  out, _ = proc.communicate(timeout=120)
  assert proc.returncode == 128 + signal.SIGTERM, out
  stopped_at = int(re.search(r"at step (\d+); checkpoint saved", out).group(1))
  saved = sorted(int(p.name) for p in (tmp_path / "checkpoints").iterdir() if p.name.isdigit())
  assert stopped_at > 20 and saved[-1] == stopped_at  # saved where it stopped
  assert not (tmp_path / "summary.json").exists()


def test_corrupt_checkpoint_is_reported_and_nothing_deleted(tmp_path):
  c = tiny()
  c.train.update(steps=20, checkpoint_every=10)
  train.run(c, tmp_path)
  latest = tmp_path / "checkpoints" / "20"
  for f in latest.rglob("*"):
    if f.is_file() and f.stat().st_size > 0 and "metadata" not in f.name:
      f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])  # truncate the array data
  before = sorted(str(p) for p in (tmp_path / "checkpoints").rglob("*"))
  c.train.steps = 20
  with pytest.raises(CheckpointError, match=r"checkpoints/20 could not be restored.*step 10"):
    train.run(c, tmp_path)
  assert sorted(str(p) for p in (tmp_path / "checkpoints").rglob("*")) == before


def test_cli_reports_bad_config_in_one_line(tmp_path):
  result = subprocess.run(
      [sys.executable, "-m", "actlab.main", f"--config={CONFIG_FILE}", f"--workdir={tmp_path}",
       "--config.model.num_heads=3"], cwd=REPO, capture_output=True, text=True, timeout=120)
  assert result.returncode == 2
  assert result.stderr.strip() == (
      "error: model.d_model=32 is not divisible by model.num_heads=3")
  assert not any(tmp_path.iterdir())  # nothing written
