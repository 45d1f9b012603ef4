"""Does ReLU or exact GELU give the lower test loss, each at the LR its own pilot chooses? A
two-arm question (docs/asking.md): `:smoke` on the embedded corpus (the sweeps' `mini` model,
150 steps; a few minutes on 2 CPU cores), `:cpu_epoch` on the TinyStories sample (RESULTS.md's
scale: add --set=data.manual_dir=<the sample's directory>)."""

from actlab.config import sizes

SIZE = {"smoke": {**sizes.SIZES["mini"], "data.test_batches": 4},
        "cpu_epoch": {**sizes.SIZES["cpu_epoch"], "data.tinystories_version": "v1"}}


def get_question(arg="smoke"):
  smoke = arg == "smoke"
  return {
      "question": "Does ReLU or exact GELU give the lower test loss at its own best LR?",
      "config": "configs/tinystories_gelu.py" + (":smoke" if smoke else ""),
      "fixed": SIZE[arg],
      "cells": {"relu": {"model.activation": "relu"}, "gelu": {"model.activation": "gelu"}},
      "contrasts": {"relu_gelu": {"relu": 1, "gelu": -1}},
      "margins": [0.1, 0.05],
      "pilot": {"lrs": [1e-3, 3e-3, 1e-2], "seeds": [0, 1, 2], "edge": {1e-3: 3e-4, 1e-2: 3e-2}},
      "fresh": {"first_seed": 100, "cap": 8 if smoke else 40},
      "rule": {"alpha": 0.05, "power": 0.8, "min_seeds": 4 if smoke else 10,
               "sd_confidence": 0.8},
  }
