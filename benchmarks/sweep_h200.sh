#!/usr/bin/env bash
# One device call (<= ~8 min): the CUDA tests and conformance, the per-kernel batch-norm breakdown on
# ResNet-50's layers, batch-norm reduction variants for small inputs, the layer/RMS rows at the shipped
# config, host cost per call (Triton's launch against normkit's direct launch).
#   run(command="bash benchmarks/sweep_h200.sh", timeout_s=600)
# Each step has its own timeout and writes as it goes. Everything lands in $OUT/sweep.tgz (the device
# tool returns at most 8 files); $OUT/summary.log holds the short form.
set -u -o pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=src
OUT=${OUT:-/tmp/normkit-sweep}
W="$OUT/sweep"
mkdir -p "$W"
T0=$(date +%s)
stamp() { echo "=== $1 at +$(( $(date +%s) - T0 ))s"; }
{
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
stamp "pytest -m cuda"
timeout 150 python3 -m pytest -q -m cuda tests > "$W/pytest_cuda.log" 2>&1; echo "pytest rc=$?"
tail -6 "$W/pytest_cuda.log"
stamp "conformance"
timeout 150 python3 -m normkit check --impl normkit --device cuda --quiet --json "$W/check_normkit_cuda.json" \
    > "$W/check_normkit_cuda.txt" 2>&1; echo "check rc=$?"
head -12 "$W/check_normkit_cuda.txt"
stamp "bn breakdown"
timeout 45 python3 benchmarks/bn_breakdown.py --layout channels_last --out "$W" > "$W/bn_breakdown.log" 2>&1
echo "rc=$?"; tail -1 "$W/bn_breakdown.log"
stamp "bn small-input variants"
timeout 100 python3 benchmarks/bn_kernels.py --out "$W" --dtypes bf16 --modes fwd,bwd \
    --shapes 256x128x28x28,256x256x14x14,256x512x7x7,256x2048x7x7,256x64x56x56 \
    --only-variants pfr02,pf05 --budget 80 --jobs 14 > "$W/bn_sweep.log" 2>&1
echo "bn rc=$?"; grep -E "^ +[0-9]" "$W/bn_sweep.log" | tail -40
stamp "done"
} 2>&1 | tee "$OUT/summary.log"
tar czf "$OUT/sweep.tgz" -C "$OUT" sweep
