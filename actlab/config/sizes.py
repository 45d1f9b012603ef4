"""The sizes configs, experiments, tests and benchmarks use: dotted overrides of `config.base()`;
the `bert_<size>` rows are the encoder's. Parameter counts are with the GELU FFN ("without wte":
without the token embedding)."""

_SMOKE = {  # the decoder: 454,144 parameters (413,184 without wte)
    "data.source": "synthetic", "data.tokenizer": "byte", "data.seq_len": 128,
    "data.val_batches": 4,
    "model.num_layers": 2, "model.d_model": 128, "model.num_heads": 4, "model.d_ff": 512,
    "model.max_len": 128,
    "optim.lr": 3e-3, "optim.warmup_steps": 30,
    "train.steps": 300, "train.batch_size": 16, "train.log_every": 10, "train.eval_every": 100,
    "train.checkpoint_every": 100,
    "metrics.sharpness_every": 0,
}

_MINI = {  # the sweeps' `:smoke` model (experiments/*.py): decoder and encoder
    "data.source": "synthetic", "data.seq_len": 64, "data.val_batches": 4,
    "model.num_layers": 2, "model.d_model": 64, "model.num_heads": 4, "model.d_ff": 256,
    "model.max_len": 64,
    "train.eval_every": 50, "train.progress": False,
}

_CPU = {  # the CPU studies' schedule and model shape (decoder and encoder)
    "data.seq_len": 128, "data.val_batches": 8,
    "model.num_layers": 2, "model.d_model": 128, "model.num_heads": 4, "model.d_ff": 512,
    "model.max_len": 128,
    "optim.warmup_steps": 20,
    "train.steps": 200, "train.batch_size": 16, "train.log_every": 10, "train.eval_every": 50,
    "train.checkpoint_every": 100, "train.progress": False,
    "metrics.sharpness_every": 0,
}

SIZES = {
    # The config files' `:smoke`: a few minutes on 2 CPU cores.
    "smoke": _SMOKE,
    # The tests' model (tests/tiny_config.py): 1 layer, d_model 32; seconds (tests of how layers
    # stack set 2).
    "tiny": {**_SMOKE, "data.seq_len": 32, "data.val_batches": 2,
             "model.num_layers": 1, "model.d_model": 32, "model.num_heads": 2, "model.d_ff": 64,
             "model.max_len": 32,
             "optim.warmup_steps": 5,
             "train.steps": 50, "train.batch_size": 8, "train.eval_every": 25,
             "train.checkpoint_every": 25, "train.progress": False},
    # The sweeps' `:smoke`: about 10 s a cell on 2 CPU cores. No peak LR: each sweep sets its own.
    "mini": {**_MINI, "data.tokenizer": "byte", "optim.warmup_steps": 15,
             "train.steps": 150, "train.batch_size": 16, "train.log_every": 5,
             "train.checkpoint_every": 50,
             "metrics.sharpness_every": 50, "metrics.sharpness_iters": 10},
    # The CPU studies on the TinyStories sample (experiments/*.py:cpu; RESULTS.md says why):
    # 937,472 parameters (413,184 without wte), a BPE trained on the sample, 200 steps of
    # 16 x 128 tokens (410k tokens, about half an epoch of the sample); a few minutes a run on
    # one core. No peak LR: each study varies its own.
    "cpu": {**_CPU, "data.tokenizer": "bpe:4096"},
    # The one-epoch CPU studies (experiments/*.py:cpu_epoch): "cpu" for 450 steps (one epoch of
    # the sample, 45 warm-up), without gradient clipping, with held-out test windows.
    "cpu_epoch": {**_CPU, "data.tokenizer": "bpe:4096", "train.steps": 450,
                  "optim.warmup_steps": 45, "train.eval_every": 75, "train.checkpoint_every": 150,
                  "optim.clip_norm": 0.0, "data.test_batches": 8},
    # The reference study (docs/reference.md §2), `base()` itself: 30,013,440 parameters
    # (10,696,704 without wte).
    "reference": {"data.tokenizer": "gpt2", "data.seq_len": 128,
                  "model.num_layers": 6, "model.d_model": 384, "model.num_heads": 6,
                  "model.d_ff": 1536, "model.max_len": 128},
    # GPT-2 small (Radford et al. 2019) at GPT-3's peak LR for its size: 124,475,904 parameters
    # (85,842,432 without wte).
    "gpt2_small": {"data.tokenizer": "gpt2", "data.seq_len": 1024,
                   "model.num_layers": 12, "model.d_model": 768, "model.num_heads": 12,
                   "model.d_ff": 3072, "model.max_len": 1024,
                   "optim.lr": 6e-4},
    # The encoder's sizes use WordPiece vocabularies ([PAD] [UNK] [CLS] [SEP] [MASK] at ids 0-4).
    # Its "mini" (experiments/bert_ffn_activation.py:smoke): about 30 s a cell on 2 CPU cores.
    "bert_mini": {**_MINI, "data.tokenizer": "wordpiece:2048", "optim.warmup_steps": 20,
                  "train.steps": 200, "train.batch_size": 32, "train.log_every": 10,
                  "train.checkpoint_every": 200,
                  "metrics.sharpness_every": 0},
    # experiments/bert_ffn_activation.py:cpu: the CPU studies' encoder on the TinyStories sample.
    "bert_cpu": {**_CPU, "data.tokenizer": "wordpiece:4096"},
    # The encoder's primary tests (experiments/questions/primary.py:page): "bert_cpu" past the MLM
    # plateau, which a BERT of this size leaves near 10M tokens: batch 64 × 128, 3,000 steps.
    "bert_cpu_past_plateau": {**_CPU, "data.tokenizer": "wordpiece:4096", "train.batch_size": 64,
                              "train.steps": 3000, "optim.warmup_steps": 300,
                              "train.eval_every": 250, "train.log_every": 50,
                              "train.checkpoint_every": 500, "data.test_batches": 8},
    # configs/bert_<activation>.py:smoke, sharing its WordPiece with "bert_mini".
    "bert_smoke": {**_SMOKE, "data.tokenizer": "wordpiece:2048",
                   "data.classify": "synthetic/hero_gender", "optim.lr": 2e-3},
    # A small BERT for TinyStories (configs/bert_<activation>.py).
    "bert_small": {"data.tokenizer": "wordpiece:8192", "data.seq_len": 128,
                   "model.num_layers": 4, "model.d_model": 256, "model.num_heads": 4,
                   "model.d_ff": 1024, "model.max_len": 128},
    # BERT-base (Devlin et al. 2019): vocabulary 30,522 (padded to 30,528), dropout 0.1;
    # pretraining at sequence length 128, batch 256, peak LR 1e-4 with 10k warm-up steps over 1M.
    "bert_base": {"data.tokenizer": "wordpiece:30522", "data.seq_len": 128,
                  "model.num_layers": 12, "model.d_model": 768, "model.num_heads": 12,
                  "model.d_ff": 3072, "model.max_len": 512, "model.dropout": 0.1,
                  "optim.lr": 1e-4, "optim.warmup_steps": 10_000, "optim.min_lr_ratio": 0.0,
                  "train.steps": 1_000_000, "train.batch_size": 256, "train.log_every": 100,
                  "train.eval_every": 10_000, "train.checkpoint_every": 10_000,
                  "metrics.sharpness_every": 10_000},
}
ENCODER_PREFIX = "bert_"
DECODER_SIZES = [s for s in SIZES if not s.startswith(ENCODER_PREFIX)]
ENCODER_SIZES = [s[len(ENCODER_PREFIX):] for s in SIZES if s.startswith(ENCODER_PREFIX)]

# Fine-tuning per encoder size: steps, peak LR, batch size (SST-2 has 67k examples: 2,000 steps of
# 32 are about one epoch; BERT fine-tunes for 2-4 epochs at 2e-5 to 5e-5).
CLASSIFY_SETTINGS = {"small": (2_000, 1e-4, 32), "smoke": (150, 1e-3, 16),
                     "base": (6_000, 3e-5, 32)}
