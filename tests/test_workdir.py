"""The run directory: the lock, atomic files, the tolerant metrics reader, identity, a full disk."""

import fcntl
import json
import os
import socket
import subprocess
import sys
import threading

import pytest

from actlab import config as config_lib
from actlab.infra import workdir
from actlab.run import train
from conftest import tiny

HOLD = ("import fcntl, sys, time\n"
        "f = open(sys.argv[1], 'a'); fcntl.flock(f, fcntl.LOCK_EX)\n"
        "f.write('{\"pid\": 4242, \"host\": \"node7\", \"since\": \"then\"}'); f.flush()\n"
        "print('held', flush=True); time.sleep(120)\n")


def hold_lock(path):
  """A process that holds the flock on `path` (as a running actlab would) until killed."""
  path.parent.mkdir(parents=True, exist_ok=True)
  proc = subprocess.Popen([sys.executable, "-c", HOLD, str(path)], stdout=subprocess.PIPE,
                          text=True)
  assert proc.stdout.readline().strip() == "held"
  return proc


def test_lock_refuses_a_second_process_naming_the_holder(tmp_path):
  holder = hold_lock(tmp_path / ".lock")
  try:
    with pytest.raises(workdir.Lock.Busy, match=r"in use by pid 4242 on node7 \(since then\)"):
      with workdir.Lock(tmp_path):
        pass
  finally:
    holder.kill()
    holder.wait()
  with workdir.Lock(tmp_path):  # The kernel released it with the process: no stale lock.
    info = json.loads((tmp_path / ".lock").read_text())
    assert info["pid"] == os.getpid() and info["host"] == socket.gethostname()
    assert info["parent"] == os.getppid()  # workers.sibling: another worker's cell


def test_a_lock_taken_a_moment_ago_names_its_holder(tmp_path):
  """The holder writes who it is just after it takes the lock: a process that finds the lock in
  that moment waits for the name (a sweep's worker tells its siblings' cells apart by it)."""
  path = tmp_path / ".lock"
  with open(path, "a") as held:
    fcntl.flock(held, fcntl.LOCK_EX)  # Another open file: a second holder even in this process.
    later = threading.Timer(0.2, lambda: (held.write('{"pid": 4242, "host": "node7", '
                                                     '"since": "then"}'), held.flush()))
    later.start()
    try:
      with pytest.raises(workdir.Lock.Busy) as busy:
        with workdir.Lock(tmp_path):
          pass
    finally:
      later.join()
  assert busy.value.holder.get("pid") == 4242, busy.value
  assert "in use by pid 4242 on node7 (since then)" in str(busy.value)


def test_lock_is_reentrant_within_a_process(tmp_path):
  with workdir.Lock(tmp_path):
    with workdir.Lock(tmp_path):
      pass
    assert workdir.Lock(tmp_path).path in workdir._held  # still held by the outer block
  assert not workdir._held


def test_write_json_leaves_the_old_file_when_interrupted(tmp_path, monkeypatch):
  path = tmp_path / "summary.json"
  workdir.write_json(path, {"status": "stable"})

  def crash(src, dst):
    raise OSError(28, "No space left on device", str(dst))

  monkeypatch.setattr(os, "replace", crash)
  with pytest.raises(OSError):
    workdir.write_json(path, {"status": "diverged"})
  assert json.loads(path.read_text()) == {"status": "stable"}
  assert [p.name for p in tmp_path.iterdir()] == ["summary.json"]  # no temp file left


@pytest.mark.parametrize("content", ["", "{", "[1, 2]", "\x00\x00"])
def test_unreadable_summary_means_not_finished(tmp_path, content, capsys):
  (tmp_path / "summary.json").write_text(content)
  assert workdir.read_summary(tmp_path) is None
  assert "unreadable; treating the run as not finished" in capsys.readouterr().err


def test_read_rows_skips_torn_and_mangled_lines(tmp_path):
  path = tmp_path / "metrics.jsonl"
  path.write_text('{"step": 0, "val_loss": 5.0}\n{"step": 10, "train_lo{"step": 20}\n'
                  '["not a row"]\n{"step": 30, "train_loss": 2.0}\n{"step": 40, "train_')
  rows, bad = workdir.read_rows(path)
  assert [r["step"] for r in rows] == [0, 30] and bad == 3


def test_metrics_log_is_rebuilt_from_the_checkpoint_rows(tmp_path, capsys):
  path = tmp_path / "metrics.jsonl"
  rows = [{"step": 0, "val_loss": 5.0}, {"step": 10, "train_loss": 3.0}]
  path.write_text("".join(json.dumps(r) + "\n" for r in rows)
                  + '{"step": 20, "train_loss": 2.5}\n{"step": 30, "tr')
  log = workdir.MetricsLog(path, rows, step=10)
  assert "1 row(s) after step 10 dropped, 1 unreadable line(s) dropped" in capsys.readouterr().err
  log.write({"step": 20, "train_loss": 2.4})
  assert workdir.read_rows(path) == (rows + [{"step": 20, "train_loss": 2.4}], 0)
  path.write_text(json.dumps(rows[0]) + "\n")  # A row lost: restored from the checkpoint's copy.
  workdir.MetricsLog(path, rows, step=10)
  assert "1 row(s) restored" in capsys.readouterr().err
  assert workdir.read_rows(path) == (rows, 0)


def test_workdir_that_is_a_file_is_refused(tmp_path):
  (tmp_path / "f").write_text("x")
  with pytest.raises(workdir.WorkdirError, match="is a file, not a directory"):
    workdir.check_usable(tmp_path / "f")
  with pytest.raises(workdir.WorkdirError, match=r"lies under .*/f, which is a file"):
    workdir.check_usable(tmp_path / "f" / "run")
  workdir.check_usable(tmp_path / "new" / "run")  # not there yet: fine


def test_a_directory_of_other_files_is_refused_and_a_run_or_a_locked_one_is_not(tmp_path):
  """A workdir that holds no run but the user's files is refused in one line; one that is new,
  empty, only locked (a sweep's cell before its run starts, another host's `process_<i>/`) or
  holds a run (its config.json or checkpoints, beside anything else) is taken."""
  for name, made in [("new", []), ("empty", ["/"]), ("locked", [".lock", "process_1/.lock"]),
                     ("run", ["config.json", "notes.txt"]), ("saved", ["checkpoints/5/", "x"])]:
    for path in made:
      (tmp_path / name / path).parent.mkdir(parents=True, exist_ok=True)
      if not path.endswith("/"):
        (tmp_path / name / path).write_text(json.dumps(tiny().to_dict()))
    workdir.check_unused(tmp_path / name)
  mine = tmp_path / "mine"
  (mine / "data").mkdir(parents=True)
  for name in ("notes.txt", "b.csv", "c.csv", ".lock"):
    (mine / name).write_text("x")
  with pytest.raises(workdir.WorkdirError) as refused:
    workdir.check_unused(mine)
  assert str(refused.value) == (f"--workdir {mine} holds no run but other files (b.csv, c.csv, "
                                "data and 1 more); give a new or empty directory, or a run's "
                                "directory to resume it")


def test_another_config_is_named_by_the_fields_that_differ(tmp_path):
  """Few differences are shown with their values; many (another run altogether) by the first
  field names and a count; a config.json that is no run's is said to be none."""
  run_dir = workdir.RunDir.open(tmp_path)
  run_dir.write_config(tiny().to_dict())
  other = tiny(**{"model.d_model": 64, "model.num_layers": 2, "optim.lr": 1e-3,
                  "train.steps": 70, "model.activation": "relu"})
  with pytest.raises(workdir.WorkdirError) as refused:
    train.finished(other, run_dir)
  assert str(refused.value) == (
      f"{tmp_path} holds a run with a different config (5 fields: model.activation, "
      "model.d_model, model.num_layers and 2 more); rerun with the same config to resume, or choose "
      "another --workdir")
  (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2", "n_layer": 2}))
  with pytest.raises(workdir.WorkdirError, match=r"config.json is not an actlab run's config \("
                     r"it has no model and train sections\); choose another --workdir$"):
    train.finished(tiny(), run_dir)


def test_only_what_changes_the_math_identifies_a_run(tmp_path):
  c, run_dir = tiny(), workdir.RunDir.open(tmp_path)
  run_dir.write_config(c.to_dict())
  for key, value in [("train.progress", True), ("metrics.tensorboard", False),
                     ("train.keep_checkpoints", 9), ("parallel.cpu_devices", 2),
                     ("data.dir", "/elsewhere"), ("sweep.vectorize", True)]:
    other = tiny(**{key: value})
    train.finished(other, run_dir)
  with pytest.raises(workdir.WorkdirError, match=r"optim.lr: 0.003 → 0.001"):
    train.finished(tiny(**{"optim.lr": 1e-3}), run_dir)


def test_disk_full_is_found_in_the_cause_chain(tmp_path):
  try:
    try:
      raise OSError(28, "No space left on device", "/runs/x/metrics.jsonl")
    except OSError as e:
      raise RuntimeError("async save failed") from e
  except RuntimeError as e:
    err = e
  with pytest.raises(workdir.WorkdirError, match=r"no space left on device writing "
                     r"/runs/x/metrics.jsonl; free some space and rerun the same command"):
    with workdir.full_disk_reported(tmp_path):
      raise err
  with pytest.raises(RuntimeError):
    with workdir.full_disk_reported(tmp_path):
      raise RuntimeError("not a disk problem")


def test_disk_full_in_orbaxs_tensorstore_error_is_found(tmp_path):
  """Orbax's array writes fail with TensorStore's ValueError, the OS error code in its text."""
  err = ValueError(
      'RESOURCE_EXHAUSTED: Error writing local file "/runs/x/checkpoints/15.orbax-checkpoint-tmp/'
      'state/_sharding": Failed writing: "/runs/x/checkpoints/15.orbax-checkpoint-tmp/state/'
      '_sharding.__lock": Failed to write 24299 bytes to file 10: No space left on device '
      "[os_error_code='28']")
  with pytest.raises(workdir.WorkdirError, match=r"no space left on device writing "
                     r"/runs/x/checkpoints/15.orbax-checkpoint-tmp/state/_sharding; free"):
    with workdir.full_disk_reported(tmp_path):
      raise RuntimeError("checkpoint thread failed") from err
  with pytest.raises(ValueError):
    with workdir.full_disk_reported(tmp_path):
      raise ValueError("INVALID_ARGUMENT: Error reading \"/x\" [os_error_code='2']")


def test_a_config_written_before_a_field_was_added_is_the_same_run(tmp_path):
  """A config.json without a field reads as that field's default (`workdir.ADDED_FIELDS`, derived
  from the fields, e.g. `train.init_from` ""): a run written before any field its config holds at
  the default resumes; a different value is another run."""
  c = tiny()
  old = json.loads(c.to_json())
  assert workdir.ADDED_FIELDS == {(s, f): v for s, values in config_lib.schema.defaults().items()
                                  for f, v in values.items()}
  at_default = [(s, f) for (s, f), v in workdir.ADDED_FIELDS.items() if c[s][f] == v]
  assert ("model", "parametrization") in at_default and ("optim", "name") in at_default
  for section, field in at_default:
    del old[section][field]
  (tmp_path / "config.json").write_text(json.dumps(old))
  read = workdir.run_config(tmp_path)  # what sample and export read: the fields of then filled in
  # (A section left empty, as `parallel` here, is no section: a real config.json has none such.)
  assert all(read[s][f] == c[s][f] for s, f in workdir.ADDED_FIELDS if old[s])
  run_dir = workdir.RunDir.open(tmp_path)
  train.finished(c, run_dir)
  c.train.init_from = "hf:/models/gpt2"
  with pytest.raises(workdir.WorkdirError, match=r"train.init_from: '' → 'hf:/models/gpt2'"):
    train.finished(c, run_dir)


def test_the_runtime_fields_are_the_fields_marked_runtime():
  """`RUNTIME_FIELDS` (prefixes, set by actlab.config from its fields' `runtime` marks) covers the
  fields marked so and no other: a run resumed with another value of one is the same run."""
  keys = workdir.dotted(config_lib.base().to_dict())
  assert {k for k in keys if k.startswith(config_lib.RUNTIME_FIELDS)} == set(
      config_lib.marked("runtime"))
  assert {"parallel.mode", "sweep.vectorize", "train.progress", "metrics.wandb_mode",
          "data.dir"} <= set(config_lib.marked("runtime"))
  assert config_lib.RUNTIME_FIELDS[:2] == ("parallel.", "sweep.")  # sections of them alone
