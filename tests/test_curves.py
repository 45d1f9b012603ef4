"""actlab/report/curves.py: a run's logged curve (a torn log refused), the loss excess over the
best LR integrated over training, the exit below a bar, the late descent, the correlation of exit
and end between seeds; the runs of a sweep directory by (activation, LR, seed)."""

import json

import numpy as np
import pytest

from actlab.report import curves


def write_run(root, act, lr, seed, val_loss: dict):
  """A finished run of `act` at `lr` and `seed` whose metrics.jsonl logs `val_loss` ({step:
  value})."""
  run = root / f"activation={act},lr={lr},seed={seed}"
  run.mkdir(parents=True)
  config = {"model": {"activation": act}, "optim": {"lr": lr}, "train": {"seed": seed}}
  (run / "config.json").write_text(json.dumps(config))
  (run / "summary.json").write_text(json.dumps({"final_val_loss": val_loss[max(val_loss)]}))
  (run / "metrics.jsonl").write_text("\n".join(json.dumps({"step": s, "val_loss": v})
                                               for s, v in val_loss.items()))
  return run


def test_a_curve_is_read_with_the_logs_reader_and_a_torn_log_is_refused(tmp_path):
  log = tmp_path / "metrics.jsonl"
  log.write_text('{"step": 0, "val_loss": 5.0}\n{"step": 10}\n\n{"step": 20, "val_loss": 4.0}\n')
  assert curves.curve(log, "val_loss") == {0: 5.0, 20: 4.0}
  log.write_text('{"step": 0, "val_loss": 5.0}\n{"step": 20, "val_lo\n')  # cut mid-write
  with pytest.raises(ValueError, match="1 unreadable line"):
    curves.curve(log, "val_loss")


def test_a_directorys_runs_are_its_finished_ones_in_order(tmp_path):
  later = write_run(tmp_path, "relu", 3e-3, 1, {0: 5.0})
  first = write_run(tmp_path, "relu", 3e-3, 0, {0: 5.0})
  (tmp_path / "unfinished").mkdir()
  (tmp_path / "unfinished" / "config.json").write_text("{}")
  assert list(curves.runs(tmp_path).items()) == [(("relu", 3e-3, 0), first),
                                                 (("relu", 3e-3, 1), later)]


def test_the_loss_excess_integrates_each_lrs_curve_above_the_best_lrs(tmp_path):
  """1e-3 is the best LR (lower final loss); 3e-3 is 1 nat above it at steps 0 and 100, 0 at 200:
  the trapezoid gives (1 + 0.5) * 100 / 200 = 0.75 nats."""
  for lr, losses in ((1e-3, (5.0, 3.0, 2.0)), (3e-3, (6.0, 4.0, 2.0 + 1e-6))):
    write_run(tmp_path, "gelu", lr, 0, dict(zip((0, 100, 200), losses)))
  excess = curves.loss_excess(tmp_path)
  assert excess[("gelu", 1e-3)] == [0.0]
  assert excess[("gelu", 3e-3)] == [pytest.approx(0.75, abs=1e-6)]


def test_the_plateau_exit_is_the_first_crossing_interpolated_between_evaluations():
  exit_ = lambda loss: curves.first_below(loss, 4.0)
  assert exit_({0: 6.0, 250: 5.8, 500: 4.5, 750: 3.5, 1000: 4.2, 1250: 3.0}) == 625
  assert exit_({0: 6.0, 250: 4.0, 500: 3.0}) == 250  # at the bar is not below
  assert exit_({0: 6.0, 250: 4.5}) is None


def test_the_late_descent_is_the_fall_over_the_last_steps():
  descent = lambda loss: curves.late_descent(loss, 500)
  assert descent({0: 6.0, 2500: 3.2, 2750: 3.1, 3000: 3.05}) == pytest.approx(0.15)
  assert descent({0: 6.0, 2500: 3.0, 3000: 3.1}) == pytest.approx(-0.1)  # rising
  assert descent({0: 6.0, 2600: 3.2, 3000: 3.0}) is None


def test_the_seed_correlation_removes_the_activations_means():
  """Within each activation a later exit ends higher; between them the opposite."""
  exits = {("relu", 0): (2000, 2.0, 0.1), ("relu", 1): (2200, 2.2, 0.1),
           ("relu", 2): (2100, 2.1, 0.1), ("gelu", 0): (1000, 3.0, 0.1),
           ("gelu", 1): (1200, 3.2, None), ("tanh", 0): (None, 9.0, 0.1),
           ("swiglu", 0): (500, 9.0, 0.1)}
  r, n = curves.seed_correlation(exits)
  assert r == pytest.approx(1.0) and n == 5
  pooled = [v[:2] for v in exits.values() if v[0] is not None]
  assert np.corrcoef(np.array(pooled).T)[0, 1] < 0
