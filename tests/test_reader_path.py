"""The reader's path (docs/design.md §1), measured by following calls: `actlab.main` trains the
Quickstart's config (configs/tinystories_gelu.py:smoke, its default fused loss) under
`sys.setprofile` and `threading.setprofile` until the optimizer's update, `optax.apply_updates`,
and the token's path is every actlab file on the call stack while a window of tokens is cut
(`Dataset.train_batch`) or the train step that takes it to the update is traced
(`core.Step.train_step`). A thread's stack goes on from the call that gave it its work (a program
compiled in a thread: from where its compilation was started). The files must be the allow-list
`PATH`, which design.md walks and counts, and the README counts: a file joining the path fails,
as a module planted on it shows."""

import pathlib
import re
import sys
import threading
from concurrent.futures import thread as pool_thread

import optax
import pytest

from actlab import core, data, tasks
from actlab import main as main_lib
from actlab.infra import errors

REPO = pathlib.Path(__file__).resolve().parent.parent
PACKAGE = REPO / "actlab"
CONFIG = "configs/tinystories_gelu.py:smoke"
# The path as the trace finds it, in the order a reader meets the files.
PATH = ("main.py", "run/train.py", "run/loop.py", "data/__init__.py", "run/program.py",
        "core/step.py", "core/model.py", "core/activations.py", "core/kernels.py")
MAX_FILES, MAX_CORE_FILES = 9, 4  # kernels.py counts as core: the default's loss is its own
ROOTS = {data.Dataset.train_batch.__code__, core.Step.train_step.__code__}
# A pool's work item: made where work is submitted, run in the pool's thread.
SUBMITTED, RUN = pool_thread._WorkItem.__init__.__code__, pool_thread._WorkItem.run.__code__


class Updated(Exception):
  """Raised where the trace reaches `optax.apply_updates`: the run stops there."""


class Trace:
  """The actlab files on the stack at each call under a root (`ROOTS`), by threads joined to the
  stack that submitted their work, from the start until `optax.apply_updates`."""

  def __init__(self):
    self.files: list[str] = []
    self.submitted: dict[int, list] = {}  # a work item -> the stack that submitted it
    self.done = False

  def stack(self, frame) -> list:
    frames = []
    while frame is not None:
      frames.append(frame)
      if frame.f_code is RUN:
        frames.extend(self.submitted.get(id(frame.f_locals["self"]), []))
        break
      frame = frame.f_back
    return frames

  def __call__(self, frame, event, arg):
    if self.done:
      sys.setprofile(None)
      return
    if event != "call":
      return
    code = frame.f_code
    if code is SUBMITTED:
      self.submitted[id(frame.f_locals["self"])] = self.stack(frame.f_back)
    elif code is optax.apply_updates.__code__:
      self.done = True
      raise Updated()
    elif code.co_filename.startswith(f"{PACKAGE}/"):
      frames = self.stack(frame)[::-1]
      if any(f.f_code in ROOTS for f in frames):
        for f in frames:
          name = f.f_code.co_filename
          if name.startswith(f"{PACKAGE}/"):
            file = name[len(f"{PACKAGE}/"):]
            if file not in self.files:
              self.files.append(file)


def traced(workdir: pathlib.Path) -> list[str]:
  """The token's path of `python -m actlab.main --config=CONFIG --workdir=<workdir>`, its files in
  the order the trace first finds them."""
  trace = Trace()
  path, _, arg = CONFIG.partition(":")
  config = errors.call_file(str(REPO / path), "get_config", arg, kind="config")
  tasks.get(config).dataset(config)  # Its token cache made first, off the trace: seconds.
  threading.setprofile(trace)
  sys.setprofile(trace)
  try:
    with pytest.raises(Updated):
      main_lib.train_one(config, str(workdir))
  finally:
    sys.setprofile(None)
    threading.setprofile(None)
  return trace.files


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
def test_the_token_path_is_the_allow_list(tmp_path):
  files = traced(tmp_path / "run")
  assert not off_the_list(files), files
  assert len(PATH) <= MAX_FILES
  assert sum(f.startswith("core/") for f in PATH) <= MAX_CORE_FILES


@pytest.mark.slow
def test_a_module_planted_on_the_path_fails_the_check(tmp_path, monkeypatch):
  """A window's cut that passes through a new file of the package (here a function compiled as
  if from actlab/data/planted.py) adds it to the traced path: the check names it."""
  cut, planted = data.Dataset.train_batch, {}
  exec(compile("def train_batch(self, k):\n  return cut(self, k)\n",
               str(PACKAGE / "data" / "planted.py"), "exec"), {"cut": cut}, planted)
  monkeypatch.setattr(data.Dataset, "train_batch", planted["train_batch"])
  assert off_the_list(traced(tmp_path / "run")) == ["data/planted.py"]


def test_the_design_notes_and_the_readme_walk_the_traced_path():
  """design.md §1 names the path's files in `PATH`'s order (a return repeats one) and counts
  them, and the core's; the README's layout says the same count."""
  files, count = path_in_design()
  assert list(dict.fromkeys(files)) == list(PATH), files
  counted = f"{len(PATH)} files, {sum(f.startswith('core/') for f in PATH)} of them the core's"
  assert count.startswith(counted), count
  assert counted in " ".join((REPO / "README.md").read_text().split())
  assert all((PACKAGE / f).is_file() for f in files)
