"""The evaluators a config chooses (actlab/measure/evaluators.py), and what each adds to a row."""

import functools

import jax
import numpy as np
import pytest

from actlab import core
from actlab.measure import evaluators
from actlab.run import program
from conftest import tiny


@pytest.mark.slow
@pytest.mark.parametrize("act_stats,sharpness_every", [(True, 0), (False, 5)])
def test_the_config_chooses_the_evaluators(act_stats, sharpness_every):
  c = tiny(**{"metrics.act_stats": act_stats, "metrics.sharpness_every": sharpness_every,
              "metrics.sharpness_iters": 3})
  evals = evaluators.Evaluators.create(c.metrics, c.train.steps)
  names = [e.name for e in evals.validation]
  assert names == (["loss", "act_stats"] if act_stats else ["loss"]) + ["ffn_hist"]
  assert evals.sharpness == (evaluators.Sharpness(5, 3) if sharpness_every else None)

  task = program.create_step(c, 257)
  params = jax.jit(task.init)(0).params
  batch = np.random.default_rng(0).integers(0, 257, (4, c.data.seq_len + 1)).astype(np.int32)
  out = jax.device_get(jax.jit(functools.partial(evals.validation_step, task))(params, batch))
  assert sorted(out) == sorted(names)
  row = evals.pool([out, out])
  assert ("act_zero_frac" in row) == act_stats and "sharpness" not in row
  hist = row["ffn_preact/layer_0"]  # for the trackers: every z entry of both batches
  assert hist.num == 2 * batch.shape[0] * c.data.seq_len * c.model.d_ff
  loss = task.objective(params, batch, jax.random.PRNGKey(0), train=False)
  assert row["val_loss"] == pytest.approx(float(loss.loss_sum / loss.count), rel=1e-6)


def test_loss_pools_sums_not_means():
  """Batches of different sizes weigh by their counts: Σ loss / Σ count, not a mean of means."""
  row = evaluators.Loss().pool([core.Sums(3.0, 1, 0.0, correct=1),
                                core.Sums(3.0, 3, 0.0, correct=0)])
  assert row == {"val_loss": 1.5, "val_accuracy": 0.25}


def test_histograms_only_when_a_tracker_shows_them():
  names = lambda **o: [e.name for e in evaluators.Evaluators.create(tiny(**o).metrics, 50).validation]
  assert names() == ["loss", "act_stats", "ffn_hist"]  # TensorBoard is on by default
  assert names(**{"metrics.ffn_hist_bins": 0}) == ["loss", "act_stats"]
  assert names(**{"metrics.tensorboard": False}) == ["loss", "act_stats"]
  assert names(**{"metrics.tensorboard": False, "metrics.wandb_project": "p"})[-1] == "ffn_hist"
  assert evaluators.Evaluators.create(tiny(**{"metrics.ffn_hist_bins": 16}).metrics, 50).validation[-1] == (
      evaluators.PreactHistogram(16, 8.0))
