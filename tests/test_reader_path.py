"""The reader's path (docs/design.md §1): the files a reader opens from `python -m actlab.main`
to the parameter update, in order, counted by following calls. The test reads the path from the
design notes, checks their count and holds it to its size today (a file joining it fails), and
checks the core's part against the files JAX actually runs while it traces the default decoder's
train step."""

import pathlib
import re
import sys

import jax
import numpy as np

from actlab import config as config_lib
from actlab import tasks
from actlab.run import program

REPO = pathlib.Path(__file__).resolve().parent.parent
PACKAGE = REPO / "actlab"
MAX_FILES, MAX_JUMPS, MAX_CORE_FILES = 9, 10, 3  # today's path: a file joining it fails


def path_in_design() -> tuple[list[str], str, str]:
  """The files of design.md §1's path, in order (a return repeats its file), the paragraph that
  walks it and the one that counts it."""
  text = (REPO / "docs" / "design.md").read_text()
  walk, count = text.split("Reading it in code", 1)[1].split("\n\n", 3)[1:3]
  return re.findall(r"`([\w/]+\.py)`", walk), walk, count


def test_the_design_notes_count_their_path_as_it_is_written():
  files, walk, count = path_in_design()
  n_files, n_jumps, n_returns = map(int, re.search(
      r"(\d+) files and (\d+) jumps, (\d+) of them returns", count).groups())
  assert files[0] == "main.py"
  assert n_files == len(set(files))
  assert n_jumps == walk.count("→") == len(files) - 1
  assert n_returns == walk.count("↩") == len(files) - len(set(files))
  assert all((PACKAGE / f).is_file() for f in files)


def test_no_file_joins_the_path():
  files = path_in_design()[0]
  core = {f for f in files if f.startswith("core/")}
  assert len(set(files)) <= MAX_FILES and len(files) - 1 <= MAX_JUMPS
  assert len(core) <= MAX_CORE_FILES


def test_the_cores_part_of_the_path_is_what_the_default_step_runs():
  """Every file of the core that JAX runs while tracing the default decoder's train step with its
  plain loss (the smoke size of configs/tinystories_gelu.py, `model.loss_impl=plain`: the path
  reads the plain loss; kernels.py's fused one is an equal variant off it) is on the path, and
  every core file on the path runs. (The core imports nothing of the harness: test_layers.py.
  Harness hooks JAX calls while tracing, e.g. infra/compile_cache.py's compile tally, are not
  the step.)"""
  config = config_lib.decoder("gelu", "smoke")
  config.model.loss_impl = "plain"
  dataset = tasks.get(config).dataset(config)
  step = program.create_step(config, dataset.tokenizer.vocab_size)
  state = jax.eval_shape(step.init, 0, 1.0)
  batch = jax.ShapeDtypeStruct((config.train.batch_size, config.data.seq_len + 1), np.int32)
  ran = set()

  def record(frame, event, arg):
    if event == "call" and frame.f_code.co_filename.startswith(str(PACKAGE / "core")):
      ran.add(pathlib.Path(frame.f_code.co_filename).relative_to(PACKAGE).as_posix())

  sys.setprofile(record)
  try:
    jax.make_jaxpr(step.train_step)(state, batch)
  finally:
    sys.setprofile(None)
  files = path_in_design()[0]
  assert ran == {f for f in files if f.startswith("core/")}, ran
