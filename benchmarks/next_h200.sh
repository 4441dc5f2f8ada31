#!/usr/bin/env bash
# The next session's first two device calls (carry .whl; each <= ~8 min):
#   run(command="PART=1 bash benchmarks/next_h200.sh", carry=[".whl"], timeout_s=580)
#   run(command="PART=2 bash benchmarks/next_h200.sh", carry=[".whl"], timeout_s=580)
# PART=1: `pytest -m cuda` (four group-norm CUDA tests were fixed after session 7's last GPU run and have
#         not run since, nor the instance_norm override of enable()), and the group-norm variants prepared
#         in session 7 (NOTES-group_norm.md "Next": clalignall, all4, shiftelu2, unroll2, ncbwdwhole, ncbs1k)
#         against base.
# PART=2: the CUDA tests of programmatic dependent launch, conformance on CUDA, batch norm's combine-tile
#         variants (comb1k, comb2k; NOTES-batch_norm.md session 7) and programmatic dependent launch (pdl,
#         pdlcomb1k) on the small resnet50 layers and suite rows, and the layer / RMS backward's dw/db
#         reduction with programmatic dependent launch (ln_kernels.py group bwdpdl).
set -u -o pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=src
PART=${PART:-1}
OUT=${OUT:-/tmp/normkit-next}
W="$OUT/next$PART"
mkdir -p "$W"
T0=$(date +%s)
stamp() { echo "=== $1 at +$(( $(date +%s) - T0 ))s"; }
{
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
if [ "$PART" = 1 ]; then
    stamp "pytest -m cuda"
    timeout 300 python3 -m pytest -q -m cuda tests > "$W/pytest_cuda.log" 2>&1; echo "pytest rc=$?"
    tail -1 "$W/pytest_cuda.log"; grep -E "^FAILED|^E  " "$W/pytest_cuda.log" | head -20
    stamp "group-norm variants"
    timeout 230 python3 benchmarks/gn_kernels.py --out "$W" --variants base,clalignall,all4,shiftelu2,unroll2,ncbwdwhole,ncbs1k \
        --budget 210 > "$W/gn_kernels.log" 2>&1; echo "sweep rc=$?"; cut -c1-200 "$W/gn_kernels.log"
else
    stamp "pytest -m cuda -k pdl (programmatic dependent launch: same bits, CUDA graphs)"
    timeout 120 python3 -m pytest -q -m cuda -k "pdl or graph" tests > "$W/pytest_pdl.log" 2>&1; echo "pytest rc=$?"
    tail -1 "$W/pytest_pdl.log"; grep -E "^FAILED|^E  " "$W/pytest_pdl.log" | head -20
    stamp "conformance"
    timeout 110 python3 -m normkit check --impl normkit --device cuda --quiet --json "$W/check_cuda.json" \
        > "$W/check_cuda.txt" 2>&1; echo "check rc=$?"; head -14 "$W/check_cuda.txt"
    stamp "batch-norm combine tiles and programmatic dependent launch"
    timeout 200 python3 benchmarks/bn_kernels.py --out "$W" --budget 170 --only-variants comb1k,comb2k,pdl,pdlcomb1k \
        --shapes 256x2048x7x7,256x1024x14x14,256x64x56x56,65536x1024,256x512x7x7,256x256x14x14,256x128x28x28,256x512x28x28 --modes fwd,bwd \
        > "$W/bn_kernels.log" 2>&1; echo "bn rc=$?"; tail -60 "$W/bn_kernels.log" | cut -c1-220
    stamp "layer / RMS backward: dw/db reduction with programmatic dependent launch"
    timeout 150 python3 benchmarks/ln_kernels.py --out "$W" --sweep --groups bwdpdl --sweep-budget 100 --no-rows \
        > "$W/ln_kernels.log" 2>&1; echo "ln rc=$?"; grep -E "sweep bwdpdl|chose|FAILED" "$W/ln_kernels.log" | cut -c1-200 | tail -40
fi
stamp "done"
} 2>&1 | tee "$OUT/summary$PART.log"
tar czf "$OUT/next$PART.tgz" -C "$OUT" "next$PART"
