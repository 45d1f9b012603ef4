"""Nothing lost, nothing silently wrong: exact resume after SIGKILL and SIGTERM (log included),
torn logs rebuilt, corrupt checkpoints detected, finished runs untouched, the workdir lock, a
full disk, and refused runs that leave nothing behind.

The runs in this process share one compile cache (`compiled`): a resume here continues a run of
another process, which loads the same programs from the persistent XLA cache (tests/conftest.py)."""

import contextlib
import hashlib
import json
import logging
import os
import pathlib
import re
import shutil
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import pytest

from actlab import sample, sweep
from actlab.infra import checkpoint, errors
from actlab.infra.checkpoint import Checkpoints
from actlab.infra.errors import UserError
from actlab.run import loop, program, rows as run_rows, train
from conftest import REPO, tiny
from test_workdir import hold_lock

CONFIG_FILE = str(REPO / "tests" / "tiny_config.py")
STEPS = tiny().train.steps  # 50: tiny()'s compiled programs (the schedule is in them)
KILL_AFTER = 15  # The signal follows checkpoint 15, so comes at step 30 at most (the save at 30
# waits for 15's), with 20 steps to go.
WALL_CLOCK = {"tokens_per_sec", "wall_time_sec", "train_time_sec", "provenance", "timing"}


def cli(workdir, *flags):
  """The CLI run of `cli_config`."""
  return [sys.executable, "-m", "actlab.main", f"--config={CONFIG_FILE}", f"--workdir={workdir}",
          f"--config.train.steps={STEPS}", f"--config.train.checkpoint_every={KILL_AFTER}",
          "--config.train.log_every=7", *flags]


def cli_config():
  """The config of `cli`'s run: `tiny()` logging every 7 steps, a checkpoint every KILL_AFTER."""
  return tiny(**{"train.steps": STEPS, "train.checkpoint_every": KILL_AFTER,
                 "train.log_every": 7})


def start(workdir, *flags):
  return subprocess.Popen(cli(workdir, *flags), cwd=REPO, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True)


def wait_for_checkpoint(proc, workdir, step, timeout=240):
  """Polls until Orbax has finalised checkpoint `step` (the tmp dir is renamed at the end). The
  next save waits for that, so the run is then at most `checkpoint_every` steps further."""
  path = pathlib.Path(workdir) / "checkpoints" / str(step)
  deadline = time.time() + timeout
  while not path.exists():
    assert proc.poll() is None, proc.stdout.read()
    assert time.time() < deadline, "no checkpoint in time"
    time.sleep(0.01)


def rows(workdir, wall_clock: bool = False) -> list[dict]:
  """metrics.jsonl, without the wall-clock fields unless asked."""
  out = [json.loads(l) for l in (pathlib.Path(workdir) / "metrics.jsonl").read_text().splitlines()]
  return out if wall_clock else [{k: v for k, v in r.items() if k not in WALL_CLOCK} for r in out]


def summary(workdir) -> dict:
  s = json.loads((pathlib.Path(workdir) / "summary.json").read_text())
  return {k: v for k, v in s.items() if k not in WALL_CLOCK}


def final_params(workdir, step=STEPS):
  task = program.create_step(tiny(), 257)
  ckpt = Checkpoints(pathlib.Path(workdir, "checkpoints"), 3, read_only=True)
  state, _ = ckpt.restore(step, jax.eval_shape(task.init, 0))
  ckpt.close()
  return state


def checkpoint_steps(workdir) -> list[int]:
  return sorted(int(p.name) for p in (pathlib.Path(workdir) / "checkpoints").iterdir()
                if p.name.isdigit())


def files(workdir) -> dict:
  """Every file under `workdir` with its size, mtime and content hash."""
  return {str(p.relative_to(workdir)): (p.stat().st_size, p.stat().st_mtime_ns,
                                        hashlib.sha256(p.read_bytes()).hexdigest())
          for p in sorted(pathlib.Path(workdir).rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def compiled():
  """One compile cache for the runs of this process (`program.get`)."""
  return {}


@pytest.fixture(scope="module")
def reference(tmp_path_factory, compiled):
  """The uninterrupted run that the interrupted ones must equal."""
  workdir = tmp_path_factory.mktemp("reference")
  train.run(cli_config(), workdir, cache=compiled)
  return workdir


@pytest.mark.slow
def test_sigkill_then_resume_is_exact_and_a_second_process_is_locked_out(reference, compiled,
                                                                         tmp_path, capsys):
  """The CLI run is stopped (SIGSTOP) after its first checkpoint: it holds its workdir, and a
  run of this process is refused, naming it; then SIGKILL, and this process resumes the run."""
  resumed = tmp_path / "resumed"
  proc = start(resumed)
  try:
    wait_for_checkpoint(proc, resumed, KILL_AFTER)
    proc.send_signal(signal.SIGSTOP)
    with pytest.raises(UserError) as refused:
      train.run(cli_config(), resumed, cache=compiled)
    assert re.fullmatch(rf"{resumed} is in use by pid {proc.pid} on \S+ \(since \S+\); wait for "
                        r"that run to end \(or stop it\), or choose another --workdir",
                        str(refused.value)), refused.value
  finally:
    proc.send_signal(signal.SIGKILL)
    proc.wait()
  assert proc.returncode == -signal.SIGKILL, proc.stdout.read()  # killed mid-run, not finished
  assert not (resumed / "summary.json").exists()
  capsys.readouterr()
  train.run(cli_config(), resumed, cache=compiled)
  assert "resuming at step" in capsys.readouterr().out

  a, b = final_params(reference), final_params(resumed)
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    np.testing.assert_array_equal(x, y)
  assert rows(resumed) == rows(reference)  # the log too, row for row
  assert summary(resumed) == summary(reference)
  segments = json.loads((resumed / "summary.json").read_text())["provenance"]
  assert [s["start_step"] for s in segments][0] == 0 and len(segments) == 2


@pytest.mark.slow
def test_sigterm_saves_the_step_it_stopped_at_and_resumes_exactly(reference, compiled, tmp_path,
                                                                   capsys):
  proc = start(tmp_path)
  wait_for_checkpoint(proc, tmp_path, KILL_AFTER)
  proc.send_signal(signal.SIGTERM)  # Most likely between log steps (every 7): the partial window
  # of rows since the last one must survive.
  out, _ = proc.communicate(timeout=120)
  assert proc.returncode == 128 + signal.SIGTERM, out
  stopped_at = int(re.search(r"after step (\d+); checkpoint of step \1 saved", out).group(1))
  assert KILL_AFTER < stopped_at < STEPS and checkpoint_steps(tmp_path)[-1] == stopped_at
  assert not (tmp_path / "summary.json").exists()
  assert all(r["step"] <= stopped_at for r in rows(tmp_path))

  capsys.readouterr()
  train.run(cli_config(), tmp_path, cache=compiled)
  assert f"resuming at step {stopped_at}" in capsys.readouterr().out
  assert rows(tmp_path) == rows(reference)
  assert summary(tmp_path) == summary(reference)


@pytest.mark.slow
def test_a_signal_during_a_log_step_still_saves_the_step_it_stops_at(short_run, compiled,
                                                                     tmp_path, monkeypatch):
  """The race a sweep hit: SIGTERM arrives while the loop writes a log row (host work between
  deciding whether to save and deciding whether to stop). The loop must not stop unsaved."""
  write = run_rows.Lane.write

  def write_then_signal(lane, row):
    write(lane, row)
    if row["step"] == 10:  # a log step, not a checkpoint step (every 25)
      os.kill(os.getpid(), signal.SIGTERM)

  monkeypatch.setattr(run_rows.Lane, "write", write_then_signal)
  with pytest.raises(loop.Interrupted, match=r"after step (\d+); checkpoint of step \1 saved"):
    train.run(tiny(), tmp_path, cache=compiled)
  assert checkpoint_steps(tmp_path) == [11]
  monkeypatch.setattr(run_rows.Lane, "write", write)
  train.run(tiny(), tmp_path, cache=compiled)
  assert rows(tmp_path) == rows(short_run) and summary(tmp_path) == summary(short_run)


@pytest.fixture(scope="module")
def short_run(tmp_path_factory, compiled):
  """A finished 50-step run (checkpoints at 25 and 50); tests work on copies of it."""
  workdir = tmp_path_factory.mktemp("short")
  train.run(tiny(), workdir, cache=compiled)
  return workdir


def crashed_copy(short_run, dest) -> pathlib.Path:
  """`short_run` as a crash after its step-50 checkpoint would leave it: no summary."""
  shutil.copytree(short_run, dest)
  (dest / "summary.json").unlink()
  return dest


@pytest.mark.slow
def test_torn_log_is_rebuilt_from_the_checkpoint(short_run, compiled, tmp_path, capsys):
  work = crashed_copy(short_run, tmp_path / "w")
  shutil.rmtree(work / "checkpoints" / "50")  # Killed after logging step 50, before its save.
  lines = (work / "metrics.jsonl").read_text().splitlines()
  lines[1] = lines[1][:20] + lines[2]  # A row torn in the middle of the file,
  lines[-1] = lines[-1][:len(lines[-1]) // 2]  # and the last one cut mid-write.
  (work / "metrics.jsonl").write_text("\n".join(lines))
  train.run(tiny(), work, cache=compiled)
  err = capsys.readouterr().err
  assert "rebuilt from the checkpoint of step 25: 2 row(s) after step 25 dropped, " \
         "2 unreadable line(s) dropped, 1 row(s) restored" in err
  assert rows(work) == rows(short_run)
  assert rows(work, True)[:3] == rows(short_run, True)[:3]  # rows up to 25: as first written
  assert summary(work) == summary(short_run)


@pytest.mark.slow
def test_corrupt_latest_checkpoint_is_moved_aside_and_the_previous_one_used(short_run, tmp_path):
  """From the command line: one line on stderr says so, and none of the tracebacks that Orbax's
  abandoned reads raise as they end (`errors.run`), tens of lines each."""
  work = crashed_copy(short_run, tmp_path / "w")
  data = max((work / "checkpoints" / "50" / "state").rglob("d/*"), key=lambda p: p.stat().st_size)
  raw = bytearray(data.read_bytes())
  raw[len(raw) // 2:len(raw) // 2 + 64] = bytes(64)  # Bytes overwritten in place, same size.
  data.write_bytes(bytes(raw))
  before = sorted(p.relative_to(work / "checkpoints" / "50")
                  for p in (work / "checkpoints" / "50").rglob("*"))
  result = subprocess.run(cli(work, "--config.train.log_every=10",
                              "--config.train.checkpoint_every=25"),
                          cwd=REPO, capture_output=True, text=True, timeout=120)
  assert result.returncode == 0, result.stderr[-3000:]
  assert re.search(r"checkpoint .*/checkpoints/50 (does not match its checksums|could not be "
                   r"read).*; moved aside to .*/checkpoints.corrupt/50; using step 25",
                   result.stderr), result.stderr[-3000:]
  assert "Traceback" not in result.stderr, result.stderr[:3000]
  moved = work / "checkpoints.corrupt" / "50"
  assert sorted(p.relative_to(moved) for p in moved.rglob("*")) == before  # nothing deleted
  assert summary(work) == summary(short_run)  # retrained 26-50 from the good checkpoint


def test_an_unreadable_checkpoint_is_named_by_the_cause_orbax_wraps():
  """Orbax wraps TensorStore's error (the array, the file, what is wrong) in one that prints
  TensorStore's whole spec; the one line gives the error at the chain's end."""
  cause = ValueError('FAILED_PRECONDITION: Error reading "params.w/0.0": Data corruption')
  wrapped = Exception("Encountered error while reading array index: <TensorStore spec>")
  wrapped.__cause__ = cause
  assert checkpoint._root_cause(wrapped) == ('ValueError: FAILED_PRECONDITION: Error reading '
                                             '"params.w/0.0": Data corruption')
  assert checkpoint._root_cause(cause) == checkpoint._root_cause(wrapped)


def test_a_new_run_starts_without_orbax_and_its_checkpoints_folder_waits_for_a_save(tmp_path):
  """Orbax is imported at a run's first save, not among the imports before its first step."""
  code = "import sys, actlab.main; print(sorted({m.split('.')[0] for m in sys.modules} & {'orbax'}))"
  out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
  assert out.stdout.strip() == "[]", out.stdout + out.stderr[-2000:]
  for read_only in (False, True):
    with Checkpoints(tmp_path / "checkpoints", 2, read_only=read_only) as checkpoints:
      assert checkpoints.restore_latest(None) is None and checkpoints.latest_step() is None
    assert not (tmp_path / "checkpoints").exists()


@pytest.mark.slow
def test_no_restorable_checkpoint_is_one_line_and_nothing_is_moved(short_run, tmp_path):
  work = crashed_copy(short_run, tmp_path / "w")
  for step in (25, 50):
    for f in (work / "checkpoints" / str(step) / "state").rglob("d/*"):
      f.write_bytes(f.read_bytes()[:f.stat().st_size // 2])  # truncated array data
  before = files(work)
  result = subprocess.run(cli(work, "--config.train.log_every=10",
                              "--config.train.checkpoint_every=25"),
                          cwd=REPO, capture_output=True, text=True, timeout=120)
  assert result.returncode == 2, result.stderr
  assert len(result.stderr.splitlines()) == 1, result.stderr
  assert result.stderr.startswith("error: no checkpoint can be restored: checkpoint ")
  assert "Nothing was moved or deleted" in result.stderr
  after = files(work)
  assert {k: v for k, v in after.items() if k != ".lock"} == \
      {k: v for k, v in before.items() if k != ".lock"}


@pytest.mark.slow
def test_finished_run_is_reported_and_its_files_untouched(short_run, tmp_path):
  work = tmp_path / "w"
  shutil.copytree(short_run, work)
  before = files(work)
  result = subprocess.run(cli(work, "--config.train.log_every=10",
                              "--config.train.checkpoint_every=25"),
                          cwd=REPO, capture_output=True, text=True, timeout=120)
  assert result.returncode == 0, result.stderr
  saved = json.loads((work / "summary.json").read_text())
  assert result.stdout.startswith(f"nothing trained: {work} holds a run that had already ended; "
                                  "its result:\nstatus: "), result.stdout
  assert f"{saved['final_val_loss']:.4f} at step 50" in result.stdout
  assert f"{saved['tokens_per_sec']:,.0f} tokens/s" in result.stdout
  assert files(work) == before


@pytest.mark.slow
def test_unreadable_summary_means_the_run_is_finished_again(short_run, compiled, tmp_path,
                                                            capsys):
  work = tmp_path / "w"
  shutil.copytree(short_run, work)
  (work / "summary.json").write_text("")  # What a crash mid-write used to leave.
  assert train.run(tiny(), work, cache=compiled)["final_val_loss"] == \
      summary(short_run)["final_val_loss"]
  assert "summary.json is unreadable; treating the run as not finished" in capsys.readouterr().err
  assert summary(work) == summary(short_run)
  assert rows(work, True) == rows(short_run, True)


@pytest.mark.slow
def test_runtime_fields_do_not_block_a_resume_and_segments_are_recorded(short_run, tmp_path):
  work = crashed_copy(short_run, tmp_path / "w")
  shutil.rmtree(work / "checkpoints" / "50")
  c = tiny(**{"train.progress": True, "metrics.tensorboard": False, "train.keep_checkpoints": 5})
  result = train.run(c, work)
  assert [s["start_step"] for s in result["provenance"]] == [0, 25]
  assert result["provenance"][1]["runtime"]["metrics.tensorboard"] is False
  assert json.loads((work / "config.json").read_text())["metrics"]["tensorboard"] is True
  assert summary(work) == summary(short_run)


@pytest.mark.parametrize("override, message", [
    ({"parallel.num_devices": 64}, "parallel.num_devices=64, but only"),
    ({"train.init_from": "/nonexistent/run"}, "holds no run"),
])
def test_refused_run_leaves_nothing_behind(tmp_path, override, message):
  c = tiny()
  if "train.init_from" in override:
    c.train.init_from = ""
  c.update_from_flattened_dict(override)
  with pytest.raises(UserError, match=message):
    train.run(c, tmp_path / "w")
  assert not (tmp_path / "w").exists()


def test_sampling_reads_a_workdir_without_writing_to_it(short_run, tmp_path):
  work = tmp_path / "w"
  work.mkdir()
  shutil.copy(short_run / "config.json", work)
  with pytest.raises(UserError, match="holds no checkpoint yet"):
    sample.load_run(work)
  assert [p.name for p in work.iterdir()] == ["config.json"]


@pytest.mark.slow
def test_two_sweeps_share_the_cells(compiled, tmp_path):
  spec = tmp_path / "grid.py"  # Cells of tiny() itself: the program `short_run` compiled.
  spec.write_text("def get_sweep(arg=None):\n"
                  "  return {'axes': {'optim.lr': [1e-3, 3e-3]}, 'seeds': [0]}\n")
  root = tmp_path / "sweep"
  holder = hold_lock(root / "lr=0.003,seed=0" / ".lock")  # Another sweep trains this cell.
  said = []
  try:
    results = sweep.run(tiny(), str(spec), root, log=said.append, cache=compiled)
  finally:
    holder.kill()
    holder.wait()
  assert list(results) == ["lr=0.001,seed=0"]
  assert any(s.startswith("lr=0.003,seed=0: skipped: ") and "in use by pid 4242" in s
             for s in said), said
  assert not (root / "lr=0.003,seed=0" / "metrics.jsonl").exists()
  assert list(sweep.run(tiny(), str(spec), root, log=said.append, cache=compiled)) == [
      "lr=0.001,seed=0", "lr=0.003,seed=0"]


@contextlib.contextmanager
def small_disk(path: pathlib.Path, size: str):
  path.mkdir()
  if subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                    capture_output=True).returncode:
    pytest.skip("cannot mount a small tmpfs here (needs root)")
  try:
    yield path
  finally:
    subprocess.run(["umount", "-l", str(path)], check=True)


def test_a_checkpoint_keeps_its_meta_as_it_was_when_saved(tmp_path):
  """The save runs on in the background while the loop appends rows: the checkpoint must hold
  the rows of its step, not those logged after it (a resumed log would repeat them)."""
  rows = [{"step": 0, "val_loss": 5.0}]
  with Checkpoints(tmp_path, 3) as ck:
    ck.save(20, {"w": jax.numpy.ones(3)}, {"rows": rows})
    rows.append({"step": 21, "train_loss": 4.0})
  with Checkpoints(tmp_path, 3, read_only=True) as ck:
    _, meta = ck.restore(20, {"w": jax.numpy.ones(3)})
  assert meta["rows"] == [{"step": 0, "val_loss": 5.0}]


def test_orbax_and_asyncios_warnings_are_a_commands_noise():
  """What Orbax's abandoned reads log after a failed checkpoint read, Orbax's warnings and
  asyncio's, whenever the reads end or their tasks are freed, is what a command's filter drops
  (`errors.run`, for the rest of its process); other records pass."""
  record = lambda name, level, path: logging.LogRecord(name, level, path, 1, "m", None, None)
  assert errors.orbax_noise(record("asyncio", logging.ERROR, "/lib/asyncio/base_events.py"))
  assert errors.orbax_noise(record("absl", logging.WARNING, "/lib/orbax/checkpoint/manager.py"))
  assert not errors.orbax_noise(record("absl", logging.INFO, "/lib/orbax/checkpoint/manager.py"))
  assert not errors.orbax_noise(record("absl", logging.WARNING, "/lib/actlab/data/__init__.py"))


@pytest.mark.slow
def test_full_disk_is_one_line_and_the_checkpoints_stay_intact(tmp_path):
  with small_disk(tmp_path / "disk", "1200k") as disk:
    # The program of `reference` (STEPS): loaded from the persistent XLA cache, not compiled.
    result = subprocess.run(cli(disk / "run", "--config.train.checkpoint_every=5"),
                            cwd=REPO, capture_output=True, text=True, timeout=180)
    assert result.returncode == 2, result.stdout + result.stderr
    assert len(result.stderr.splitlines()) == 1, result.stderr
    assert re.match(r"error: no space left on device writing \S+; free some space and rerun the "
                    "same command", result.stderr), result.stderr
    saved = checkpoint_steps(disk / "run")
    assert saved
    like = program.create_step(cli_config(), 257).init(0)
    ck = Checkpoints(disk / "run" / "checkpoints", 3, read_only=True)
    assert ck.restore_latest(like)[0] == saved[-1]  # intact: checksums match
    ck.close()
