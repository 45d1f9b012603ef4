"""The reader's path (docs/design.md §1), measured: `python -m actlab.main` trains the Quickstart's
config (configs/tinystories_gelu.py:smoke) in a fresh process under `sys.setprofile` and
`threading.setprofile`, every thread, from `main()` to the first optimizer update
(`optax.apply_updates`, traced inside the step), and its path is every actlab file a call enters,
in the order first entered; the code modules run as they are imported is not counted (an import
inside a function counts only what is then called). The token cache is built before, as every
run after the first finds it. The files must be the allow-list `PATH`, which design.md walks and
counts and the README counts: a file joining the path anywhere fails, as a planted module shows."""

import json
import os
import pathlib
import re
import subprocess
import sys

import pytest

from actlab.infra import errors
from conftest import CPU_ONLY, REPO

PACKAGE = REPO / "actlab"
CONFIG = "configs/tinystories_gelu.py:smoke"
# The path as the trace finds it, in the order first entered.
PATH = ("main.py", "run/train.py", "config/schema.py", "core/model.py", "core/activations.py",
        "data/tokenizer.py", "core/step.py", "infra/parallel.py", "infra/workdir.py",
        "run/program.py", "tasks.py", "data/__init__.py", "data/synthetic.py", "core/kernels.py",
        "measure/evaluators.py", "infra/checkpoint.py", "run/rows.py", "run/loop.py")
MAX_FILES, MAX_CORE_FILES = 18, 4

# Run in a fresh process: `main()` under the profile, which prints the files entered (JSON) and
# ends the process at the first `optax.apply_updates`. With "plant", a window's cut first passes
# through a function compiled as if from actlab/data/planted.py.
TRACE = """
import json, os, sys, threading
import optax
from actlab import data, main as main_lib
from actlab.infra import errors

package, plant, sys.argv = sys.argv[1] + "/", sys.argv[2] == "plant", sys.argv[2:]
if plant:
  cut, planted = data.Dataset.train_batch, {}
  exec(compile("def train_batch(self, k):\\n  return cut(self, k)\\n",
               package + "data/planted.py", "exec"), {"cut": cut}, planted)
  data.Dataset.train_batch = planted["train_batch"]
files, update = [], optax.apply_updates.__code__

def importing(frame):
  while frame is not None:
    if frame.f_code.co_filename.startswith("<frozen importlib"):
      return True
    frame = frame.f_back
  return False

def trace(frame, event, arg):
  if event != "call":
    return
  name = frame.f_code.co_filename
  if frame.f_code is update:
    print(json.dumps(files), flush=True)
    os._exit(0)
  if name.startswith(package) and name[len(package):] not in files and not importing(frame):
    files.append(name[len(package):])

def main(argv):
  threading.setprofile(trace)
  sys.setprofile(trace)
  main_lib.main(argv)

main_lib.define_flags()
errors.run(main)
"""


def traced(workdir: pathlib.Path, plant: bool = False) -> list[str]:
  """The files `python -m actlab.main --config=CONFIG --workdir=<workdir>` enters from `main()`
  to its first update, in the order first entered."""
  path, _, arg = CONFIG.partition(":")
  config = errors.call_file(str(REPO / path), "get_config", arg, kind="config")
  from actlab import data
  data.load(config, progress=False)  # The token cache, built off the trace.
  proc = subprocess.run(
      [sys.executable, "-c", TRACE, str(PACKAGE), "plant" if plant else "-", f"--config={CONFIG}",
       f"--workdir={workdir}"], cwd=REPO, capture_output=True, text=True, timeout=600,
      env={**os.environ, **CPU_ONLY})
  assert proc.returncode == 0 and proc.stdout, proc.stderr[-3000:]
  return json.loads(proc.stdout.splitlines()[-1])


def off_the_list(files: list[str]) -> list[str]:
  """The files of a traced path that the allow-list does not hold, and those it holds that the
  path no longer enters."""
  return sorted(set(files) ^ set(PATH))


def path_in_design() -> tuple[list[str], str]:
  """The files design.md §1's walk names, in order, and the sentence that counts them."""
  text = (REPO / "docs" / "design.md").read_text()
  walk, count = text.split("Reading it in code", 1)[1].split("\n\n", 3)[1:3]
  return re.findall(r"`([\w/]+\.py)`", walk), count


@pytest.mark.slow
def test_the_path_from_main_to_the_first_update_is_the_allow_list(tmp_path):
  files = traced(tmp_path / "run")
  assert not off_the_list(files), files
  assert len(PATH) <= MAX_FILES
  assert sum(f.startswith("core/") for f in PATH) <= MAX_CORE_FILES


@pytest.mark.slow
def test_a_module_planted_on_the_path_fails_the_check(tmp_path):
  assert off_the_list(traced(tmp_path / "run", plant=True)) == ["data/planted.py"]


def test_the_design_notes_and_the_readme_walk_the_traced_path():
  """design.md §1 names the path's files in `PATH`'s order (a return repeats one) and counts
  them; the README's layout says the same count."""
  files, count = path_in_design()
  assert list(dict.fromkeys(files)) == list(PATH), files
  assert count.startswith(f"{len(PATH)} files"), count
  assert f"enters {len(PATH)} files" in " ".join((REPO / "README.md").read_text().split())
  assert all((PACKAGE / f).is_file() for f in files)
