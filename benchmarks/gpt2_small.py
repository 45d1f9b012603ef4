"""GPT-2 small (`sizes.SIZES["gpt2_small"]`, 124M: 12 layers, d_model 768, 12 heads, d_ff 3072,
context 1024, GPT-2 vocabulary 50,257 → 50,304) for `actlab.bench`: the issue's GPU throughput
target (bf16, ≥ 50% MFU).

    python -m actlab.bench --config=benchmarks/gpt2_small.py            # bf16, cuDNN attention
    python -m actlab.bench --config=benchmarks/gpt2_small.py:fp32       # the float32 baseline
    python -m actlab.bench --config=benchmarks/gpt2_small.py --config.model.attention_impl=xla

Variants: "" (bf16, attention "auto", fused loss, batch 16 × 1024 tokens per device),
"fp32", "smoke" (2 layers, context 128: checks the path on a CPU in seconds).
The benchmark uses random tokens; `data.*` only fixes the vocabulary (gpt2) and the context.
"""

from actlab import config as config_lib

VARIANTS = {"": {}, "fp32": {"model.dtype": "float32"},
            "smoke": {"model.num_layers": 2, "model.max_len": 128, "data.seq_len": 128,
                      "train.batch_size": 4}}


def get_config(arg=None):
  if (arg or "") not in VARIANTS:
    raise ValueError(f"unknown variant {arg!r}: choose '', 'fp32' or 'smoke'")
  c = config_lib.decoder("gelu_tanh", "gpt2_small")  # GPT-2's activation
  return config_lib.override(c, {"model.dtype": "bfloat16", "model.attention_impl": "auto",
                                 "model.loss_impl": "fused", "train.batch_size": 16,
                                 "train.steps": 1000, **VARIANTS[arg or ""]})
