#!/usr/bin/env bash
# Every GPU row of BENCHMARKS.md in one command. Each line is one row: the optimisation named in
# --label switched on or off against the baseline, or actlab side by side with PyTorch
# (--torch: torch.compile with fused AdamW on a GPU), step by step and back to back.
# Needs: pip install -e '.[cuda]'. For the six-run study also TinyStories + the GPT-2 BPE files
# (see docs/data.md). Output: markdown rows on stdout, JSON lines in $OUT.
set -euo pipefail
OUT=${OUT:-benchmarks/results_gpu.jsonl}
B="python -m actlab.bench --json_out=$OUT --markdown --steps=30 --warmup=5"
G=benchmarks/gpt2_small.py

# GPT-2 small, 16 × 1024 tokens per step: targets >= 45% MFU in bf16, >= 1.1x torch.compile.
$B --config=$G --label="bf16, cuDNN attention (auto), fused loss: all on"
$B --config=$G --torch --rounds=6 --label="vs torch.compile (bf16 autocast, fused AdamW)"
$B --config=$G --config.model.attention_impl=xla --label="XLA attention instead of cuDNN"
$B --config=$G --config.model.loss_impl=plain --label="plain loss: full [B, L, V] logits"
$B --config=$G:fp32 --label="float32 (TF32 matmuls), XLA attention"
$B --config=$G --config.model.scan_layers=true --label="scan over layers (compile time)"
$B --config=$G --config.model.remat=dots --label="remat dots (memory)"
$B --config=$G --config.model.remat=full --config.train.batch_size=64 --label="remat full, batch 64"
$B --config=$G --config.train.batch_size=32 --label="batch 32"

# The reference config (6 × 384, ctx 128, batch 32): one run vs 3 vectorized runs.
R=configs/tinystories_gelu.py
$B --config=$R --label="reference config, fp32"
$B --config=$R --config.model.dtype=bfloat16 --label="reference config, bf16"
$B --config=$R --config.model.dtype=bfloat16 --torch --rounds=6 --label="reference config, bf16, vs torch.compile"
$B --config=$R --config.model.dtype=bfloat16 --runs=3 --label="reference config, bf16, 3 vectorized runs"
$B --config=$R --config.model.dtype=bfloat16 --runs=6 --label="reference config, bf16, 6 vectorized runs"

# The six-run study end to end (target: < 10 minutes total with vectorized sweeps).
for v in true false; do
  rm -rf /tmp/six_$v
  /usr/bin/time -f "six-run study, vectorize=$v: %e s" python -m actlab.sweep \
      --config=$R --config.model.dtype=bfloat16 --config.sweep.vectorize=$v \
      --sweep=benchmarks/six_run_study.py --workdir=/tmp/six_$v
done
