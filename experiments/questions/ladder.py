"""Does the answer survive 26× more parameters? ReLU − GELU in GPT-2's block, unclipped and
clipped at 1.0, at three sizes: 2 × 128 (RESULTS.md's `cpu` model, 0.41M parameters without the
embedding), 4 × 256 (3.2M) and 6 × 384 with 6 heads and FFN 4 × d (the reference stack, 10.7M).
Everything else as `cpu_epoch`: the sample's `bpe:4096` tokenizer, 450 steps of 16 × 128 tokens
(one epoch), 45 warm-up steps, cosine to 10%, AdamW, exact GELU. Declared before any of its runs.

- Each cell's LR from its own size's and clipping's pilot: LR {1e-3, 3e-3, 1e-2} × seeds 500–504,
  one step past an edge (3e-4, 3e-2) before choosing.
- 11 contrasts, K = 11: the gap at each size, unclipped and clipped (6); its change under clipping
  at each size (3); the gap's change from 2 × 128 to 6 × 384, unclipped and clipped (2: the scale
  question). Margins 0.1 and 0.05, the exact sign-flip test beside each interval, the spiking
  seeds' share as the secondary analysis (descriptive).
- n from the upper 80% bound of each contrast's pilot sd (power 0.8 against 0.1 at α/11), the
  same fresh seeds (from 1000) in all 12 cells, at least 20 (as family 3) and at most 40: 480
  fresh runs at most.

Where each stage trains: every pilot on one H100 (TF32 matmuls); every fresh seed on CPU
(float32). As declared (4a4523b), the two larger rungs were for a GPU and 2 × 128 for the CPU;
after the pilot every rung was for one GPU, so that the scale contrasts compare runs of one
device (fe6c422); 4 × 256 moved to CPU before its fresh seeds (eb295e5), and with no GPU
lent, on 2026-11-28 before the first of theirs, 2 × 128 and 6 × 384 did too
(`results/ladder/DEVICE.md`): the scale contrasts compare runs of one kind of device. A 4 × 256
run of one epoch is about 7 minutes of one core of a 2-core Xeon, a 6 × 384 one about 16. Each
rung resumes across sessions (`ladder_gpu.sh` trained the pilot):

    SET=data.manual_dir=manual,train.keep_checkpoints=1,train.progress=false
    SET+=,metrics.tensorboard=false,metrics.ffn_hist_bins=0  # as ladder_gpu.sh's
    python -m actlab.ask experiments/questions/ladder.py run --workdir=results/ladder \
        --cells='*_RUNG' --workers=2 --set=$SET  # RUNG: 2x128, 4x256, 6x384
"""

from actlab.config import sizes

RUNGS = {"2x128": {"model.num_layers": 2, "model.d_model": 128, "model.num_heads": 4},
         "4x256": {"model.num_layers": 4, "model.d_model": 256, "model.num_heads": 4},
         "6x384": {"model.num_layers": 6, "model.d_model": 384, "model.num_heads": 6}}
CLIP = {"none": 0.0, "clip": 1.0}


def gap(clip: str, rung: str, sign: int = 1) -> dict:
  return {f"relu_{clip}_{rung}": sign, f"gelu_{clip}_{rung}": -sign}


def change(to: tuple, from_: tuple, moves: str) -> dict:
  """The gap at `to` less the gap at `from_` (each (clip, rung)), its sides in words."""
  return {"weights": {**gap(*to), **gap(*from_, -1)},
          **{side: f"{moves} ReLU − GELU toward {arm}"
             for side, arm in (("negative", "ReLU"), ("positive", "GELU"))}}


def get_question(arg=None):
  del arg
  clipped = {"none": "unclipped", "clip": "clipped at 1.0"}
  return {
      "question": "Does ReLU − GELU, unclipped and clipped at 1.0, hold from 2 × 128 to 6 × 384?",
      "config": "configs/tinystories_gelu.py",
      # Declared before XLA's deterministic GPU ops were a field: its runs trained without them.
      "fixed": {**sizes.SIZES["cpu_epoch"], "data.tinystories_version": "v1",
                "train.deterministic_ops": False},
      "cells": {f"{act}_{clip}_{rung}": {**fields, "model.d_ff": 4 * fields["model.d_model"],
                                         "model.activation": act, "optim.clip_norm": norm}
                for rung, fields in RUNGS.items() for clip, norm in CLIP.items()
                for act in ("relu", "gelu")},
      "contrasts": {
          **{f"gap_{c}_{r}": {"weights": gap(c, r), "a": "ReLU", "b": "GELU"}
             for r in RUNGS for c in CLIP},
          **{f"clip_change_{r}": change(("clip", r), ("none", r),
                                        f"at {r}, clipping at 1.0 moves") for r in RUNGS},
          **{f"scale_change_{c}": change((c, "6x384"), (c, "2x128"),
                                         f"{clipped[c]}, 2x128 → 6x384 moves") for c in CLIP}},
      "margins": [0.1, 0.05],
      "pilot": {"lrs": [1e-3, 3e-3, 1e-2], "seeds": [500, 501, 502, 503, 504],
                "edge": {1e-3: 3e-4, 1e-2: 3e-2}},
      "fresh": {"first_seed": 1000, "cap": 40},
      "rule": {"alpha": 0.05, "power": 0.8, "min_seeds": 20, "sd_confidence": 0.8},
      "spike": 10.0,
  }
