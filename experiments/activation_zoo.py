"""Every activation in the registry (`actlab.core.activations.NAMES`) at one peak LR, 1e-3.

Gated ones use the parameter-matched hidden width (model.gated_match_params). `:smoke` runs them
on the tiny `sizes.SIZES["mini"]` setup with one seed. `:cpu` is the CPU study (RESULTS.md):
relu, tanh, elu, gelu, gelu_tanh, silu, relu2, swiglu, geglu, reglu on the `sizes.SIZES["cpu"]`
model at LRs {1e-3, 3e-3, 1e-2} around the best, 3 seeds, GELU the baseline: does the
gated-beats-plain ordering of Shazeer (2020, Table 1) show at this scale? Its report also compares
each gated FFN with its plain activation (`pairs`: gated − plain).

`:cpu_epoch`: the same ten at the one-epoch schedule of `relu_vs_gelu_lr.py:cpu_epoch` (450
steps, no clipping, held-out test windows) at its best LR for both relu and gelu, 3e-3, 3 seeds;
stated before running: the equivalence margin, 0.02 nats.
"""

from actlab.config import sizes
from actlab.core import activations

CPU_ACTIVATIONS = ["relu", "tanh", "elu", "gelu", "gelu_tanh", "silu", "relu2", "swiglu", "geglu",
                   "reglu"]
CPU_PAIRS = [["swiglu", "silu"], ["geglu", "gelu"], ["reglu", "relu"]]  # gated − plain


def get_sweep(arg=None):
  axes = {"model.activation": list(activations.NAMES)}
  if arg == "smoke":
    return {"description": "Activation zoo at LR 3e-3 (smoke: tiny model, 150 steps, one seed)",
            "axes": axes, "seeds": [0], "fixed": {**sizes.SIZES["mini"], "optim.lr": 3e-3}}
  if arg == "cpu":
    return {"description": "Activation zoo at matched parameters (CPU study: 0.94M parameters, "
                           "TinyStories, 200 steps)",
            "axes": {"model.activation": CPU_ACTIVATIONS, "optim.lr": [1e-3, 3e-3, 1e-2]},
            "seeds": [0, 1, 2], "fixed": sizes.SIZES["cpu"], "baseline": "gelu",
            "pairs": CPU_PAIRS}
  if arg == "cpu_epoch":
    return {"description": "Activation zoo at LR 3e-3, one epoch, no clipping (CPU study: "
                           "0.94M parameters, TinyStories sample)",
            "axes": {"model.activation": CPU_ACTIVATIONS, "optim.lr": [3e-3]},
            "seeds": [0, 1, 2], "fixed": sizes.SIZES["cpu_epoch"], "baseline": "gelu",
            "pairs": CPU_PAIRS, "equivalence_margin": 0.02}
  if arg:
    raise ValueError(f"activation_zoo: unknown variant {arg!r}; use ':smoke', ':cpu', "
                     "':cpu_epoch' or nothing")
  return {"description": "Activation zoo at LR 1e-3", "axes": axes, "seeds": [0, 1, 2],
          "fixed": {"optim.lr": 1e-3}}
