#!/usr/bin/env bash
# One device call (<= ~9.5 min): the CUDA tests, host cost per call (Triton's launch against normkit's
# direct launch), the per-kernel batch-norm breakdown on ResNet-50's layers, the batch-norm defaults in
# bf16 and fp32, the layer/RMS forward tile sweeps, and whole steps (resnet50-cl, ViT-B/16) under enable().
#   run(command="bash benchmarks/sweep_h200.sh", timeout_s=600, carry=[".whl"])
# Every step has its own timeout and writes under $OUT as it goes, so a cut-off run still leaves data.
set -u -o pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=src
OUT=${OUT:-/tmp/normkit-sweep}
mkdir -p "$OUT"
T0=$(date +%s)
stamp() { echo "=== $1 at +$(( $(date +%s) - T0 ))s"; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
stamp "pytest -m cuda"
timeout 150 python3 -m pytest -q -m cuda -x tests 2>&1 | tail -15 | tee "$OUT/pytest_cuda.log"
stamp "host cost"
timeout 100 python3 benchmarks/host_overhead.py --out "$OUT" --calls 200 2>&1 | tee "$OUT/host_overhead.log" | tail -64
stamp "bn breakdown"
for layout in channels_last contiguous; do
    timeout 60 python3 benchmarks/bn_breakdown.py --layout $layout --out "$OUT" > "$OUT/bn_breakdown_$layout.log" 2>&1
    echo "rc=$?"; tail -40 "$OUT/bn_breakdown_$layout.log"
done
stamp "bn defaults bf16 + fp32"
timeout 80 python3 benchmarks/bn_kernels.py --out "$OUT" --dtypes bf16,fp32 --no-variants \
    --budget 50 --jobs 14 > "$OUT/bn_sweep.log" 2>&1
echo "bn rc=$?"; tail -45 "$OUT/bn_sweep.log"
stamp "ln forward sweeps"
timeout 130 python3 benchmarks/ln_kernels.py --sweep --groups fwdsmall,fwdmid --no-rows \
    --graph --quick --budget 120 --sweep-budget 110 --out "$OUT" > "$OUT/ln_stdout.log" 2>&1
echo "ln sweep rc=$?"; grep -E "chose|FAILED|chosen" "$OUT/ln_stdout.log"
stamp "models"
timeout 120 python3 -m normkit bench --models resnet50-cl vit_b16 --steps 20 --no-progress \
    --json "$OUT/models.json" --out "$OUT/models" 2>&1 | tail -20
stamp "done"
ls -la "$OUT"
