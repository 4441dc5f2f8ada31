#!/usr/bin/env bash
# The last device call of session 6 (<= ~2.5 min): the layer-norm kernels' CUDA tests with the prefetching
# backward holding w at 8192 (tentatively on), then `--groups bwdpfhold` (off / from 8192 / from 2048).
#   run(command="bash benchmarks/next_h200.sh", timeout_s=200)
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
timeout 90 python3 -m pytest -q -m cuda tests/kernels/test_layer_norm_kernels.py > "$W/pytest_ln_cuda.log" 2>&1
echo "pytest rc=$?"; tail -1 "$W/pytest_ln_cuda.log"; grep -E "^FAILED|^E  " "$W/pytest_ln_cuda.log" | head -20
stamp "bwdpfhold sweep"
timeout 100 python3 benchmarks/ln_kernels.py --out "$W" --sweep --no-rows --groups bwdpfhold --sweep-budget 75 \
    --budget 90 > "$W/ln_sweep.log" 2>&1
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
