"""The project's pre-registered questions, RESULTS.md's four families, as question files state
them (docs/asking.md). Each was declared before its fresh seeds (family 1's sentence in RESULTS.md
names the one pilot that came before it); their runs are committed under results/, made before
`actlab.ask` by the sweeps its history names, so each family names its directories (`runs`):

    python -m actlab.ask experiments/questions/primary.py:<family> report --workdir=results

- `page` (family 1, K = 7): each arm's LR chosen on its pilot's validation windows (every LR it
  ran), n from the pilot's paired sd itself at α/7 (power 0.8 against δ = 0.1), at least 10 pairs,
  the encoder's at most 10; no sign-flip test (it came with family 3).
- `recipe` (family 2, K = 6): ReLU − GELU under four recipes and in the LLaMA-style block with a
  plain FFN (ReLU and ReLU² against GELU there); pilots of {1e-3, 3e-3, 1e-2} × seeds 0–2, one step
  past an edge (3e-4, 3e-2) before choosing; at most 40 pairs, 20 for `wide`.
- `retest` (K = 3): tests 2–4's pilot extended one step below its lowest LR; a test is asked
  again on seeds from 600 only where the choice of LR moves (none did: no fresh runs).
- `factorial` (family 3, K = 5): ReLU and GELU × clipping (none, at 1.0, spike-only at 10×) ×
  block (GPT-2's, LLaMA-style), LR 3e-3 in every cell, the same seeds in all 12 cells, n from the
  upper 80% bound of each contrast's pilot sd, at least 20 and at most 40, verdicts at ±0.1 and
  ±0.05 with an exact sign-flip test beside each.
"""

from actlab.config import BLOCKS, GPT2_BLOCK, sizes

DECODER = sizes.SIZES["cpu_epoch"]
ENCODER = {**sizes.SIZES["bert_cpu_past_plateau"], "model.kind": "encoder", "model.task": "mlm"}
MODERN = {**BLOCKS["llama"], "model.ffn": "plain"}  # the LLaMA-style block, plain FFN
LRS, WIDE_LRS = [1e-3, 3e-3, 1e-2], [1e-3, 3e-3, 1e-2, 3e-2, 1e-1, 3e-1]
EDGE = {1e-3: 3e-4, 1e-2: 3e-2}
FIRST_RULE = {"sd_confidence": None, "shared": False, "sign_flip": False}  # families 1, 2
# Every family's runs predate XLA's deterministic GPU ops as a field (they trained on CPU, whose
# programs are deterministic anyway), so each states the value they ran with.
BEFORE = {"train.deterministic_ops": False}


WORDS = {"relu": "ReLU", "gelu": "GELU", "swiglu": "SwiGLU", "silu": "SiLU", "geglu": "GEGLU",
         "reglu": "ReGLU", "relu2": "ReLU²"}


def arms(a: str, b: str, question: str, cells=None, **more) -> dict:
  """The contrast a − b of cells `cells` (default: named a and b), the claim naming a and b."""
  x, y = cells or (a, b)
  return {"weights": {x: 1, y: -1}, "question": question, "a": WORDS.get(a, a),
          "b": WORDS.get(b, b), **more}


def page() -> dict:
  acts = ("relu", "gelu", "swiglu", "silu", "geglu", "reglu")
  bert = {"pilot": {"seeds": [0, 1], "lrs": [1e-3, 3e-3]},
          "outcome": ["final_val_mask_loss", "final_test_mask_loss"]}
  tests = ("relu_gelu", "swiglu_silu", "geglu_gelu", "reglu_relu", "bert_relu_gelu",
           "bert_tanh_gelu", "bert_swiglu_gelu")
  return {
      "config": "configs/tinystories_gelu.py",
      "fixed": BEFORE,
      "cells": {**{a: {**DECODER, "model.activation": a} for a in acts},
                **{f"bert_{a}": {**ENCODER, "model.activation": a}
                   for a in ("relu", "gelu", "tanh", "swiglu")}},
      "contrasts": {
          "relu_gelu": arms("relu", "gelu", "Does ReLU or GELU give the lower loss at its best "
                            "LR (decoder)?"),
          "swiglu_silu": arms("swiglu", "silu", "Does gating change SiLU's loss at each one's "
                              "best LR (decoder)?"),
          "geglu_gelu": arms("geglu", "gelu", "Does gating change GELU's loss at each one's best "
                             "LR (decoder)?"),
          "reglu_relu": arms("reglu", "relu", "Does gating change ReLU's loss at each one's best "
                             "LR (decoder)?"),
          **{f"bert_{a}_gelu": arms(a, "gelu", f"Does {w} change BERT's [MASK] loss against "
                                    "GELU (encoder, MLM)?", (f"bert_{a}", "bert_gelu"), cap=10)
             for a, w in (("relu", "ReLU"), ("tanh", "tanh"), ("swiglu", "SwiGLU"))}},
      "pilot": {"seeds": [0, 1, 2], "lrs": LRS},
      "by_cell": {"relu": {"pilot": {"seeds": [0, 1, 2], "lrs": WIDE_LRS}},
                  "gelu": {"pilot": {"seeds": [0, 1, 2], "lrs": WIDE_LRS}},
                  **{f"bert_{a}": bert for a in ("relu", "gelu", "tanh", "swiglu")}},
      "fresh": {"first_seed": 100},
      "rule": FIRST_RULE,
      "runs": {"pilot": ["relu_vs_gelu_cpu_epoch", "primary_gated_pilot",
                         "bert_past_plateau_pilot"],
               "fresh": [f"primary_{t}" for t in tests]}}


RECIPES = {"clip": {"optim.clip_norm": 1.0}, "warmup": {"optim.warmup_steps": 180},
           "wide": {"model.d_model": 256, "model.d_ff": 1024, "model.num_heads": 8},
           "clip_warmup": {"optim.clip_norm": 1.0, "optim.warmup_steps": 180}}


def recipe() -> dict:
  cells = {f"{a}_{r}": {**DECODER, **fields, "model.activation": a}
           for r, fields in RECIPES.items() for a in ("relu", "gelu")}
  cells.update({f"{a}_modern": {**DECODER, **MODERN, "model.activation": a}
                for a in ("relu", "relu2", "gelu")})
  question = "Does ReLU or GELU give the lower loss at its best LR (decoder, recipe {})?"
  return {
      "config": "configs/tinystories_gelu.py",
      "fixed": BEFORE,
      "cells": cells,
      "contrasts": {
          **{f"recipe_{r}": arms("relu", "gelu", question.format(r), (f"relu_{r}", f"gelu_{r}"),
                                 **({"cap": 20} if r == "wide" else {})) for r in RECIPES},
          **{f"modern_{a}_gelu": arms(a, "gelu", f"Does {w} or GELU give the lower loss at its "
                                      "best LR (decoder, the modern block, plain FFN)?",
                                      (f"{a}_modern", "gelu_modern"))
             for a, w in (("relu", "ReLU"), ("relu2", "ReLU²"))}},
      "pilot": {"seeds": [0, 1, 2], "lrs": LRS, "edge": EDGE},
      "fresh": {"first_seed": 200, "cap": 40},
      "rule": FIRST_RULE,
      "runs": {"pilot": [f"primary_recipe_{r}_{s}" for r in RECIPES for s in ("pilot", "edge")]
               + ["primary_modern_pilot"],
               "fresh": [f"primary_recipe_{r}" for r in RECIPES]
               + ["primary_modern_relu_gelu", "primary_modern_relu2_gelu"]}}


def retest() -> dict:
  family1 = page()
  gated = ("swiglu", "silu", "geglu", "gelu", "reglu", "relu")
  return {**{k: family1[k] for k in ("config", "fixed", "rule")},
          "cells": {a: family1["cells"][a] for a in gated},
          "contrasts": {f"{t}_retest": family1["contrasts"][t]
                        for t in ("swiglu_silu", "geglu_gelu", "reglu_relu")},
          "pilot": {"seeds": [0, 1, 2], "lrs": LRS, "edge": {1e-3: 3e-4}},
          "by_cell": {a: {"pilot": {"seeds": [0, 1, 2], "lrs": WIDE_LRS, "edge": {1e-3: 3e-4}}}
                      for a in ("relu", "gelu")},
          "fresh": {"first_seed": 600, "cap": 40},
          "runs": {"pilot": ["relu_vs_gelu_cpu_epoch", "primary_gated_pilot",
                             "primary_gated_edge"], "fresh": []}}


CLIPPINGS = {"none": ({"optim.clip_norm": 0.0, "optim.spike_clip": 0.0}, "unclipped"),
             "clip": ({"optim.clip_norm": 1.0, "optim.spike_clip": 0.0}, "clipped at 1.0"),
             "spike": ({"optim.clip_norm": 0.0, "optim.spike_clip": 10.0},
                       "with spike-only clipping")}
BLOCK = {"gpt2": ({f"model.{k}": v for k, v in GPT2_BLOCK.items()}, "in GPT-2's block"),
         "llama": (MODERN, "in the LLaMA-style block")}


def gap(clip: str, block: str, sign: int = 1) -> dict:
  """ReLU − GELU under clipping `clip` in `block`, as cell weights (× sign)."""
  return {f"relu_{clip}_{block}": sign, f"gelu_{clip}_{block}": -sign}


def change(to: tuple, from_: tuple, moves: str, question: str = "") -> dict:
  """The gap at `to` less the gap at `from_` (each (clip, block)), its sides in words."""
  return {"weights": {**gap(*to), **gap(*from_, -1)}, "question": question,
          **{side: f"{moves} ReLU − GELU toward {arm}"
             for side, arm in (("negative", "ReLU"), ("positive", "GELU"))}}


def factorial() -> dict:
  return {
      "config": "configs/tinystories_gelu.py",
      "fixed": {**DECODER, **BEFORE},
      "cells": {f"{a}_{c}_{b}": {"model.activation": a, **CLIPPINGS[c][0], **BLOCK[b][0]}
                for a in ("relu", "gelu") for c in CLIPPINGS for b in BLOCK},
      "contrasts": {
          "relu_gelu": {"weights": gap("none", "gpt2"), "a": "ReLU", "b": "GELU",
                        "question": "Does ReLU or GELU give the lower loss in GPT-2's block "
                                    "without clipping (test 1 again)?"},
          "clip_change": change(("clip", "gpt2"), ("none", "gpt2"), "clipping at 1.0 moves",
                                "Does clipping at 1.0 change ReLU − GELU (GPT-2's block)?"),
          "spike_change": change(("spike", "gpt2"), ("none", "gpt2"), "spike-only clipping moves",
                                 "Does spike-only clipping change ReLU − GELU (GPT-2's block)?"),
          "spike_vs_clip": change(("spike", "gpt2"), ("clip", "gpt2"), "spike-only clipping, "
                                  "against clipping at 1.0, moves", "Does spike-only clipping "
                                  "leave ReLU − GELU where clipping at 1.0 does?"),
          "block_change": change(("none", "llama"), ("none", "gpt2"), "the LLaMA-style block "
                                 "moves", "Does the LLaMA-style block change ReLU − GELU "
                                 "(unclipped)?")},
      "descriptive": {**{f"relu_gelu_{c}_{b}": gap(c, b) for b in BLOCK for c in CLIPPINGS},
                      "clip_change_llama": change(("clip", "llama"), ("none", "llama"),
                                                  "clipping at 1.0 moves"),
                      "spike_change_llama": change(("spike", "llama"), ("none", "llama"),
                                                   "spike-only clipping moves")},
      "margins": [0.1, 0.05],
      "pilot": {"seeds": [300, 301, 302, 303, 304], "lr": 3e-3},
      "fresh": {"first_seed": 400, "cap": 40},
      "rule": {"min_seeds": 20, "sd_confidence": 0.8},
      "spike": 10.0,
      "runs": {"pilot": ["primary_factorial_pilot"], "fresh": ["primary_factorial"]}}


FAMILIES = {"page": page, "recipe": recipe, "retest": retest, "factorial": factorial}


def get_question(arg=None):
  if arg not in FAMILIES:
    raise ValueError(f"unknown family {arg!r}; use one of {', '.join(FAMILIES)}")
  return FAMILIES[arg]()
