#!/usr/bin/env bash
# One device call (<= ~9 min), prepared for the next GPU time:
#   1. the CUDA tests and the CUDA conformance run (the session-4 commits after 48c5f81 are CPU-tested only:
#      the direct launch's one-loop key, the rows-reduction prefetch refactor);
#   2. the RMS-forward gap bisect (`rms_fwd_gap.py --bisect`: the bench's context rebuilt step by step);
#   3. batch-norm A/B (`bn_kernels.py`): reduction prefetch (`rowspf`, `ncspf`, `ncspf8k`) and the flat
#      16-byte passes over 7x7 / 14x14 NCHW planes (`ncsflat` elementwise, `ncsredflat` reduction,
#      `ncsflatboth`; they need tl.gather: if Triton 3.6 cannot compile it the variant reads FAILED),
#      bf16 and fp32, suite rows and resnet50's small layers.
#   run(command="bash benchmarks/sweep_h200.sh", timeout_s=600, carry=[".whl"])
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
if ls .whl/liger*.whl >/dev/null 2>&1 && python3 -m pip install -q --no-index --no-deps --no-compile \
        --no-cache-dir --target /tmp/site .whl/liger*.whl >/dev/null 2>&1; then
    export PYTHONPATH=/tmp/site:src
fi
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
stamp "pytest -m cuda"
timeout 150 python3 -m pytest -q -m cuda tests > "$W/pytest_cuda.log" 2>&1; echo "pytest rc=$?"
tail -4 "$W/pytest_cuda.log"
stamp "conformance"
timeout 100 python3 -m normkit check --impl normkit --device cuda --quiet --json "$W/check_normkit_cuda.json" \
    > "$W/check_normkit_cuda.txt" 2>&1; echo "check rc=$?"
head -10 "$W/check_normkit_cuda.txt"
stamp "rms forward gap bisect"
timeout 90 python3 benchmarks/rms_fwd_gap.py --bisect --out "$W" > "$W/rms_fwd_gap.log" 2>&1
echo "gap rc=$?"; grep -E "ms  calls" "$W/rms_fwd_gap.log"
stamp "bn rows prefetch A/B"
timeout 175 python3 benchmarks/bn_kernels.py --out "$W" --dtypes bf16,fp32 --modes fwd,bwd,eval --layouts cl,contig \
    --shapes 256x64x56x56,256x512x28x28,256x1024x14x14,256x2048x7x7,65536x1024,256x128x28x28,256x256x14x14,256x512x7x7 \
    --only-variants rowspf,ncspf,ncspf8k,ncsflat,ncsredflat,ncsflatboth --budget 150 --jobs 14 > "$W/bn_sweep.log" 2>&1
echo "bn rc=$?"; sed -n '/^variants, graph ms per call/,$p' "$W/bn_sweep.log" | head -45
stamp "done"
} 2>&1 | tee "$OUT/summary.log"
tar czf "$OUT/sweep.tgz" -C "$OUT" sweep
