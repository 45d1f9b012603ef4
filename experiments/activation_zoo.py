"""Every activation in the registry (`actlab.activations.NAMES`) at one peak LR, 1e-3.

Gated ones use the parameter-matched hidden width (model.gated_match_params). `:smoke` runs them
on the tiny `sizes.SIZES["mini"]` setup with one seed.
"""

from actlab import activations, sizes


def get_sweep(arg=None):
  axes = {"model.activation": list(activations.NAMES)}
  if arg == "smoke":
    return {"description": "Activation zoo at LR 3e-3 (smoke: tiny model, 150 steps, one seed)",
            "axes": axes, "seeds": [0], "fixed": {**sizes.SIZES["mini"], "optim.lr": 3e-3}}
  if arg:
    raise ValueError(f"activation_zoo: unknown variant {arg!r}; use ':smoke' or nothing")
  return {"description": "Activation zoo at LR 1e-3", "axes": axes, "seeds": [0, 1, 2],
          "fixed": {"optim.lr": 1e-3}}
