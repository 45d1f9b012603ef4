"""Does clipping at 1.0 change ReLU − GELU? A factorial question (docs/asking.md): ReLU and GELU
× {unclipped, clipped at global norm 1.0} at one LR, every cell on the same seeds; the gap in each
clipping and its change under clipping (a difference of differences). `:smoke` on the embedded
corpus (the sweeps' `mini` model; several minutes on 2 CPU cores), `:cpu_epoch` on the TinyStories
sample (--set=data.manual_dir=<the sample's directory>)."""

from actlab.config import sizes

SIZE = {"smoke": {**sizes.SIZES["mini"], "data.test_batches": 4},
        "cpu_epoch": {**sizes.SIZES["cpu_epoch"], "data.tinystories_version": "v1"}}
CLIP = {"none": 0.0, "clip": 1.0}


def get_question(arg="smoke"):
  cells = {f"{act}_{c}": {"model.activation": act, "optim.clip_norm": norm}
           for act in ("relu", "gelu") for c, norm in CLIP.items()}
  gap = lambda c, sign=1: {f"relu_{c}": sign, f"gelu_{c}": -sign}
  return {
      "question": "Does clipping at 1.0 change how much lower ReLU's loss is than GELU's?",
      "config": "configs/tinystories_gelu.py" + (":smoke" if arg == "smoke" else ""),
      "fixed": SIZE[arg],
      "cells": cells,
      "contrasts": {
          "gap_unclipped": {"weights": gap("none"), "a": "ReLU", "b": "GELU"},
          "gap_clipped": {"weights": gap("clip"), "a": "ReLU", "b": "GELU"},
          "clip_change": {"weights": {**gap("clip"), **gap("none", -1)},
                          "negative": "clipping moves ReLU − GELU toward ReLU",
                          "positive": "clipping moves ReLU − GELU toward GELU"}},
      "margins": [0.1, 0.05],
      "pilot": {"lr": 3e-3, "seeds": [0, 1, 2, 3]},
      "fresh": {"first_seed": 100, "cap": 8 if arg == "smoke" else 40},
      "rule": {"min_seeds": 4 if arg == "smoke" else 20, "sd_confidence": 0.8},
      "spike": 10.0,
  }
