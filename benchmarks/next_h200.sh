#!/usr/bin/env bash
# The device call prepared in session 6 (<= ~7 min):
#   1. the layer-norm kernels' CUDA tests (the cooperative forward / backward among them: compiled,
#      against float64, bit-identical to the two-launch forward, repeated calls bit-identical);
#   2. `ln_profile.py`: per-kernel times of LN 16384x4096 / 8192x8192 forward + backward, bf16 x with bf16
#      or fp32 w/b, and fp32 (the mixed backward ran 1.8x slower than bf16 in the bench);
#   3. `ln_kernels.py --sweep --groups fwdcoop,bwdcoop`: the cooperative split-row kernels (off by
#      default) against the shipped wide paths, LN and RMS, bf16 and fp32.
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
stamp "layer-norm CUDA tests"
timeout 240 python3 -m pytest -q -m cuda tests/kernels/test_layer_norm_kernels.py > "$W/pytest_ln_cuda.log" 2>&1
echo "pytest rc=$?"; tail -1 "$W/pytest_ln_cuda.log"; grep -E "^FAILED|Error" "$W/pytest_ln_cuda.log" | head
stamp "profile"
timeout 60 python3 benchmarks/ln_profile.py --out "$W" > "$W/ln_profile.log" 2>&1; echo "profile rc=$?"
cat "$W/ln_profile.log" | cut -c1-150 | head -60
stamp "cooperative sweep"
timeout 270 python3 benchmarks/ln_kernels.py --out "$W" --sweep --no-rows --groups fwdcoop,bwdcoop --sweep-budget 230 \
    --budget 260 > "$W/ln_sweep.log" 2>&1
echo "sweep rc=$?"; grep -E "chose|FAILED|out of time" "$W/ln_sweep.log" | cut -c1-300
python3 - "$W/ln_sweep.jsonl" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    d = json.loads(line)
    if "label" in d:
        print(d["group"], d["label"], d["op"], d["M"], d["N"], d.get("dtype", "")[6:], round(d["ms"], 4),
              round(d["sol"] or 0, 3), d.get("err"))
PY
stamp "done"
} 2>&1 | tee "$OUT/summary.log"
tar czf "$OUT/next.tgz" -C "$OUT" next
