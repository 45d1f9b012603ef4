"""A real distributed run on one machine: two processes joined by `jax.distributed` over localhost
(one coordinator address, one CPU device each, JAX's CPU collectives) train the tiny config data
parallel into one workdir, are killed, resume, and end with the numbers of one process training
the same global batch on 2 devices. The same code path as a SLURM or TPU-pod job, with the
coordinator given by flags (`parallel.coordinator`, `num_processes`, `process_id`)."""

import json
import os
import signal
import socket
import subprocess
import sys

import jax
import numpy as np
import pytest

from actlab.run import pretrained
from conftest import CPU_ONLY, REPO
from test_entry_points import guarded
from test_resume import rows, summary, wait_for_checkpoint

STEPS = 20
CHECKPOINT = 5  # Killed once it exists: then at step 2 * CHECKPOINT at most (the next save
# waits for it), with STEPS - 2 * CHECKPOINT = 10 steps to go, some 0.15 s each.
ENV = {**os.environ, **CPU_ONLY}  # JAX's CPU collectives: on a GPU host too


def cli(workdir, *flags, main=(sys.executable, "-m", "actlab.main")):
  return [*main, f"--config={REPO / 'tests' / 'tiny_config.py'}",
          f"--workdir={workdir}", f"--config.train.steps={STEPS}",
          f"--config.train.checkpoint_every={CHECKPOINT}", "--config.train.log_every=10",
          "--config.train.eval_every=50", *flags]


def free_port() -> int:
  with socket.socket() as s:
    s.bind(("localhost", 0))
    return s.getsockname()[1]


def start_two(workdir) -> list[subprocess.Popen]:
  """Processes 0 and 1 of a distributed run, one CPU device each."""
  port = free_port()
  return [subprocess.Popen(
      cli(workdir, "--config.parallel.distributed=true", "--config.parallel.cpu_devices=1",
          f"--config.parallel.coordinator=localhost:{port}", "--config.parallel.num_processes=2",
          f"--config.parallel.process_id={i}"),
      cwd=REPO, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
      for i in (0, 1)]


def finish(procs) -> list[str]:
  outs = [p.communicate(timeout=600)[0] for p in procs]
  for p, out in zip(procs, outs):
    assert p.returncode == 0, out[-3000:]
  return outs


@pytest.mark.slow
def test_two_processes_killed_and_resumed_equal_one_process_on_two_devices(tmp_path):
  reference, run = tmp_path / "one_process", tmp_path / "two_processes"
  # Under test_entry_points' guard: main sets up its 2 devices before anything asks for one.
  finish([subprocess.Popen(cli(reference, "--config.parallel.cpu_devices=2",
                               main=guarded("actlab.main")),
                           cwd=REPO, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True)])

  procs = start_two(run)
  wait_for_checkpoint(procs[0], run, CHECKPOINT)
  for p in procs:
    p.send_signal(signal.SIGKILL)
    p.wait()
  assert not (run / "summary.json").exists()
  outs = finish(start_two(run))
  assert all("resuming at step" in out for out in outs), outs

  # One set of checkpoints, written by both processes; process 0 writes the run's files and
  # process 1 keeps identical copies of its log in process_1/.
  assert not (run / "process_1" / "checkpoints").exists()
  segments = json.loads((run / "provenance.json").read_text())["segments"]
  assert [(s["process_count"], s["device_count"]) for s in segments] == [(2, 2)] * 2
  (segment,) = json.loads((reference / "provenance.json").read_text())["segments"]
  assert (segment["process_count"], segment["device_count"]) == (1, 2)
  assert rows(run) == rows(run / "process_1") == rows(reference)
  assert summary(run) == summary(reference)
  # The parameters too, read as sampling and export read them (`pretrained.load_run`): on this
  # process's one device, whatever the run trained on.
  (_, _, _, params, step), (*_, reference_params, _) = map(pretrained.load_run, (run, reference))
  assert step == STEPS
  for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(reference_params)):
    np.testing.assert_array_equal(a, b)
