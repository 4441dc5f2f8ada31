#!/usr/bin/env bash
# One device call (<= ~8 min): layer/RMS variant sweeps (w/b loads and elements per thread of the
# one-row forward, narrow tiles, backward programs per SM at 4096 / 8192), then the layer/RMS rows of the
# suite in the headline dtype with every peer, run with the sweep's winners (the bench's own checks
# against float64 mark any wrong row), then the layer-norm CUDA tests.
#   run(command="NORMKIT_GIT_SHA=<sha> bash benchmarks/sweep_h200.sh", timeout_s=520, carry=[".whl"])
# Everything lands in $OUT/sweep.tgz (the device tool returns at most 8 files); $OUT/summary.log holds
# the short form.
set -u -o pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=src
OUT=${OUT:-/tmp/normkit-sweep}
W="$OUT/sweep"
mkdir -p "$W"
T0=$(date +%s)
stamp() { echo "=== $1 at +$(( $(date +%s) - T0 ))s"; }
{
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv
if ls .whl/*.whl >/dev/null 2>&1 && python3 -m pip install -q --no-index --no-deps --no-compile \
        --no-cache-dir --target /tmp/site .whl/*.whl >/dev/null 2>&1; then
    export PYTHONPATH=/tmp/site:src
else
    echo "no peer wheels: Liger-Kernel / FlagGems rows will read n/a"
fi
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
stamp "ln/rms sweep"
timeout 140 python3 benchmarks/ln_kernels.py --out "$W" --sweep --no-rows \
    --groups fwdwb,fwdwbnarrow,bwdmid --sweep-budget 115 > "$W/ln_sweep.log" 2>&1
echo "ln rc=$?"; grep -E "chose|FAILED" "$W/ln_sweep.log" | cut -c1-300
stamp "bench layer/rms, sweep winners"
timeout 250 python3 - "$W" <<'EOF' > "$W/bench.log" 2>&1
import json, os, sys
from normkit.kernels import layer_norm as L
w = sys.argv[1]
chosen = {}
path = os.path.join(w, "ln_sweep.jsonl")
if os.path.exists(path):
    for line in open(path):
        d = json.loads(line)
        if "chose" in d:
            chosen.update(d["cfg"])
L._CFG.update(chosen)
print("applied", chosen, flush=True)
from normkit.bench.cli import main
sys.exit(main(["--ops", "layer_norm", "rms_norm", "--perf", "--peers", "all", "--compile-dynamic",
               "--budget", "200", "--json", os.path.join(w, "bench.json"), "--out", w, "--no-progress"]))
EOF
echo "bench rc=$?"; grep -E "^applied" "$W/bench.log"; sed -n '/## Headline/,/^## [^H]/p' "$W/summary.md" 2>/dev/null | head -30
stamp "pytest -m cuda (layer norm)"
timeout 70 python3 -m pytest -q -m cuda tests/kernels/test_layer_norm_kernels.py > "$W/pytest_cuda.log" 2>&1
echo "pytest rc=$?"; tail -3 "$W/pytest_cuda.log"
stamp "done"
} 2>&1 | tee "$OUT/summary.log"
tar czf "$OUT/sweep.tgz" -C "$OUT" sweep
