#!/usr/bin/env bash
# The device call prepared in session 6 after the headline run (<= ~3 min):
#   1. the layer-norm kernels' CUDA tests (the plain backward's new HOLD_W among them);
#   2. `ln_kernels.py --sweep --groups bwdholdw`: the plain one-row backward holding w in registers
#      against reloading it per row (fp32 8192, bf16 x / fp32 w 4096 / 8192, RMS 16384).
#   run(command="bash benchmarks/next_h200.sh", timeout_s=400)
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
timeout 150 python3 -m pytest -q -m cuda tests/kernels/test_layer_norm_kernels.py > "$W/pytest_ln_cuda.log" 2>&1
echo "pytest rc=$?"; tail -1 "$W/pytest_ln_cuda.log"; grep -E "^FAILED|^E  " "$W/pytest_ln_cuda.log" | head -20
stamp "bwdholdw sweep"
timeout 120 python3 benchmarks/ln_kernels.py --out "$W" --sweep --no-rows --groups bwdholdw --sweep-budget 90 \
    --budget 110 > "$W/ln_sweep.log" 2>&1
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
