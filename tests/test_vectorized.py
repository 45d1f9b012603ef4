"""Vectorized sweeps (actlab/vectorized.py) equal sequential runs, cell by cell."""

import json

import flax
import jax
import numpy as np
import pytest

from actlab import parallel, sweep, train, vectorized
from actlab.checkpoint import Checkpoints
from conftest import tiny

TOL = 1e-6
# The wall clock, and where and when a run ran: differ between any two runs.
RUN_SPECIFIC = {"tokens_per_sec", "wall_time_sec", "train_time_sec", "provenance"}


def cell_config(lr, seed, **overrides):
  c = tiny(**{"train.steps": 8, "train.log_every": 2, "train.eval_every": 4,
              "train.checkpoint_every": 4, "optim.warmup_steps": 2,
              "metrics.sharpness_every": 4, "metrics.sharpness_iters": 3,
              "metrics.tensorboard": False, **overrides})
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
  like = train.Compiled.create(config, 257).init(0, config.optim.lr)
  ck = Checkpoints((workdir / "checkpoints").absolute(), 3)
  try:
    return ck.restore(ck.latest_step(), like)[0].params
  finally:
    ck.close()


@pytest.mark.slow
def test_vectorized_runs_equal_sequential_runs(tmp_path):
  # Two learning rates and two seeds: per-run LR and per-run data/initialisation both matter.
  configs = [cell_config(3e-3, 0), cell_config(1e-3, 0), cell_config(3e-3, 1)]
  cache = {}
  seq = [train.run(c, tmp_path / f"seq{i}", cache=cache) for i, c in enumerate(configs)]
  vec = vectorized.train_group(configs, [tmp_path / f"vec{i}" for i in range(3)], cache=cache)
  for i, (s, v) in enumerate(zip(seq, vec)):
    assert_close_rows(rows(tmp_path / f"seq{i}"), rows(tmp_path / f"vec{i}"))
    assert set(v) - set(s) == {"vectorized_runs"} and v["vectorized_runs"] == 3
    for k in s:
      if k in RUN_SPECIFIC:
        continue
      if isinstance(s[k], float):
        assert abs(s[k] - v[k]) <= TOL * max(1.0, abs(s[k])), (k, s[k], v[k])
      else:
        assert s[k] == v[k], k
    p_seq = final_params(tmp_path / f"seq{i}", configs[i])
    p_vec = final_params(tmp_path / f"vec{i}", configs[i])
    assert parallel.tree_max_abs_diff(without_key_bias(p_seq), without_key_bias(p_vec)) <= TOL
  # The runs really differ from each other (the comparison above is not vacuous).
  assert abs(seq[0]["final_val_loss"] - seq[1]["final_val_loss"]) > 1e-3
  assert abs(seq[0]["final_val_loss"] - seq[2]["final_val_loss"]) > 1e-3


@pytest.mark.slow
def test_vectorized_resume_and_divergence(tmp_path):
  # lr=30 diverges; the other run must carry on, unaffected, and both resume sequentially.
  configs = [cell_config(3e-3, 0), cell_config(30.0, 0)]
  dirs = [tmp_path / "ok", tmp_path / "bad"]
  vec = vectorized.train_group(configs, dirs)
  assert vec[1]["status"] == "diverged" and vec[0]["status"] != "diverged"
  ref = train.run(configs[0], tmp_path / "ok_seq")
  assert_close_rows(rows(tmp_path / "ok_seq"), rows(dirs[0]))
  # Continue both to 12 steps: configs with more steps are a different run (workdir check), so
  # resume means the same config again: the finished run returns its summary unchanged.
  again = vectorized.train_group(configs, dirs)
  assert again[1]["status"] == "diverged"


def test_group_refuses_other_differences():
  a, b = cell_config(1e-3, 0), cell_config(1e-3, 0, **{"model.d_ff": 128})
  with pytest.raises(vectorized.VectorizeError, match="model.d_ff"):
    vectorized.check_group([a, b])
  vectorized.check_group([a, cell_config(3e-3, 5)])  # LR and seed may differ


@pytest.mark.slow
def test_sweep_vectorize_switch(tmp_path):
  base = cell_config(1e-3, 0, **{"train.steps": 6, "metrics.sharpness_every": 0})
  base.sweep.vectorize = True
  spec = tmp_path / "grid.py"
  spec.write_text("def get_sweep(arg=None):\n"
                  "  return {'axes': {'optim.lr': [1e-3, 3e-3]}, 'seeds': [0, 1]}\n")
  logs = []
  results = sweep.run(base, str(spec), tmp_path / "sweep", log=logs.append)
  assert len(results) == 4
  assert all(r.get("vectorized_runs") == 4 for r in results.values()), logs
  assert any("vectorized ×4" in l for l in logs)
