#!/usr/bin/env bash
# The device call prepared at the end of session 5 (<= ~9 min):
#   1. `pytest -m cuda` (the one-launch wide backward's CUDA test among them: compiled, against float64,
#      repeated calls bit-identical);
#   2. `normkit check --impl normkit --device cuda` (the defaults switched on after the last full check:
#      4 rows per program for wide params, 1 plain backward program per SM, no zero-filled gradients);
#   3. `ln_kernels.py --sweep --groups bwdwide`: the one-launch wide backward (off by default) against the
#      row-sums + column-kernel path on the wide rows, bf16 and fp32, three configurations.
# Then the headline run: NORMKIT_GIT_SHA=<sha> PART=headline bash benchmarks/run_h200.sh (carry .whl).
#   run(command="bash benchmarks/next_h200.sh", timeout_s=600)
# $OUT/summary.log holds the short form; everything else lands in $OUT/next.tgz.
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
timeout 200 python3 -m pytest -q -m cuda tests > "$W/pytest_cuda.log" 2>&1; echo "pytest rc=$?"
tail -1 "$W/pytest_cuda.log"; grep -E "^FAILED" "$W/pytest_cuda.log" | head
stamp "conformance"
timeout 90 python3 -m normkit check --impl normkit --device cuda --quiet --json "$W/check_cuda.json" \
    > "$W/check_cuda.txt" 2>&1; echo "check rc=$?"; head -12 "$W/check_cuda.txt"
stamp "wide backward sweep"
timeout 230 python3 benchmarks/ln_kernels.py --out "$W" --sweep --no-rows --groups bwdwide --sweep-budget 180 \
    --budget 220 > "$W/ln_sweep.log" 2>&1
echo "sweep rc=$?"; grep -E "chose|FAILED" "$W/ln_sweep.log" | cut -c1-300
python3 - "$W/ln_sweep.jsonl" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    d = json.loads(line)
    if "label" in d:
        print(d["group"], d["label"], d["op"], d["M"], d["N"], d.get("dtype", ""), round(d["ms"], 4), d.get("sol"))
PY
stamp "done"
} 2>&1 | tee "$OUT/summary.log"
tar czf "$OUT/next.tgz" -C "$OUT" next
