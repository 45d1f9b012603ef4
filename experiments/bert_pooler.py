"""The pooler's activation (docs/reference.md §3): BERT's tanh against exact GELU and none
(identity), fine-tuning a pretrained encoder on a sequence-classification task. The FFN activation
stays that of the MLM checkpoint; only the pooler (dense over [CLS] → activation → classifier)
changes.

First pretrain (MLM), then fine-tune every cell from that checkpoint (`train.init_from`):

    python -m actlab.main --config=configs/bert_gelu.py --workdir=runs/bert_gelu
    python -m actlab.sweep --config=configs/bert_gelu.py:classify \\
        --config.train.init_from=runs/bert_gelu \\
        --sweep=experiments/bert_pooler.py --workdir=runs/bert_pooler
    python -m actlab.report runs/bert_pooler

Full grid: pooler tanh, gelu, identity × seeds {0, 1, 2} on SST-2 (`data.classify="glue/sst2"`,
2,000 steps of 32). The report's `val acc` is the accuracy on SST-2's dev set.

`:smoke` (offline, a few minutes on 2 CPU cores): the same three poolers × seeds {0, 1, 2} on the
embedded corpus's hero-gender labels (actlab/data/classify.py), 60 steps on 64-token sequences,
from the `:smoke` MLM run:

    python -m actlab.main --config=configs/bert_gelu.py:smoke --workdir=runs/bert_smoke
    python -m actlab.sweep --config=configs/bert_gelu.py:smoke_classify \\
        --config.train.init_from=runs/bert_smoke \\
        --sweep=experiments/bert_pooler.py:smoke --workdir=runs/bert_pooler_smoke

That task is easy (every pooler reaches ~100%); compare the losses, and use SST-2 for the answer.
Without `train.init_from` the cells train from random weights (a no-pretraining baseline).
"""

POOLERS = ["tanh", "gelu", "identity"]

# `:smoke`'s fine-tuning, shorter than `:smoke_classify`'s; the model is the checkpoint's (the
# `:smoke` size), so this sets no size, only the schedule and a shorter sequence.
SMOKE_FINETUNE = {
    "data.seq_len": 64, "optim.warmup_steps": 6,
    "train.steps": 60, "train.batch_size": 16, "train.log_every": 5, "train.eval_every": 20,
    "train.checkpoint_every": 60, "train.progress": False,
}


def get_sweep(arg=None):
  axes = {"model.pooler_activation": POOLERS}
  fixed = {"model.kind": "encoder", "model.task": "classify"}
  if arg == "smoke":
    return {"description": "Pooler activation, fine-tuning (smoke: hero-gender labels of the "
                           "embedded corpus, 60 steps)", "axes": axes, "seeds": [0, 1, 2],
            "fixed": {**fixed, **SMOKE_FINETUNE, "data.classify": "synthetic/hero_gender"}}
  if arg:
    raise ValueError(f"bert_pooler: unknown variant {arg!r}; use ':smoke' or nothing")
  return {"description": "Pooler activation, fine-tuning on SST-2", "axes": axes,
          "seeds": [0, 1, 2], "fixed": {**fixed, "data.classify": "glue/sst2"}}
