"""The reference study (docs/reference.md §2): ReLU vs exact GELU across peak learning rates.

Full grid: relu, gelu × peak LR {1e-4, 1e-3, 3e-3} × seeds {0, 1, 2} on the base config (the
published setup: 6 layers, d_model 384, TinyStories, 5,000 steps).

`:cpu`: the question at the scale 2 CPU cores allow (RESULTS.md): the `sizes.SIZES["cpu"]` model
(0.94M parameters, BPE-4096) on TinyStories for 200 steps, relu, gelu × 6 peak LRs from too low
to past where both break (3e-4 … 1e-1, half-decades) × 5 seeds, GELU the report's baseline.

`:cpu_epoch`: the longest horizon the sample allows at this cost, and the stability question as
Wortsman et al. (2023) ask it: the same model for one epoch of the sample (450 steps, warm-up 45,
cosine to 10%), without gradient clipping (Adam largely undoes global-norm clipping), at peak LRs
{1e-3 … 3e-1} from below the best to where runs break, 3 seeds, with held-out test windows (the validation
split's second half: the best-LR comparison chooses on validation and tests on them). Stated
before running: the equivalence margin is 0.02 nats of final loss (about one seed sd of the
200-step study), below which a difference between the activations would not change a choice.

`:cpu_epoch_qknorm`: the same with qk-layernorm (`model.qk_norm`), which Wortsman et al. (2023)
find removes attention-logit growth; `actlab.report` merges it with `:cpu_epoch` (qk_norm then
an axis).

`:cpu_epoch_d32`, `:cpu_epoch_d64`: the width axis, `:cpu_epoch` at d_model 32 and 64 (d_ff
4·d_model, heads of 32 dimensions as at 128); `actlab.report` merges the three along the width
fields. Does the gap between the activations, or their LR sensitivity, change with width?

`:smoke`: the same question on the tiny `sizes.SIZES["mini"]` setup (embedded corpus, 150 steps,
2 CPU cores, a few minutes). Its LRs {1e-4, 3e-3, 3e-2} span too low, near the best and too high
for that tiny model; the reference LRs would all sit at or below its optimum.

`:smoke_llama`: the `:smoke` grid on the LLaMA-style block (`config.BLOCKS["llama"]`: RMSNorm,
RoPE, no biases, an untied head) with a plain FFN (`model.ffn="plain"`: W₂·act(W₁x), not gated),
so that the activations compared are still ReLU and GELU themselves.
"""

from actlab import config
from actlab.config import sizes

WIDTHS = {"d32": 32, "d64": 64}  # the width axis' narrower arms; `:cpu_epoch` is d_model 128
CPU_LRS = [3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 1e-1]
EPOCH_LRS = [1e-3, 3e-3, 1e-2, 3e-2, 1e-1, 3e-1]


def get_sweep(arg=None):
  if arg in ("smoke", "smoke_llama"):
    llama = arg == "smoke_llama"
    return {"description": "ReLU vs GELU across learning rates (smoke: tiny model, 150 steps"
                           + ("; LLaMA-style block, plain FFN)" if llama else ")"),
            "axes": {"model.activation": ["relu", "gelu"], "optim.lr": [1e-4, 3e-3, 3e-2]},
            "seeds": [0, 1, 2], "fixed": {**sizes.SIZES["mini"], **(
                {**config.BLOCKS["llama"], "model.ffn": "plain"} if llama else {})}}
  if arg == "cpu":
    return {"description": "ReLU vs GELU across learning rates (CPU study: 0.94M parameters, "
                           "TinyStories, 200 steps)",
            "axes": {"model.activation": ["relu", "gelu"], "optim.lr": CPU_LRS},
            "seeds": [0, 1, 2, 3, 4], "fixed": sizes.SIZES["cpu"], "baseline": "gelu"}
  if arg and arg.startswith("cpu_epoch"):
    variant = arg.removeprefix("cpu_epoch").removeprefix("_")
    if variant not in ("", "qknorm", *WIDTHS):
      raise ValueError(f"relu_vs_gelu_lr: unknown variant {arg!r}; use ':cpu_epoch', "
                       f"':cpu_epoch_qknorm' or one of {[f':cpu_epoch_{w}' for w in WIDTHS]}")
    qk, d = variant == "qknorm", WIDTHS.get(variant, 128)
    width = {"model.d_model": d, "model.d_ff": 4 * d, "model.num_heads": d // 32}
    return {"description": "ReLU vs GELU across learning rates to breaking, one epoch, no clipping"
                           + (", qk-layernorm" if qk else "")
                           + (f" (CPU study: d_model {d}, TinyStories sample)" if d != 128 else
                              " (CPU study: 0.94M parameters, TinyStories sample)"),
            "axes": {"model.activation": ["relu", "gelu"], "optim.lr": EPOCH_LRS},
            "seeds": [0, 1, 2], "baseline": "gelu", "equivalence_margin": 0.02,
            "fixed": {**sizes.SIZES["cpu_epoch"], **({"model.qk_norm": True} if qk else {}),
                      **width}}
  if arg:
    raise ValueError(f"relu_vs_gelu_lr: unknown variant {arg!r}; use ':smoke', ':smoke_llama', "
                     "':cpu', ':cpu_epoch', ':cpu_epoch_qknorm' or nothing")
  return {"description": "ReLU vs GELU across learning rates (docs/reference.md §2)",
          "axes": {"model.activation": ["relu", "gelu"], "optim.lr": [1e-4, 1e-3, 3e-3]},
          "seeds": [0, 1, 2]}
