"""The optimizer (issue 101, question 2): does moving from AdamW to Muon change ReLU − GELU and
ReLU² − GELU, in GPT-2's block at the ladder's smallest rung?

Every answer on RESULTS.md is AdamW's. Muon (Jordan 2024; `optim.name="muon"`: Muon on the
blocks' matrices, AdamW on embeddings, the tied head, biases and norms; docs/recipe.md) is what
modded-nanogpt's records train with, beside ReLU² (Primer's squared ReLU). Six cells, each with
its own LR pilot:

- ReLU, exact GELU and ReLU² × AdamW and Muon, at 2 × 128 (4 heads, d_ff 512), unclipped, on the
  ladder's `cpu_epoch` schedule and data (the TinyStories sample, 450 steps, 45 warm-up, cosine to
  10%, held-out test windows), the standard parametrization.
- Muon as configured: `muon_scale="rms"` (the orthogonalized update × 0.2·√max(fan_in, fan_out),
  Moonlight's, which gives it AdamW's update RMS) with `muon_adam_lr_ratio=1`, so that `optim.lr`
  is one LR for both parts and Muon's grid is AdamW's: the pilot chooses the matrices' LR, the
  AdamW part at the same. Momentum 0.95, Nesterov, weight decay 0.1 on today's leaves.
- The pilot: {1e-3, 3e-3, 1e-2} (one step past an edge: 3e-4, 3e-2) on seeds 600–604, each cell
  its own LR (the lowest mean validation loss).
- Contrasts (K = 6): ReLU − GELU and ReLU² − GELU under each optimizer, and each gap's change
  from AdamW to Muon ("moving to Muon moves ReLU − GELU toward …"). Margins 0.1 and 0.05; n from
  the pilot's sd at its upper 80% bound, power 0.8 at α/K, at least 20, every cell on the same
  seeds, fresh seeds from 3000 (no other question's).

Each contrast's LRs are its cells' own choices (the report's LR column names them): a change
from AdamW to Muon compares each optimizer at its own best LR, not at one LR.

Where the runs train: results/optimizer/DEVICE.md, written before the first run.
"""

from actlab.config import sizes

ACTIVATIONS = {"relu": "ReLU", "gelu": "GELU", "relu2": "ReLU²"}
OPTIMIZERS = ("adamw", "muon")


def get_question(arg=None):
  del arg
  gap = lambda act, opt: {f"{act}_{opt}": 1, f"gelu_{opt}": -1}
  change = lambda act: {f"{act}_muon": 1, "gelu_muon": -1, f"{act}_adamw": -1, "gelu_adamw": 1}
  return {
      "question": "Does moving from AdamW to Muon change ReLU − GELU and ReLU² − GELU?",
      "config": "configs/tinystories_gelu.py",
      "fixed": {**sizes.SIZES["cpu_epoch"], "data.tinystories_version": "v1",
                "optim.muon_scale": "rms", "optim.muon_adam_lr_ratio": 1.0},
      "cells": {f"{act}_{opt}": {"model.activation": act, "optim.name": opt}
                for opt in OPTIMIZERS for act in ACTIVATIONS},
      "contrasts": {
          **{f"{act}_gelu_{opt}": {"weights": gap(act, opt), "a": ACTIVATIONS[act], "b": "GELU"}
             for opt in OPTIMIZERS for act in ("relu", "relu2")},
          **{f"{act}_gelu_change": {
              "weights": change(act),
              "question": f"{ACTIVATIONS[act]} − GELU's change from AdamW to Muon",
              "negative": f"moving to Muon moves {ACTIVATIONS[act]} − GELU toward "
                          f"{ACTIVATIONS[act]}",
              "positive": f"moving to Muon moves {ACTIVATIONS[act]} − GELU toward GELU"}
             for act in ("relu", "relu2")}},
      "margins": [0.1, 0.05],
      "pilot": {"lrs": [1e-3, 3e-3, 1e-2], "seeds": [600, 601, 602, 603, 604],
                "edge": {1e-3: 3e-4, 1e-2: 3e-2}},
      "fresh": {"first_seed": 3000, "cap": 40},
      "rule": {"alpha": 0.05, "power": 0.8, "min_seeds": 20, "sd_confidence": 0.8},
      "spike": 10.0,
  }
