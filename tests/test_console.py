"""What a run prints, as a newcomer reads it: a line per evaluation beside the progress bar
(nanoGPT's `step N: train loss …, val loss …`), a closing line that says compile work in
background threads as such, and a Ctrl-C during `actlab.sweep --workers=2` said in lines, not in
the workers' tracebacks."""

import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from actlab import main
from actlab.run import train
from conftest import REPO, production_env, tiny


def test_each_evaluation_prints_its_losses_though_no_row_moves_the_bar(tmp_path, capsys):
  """Fewer steps than `train.log_every`: the bar would stay still until the end; each evaluation
  says its step's losses in a line, as the row has them."""
  train.run(tiny(**{"train.steps": 10, "train.eval_every": 5, "train.log_every": 50}), tmp_path)
  rows = [json.loads(l) for l in (tmp_path / "metrics.jsonl").read_text().splitlines()]
  lines = [l for l in capsys.readouterr().out.splitlines() if l.startswith("step ")]
  assert lines == [f"step 0: val loss {rows[0]['val_loss']:.4f}"] + [
      f"step {r['step']}: train loss {r['train_loss']:.4f}, val loss {r['val_loss']:.4f}"
      + (f", test loss {r['test_loss']:.4f}" if "test_loss" in r else "") for r in rows[1:]]
  assert [r["step"] for r in rows] == [0, 5, 10]


def test_the_closing_line_says_compile_work_as_summed_over_threads():
  """29.2 s of compile work in a 28 s run is no contradiction once it says where it ran."""
  said = main.timing({"startup_sec": 4.1, "compile": {
      "sec": 29.2, "programs_compiled": 5, "programs_cached": 0}})
  assert said == (", its first step 4.1 s after the start; compile work 29.2 s, summed over "
                  "background threads (5 programs compiled, 0 from the cache)")
  assert main.timing(None) == ""


@pytest.mark.slow
def test_a_ctrl_c_during_a_sweep_with_workers_is_lines_not_tracebacks(tmp_path):
  """SIGINT to the parent half a second after it starts its workers (as they import, most likely;
  compiling or training, where they are quicker): each worker ends with 128 + 2, in a line at
  most, and the parent says so; no traceback."""
  if len(os.sched_getaffinity(0)) < 2:
    pytest.skip("needs 2 CPUs")
  spec = tmp_path / "grid.py"
  spec.write_text("def get_sweep(arg=None):\n  return {'axes': {'optim.lr': [1e-3, 3e-3]}, "
                  "'seeds': [0], 'fixed': {'train.steps': 200}}\n")
  proc = subprocess.Popen(
      [sys.executable, "-m", "actlab.sweep", f"--config={REPO / 'tests' / 'tiny_config.py'}",
       f"--sweep={spec}", f"--workdir={tmp_path / 'runs'}", "--workers=2"],
      cwd=REPO, env=production_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
  first = proc.stdout.readline()
  assert "2 workers" in first, first
  time.sleep(0.5)
  proc.send_signal(signal.SIGINT)
  out = first + proc.communicate(timeout=300)[0]
  assert proc.returncode == 128 + signal.SIGINT, out
  assert "Traceback" not in out and "KeyboardInterrupt" not in out, out
  ends = re.findall(r"^worker \d/2 \(CPUs \S+\): (.*)$", out, re.M)
  assert ends and set(ends) == {"stopped with exit code 130"}, out
  assert out.endswith("error: stopped by signal 2; rerun the same command to resume\n"), out
