"""The issue's timing target: the reference study's six runs (ReLU, GELU × peak LR 1e-4, 1e-3,
3e-3; one seed; 5,000 steps each on the base config), for wall-clock comparisons of sequential vs
vectorized sweeps (`--config.sweep.vectorize=true`, a GPU's default: one program per
activation, 3 runs each; `false`: one run after another).

    time python -m actlab.sweep --config=configs/tinystories_gelu.py \\
        --sweep=benchmarks/six_run_study.py --workdir=runs/six --config.sweep.vectorize=true \\
        --config.model.dtype=bfloat16        # on a GPU; drop for the FP32 study

`:smoke` is the same grid on the tiny `sizes.SIZES["mini"]` setup, for a CPU comparison.
"""

from actlab.config import sizes


def get_sweep(arg=None):
  grid = {"axes": {"model.activation": ["relu", "gelu"], "optim.lr": [1e-4, 1e-3, 3e-3]},
          "seeds": [0]}
  if arg == "smoke":
    return {**grid, "description": "six-run study, smoke size", "fixed": {
        **sizes.SIZES["mini"], "metrics.sharpness_every": 0, "metrics.tensorboard": False}}
  if arg:
    raise ValueError(f"six_run_study: unknown variant {arg!r}; use ':smoke' or nothing")
  return {**grid, "description": "six-run study (reference config, one seed)",
          "fixed": {"metrics.tensorboard": False}}
