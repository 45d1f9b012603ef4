"""The reference study (docs/reference.md §2): ReLU vs exact GELU across peak learning rates.

Full grid: relu, gelu × peak LR {1e-4, 1e-3, 3e-3} × seeds {0, 1, 2} on the base config (the
published setup: 6 layers, d_model 384, TinyStories, 5,000 steps).

`:cpu`: the question at the scale 2 CPU cores allow (RESULTS.md): the `sizes.SIZES["cpu"]` model
(0.94M parameters, BPE-4096) on TinyStories for 200 steps, relu, gelu × 6 peak LRs from too low
to past where both break (3e-4 … 1e-1, half-decades) × 5 seeds, GELU the report's baseline.

`:smoke`: the same question on the tiny `sizes.SIZES["mini"]` setup (embedded corpus, 150 steps,
2 CPU cores, a few minutes). Its LRs {1e-4, 3e-3, 3e-2} span too low, near the best and too high
for that tiny model; the reference LRs would all sit at or below its optimum.
"""

from actlab.config import sizes

CPU_LRS = [3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 1e-1]


def get_sweep(arg=None):
  if arg == "smoke":
    return {"description": "ReLU vs GELU across learning rates (smoke: tiny model, 150 steps)",
            "axes": {"model.activation": ["relu", "gelu"], "optim.lr": [1e-4, 3e-3, 3e-2]},
            "seeds": [0, 1, 2], "fixed": sizes.SIZES["mini"]}
  if arg == "cpu":
    return {"description": "ReLU vs GELU across learning rates (CPU study: 0.94M parameters, "
                           "TinyStories, 200 steps)",
            "axes": {"model.activation": ["relu", "gelu"], "optim.lr": CPU_LRS},
            "seeds": [0, 1, 2, 3, 4], "fixed": sizes.SIZES["cpu"], "baseline": "gelu"}
  if arg:
    raise ValueError(f"relu_vs_gelu_lr: unknown variant {arg!r}; use ':smoke', ':cpu' or nothing")
  return {"description": "ReLU vs GELU across learning rates (docs/reference.md §2)",
          "axes": {"model.activation": ["relu", "gelu"], "optim.lr": [1e-4, 1e-3, 3e-3]},
          "seeds": [0, 1, 2]}
