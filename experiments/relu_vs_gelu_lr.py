"""The reference study (docs/reference.md §2): ReLU vs exact GELU across peak learning rates.

Full grid: relu, gelu × peak LR {1e-4, 1e-3, 3e-3} × seeds {0, 1, 2} on the base config (the
published setup: 6 layers, d_model 384, TinyStories, 5,000 steps).

`:smoke`: the same question on the tiny `sizes.SIZES["mini"]` setup (embedded corpus, 150 steps,
2 CPU cores, a few minutes). Its LRs {1e-4, 3e-3, 3e-2} span too low, near the best and too high
for that tiny model; the reference LRs would all sit at or below its optimum.
"""

from actlab import sizes


def get_sweep(arg=None):
  if arg == "smoke":
    return {"description": "ReLU vs GELU across learning rates (smoke: tiny model, 150 steps)",
            "axes": {"model.activation": ["relu", "gelu"], "optim.lr": [1e-4, 3e-3, 3e-2]},
            "seeds": [0, 1, 2], "fixed": sizes.SIZES["mini"]}
  if arg:
    raise ValueError(f"relu_vs_gelu_lr: unknown variant {arg!r}; use ':smoke' or nothing")
  return {"description": "ReLU vs GELU across learning rates (docs/reference.md §2)",
          "axes": {"model.activation": ["relu", "gelu"], "optim.lr": [1e-4, 1e-3, 3e-3]},
          "seeds": [0, 1, 2]}
