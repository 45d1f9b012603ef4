"""User mistakes on the command line: one `error:` line on stderr, exit code 2, no traceback
(one subprocess per entry point shows it: main and sample here, sweep in tests/test_sweep.py,
report in tests/test_report.py, export in tests/test_export.py; the other refusals are checked
in-process)."""

import json
import re
import subprocess
import sys

import pytest
from absl import flags

from actlab import sample, sweep
from actlab.core import activations
from actlab.infra import errors
from actlab.infra.workdir import RunDir
from actlab.run import train
from actlab.sweep import grid
from conftest import REPO, tiny

GELU = "configs/tinystories_gelu.py"


def run_cli(module, *args):
  """`python -m actlab.<module> args` from the repository root; its one stderr line."""
  result = subprocess.run([sys.executable, "-m", f"actlab.{module}", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=180)
  assert "Traceback" not in result.stdout + result.stderr, result.stderr
  assert result.returncode == errors.UserError.exit_code, result.stderr
  lines = result.stderr.splitlines()
  assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
  return lines[0]


def parse_config(monkeypatch, *args):
  """The UserError or flag error of parsing `args` as actlab.main parses `--config`
  (`errors.define_config_file` on a fresh FlagValues, `errors.parse_flags`); its message."""
  monkeypatch.setattr(sys, "argv", ["main", *args])  # config_flags reads its overrides there
  values = flags.FlagValues()
  errors.define_config_file("config", "", flag_values=values)
  with pytest.raises((errors.UserError, flags.Error)) as raised:
    errors.parse_flags(sys.argv, values)
  return str(raised.value)


def test_unknown_config_field_suggests_the_closest(monkeypatch):
  assert parse_config(monkeypatch, f"--config={GELU}:smoke",
                      "--config.optim.learning_rate=1e-3") == (
      "--config.optim.learning_rate: optim has no field 'learning_rate'; did you mean 'optim.lr'?")


def test_unknown_config_section_suggests_the_closest_field(monkeypatch):
  assert parse_config(monkeypatch, f"--config={GELU}", "--config.optimizer.lr=1e-3") == (
      "--config.optimizer.lr: the config has no section 'optimizer'; did you mean 'optim.lr'?")


def test_missing_config_file_suggests_a_sibling(monkeypatch):
  assert parse_config(monkeypatch, "--config=configs/tinystories_gleu.py") == (
      "config file 'configs/tinystories_gleu.py' not found; "
      "did you mean 'configs/tinystories_gelu.py'?")


def test_config_file_with_a_syntax_error_names_file_and_line(tmp_path, monkeypatch):
  bad = tmp_path / "bad_config.py"
  bad.write_text("def get_config(arg=None):\n  return dict(a=1,,)\n")
  assert parse_config(monkeypatch, f"--config={bad}").startswith(
      f"config file {bad}:2: SyntaxError: ")


def test_unknown_config_variant_lists_the_variants(monkeypatch):
  line = parse_config(monkeypatch, f"--config={GELU}:smol")
  assert "unknown config variant 'smol'; choose one of: 'smoke'" in line


def test_wrong_override_type(monkeypatch):
  line = parse_config(monkeypatch, f"--config={GELU}", "--config.train.steps=abc")
  assert "--config.train.steps=abc" in line and "'abc'" in line


def test_unknown_flag_suggests_the_closest(tmp_path):
  """The CLI's flag errors (absl's, or a UserError of the config parser) end the process with one
  `error:` line and exit code 2, before anything is written."""
  line = run_cli("main", f"--config={GELU}", f"--workdirr={tmp_path / 'run'}")
  assert line == ("error: Unknown command line flag 'workdirr'. Did you mean: workdir ? "
                  "(see --helpshort)")
  assert not (tmp_path / "run").exists()


def test_a_missing_required_flag_says_what_it_is_for():
  line = run_cli("main", f"--config={GELU}:smoke")
  assert line == ("error: flag --workdir=None: --workdir is required: Run directory (created; "
                  "reused to resume). (see --helpshort)")


def test_inconsistent_config_is_refused_before_anything_is_written(tmp_path):
  with pytest.raises(errors.UserError) as raised:
    train.run(tiny(**{"model.num_heads": 3}), tmp_path / "run")
  assert str(raised.value) == "model.d_model=32 is not divisible by model.num_heads=3"
  assert not (tmp_path / "run").exists()


def test_workdir_that_is_a_file(tmp_path):
  (tmp_path / "taken").write_text("notes")
  with pytest.raises(errors.UserError) as raised:
    train.run(tiny(), tmp_path / "taken")
  assert str(raised.value) == (
      f"--workdir {tmp_path / 'taken'} is a file, not a directory; choose another --workdir")
  assert (tmp_path / "taken").read_text() == "notes"


def test_workdir_holding_other_files_is_refused_before_anything_is_written(tmp_path):
  """The user's files are not mixed with a run's: a directory that holds them and no run is
  refused in one line, untouched."""
  mine = tmp_path / "mine"
  mine.mkdir()
  (mine / "notes.txt").write_text("notes")
  with pytest.raises(errors.UserError) as raised:
    train.run(tiny(), mine)
  assert str(raised.value) == (f"--workdir {mine} holds no run but other files (notes.txt); give "
                               "a new or empty directory, or a run's directory to resume it")
  assert [p.name for p in mine.iterdir()] == ["notes.txt"]


@pytest.fixture(scope="module")
def decoder_run(tmp_path_factory):
  """A trained tiny decoder (10 steps, context 32, byte vocabulary of 257)."""
  workdir = tmp_path_factory.mktemp("decoder")
  c = tiny()
  c.train.update(steps=10, checkpoint_every=10)
  train.run(c, workdir)
  return workdir


def refusal(workdir, prompt="", max_tokens=None, top_k=40):
  """The UserError message of `actlab.sample`'s main with these flags."""
  with pytest.raises(errors.UserError) as raised:
    sample.continue_prompt(workdir, prompt, max_tokens, 0.8, top_k, 0)
  return str(raised.value)


@pytest.mark.slow  # the module's trained run
def test_sample_refuses_top_k_above_the_vocabulary(decoder_run):
  assert refusal(decoder_run, top_k=1000) == (
      "--top_k=1000 must be between 0 and the vocabulary size 257")


def test_sample_refuses_a_negative_temperature(tmp_path):
  line = run_cli("sample", f"--workdir={tmp_path}", "--temperature=-1")
  assert "--temperature=-1" in line and "non-negative" in line


@pytest.mark.slow  # the module's trained run
def test_sample_refuses_more_new_tokens_than_the_context_holds(decoder_run):
  assert refusal(decoder_run, max_tokens=500) == (
      "the prompt takes 1 of the model's 32 positions; --max_tokens must be between 1 and 31")


@pytest.mark.slow  # the module's trained run
def test_sample_refuses_a_prompt_longer_than_the_context(decoder_run):
  assert refusal(decoder_run, prompt="x" * 40) == (
      "the prompt takes 41 tokens and the model's context is 32; shorten the prompt")


def written_run(workdir, **model):
  """`workdir` as a run of tiny() leaves it when it starts (config.json alone), with `model`'s
  fields changed there afterwards (e.g. an activation since unregistered)."""
  workdir.mkdir(parents=True)
  RunDir.open(workdir).write_config(tiny().to_dict())
  config = json.loads((workdir / "config.json").read_text())
  config["model"].update(model)
  (workdir / "config.json").write_text(json.dumps(config))
  return workdir


def test_sample_refuses_a_run_whose_activation_is_unregistered(tmp_path):
  """As actlab.main does (tests/test_config.py); export too (tests/test_export.py)."""
  run = written_run(tmp_path / "run", activation="Swish")
  assert refusal(run) == (
      f"{run} holds a run with model.activation: unknown activation 'Swish'; did you mean "
      f"'silu'? valid names: {', '.join(sorted(activations.NAMES))}; register it again to load "
      "the run (docs/extending.md)")


def sweep_dir(path):
  """A sweep's directory as `actlab.sweep` leaves it before training (sweep.json); its cells."""
  return sweep.plan(tiny(), f"{REPO}/experiments/relu_vs_gelu_lr.py:smoke", path,
                    log=lambda _: None)


def test_main_and_sweep_refuse_each_others_directory(tmp_path):
  sweep_dir(tmp_path / "sweep")
  with pytest.raises(errors.UserError) as raised:
    train.run(tiny(), tmp_path / "sweep")
  assert str(raised.value) == (
      f"--workdir {tmp_path / 'sweep'} is a sweep directory (sweep.json); give the run a directory "
      "of its own, or continue the sweep with actlab.sweep")
  assert [p.name for p in (tmp_path / "sweep").iterdir()] == ["sweep.json"]
  run = written_run(tmp_path / "run")
  for workdir, where in [(run, "is"), (run / "sweep", f"lies inside {run}, which is")]:
    with pytest.raises(errors.UserError) as raised:
      sweep_dir(workdir)
    assert str(raised.value) == (f"--workdir {workdir} {where} a run directory; give the sweep a "
                                 "new directory, or an earlier sweep's")
  assert [p.name for p in run.iterdir()] == ["config.json"]


def test_sample_on_a_sweep_directory_names_a_cell(tmp_path):
  cells = sweep_dir(tmp_path)
  (tmp_path / cells[1].name / "checkpoints").mkdir(parents=True)  # the first with a checkpoint
  with pytest.raises(errors.UserError) as raised:
    sample.load_run(tmp_path)
  assert str(raised.value) == (f"{tmp_path} is a sweep directory; pick one of its cells, e.g. "
                               f"--workdir={tmp_path / cells[1].name}")


def test_broken_sweep_file_names_file_and_line(tmp_path):
  """A sweep file with a syntax error is refused in one line, before the sweep writes anything
  (the sweep command line's one-line form: tests/test_sweep.py, its bad --workers)."""
  bad = tmp_path / "bad_sweep.py"
  bad.write_text("def get_sweep(arg=None):\n  return {'seeds': [0]}}\n")
  with pytest.raises(errors.UserError,
                     match=rf"^sweep file {re.escape(str(bad))}:2: SyntaxError: "):
    sweep.run(tiny(), str(bad), tmp_path / "sweep", log=lambda _: None)
  assert not (tmp_path / "sweep").exists()


def test_sweep_file_raising_on_import_names_file_and_line(tmp_path):
  bad = tmp_path / "bad_sweep.py"
  bad.write_text("import math\nSEEDS = [math.nope]\n")
  with pytest.raises(errors.UserError, match=rf"^sweep file {re.escape(str(bad))}:2: "
                     "AttributeError: "):
    grid.load(str(bad))


def test_sweep_file_raising_in_get_sweep_names_file_and_line(tmp_path):
  bad = tmp_path / "bad_sweep.py"
  bad.write_text("def get_sweep(arg=None):\n  return {'axes': AXES}\n")
  with pytest.raises(errors.UserError, match=rf"^sweep file {re.escape(str(bad))}:2: NameError: name 'AXES'"):
    grid.load(str(bad))


GLOBAL_STATE = """
import logging, sys, tempfile
import jax, orbax.checkpoint
from absl import app, flags
from ml_collections import config_flags

def state():
  filters = {n: list(logging.getLogger(n).filters) for n in ("", "absl", "asyncio")}
  return sys.unraisablehook, filters, {name: flags.FLAGS[name].parser for name in flags.FLAGS}

before = state()
from actlab.infra import checkpoint
from actlab.infra import errors
assert state() == before, ("import", before, state())
with checkpoint.Checkpoints(tempfile.mkdtemp(), 1):
  assert state() == before, ("open", before, state())
errors.define_config_file("config", "")
plain = flags.FlagValues()
config_flags.DEFINE_config_file("config", flag_values=plain)
assert type(flags.FLAGS["config"].parser) is type(plain["config"].parser), "config_flags' parser"

def main(argv):
  filters = state()[1]
  assert all(len(filters[n]) == len(before[1][n]) + 1 for n in ("absl", "asyncio")), filters
  print("filtered")
errors.run(main)
"""


def test_imports_change_no_global_state():
  """Importing actlab.infra.errors and actlab.infra.checkpoint installs no log filter, unraisable
  hook or flag parser, nor does a Checkpoints; a command (`errors.run`) filters Orbax's noise for
  the rest of its process; the config file flag keeps config_flags' parser."""
  result = subprocess.run([sys.executable, "-c", GLOBAL_STATE], cwd=REPO, capture_output=True,
                          text=True, timeout=120)
  assert result.returncode == 0 and result.stdout == "filtered\n", result.stderr
