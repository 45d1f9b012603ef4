#!/usr/bin/env bash
# The ladder's rungs on one GPU, as it trained their pilots (the fresh seeds of 2 × 128 and 6 × 384
# moved to CPU before the first began: results/ladder/DEVICE.md): a process per rung, each training
# its cells' stages into stage directories of its own (`actlab.ask run --cells`), in passes: the first
# trains each rung's pilot (and its step past an edge); the fresh seeds need every rung's pilot (n
# and the shared seeds come from all of them), so the next pass trains them. Each pass resumes
# what the last left, so the same command goes on in the next lease. The processes share the GPU
# by XLA's memory fraction and overlap one another's compiles.
# Usage: [LIMIT=s] [WORKDIR=results/ladder] [PACK=file.tgz] \
#          bash experiments/questions/ladder_gpu.sh [WHEELS]
#   WHEELS: a folder of wheels for what a bare GPU image lacks (benchmarks/gpu_wheels.sh);
#   the sample's v1 files in manual/ (RESULTS.md, "Reproducing"); LIMIT: stop (SIGTERM: each run
#   checkpoints) after this many seconds, 780 by default, for a 15-minute lease; PACK: also write
#   the finished runs' files that `actlab.report --archive` keeps (what results/ commits; no
#   checkpoints; a run stopped midway left out) and the stages' sweep files to this tarball. A
#   lent machine starts bare: bring PACK back, unpack it over the checkout and commit it, and the
#   next lease resumes from there (a run stopped midway starts again).
# Cost on one H100 (2026-11-27, an empty compile cache): pilot and edges, 215 runs, 6 min 50 s
# (BENCHMARKS.md).
set -uo pipefail
cd "$(dirname "$0")/../.."
if [ -n "${1:-}" ]; then  # beside the image's packages, not over them; actlab from this checkout
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/actlab-site "$1"/*.whl \
    || exit 1
  export PYTHONPATH=/tmp/actlab-site:$PWD${PYTHONPATH:+:$PYTHONPATH}
fi
Q=experiments/questions/ladder.py
W=${WORKDIR:-results/ladder}
# Runtime fields only (the declaration is frozen): one checkpoint a run, no TensorBoard files.
SET="data.manual_dir=manual,train.keep_checkpoints=1,train.progress=false"
SET+=",metrics.tensorboard=false,metrics.ffn_hist_bins=0"
declare -A SHARE=([2x128]=0.3 [6x384]=0.6)  # of the GPU's memory, per process
end=$((SECONDS + ${LIMIT:-780}))
mkdir -p "$W/logs"
for pass in 1 2 3; do
  left=$((end - SECONDS))
  [ "$left" -gt 30 ] || break
  echo "ladder_gpu: pass $pass at $(date -u +%FT%TZ), $left s left"
  for r in "${!SHARE[@]}"; do
    XLA_PYTHON_CLIENT_MEM_FRACTION=${SHARE[$r]} PYTHONUNBUFFERED=1 timeout -s TERM -k 45 "$left" \
      python3 -m actlab.ask "$Q" run --workdir="$W" --cells="*_$r" --set="$SET" \
      >"$W/logs/$r.pass$pass.log" 2>&1 &
  done
  wait
  echo "ladder_gpu: pass $pass ended at $(date -u +%FT%TZ)"
  tail -n 3 "$W"/logs/*.pass$pass.log
  # Done when each rung's process wrote the report (its fresh stage trained).
  [ "$(grep -l '^wrote ' "$W"/logs/*.pass$pass.log | wc -l)" -eq "${#SHARE[@]}" ] && break
done
python3 -m actlab.ask "$Q" report --workdir="$W"
[ -z "${PACK:-}" ] || python3 - "$W" "$PACK" <<'EOF'
import pathlib, sys, tarfile
from actlab.report import ARCHIVED  # what a report reads of a run, as actlab.report --archive
root, finished, unfinished = pathlib.Path(sys.argv[1]), 0, 0
with tarfile.open(sys.argv[2], "w:gz") as tar:
  for path in [root / "question.json", *root.glob("*.sweep.json")]:
    tar.add(path, arcname=str(path))
  for config in sorted(root.glob("*/*/config.json")):
    run = config.parent
    if not (run / "summary.json").is_file():
      unfinished += 1
      continue
    finished += 1
    for name in ARCHIVED:
      tar.add(run / name, arcname=str(run / name))
print(f"ladder_gpu: {finished} finished runs in {sys.argv[2]} ({unfinished} unfinished left out)")
EOF
