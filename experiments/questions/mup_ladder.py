"""The ladder's scale question at one LR per arm (issue 101, question 1): under μP, does ReLU −
GELU, unclipped in GPT-2's block, change from 2 × 128 to 6 × 384 when each arm keeps the LR its
2 × 128 pilot chose?

The ladder (experiments/questions/ladder.py) found the unclipped gap moving toward GELU by at
least 0.1 from 2 × 128 to 6 × 384, with ReLU's own best LR moving from 3e-3 to 1e-3 between the
rungs, so the contrast could not say how much of the change is the size's. Here every cell trains
under μP (`model.parametrization="mup"`) with its base at 2 × 128 (`mup_base_width` 128, where
μP is SP, bitwise): each arm's LR is chosen by a pilot at 2 × 128 only and used unchanged at
6 × 384 (`by_cell.<cell>.lr_from`), which is μP's promise and removes the ladder's confound.

- Cells: ReLU and exact GELU at 2 × 128 (4 heads of 32, d_ff 512) and 6 × 384 (4 heads of 96,
  d_ff 1536), the ladder's `cpu_epoch` schedule and data (the TinyStories sample, 450 steps, 45
  warm-up, cosine to 10%, no clipping, held-out test windows). 6 × 384 keeps the base's 4 heads
  and widens each (the ladder's 6 × 384 had 6 heads of 64): μP's 1/K attention is the head
  dimension's rule, and the base's heads are this model's at width 128.
- Depth is outside μP's transfer here: actlab scales no residual branch with depth
  (docs/recipe.md), so going from 2 to 6 layers assumes a transfer μP does not promise. The page
  says so beside every answer.
- The pilot: the ladder's grid {1e-3, 3e-3, 1e-2} (one step past an edge: 3e-4, 3e-2) on seeds
  500–504, at 2 × 128 only; the 6 × 384 cells train their source's chosen LR on those seeds
  (stage transfer), which size n with the rest.
- Contrasts (K = 3): the gap at 2 × 128, the gap at 6 × 384, and the scale change (6 × 384's gap
  less 2 × 128's). Margins 0.1 and 0.05; n from the pilot's sd at its upper 80% bound, power 0.8
  at α/K, at least 20, every cell on the same seeds, fresh seeds from 2000 (no other question's).
- Optional and descriptive (never used to choose): a pilot of the 6 × 384 cells over the grid,
  to say whether the transferred LR sits within one grid step of 6 × 384's own best.

Where the runs train: results/mup_ladder/DEVICE.md, written before the first run.
"""

from actlab.config import sizes

RUNGS = {"2x128": {"model.num_layers": 2, "model.d_model": 128, "model.num_heads": 4},
         "6x384": {"model.num_layers": 6, "model.d_model": 384, "model.num_heads": 4}}


def get_question(arg=None):
  del arg
  cell = lambda act, rung: {**RUNGS[rung], "model.d_ff": 4 * RUNGS[rung]["model.d_model"],
                            "model.activation": act}
  gap = lambda rung: {f"relu_{rung}": 1, f"gelu_{rung}": -1}
  return {
      "question": "Under μP at one LR per arm, does ReLU − GELU (unclipped) change from 2 × 128 "
                  "to 6 × 384?",
      "config": "configs/tinystories_gelu.py",
      "fixed": {**sizes.SIZES["cpu_epoch"], "data.tinystories_version": "v1",
                "model.parametrization": "mup", "model.mup_base_width": 128},
      "cells": {f"{act}_{rung}": cell(act, rung) for rung in RUNGS for act in ("relu", "gelu")},
      "contrasts": {
          "gap_2x128": {"weights": gap("2x128"), "a": "ReLU", "b": "GELU"},
          "gap_6x384": {"weights": gap("6x384"), "a": "ReLU", "b": "GELU"},
          "scale_change": {
              "weights": {"relu_6x384": 1, "gelu_6x384": -1, "relu_2x128": -1, "gelu_2x128": 1},
              "question": "its change from 2 × 128 to 6 × 384, at 2 × 128's LRs",
              "negative": "2x128 → 6x384 moves ReLU − GELU toward ReLU",
              "positive": "2x128 → 6x384 moves ReLU − GELU toward GELU"}},
      "margins": [0.1, 0.05],
      "pilot": {"lrs": [1e-3, 3e-3, 1e-2], "seeds": [500, 501, 502, 503, 504],
                "edge": {1e-3: 3e-4, 1e-2: 3e-2}},
      "by_cell": {f"{act}_6x384": {"lr_from": f"{act}_2x128"} for act in ("relu", "gelu")},
      "fresh": {"first_seed": 2000, "cap": 40},
      "rule": {"alpha": 0.05, "power": 0.8, "min_seeds": 20, "sd_confidence": 0.8},
      "spike": 10.0,
  }
