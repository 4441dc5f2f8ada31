#!/usr/bin/env bash
# Group norm on the H200 in one device call (<= ~8 min; carry .whl for the bench's peers):
#   1. `pytest -m cuda` (every CUDA test: the group-norm kernels' and the rest at the shipped defaults);
#   2. `normkit check --impl normkit --device cuda` (every op);
#   3. benchmarks/gn_kernels.py: the suite's group-norm rows, float64 check + graph timing of _CFG variants
#      (VARIANTS, default base) against ATen eager, with per-kernel GPU times (PROFILE=--profile; "" drops it).
#   run(command="bash benchmarks/gn_h200.sh", carry=[".whl"], timeout_s=560)
# Next session (the forward-partials variants prepared 2026-12-01, NOTES-group_norm.md "Next"):
#   (or `PART=1 bash benchmarks/next_h200.sh`, which also runs `pytest -m cuda`)
#   run(command="SKIP_TESTS=1 VARIANTS=base,clalignall,all4,shiftelu2,unroll2,ncbwdwhole bash benchmarks/gn_h200.sh", carry=[".whl"], timeout_s=580)
set -u -o pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=src
OUT=${OUT:-/tmp/normkit-gn}
VARIANTS=${VARIANTS:-base}
PROFILE=${PROFILE:---profile}
SKIP_TESTS=${SKIP_TESTS:-0}
SKIP_CHECK=${SKIP_CHECK:-0}
SWEEP_BUDGET=${SWEEP_BUDGET:-170}
mkdir -p "$OUT"
T0=$(date +%s)
stamp() { echo "=== $1 at +$(( $(date +%s) - T0 ))s"; }
{
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
if [ "$SKIP_TESTS" != 1 ]; then
    stamp "pytest -m cuda"
    timeout 300 python3 -m pytest -q -m cuda tests > "$OUT/pytest_cuda.log" 2>&1; echo "pytest rc=$?"
    tail -1 "$OUT/pytest_cuda.log"; grep -E "^FAILED|^E  " "$OUT/pytest_cuda.log" | head -20
fi
if [ "$SKIP_TESTS" != 1 ] && [ "$SKIP_CHECK" != 1 ]; then
    stamp "conformance"
    timeout 110 python3 -m normkit check --impl normkit --device cuda --quiet --json "$OUT/check_cuda.json" \
        > "$OUT/check_cuda.txt" 2>&1; echo "check rc=$?"; head -14 "$OUT/check_cuda.txt"
fi
stamp "group-norm sweep"
timeout 200 python3 benchmarks/gn_kernels.py --out "$OUT" --variants "$VARIANTS" $PROFILE --budget "$SWEEP_BUDGET" > "$OUT/gn_kernels.log" 2>&1
echo "sweep rc=$?"; cat "$OUT/gn_kernels.log" | cut -c1-230
stamp "done"
} 2>&1 | tee "$OUT/summary.log"
