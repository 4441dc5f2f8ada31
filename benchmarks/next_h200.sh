#!/usr/bin/env bash
# The last device call of session 6 (<= ~3 min): the layer-norm kernels' CUDA tests with w held by the
# plain backward (now the default), then the bench's layer / RMS rows at 4096-16384 wide in every dtype
# against ATen and Liger (the rows that holding w changes).
#   run(command="bash benchmarks/next_h200.sh", timeout_s=300)
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
stamp "bench"
if python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl; then
    export PYTHONPATH=/tmp/site:src
fi
timeout 150 python3 -m normkit bench --ops layer_norm rms_norm --shapes 16384x4096 8192x8192 4096x16384 --all-dtypes \
    --peers aten liger --budget 130 --json "$W/bench.json" --out "$W" --no-progress > "$W/bench.log" 2>&1
echo "bench rc=$?"; sed -n '/## Headline/,/^$/p' "$W/summary.md" | head -30
stamp "done"
} 2>&1 | tee "$OUT/summary.log"
tar czf "$OUT/next.tgz" -C "$OUT" next
