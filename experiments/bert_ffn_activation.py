"""The encoder's FFN activation (docs/reference.md §3): exact GELU (BERT's), tanh, ReLU and SwiGLU,
each across peak learning rates, MLM pretraining. Run it on an encoder config:

    python -m actlab.sweep --config=configs/bert_gelu.py --sweep=experiments/bert_ffn_activation.py \\
        --workdir=runs/bert_ffn_activation && python -m actlab.report runs/bert_ffn_activation

Full grid: gelu, tanh, relu, swiglu × peak LR {3e-4, 1e-3, 3e-3} × seeds {0, 1, 2} on the small
TinyStories encoder (4 post-LN layers, d_model 256, WordPiece 8,192, 5,000 steps). The pooler
is not trained by MLM, so it is not varied here (see experiments/bert_pooler.py).

`:smoke`: the same grid shape on `sizes.SIZES["bert_mini"]` (a 2-layer, d_model 64 encoder on
the embedded corpus, 200 steps of 32 sequences of 64 tokens; about 30 s a cell on 2 CPU cores):
4 activations × LR {3e-3, 1e-2} × seed 0. MLM learns from the ~15% masked positions only, so a
model this small spends most of such a short run near the unigram loss (≈ 5.4 nats, 6%
accuracy); the smoke checks the machinery, not the answer. The report's `val loss` is the MLM
loss on the fixed validation windows and mask, `val acc` the MLM accuracy over the masked
positions.

`:cpu`: the CPU study's encoder (RESULTS.md): `sizes.SIZES["bert_cpu"]` (2 post-LN layers,
d_model 128, WordPiece 4,096) on TinyStories, 200 steps, the 4 activations at LR 3e-3 (the
decoder study's best LR at this size) × 3 seeds, GELU the baseline: 12 runs, about 15 minutes
with `--workers=2`. One LR, for time: it asks which activation learns MLM fastest here, not how
each tolerates the LR.

`:past_plateau_pilot`: the pilot of the encoder's primary tests
(experiments/questions/primary.py:page): the `bert_cpu` encoder at batch 64 × 128 for 3,000 steps
(warm-up 300), where a BERT of this size leaves the unigram plateau (near 10M tokens), the 4
activations × peak LR {1e-3, 3e-3} × seeds {0, 1}: each activation's LR is chosen on its
validation `[MASK]` loss, and the paired sd there sets the fresh seeds of the tests.
"""

from actlab.config import sizes

ACTIVATIONS = ["gelu", "tanh", "relu", "swiglu"]


def get_sweep(arg=None):
  if arg == "smoke":
    return {"description": "Encoder FFN activation across learning rates, MLM (smoke: tiny "
                           "encoder, 200 steps)",
            "axes": {"model.activation": ACTIVATIONS, "optim.lr": [3e-3, 1e-2]},
            "seeds": [0], "fixed": {**sizes.SIZES["bert_mini"], "model.kind": "encoder",
                                     "model.task": "mlm"}}
  if arg == "cpu":
    return {"description": "Encoder FFN activation, MLM (CPU study: 2 layers, d_model 128, "
                           "TinyStories, 200 steps)",
            "axes": {"model.activation": ACTIVATIONS, "optim.lr": [3e-3]},
            "seeds": [0, 1, 2], "fixed": {**sizes.SIZES["bert_cpu"], "model.kind": "encoder",
                                          "model.task": "mlm"}, "baseline": "gelu"}
  if arg == "past_plateau_pilot":
    return {"description": "Encoder FFN activation, MLM past the plateau: the primary tests' "
                           "pilot (batch 64 x 128, 3,000 steps)",
            "axes": {"model.activation": ACTIVATIONS, "optim.lr": [1e-3, 3e-3]},
            "seeds": [0, 1], "baseline": "gelu",
            "fixed": {**sizes.SIZES["bert_cpu_past_plateau"], "model.kind": "encoder",
                      "model.task": "mlm"}}
  if arg:
    raise ValueError(f"bert_ffn_activation: unknown variant {arg!r}; use ':smoke', ':cpu', "
                     "':past_plateau_pilot' or nothing")
  return {"description": "Encoder FFN activation across learning rates, MLM pretraining",
          "axes": {"model.activation": ACTIVATIONS, "optim.lr": [3e-4, 1e-3, 3e-3]},
          "seeds": [0, 1, 2], "fixed": {"model.kind": "encoder", "model.task": "mlm"}}
