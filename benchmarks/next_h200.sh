#!/usr/bin/env bash
# The first device call of the next session (<= ~4 min): `pytest -m cuda` and
# `normkit check --impl normkit --device cuda` at the shipped defaults (session 6 ran the full CUDA tests
# and conformance at 9334a74; the two later backward defaults ran the layer-norm CUDA tests only).
#   run(command="bash benchmarks/next_h200.sh", timeout_s=400)
set -u -o pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=src
OUT=${OUT:-/tmp/normkit-next}
W="$OUT/next"
mkdir -p "$W"
T0=$(date +%s)
stamp() { echo "=== $1 at +$(( $(date +%s) - T0 ))s"; }
{
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
stamp "pytest -m cuda"
timeout 220 python3 -m pytest -q -m cuda tests > "$W/pytest_cuda.log" 2>&1; echo "pytest rc=$?"
tail -1 "$W/pytest_cuda.log"; grep -E "^FAILED|^E  " "$W/pytest_cuda.log" | head -20
stamp "conformance"
timeout 100 python3 -m normkit check --impl normkit --device cuda --quiet --json "$W/check_cuda.json" \
    > "$W/check_cuda.txt" 2>&1; echo "check rc=$?"; head -12 "$W/check_cuda.txt"
stamp "done"
} 2>&1 | tee "$OUT/summary.log"
tar czf "$OUT/next.tgz" -C "$OUT" next
