"""provenance.json: one segment per start of a run; the paths a run records."""

import json
import os
import pathlib
import sys

import pytest

from actlab.infra import workdir as workdir_lib
from actlab.run import rows as lane, train
from conftest import REPO, tiny


def test_provenance_segment(tmp_path, monkeypatch):
  monkeypatch.setenv("XLA_FLAGS", "--xla_gpu_deterministic_ops=true")
  seg = lane.segment(tiny(**{"train.progress": False}), start_step=40)
  assert seg["xla_flags"] == "--xla_gpu_deterministic_ops=true"
  assert seg["deterministic_ops"] == {"asked": False, "in_xla_flags": True}
  assert seg["start_step"] == 40 and seg["device_count"] >= 1 and seg["device_kind"]
  cpuinfo = pathlib.Path("/proc/cpuinfo")  # the host's processor, as Linux names it
  assert seg["host_cpu"]
  assert not cpuinfo.exists() or f": {seg['host_cpu']}\n" in cpuinfo.read_text()
  assert set(lane.PACKAGES) <= set(seg["versions"]) and seg["versions"]["jax"]
  assert seg["git_commit"] is None or len(seg["git_commit"]) == 40
  assert seg["command"][0] == os.path.basename(sys.executable)
  assert seg["runtime"]["train.progress"] is False
  assert [s["start_step"] for s in lane.append_segment(tmp_path, seg)] == [40]
  assert [s["start_step"] for s in lane.append_segment(tmp_path, {**seg, "start_step": 90})] \
      == [40, 90]


def test_recorded_paths_are_relative_to_the_run_directory():
  """An absolute path that shares a directory below / with the run directory is recorded
  relative to it, any other by its base name; a relative one as it is. The interpreter is its
  base name, an actlab entry point `-m <module>`."""
  run = "/work/runs/sweep/cell"
  assert workdir_lib.recorded_path("/work/manual", run) == "../../../manual"
  assert workdir_lib.recorded_path("/work/runs/sweep", run) == ".."
  assert workdir_lib.recorded_path("/work/runs/sweep/cell/", run) == "."
  assert workdir_lib.recorded_path("hf:/work/models/gpt2", run) == "hf:../../../models/gpt2"
  assert workdir_lib.recorded_path("/data/tinystories", run) == "tinystories"
  assert workdir_lib.recorded_path("manual", run) == "manual"
  assert workdir_lib.recorded_path("hf:gpt2", run) == "hf:gpt2"
  package = "/home/u/actlab/actlab"
  assert workdir_lib.recorded_command(
      [f"{package}/sweep/__main__.py", "--config=configs/tinystories_gelu.py",
       "--config.data.manual_dir=/work/manual", "--workdir=/work/runs/sweep", "--workers=2",
       "/work/runs/other"], "/home/u/.venv/bin/python3", run, package) == [
      "python3", "-m", "actlab.sweep", "--config=configs/tinystories_gelu.py",
      "--config.data.manual_dir=../../../manual", "--workdir=..", "--workers=2", "../../other"]
  assert workdir_lib.recorded_command([f"{package}/main.py"], "python", run, package) \
      == ["python", "-m", "actlab.main"]
  assert workdir_lib.recorded_command(["/opt/tools/train.py", "-x"], "/usr/bin/python", run) \
      == ["python", "train.py", "-x"]
  assert workdir_lib.recorded_command([], "/usr/bin/python", run) == ["python"]


def test_a_config_on_absolute_paths_is_written_relative_and_read_back(tmp_path):
  """config.json of a config with an absolute data dir and init_from holds them relative to the
  run directory, `run_config` (sample, export) reads the data dir back against it, and the guard
  takes the absolute form given again (or another data dir) for the same run."""
  workdir, data_dir = tmp_path / "runs" / "a", tmp_path / "data"
  c = tiny(**{"data.dir": str(data_dir), "train.init_from": f"hf:{tmp_path / 'gpt2'}"})
  run_dir = workdir_lib.RunDir.open(workdir)
  workdir.mkdir(parents=True)
  run_dir.write_config(c.to_dict())
  written = json.loads((workdir / "config.json").read_text())
  assert written["data"]["dir"] == "../../data"
  assert written["train"]["init_from"] == "hf:../../gpt2"
  assert {k: v for k, v in written.items() if k not in ("data", "train")} \
      == {k: v for k, v in json.loads(c.to_json()).items() if k not in ("data", "train")}
  assert workdir_lib.run_config(workdir)["data"]["dir"] == str(data_dir)
  train.finished(c, run_dir)  # the same run
  train.finished(tiny(**{"data.dir": "/elsewhere",  # a runtime field: the same run
                               "train.init_from": c.train.init_from}), run_dir)
  with pytest.raises(workdir_lib.WorkdirError, match=r"train.init_from: 'hf:../../gpt2' → 'hf:"):
    train.finished(tiny(**{"train.init_from": f"hf:{tmp_path / 'other'}"}), run_dir)


@pytest.mark.slow
def test_no_file_of_a_run_names_a_directory_of_the_machine(tmp_path, monkeypatch):
  """A run trained from the command line on an absolute workdir and manual dir: no JSON file it
  writes (config.json, provenance.json, summary.json, the tokenizer's manifest, ...) holds the
  absolute path of the workdir, the manual dir, the interpreter or the checkout; the command is
  recorded as one would type it, the manual dir relative to the run directory, and the run
  resumes (here: is found finished) from the same command."""
  workdir, manual = tmp_path / "runs" / "a", tmp_path / "manual"
  monkeypatch.setattr(sys, "argv", [
      str(REPO / "actlab" / "main.py"), f"--config={REPO / 'tests' / 'tiny_config.py'}",
      f"--config.data.manual_dir={manual}", f"--workdir={workdir}"])
  c = tiny(**{"data.manual_dir": str(manual), "train.steps": 4, "optim.warmup_steps": 1,
              "train.log_every": 2, "train.eval_every": 4, "train.checkpoint_every": 4,
              "metrics.sharpness_every": 0})
  summary = train.run(c, workdir)
  files = sorted(p for p in workdir.rglob("*") if p.is_file() and p.suffix in (".json", ".jsonl"))
  assert {"config.json", "summary.json", "provenance.json"} <= {p.name for p in files}
  machine = {str(workdir), str(manual), str(tmp_path), str(REPO), sys.executable,
             os.path.dirname(sys.executable)}
  for path in files:
    text = path.read_text()
    assert not [m for m in machine if m in text], (path, [m for m in machine if m in text])
  (segment,) = summary["provenance"]
  # What it trained on, in the row the report reads (summary.json): the CPU model and the
  # device (a GPU's name, "cpu" on a CPU), as this machine names them.
  import jax  # pylint: disable=import-outside-toplevel
  on_disk = json.loads((workdir / "summary.json").read_text())["provenance"][-1]
  assert segment["host_cpu"] == on_disk["host_cpu"] == lane.host_cpu() != ""
  assert segment["device_kind"] == on_disk["device_kind"] == jax.devices()[0].device_kind
  command = segment["command"]
  assert command[:3] == [os.path.basename(sys.executable), "-m", "actlab.main"]
  assert command[3].startswith("--config=") and command[3].endswith("tiny_config.py")
  assert command[4:] == ["--config.data.manual_dir=../../manual", "--workdir=."]
  assert segment["runtime"]["data.manual_dir"] == "../../manual"
  assert json.loads((workdir / "config.json").read_text())["data"]["manual_dir"] == "../../manual"
  assert workdir_lib.run_config(workdir)["data"]["manual_dir"] == str(manual)
  assert train.run(c, workdir) == summary
