#!/usr/bin/env bash
# Every GPU row of BENCHMARKS.md in one command. Each line is one row: the optimisation named in
# --label switched on or off against the baseline, or actlab side by side with PyTorch
# (--torch: torch.compile with fused AdamW on a GPU), step by step and back to back.
# Needs: pip install -e '.[cuda]'. For the six-run study also TinyStories + the GPT-2 BPE files
# (see docs/data.md; ACTLAB_DATA_DIR and ACTLAB_GPT2_DIR point at them). Output: markdown rows on
# stdout, JSON lines in $OUT.
# Usage: [PARTS="compile cost study step"] bash benchmarks/gpu_suite.sh [WHEELS]: WHEELS, a folder
# of wheels for what a bare GPU image lacks, installed offline first (`benchmarks/gpu_wheels.sh`
# downloads them for the image with jax 0.11.2). PARTS names the parts to run, in the order given
# (all four by default); STUDY_FLAGS adds flags to the study's sweeps (on an offline machine with
# v1's files in $ACTLAB_DATA_DIR/manual/tiny_stories: --config.data.tinystories_version=v1). What
# each took: compile not run yet (about 4 min expected: three processes, the sharpness program's
# compile about 100 s); cost 196 s for the reference size on an H200 (2026-11-27: its two cells with
# an empty and a warm cache, 1,000 steps each, and the same two in one sweep; the smoke size not
# timed; device_start.py about 10 s a line); study 38 s for its bench line and 314 s for the
# vectorized study with an empty cache on an H200 (the sequential study not measured); step 30-60 s
# a row. A 15-minute lease holds about two parts: run those whose rows still say "not measured"
# first.
set -euo pipefail
if [ -n "${1:-}" ]; then  # beside the image's packages, not over them; actlab from this checkout
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/actlab-site "$1"/*.whl
  export PYTHONPATH=/tmp/actlab-site:$PWD${PYTHONPATH:+:$PYTHONPATH}
fi
OUT=${OUT:-benchmarks/results_gpu.jsonl}
B="python3 -m actlab.bench --json_out=$OUT --markdown --steps=30 --warmup=5"
G=benchmarks/gpt2_small.py
R=configs/tinystories_gelu.py

compile() {
  # What XLA:GPU's autotuning costs and buys per program, each option set in a process of its own:
  # may the rarely run sharpness program (100-125 s to compile on an H100) be compiled with less?
  python3 benchmarks/compile_options.py --config=$R --config.data.source=synthetic \
      --config.data.tokenizer=byte --config.model.dtype=bfloat16 --runs=3
}

cost() {
  # What starting the device costs (its memory pool's allocation at the first transfer, the exit),
  # with XLA's default preallocation and without.
  python3 benchmarks/device_start.py
  XLA_PYTHON_CLIENT_PREALLOCATE=false python3 benchmarks/device_start.py
  # A run's fixed cost: two cells of a sweep sharing a fresh compilation cache, as a default
  # 1,000-step reference run (targets: <= 15 s with a warm cache; the loop >= 0.9x the back-to-back
  # step), and at the smoke size.
  python3 benchmarks/run_cost.py --sizes=reference --steps=1000
  python3 benchmarks/run_cost.py --sizes=smoke
}

study() {
  # The six-run study end to end (target: <= 3 minutes), vectorized and not; first its group's step
  # (3 vectorized runs) back to back, for the loop's ratio to it.
  $B --config=$R --config.model.dtype=bfloat16 --runs=3 --label="reference config, bf16, 3 vectorized runs"
  for v in true false; do
    rm -rf /tmp/six_$v
    start=$SECONDS
    python3 -m actlab.sweep --config=$R --config.model.dtype=bfloat16 \
        --config.sweep.vectorize=$v --sweep=benchmarks/six_run_study.py --workdir=/tmp/six_$v \
        ${STUDY_FLAGS:-}
    echo "six-run study, vectorize=$v: $((SECONDS - start)) s end to end"
  done
}

step() {
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

  # The reference config (6 × 384, ctx 128, batch 32): one run vs 6 vectorized runs.
  $B --config=$R --label="reference config, fp32"
  $B --config=$R --config.model.dtype=bfloat16 --label="reference config, bf16"
  $B --config=$R --config.model.dtype=bfloat16 --torch --rounds=6 --label="reference config, bf16, vs torch.compile"
  $B --config=$R --config.model.dtype=bfloat16 --runs=6 --label="reference config, bf16, 6 vectorized runs"
}

for part in ${PARTS:-compile cost study step}; do
  case $part in
    compile|cost|study|step) "$part" ;;
    *) echo "gpu_suite.sh: unknown part '$part' in PARTS; use compile, cost, study, step" >&2
       exit 2 ;;
  esac
done
