"""The persistent compilation cache (infra/compile_cache.py): a second cell of a sweep (another
seed and LR, the same shapes) compiles no program of its own, read from JAX's monitoring events
(summary.json's `timing.compile`), and compiles them all with the cache off; a damaged entry is
one line and a recompile, with the same numbers. Each run is its own process, as a sweep's cells
across workers and sessions are, with its own cache folder: no test leans on a warm cache."""

import json
import pathlib
import subprocess
import sys

import pytest

from actlab.infra import compile_cache
from conftest import REPO

CONFIG_FILE = str(REPO / "tests" / "tiny_config.py")


def train(workdir, cache, *flags) -> tuple[dict, str]:
  """A 12-step tiny run in its own process; its summary and what it printed."""
  out = subprocess.run(
      [sys.executable, "-m", "actlab.main", f"--config={CONFIG_FILE}", f"--workdir={workdir}",
       "--config.train.steps=12", "--config.train.log_every=4", "--config.train.eval_every=6",
       "--config.metrics.sharpness_every=6", "--config.metrics.sharpness_iters=2",
       f"--config.train.compile_cache={cache}", *flags],
      cwd=REPO, capture_output=True, text=True, timeout=300)
  assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
  return json.loads((pathlib.Path(workdir) / "summary.json").read_text()), out.stdout


PROGRAMS = {"jit(init)", "jit(train_step)", "jit(log_step)", "jit(eval_step)",
            "jit(sharpness_step)", "jit(unstack)"}


@pytest.mark.slow
@pytest.mark.parametrize("cache", ["folder", "off"])
def test_a_second_cell_compiles_no_program_of_its_own(tmp_path, cache):
  folder = str(tmp_path / "xla") if cache == "folder" else "off"
  first, _ = train(tmp_path / "a", folder)
  second, printed = train(tmp_path / "b", folder, "--config.train.seed=7",
                          "--config.optim.lr=3e-3")
  assert PROGRAMS <= set(first["timing"]["compile"]["compiled"])
  compiled = second["timing"]["compile"]
  if cache == "off":  # The claim below rests on the cache: without it every program compiles.
    assert PROGRAMS <= set(compiled["compiled"]) and not compiled["cached"]
    return
  assert compiled["programs_compiled"] == 0, compiled
  assert PROGRAMS <= set(compiled["cached"])
  assert "0 programs compiled" in printed
  assert second["final_val_loss"] != first["final_val_loss"]  # another run, not a copy


@pytest.mark.slow
def test_a_damaged_entry_is_one_line_and_a_recompile_with_the_same_numbers(tmp_path):
  folder = tmp_path / "xla"
  first, _ = train(tmp_path / "a", folder)
  entries = sorted((folder / compile_cache.host_kind()).glob("*-cache"))
  assert len(entries) >= len(PROGRAMS)
  train_steps = [p for p in entries if p.name.startswith("jit_train_step-")]
  train_steps[0].write_bytes(train_steps[0].read_bytes()[:100])  # a writer killed mid-file
  garbage = next(p for p in entries if p.name.startswith("jit_eval_step-"))
  garbage.write_bytes(b"\x00not an executable" * 50)
  again, printed = train(tmp_path / "again", folder)
  damaged = [l for l in printed.splitlines() if "damaged compilation-cache entry" in l]
  assert len(damaged) == 2, printed
  assert set(again["timing"]["compile"]["compiled"]) == {"jit(train_step)", "jit(eval_step)"}
  assert again["final_val_loss"] == first["final_val_loss"]
  third, printed = train(tmp_path / "third", folder)  # Replaced: all from the cache again.
  assert third["timing"]["compile"]["programs_compiled"] == 0 and "compilation-cache entry" not in printed


def test_the_setting_names_a_folder_per_kind_of_host(monkeypatch, tmp_path):
  monkeypatch.setenv("JAX_COMPILATION_CACHE_DIR", str(tmp_path))
  assert compile_cache.directory("auto") == tmp_path
  monkeypatch.delenv("JAX_COMPILATION_CACHE_DIR")
  assert compile_cache.directory("auto") == pathlib.Path(compile_cache.DEFAULT).expanduser()
  assert compile_cache.directory("off") is None
  assert compile_cache.directory("~/x") == pathlib.Path.home() / "x"
  assert compile_cache.host_kind() == compile_cache.host_kind()
  assert f"-{len(__import__('os').sched_getaffinity(0))}cpu-" in compile_cache.host_kind()
