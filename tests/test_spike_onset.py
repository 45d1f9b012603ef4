"""experiments/spike_onset.py: its per-group gradient norms add up to the train step's own gradient
norm, and measuring them leaves the trajectory as it was, to the bit."""

import importlib.util
import json
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from actlab import core
from actlab.run import loop
from conftest import REPO, tiny

spec = importlib.util.spec_from_file_location("spike_onset",
                                              REPO / "experiments" / "spike_onset.py")
spike_onset = importlib.util.module_from_spec(spec)
spec.loader.exec_module(spike_onset)

STEPS = 4  # below tiny's log_every: the loop's `train_step` (its `log_step` compiles as long)


@pytest.fixture(scope="module")
def traces():
  """The tiny GELU run's first steps with the measurement and without it."""
  c = tiny("gelu")
  cache = {}
  return (c, spike_onset.trace(c, STEPS, measure=True, cache=cache),
          spike_onset.trace(c, STEPS, measure=False, cache=cache))


@pytest.mark.slow
def test_group_norms_add_up_to_the_train_steps_gradient_norm(traces):
  c, measured, _ = traces
  assert len(measured.rows) == STEPS
  for row in measured.rows:
    rss = math.sqrt(sum(row[f"g.{g}"] ** 2 for g in measured.groups))
    assert rss == pytest.approx(row["grad_norm"], rel=1e-5)
    assert row["grad_rss"] == pytest.approx(row["grad_norm"], rel=1e-5)
    assert row["measure_loss"] == pytest.approx(row["train_loss"], rel=1e-6)
    for layer in range(c.model.num_layers):
      assert 0.0 < row[f"z_neg.l{layer}"] < 1.0 and row[f"z_sd.l{layer}"] > 0.0
      assert row[f"z_absmax.l{layer}"] >= abs(row[f"z_mean.l{layer}"])
  per_block = ["attn.query", "attn.key", "attn.value", "attn.out", "ffn.up", "ffn.down",
               "ln_attn.scale", "ln_attn.bias", "ln_ffn.scale", "ln_ffn.bias"]
  assert sorted(measured.groups) == sorted(
      [f"block_{i}.{g}" for i in range(c.model.num_layers) for g in per_block]
      + ["wte", "wpe", "ln_f.scale", "ln_f.bias"])


@pytest.mark.slow
def test_measuring_leaves_the_trajectory_bitwise_as_it_was(traces):
  _, measured, plain = traces
  assert [r["grad_norm"] for r in measured.rows] == [r["grad_norm"] for r in plain.rows]
  assert [r["train_loss"] for r in measured.rows] == [r["train_loss"] for r in plain.rows]
  a, b = (jax.device_get(t.final_state) for t in (measured, plain))
  assert int(a.step) == STEPS
  for x, y in zip(jax.tree.leaves((a.params, a.opt_state)), jax.tree.leaves((b.params,
                                                                            b.opt_state))):
    np.testing.assert_array_equal(x, y)


@pytest.mark.slow
def test_the_check_against_a_committed_run_reads_its_rows(traces, tmp_path):
  """A run directory whose metrics.jsonl holds this trajectory's own values checks as equal."""
  c, measured, _ = traces
  norms = [r["grad_norm"] for r in measured.rows]
  (tmp_path / "config.json").write_text(json.dumps(c.to_dict()))
  rows = [{"step": 0, "val_loss": 1.0},
          {"step": 2, "grad_norm": norms[1], "grad_norm_max": max(norms[:2]),
           "grad_norm_init": norms[0]},
          {"step": 4, "grad_norm": norms[3], "grad_norm_max": max(norms[2:4])},
          {"step": 6, "grad_norm": 1.0, "grad_norm_max": 1.0}]  # past the steps traced
  (tmp_path / "metrics.jsonl").write_text("\n".join(map(json.dumps, rows)))
  check = spike_onset.committed_check(measured.rows, tmp_path, c)
  assert check == {"config_diffs": [], "grad_norm": 0.0, "grad_norm_max": 0.0,
                   "grad_norm_init": 0.0, "rows_compared": 2}


def test_groups_and_the_onset():
  assert spike_onset.group_of(("block_0", "attn", "query", "kernel")) == "block_0.attn.query"
  assert spike_onset.group_of(("block_1", "ffn", "gate", "bias")) == "block_1.ffn.gate"
  assert spike_onset.group_of(("block_1", "ln_ffn", "scale")) == "block_1.ln_ffn.scale"
  assert spike_onset.group_of(("ln_f", "bias")) == "ln_f.bias"
  assert spike_onset.group_of(("wte", "embedding")) == "wte"
  assert spike_onset.group_of(("lm_head",)) == "lm_head"
  # Scanned layers split along their leading layer axis.
  grads = {"blocks": {"ffn": {"up": {"kernel": jnp.stack([jnp.ones((2, 3)), 2 * jnp.ones((2, 3))]),
                                     "bias": jnp.zeros((2, 3))}}},
           "ln_f": {"scale": jnp.full((4,), 0.5)}}
  got = {k: float(v) for k, v in spike_onset.group_squares(grads).items()}
  assert got == {"block_0.ffn.up": 6.0, "block_1.ffn.up": 24.0, "ln_f.scale": 1.0}
  # The onset: the first step past 3× step 0's norm; growth against each group's own step 0.
  rows = [{"step": k, "grad_norm": n, "g.a": a, "g.b": b}
          for k, (n, a, b) in enumerate([(1.0, 1.0, 1.0), (2.0, 1.5, 1.0), (4.0, 1.0, 8.0),
                                         (10.0, 9.0, 2.0), (1.0, 1.0, 1.0)])]
  o = spike_onset.onset(rows, ["a", "b"])
  assert (o["onset_step"], o["peak_step"], o["peak_rel"]) == (2, 3, 10.0)
  assert list(o["growth_at_onset"]) == ["b", "a"] and list(o["growth_at_peak"]) == ["a", "b"]
  assert o["group_first_past_rel"] == {"a": 3, "b": 2}
