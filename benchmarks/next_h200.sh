#!/usr/bin/env bash
# The device call prepared in session 6 (<= ~5 min), after the cooperative sweep:
#   1. `pytest -m cuda` (the cooperative wide backward, now the default for fp32 up to 65536 and 16-bit
#      up to 16384, among them) and `normkit check --impl normkit --device cuda`;
#   2. `ln_kernels.py --sweep --groups bwdmix`: the one-row backward with w wider than x (bf16 x, fp32 w):
#      prefetching kernel against the plain one with 1, 2 or 4 programs per SM.
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
timeout 220 python3 -m pytest -q -m cuda tests > "$W/pytest_cuda.log" 2>&1; echo "pytest rc=$?"
tail -1 "$W/pytest_cuda.log"; grep -E "^FAILED|^E  " "$W/pytest_cuda.log" | head -20
stamp "conformance"
timeout 100 python3 -m normkit check --impl normkit --device cuda --quiet --json "$W/check_cuda.json" \
    > "$W/check_cuda.txt" 2>&1; echo "check rc=$?"; head -12 "$W/check_cuda.txt"
stamp "bwdmix sweep"
timeout 120 python3 benchmarks/ln_kernels.py --out "$W" --sweep --no-rows --groups bwdmix --sweep-budget 90 \
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
