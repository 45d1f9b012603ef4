"""Vectorized runs (`train.run_group`: one `program.Program` for R runs) equal sequential runs,
cell by cell; an interrupted group resumes exactly; a diverging run leaves the others alone."""

import json
import shutil

import flax
import jax
import numpy as np
import pytest

from actlab import config as config_lib, sweep
from actlab.infra import workdir
from actlab.infra.checkpoint import Checkpoints
from actlab.run import program, train
from conftest import tiny
from tree_utils import tree_max_abs_diff

TOL = 1e-6
# The wall clock, and where and when a run ran: differ between any two runs.
RUN_SPECIFIC = {"tokens_per_sec", "wall_time_sec", "train_time_sec", "provenance", "timing"}


def cell_config(lr, seed, **overrides):
  """`sweep.vectorize` on (`train.run_group` ignores it): a sweep of these cells trains them as
  one program, the one `compiled` holds."""
  c = tiny(**{"train.steps": 8, "train.log_every": 2, "train.eval_every": 4,
              "train.checkpoint_every": 4, "optim.warmup_steps": 2,
              "metrics.sharpness_every": 4, "metrics.sharpness_iters": 3,
              "metrics.tensorboard": False, "sweep.vectorize": True, **overrides})
  c.optim.lr, c.train.seed = lr, seed
  return c


def rows(workdir):
  return [json.loads(l) for l in (workdir / "metrics.jsonl").read_text().splitlines()]


def assert_close_rows(a, b):
  assert [r["step"] for r in a] == [r["step"] for r in b]
  for ra, rb in zip(a, b):
    assert set(ra) == set(rb), (set(ra) ^ set(rb))
    for k in ra:
      if k in RUN_SPECIFIC:
        continue
      if isinstance(ra[k], float):
        assert abs(ra[k] - rb[k]) <= TOL * max(1.0, abs(ra[k])), (ra["step"], k, ra[k], rb[k])
      else:
        assert ra[k] == rb[k], (ra["step"], k)


def without_key_bias(params):
  """The attention key bias has an exactly zero gradient (softmax ignores a shift shared by all
  keys), so its gradient is rounding noise, which Adam scales up to LR-sized steps: vmapped and
  sequential runs may differ there by more than TOL. Everything else is compared."""
  flat = flax.traverse_util.flatten_dict(params)
  return {k: v for k, v in flat.items() if k[-2:] != ("key", "bias")}


def final_params(workdir, config):
  like = jax.eval_shape(program.create_step(config, 257).init, 0, config.optim.lr)
  ck = Checkpoints((workdir / "checkpoints").absolute(), 3, read_only=True)
  try:
    return ck.restore(ck.latest_step(), like)[0].params
  finally:
    ck.close()


def crashed_copy(workdir, dest):
  """`workdir` as a crash after its step-4 checkpoint leaves it: no checkpoint 8 and no
  summary.json (its log ran ahead to step 8; resuming rebuilds it from the checkpoint)."""
  shutil.copytree(workdir, dest)
  (dest / "summary.json").unlink()
  shutil.rmtree(dest / "checkpoints" / "8")
  return dest


def comparable(record: dict) -> dict:
  """A log row or summary without the fields that differ between any two runs."""
  return {k: v for k, v in record.items() if k not in RUN_SPECIFIC}


def file_contents(workdir) -> dict:
  """Every file under `workdir` but its lock, with its bytes."""
  return {p: p.read_bytes() for p in workdir.rglob("*") if p.is_file() and p.name != ".lock"}


GROUP = [cell_config(3e-3, 0), cell_config(1e-3, 1)]


@pytest.fixture(scope="module")
def compiled():
  """One compile cache for the module: every group below is 2 runs of one program."""
  return {}


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, compiled):
  """The group of two runs trained to the end (checkpoints at steps 4 and 8) in one go."""
  root = tmp_path_factory.mktemp("uninterrupted")
  dirs = [root / "a", root / "b"]
  summaries = train.run_group(GROUP, dirs, cache=compiled)
  assert all(s["vectorized_runs"] == 2 for s in summaries)
  return dirs, summaries


@pytest.mark.slow
def test_interrupted_group_resumes_exactly(uninterrupted, compiled, tmp_path):
  dirs, summaries = uninterrupted
  crashed = [crashed_copy(d, tmp_path / d.name) for d in dirs]
  logs = []
  resumed = train.run_group(GROUP, crashed, cache=compiled, log=logs.append)
  assert not logs  # no fall-back to one run after another
  for config, before, after, summary, again in zip(GROUP, dirs, crashed, summaries, resumed):
    assert again["vectorized_runs"] == 2
    assert [s["start_step"] for s in again["provenance"]] == [0, 4]  # resumed at step 4
    assert [comparable(r) for r in rows(after)] == [comparable(r) for r in rows(before)]
    assert comparable(again) == comparable(summary)
    jax.tree.map(np.testing.assert_array_equal, final_params(before, config),
                 final_params(after, config))


@pytest.mark.slow
def test_diverging_run_leaves_the_other_unaffected_and_both_resume(uninterrupted, compiled,
                                                                    tmp_path):
  """lr = 1e30 overflows to non-finite values within a few steps: that lane stops being logged
  and checkpointed at once (`loop.train_lanes`) while the other goes on. (lr = 30 would only end
  `diverged` by the verdict on its final loss, and never stop a lane.)"""
  (ok_alone, _), _ = uninterrupted
  configs = [GROUP[0], cell_config(1e30, 0)]
  dirs = [tmp_path / "ok", tmp_path / "bad"]
  first = train.run_group(configs, dirs, cache=compiled)
  assert first[1]["status"] == "diverged" and first[0]["status"] != "diverged"
  assert all(s["vectorized_runs"] == 2 for s in first)
  assert 0 < first[1]["diverged_at"] < 4
  assert rows(dirs[1])[-1]["step"] == first[1]["diverged_at"]  # logged up to the bad step
  assert not (dirs[1] / "checkpoints").exists()  # no checkpoint, not even the folder for one
  # The healthy run equals the same run grouped with a healthy partner.
  assert_close_rows(rows(ok_alone), rows(dirs[0]))
  assert tree_max_abs_diff(
      without_key_bias(final_params(ok_alone, configs[0])),
      without_key_bias(final_params(dirs[0], configs[0]))) <= TOL
  # A crash loses the healthy run's end; the diverged run is finished, so the group resumes
  # one run after another: the healthy one from step 4, the diverged one returns its summary.
  bad_files = file_contents(dirs[1])
  shutil.move(dirs[0], tmp_path / "ok_done")
  crashed_copy(tmp_path / "ok_done", dirs[0])
  logs = []
  again = train.run_group(configs, dirs, cache=compiled, log=logs.append)
  assert len(logs) == 1 and "one after another" in logs[0]
  assert again[1] == first[1]
  assert file_contents(dirs[1]) == bad_files
  assert [s["start_step"] for s in again[0]["provenance"]] == [0, 4]
  assert_close_rows(rows(ok_alone), rows(dirs[0]))


def test_group_refuses_other_differences():
  a, b = cell_config(1e-3, 0), cell_config(1e-3, 0, **{"model.d_ff": 128})
  with pytest.raises(program.GroupError, match="model.d_ff"):
    program.check_group([a, b])
  program.check_group([a, cell_config(3e-3, 5)])  # LR and seed may differ


def test_compile_key_ignores_exactly_the_initial_state_and_the_fields_no_program_reads():
  """Configs share a program (`program.get`'s cache, a vectorized group) where they differ only in
  the peak LR, the seed, `train.init_from` or a runtime field marked "harness" (config/schema.py);
  another value of any other field, a runtime one the programs are built for among them (the
  devices, what evaluation measures for the trackers), makes another program."""
  ignored = {"optim.lr", "train.seed", "train.init_from",
             *(k for k, how in config_lib.marked("runtime").items() if how == "harness")}
  assert {"train.progress", "sweep.vectorize", "data.dir"} <= ignored
  assert not ignored & {"parallel.mode", "metrics.tensorboard", "metrics.ffn_hist_bins"}
  key = program.compile_key(tiny(), 257)
  for name, value in workdir.dotted(tiny().to_dict()).items():
    other = (not value if isinstance(value, bool) else value + 1 if isinstance(value, (int, float))
             else f"{value}x")
    assert (program.compile_key(tiny(**{name: other}), 257) == key) == (name in ignored), name


@pytest.mark.slow
def test_sweep_vectorize_switch(compiled, tmp_path):
  spec = tmp_path / "grid.py"
  spec.write_text("def get_sweep(arg=None):\n"
                  "  return {'axes': {'optim.lr': [1e-3, 3e-3]}, 'seeds': [0]}\n")
  logs = []
  results = sweep.run(cell_config(1e-3, 0), str(spec), tmp_path / "sweep", log=logs.append,
                      cache=compiled)
  assert len(results) == 2
  assert all(r.get("vectorized_runs") == 2 for r in results.values()), logs
  assert any("vectorized ×2" in l for l in logs)
