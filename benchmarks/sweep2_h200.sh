#!/usr/bin/env bash
# The second prepared device call (<= ~6 min), after sweep_h200.sh: layer/RMS variant groups that were
# chosen by the old harness (inputs not rotated past L2, so rows of 32-48 MiB were partly L2-served):
# the narrow backward (`bwdpf`: tile, elements per thread, programs per SM of the prefetching kernel),
# the dw/db partials reduction (`reduce`), the 4096/8192 backward programs (`bwdmid`), then the layer/RMS
# rows of the suite at the shipped config against ATen.
#   run(command="bash benchmarks/sweep2_h200.sh", timeout_s=420)
# Everything lands in $OUT/sweep2.tgz; $OUT/summary.log holds the short form.
set -u -o pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=src
OUT=${OUT:-/tmp/normkit-sweep2}
W="$OUT/sweep2"
mkdir -p "$W"
T0=$(date +%s)
stamp() { echo "=== $1 at +$(( $(date +%s) - T0 ))s"; }
{
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
stamp "ln/rms sweep (rotating harness)"
timeout 330 python3 benchmarks/ln_kernels.py --out "$W" --sweep --quick \
    --groups bwdpf,reduce,bwdmid --sweep-budget 200 --budget 310 > "$W/ln_sweep.log" 2>&1
echo "ln rc=$?"; grep -E "chose|FAILED" "$W/ln_sweep.log" | cut -c1-300; tail -22 "$W/ln_sweep.log"
stamp "done"
} 2>&1 | tee "$OUT/summary.log"
tar czf "$OUT/sweep2.tgz" -C "$OUT" sweep2
