"""The LLaMA-style block (RMSNorm, RoPE, no biases, an untied head; a plain FFN) goes where GPT-2's
goes: a vectorized sweep over ReLU and GELU and its report, each lane equal to its run alone, and
a run resumed from its checkpoint equal to the run uninterrupted, bit for bit. One sweep and one
run alone for all of them: three programs compiled (a group of two for each activation, one run
alone). The block's own numerics: test_modern_block.py; its shardings: test_parallel.py."""

import json
import types

import jax
import numpy as np
import pytest

from actlab import config as config_lib
from actlab import report, sweep
from actlab.report import plots
from actlab.run import train
from actlab.sweep import grid
from test_vectorized import (assert_close_rows, cell_config, comparable, crashed_copy,
                             final_params, rows, TOL)
from tree_utils import tree_max_abs_diff

MODERN = {**config_lib.BLOCKS["llama"], "model.ffn": "plain"}
# The fields the report names: the block's, where it is not GPT-2's.
NAMED = ("model.norm_type='rms'", "model.position='rope'", "model.bias=False",
         "model.tie_head=False", "model.ffn='plain'")


@pytest.fixture(scope="module")
def swept(tmp_path_factory):
  """relu, gelu × seeds 0, 1 at one LR: 8 steps of the tiny modern block (checkpoints at 4 and
  8, statistics at 0, 4 and 8, no sharpness), each activation's seeds as one vectorized program;
  then the relu cell of seed 0 alone, in a program of its own."""
  tmp = tmp_path_factory.mktemp("modern")
  spec = tmp / "grid.py"
  spec.write_text("def get_sweep(arg=None):\n"
                  "  return {'description': 'ReLU vs GELU, LLaMA-style block',\n"
                  "          'axes': {'model.activation': ['relu', 'gelu']}, 'seeds': [0, 1]}\n")
  base = cell_config(3e-3, 0, **MODERN, **{"metrics.sharpness_every": 0})
  cache, said = {}, []
  results = sweep.run(base, str(spec), tmp / "sweep", log=said.append, cache=cache)
  cell = next(c for c in grid.cells(base, grid.load(str(spec)))
              if c.name == "activation=relu,seed=0")
  train.run(cell.config, tmp / "alone", cache=cache)
  return types.SimpleNamespace(root=tmp / "sweep", results=results, said=said, cell=cell,
                               alone=tmp / "alone", cache=cache)


@pytest.mark.slow
def test_a_sweep_of_the_modern_block_is_vectorized_and_reported(swept, monkeypatch):
  assert sum("vectorized ×2" in s for s in swept.said) == 2, swept.said
  assert sorted(swept.results) == [f"activation={a},seed={s}" for a in ("gelu", "relu")
                                   for s in (0, 1)]
  assert all(r["status"] != "diverged" and r["vectorized_runs"] == 2
             for r in swept.results.values())
  evals = [r for r in rows(swept.root / "activation=gelu,seed=1") if "val_loss" in r]
  assert [r["step"] for r in evals] == [0, 4, 8]  # with the attention statistics after RoPE
  assert all(r["attn_logit_max"] == r["attn_logit_max/layer_0"] and r["attn_entropy_min"] > 0
             for r in evals)
  monkeypatch.setattr(plots, "write", lambda manifest, runs, directory: [])  # not the claim here
  text = report.write(swept.root).read_text()
  assert "4 of 4 runs finished" in text
  assert "| gelu | relu | 2 |" in text.split("## Paired comparisons")[1]
  block = next(line for line in text.splitlines() if line.startswith("Block: "))
  assert all(field in block for field in NAMED), block


@pytest.mark.slow
def test_a_lane_of_the_vectorized_group_equals_its_run_alone(swept):
  lane = swept.root / swept.cell.name
  assert_close_rows(rows(swept.alone), rows(lane))
  assert tree_max_abs_diff(final_params(swept.alone, swept.cell.config),
                           final_params(lane, swept.cell.config)) <= TOL


@pytest.mark.slow
def test_the_modern_block_resumes_exactly(swept, tmp_path):
  """The run alone as a crash after its step-4 checkpoint leaves it, resumed: the log, summary
  and parameters are the uninterrupted run's, bit for bit."""
  resumed = crashed_copy(swept.alone, tmp_path / "resumed")
  again = train.run(swept.cell.config, resumed, cache=swept.cache)
  assert [s["start_step"] for s in again["provenance"]] == [0, 4]
  assert [comparable(r) for r in rows(resumed)] == [comparable(r) for r in rows(swept.alone)]
  assert comparable(again) == comparable(json.loads((swept.alone / "summary.json").read_text()))
  jax.tree.map(np.testing.assert_array_equal, final_params(swept.alone, swept.cell.config),
               final_params(resumed, swept.cell.config))
