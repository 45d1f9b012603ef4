"""Gated FFNs (Shazeer 2020) against their plain counterparts at matched parameter count.

Pairs: relu/reglu, gelu/geglu, silu/swiglu, sigmoid/glu, identity/bilinear. The gated FFN has
three matrices of width round(2/3·d_ff) to a multiple of 64 (model.gated_match_params), so both
members of a pair have the same parameters and FLOPs within a few percent; the report shows the
counts, and compares each gated FFN with its plain one, paired by seed (`pairs`: gated − plain).
`:smoke` uses the tiny `sizes.SIZES["mini"]` setup with d_ff 384, whose gated width 256 is
exactly 2/3 of it.
"""

from actlab.config import sizes

PAIRS = [("relu", "reglu"), ("gelu", "geglu"), ("silu", "swiglu"), ("sigmoid", "glu"),
         ("identity", "bilinear")]


def get_sweep(arg=None):
  axes = {"model.activation": [name for pair in PAIRS for name in pair]}
  pairs = [[gated, plain] for plain, gated in PAIRS]
  if arg == "smoke":
    return {"description": "Gated vs plain FFNs, parameter-matched (smoke: tiny model, 150 steps)",
            "axes": axes, "seeds": [0, 1], "pairs": pairs,
            "fixed": {**sizes.SIZES["mini"], "model.d_ff": 384, "model.gated_match_params": True,
                      "optim.lr": 3e-3}}
  if arg:
    raise ValueError(f"glu_variants: unknown variant {arg!r}; use ':smoke' or nothing")
  return {"description": "Gated vs plain FFNs, parameter-matched", "axes": axes,
          "seeds": [0, 1, 2], "pairs": pairs, "fixed": {"model.gated_match_params": True, "optim.lr": 1e-3}}
