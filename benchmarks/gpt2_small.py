"""GPT-2 small (124M: 12 layers, d_model 768, 12 heads, d_ff 3072, context 1024, GPT-2 vocabulary
50,257 → 50,304) for `actlab.bench`: the issue's GPU throughput target (bf16, ≥ 50% MFU).

    python -m actlab.bench --config=benchmarks/gpt2_small.py            # bf16, cuDNN attention
    python -m actlab.bench --config=benchmarks/gpt2_small.py:fp32       # the float32 baseline
    python -m actlab.bench --config=benchmarks/gpt2_small.py --config.model.attention_impl=xla

Variants: "" (bf16, attention "auto", fused loss, batch 16 × 1024 tokens per device),
"fp32", "smoke" (2 layers, context 128: checks the path on a CPU in seconds).
The benchmark uses random tokens; `data.*` only fixes the vocabulary (gpt2) and the context.
"""

from actlab import config as config_lib


def get_config(arg=None):
  c = config_lib.base("gelu_tanh")  # GPT-2's activation
  c.model.update(num_layers=12, d_model=768, num_heads=12, d_ff=3072, max_len=1024,
                 dtype="bfloat16", attention_impl="auto", loss_impl="fused")
  c.data.update(seq_len=1024, tokenizer="gpt2")
  c.train.update(batch_size=16, steps=1000)
  c.optim.update(lr=6e-4, warmup_steps=100)
  if arg == "fp32":
    c.model.update(dtype="float32")
  elif arg == "smoke":
    c.model.update(num_layers=2, max_len=128)
    c.data.seq_len = 128
    c.train.batch_size = 4
  elif arg:
    raise ValueError(f"unknown variant {arg!r}: choose '', 'fp32' or 'smoke'")
  return c
