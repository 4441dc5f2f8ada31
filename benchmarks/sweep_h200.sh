#!/usr/bin/env bash
# One device call (<= ~8 min): host cost per call, the batch-norm and layer/RMS-norm kernel variant sweeps
# (fp32 defaults timed beside bf16: the bf16-only sweep of 2026-11-30 hid an fp32 regression).
#   run(command="bash benchmarks/sweep_h200.sh", timeout_s=600)
# Files under $OUT (8): host_overhead.json, host_overhead_profile.txt, bn_kernels.jsonl, bn_sweep.log,
# ln_sweep.jsonl, ln_bench.json, ln_bench.log, ln_stdout.log.
set -u -o pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=src
OUT=${OUT:-/tmp/normkit-sweep}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv
timeout 90 python3 benchmarks/host_overhead.py --out "$OUT" 2>&1 | tail -30
timeout 170 python3 benchmarks/bn_kernels.py --out "$OUT" --dtypes bf16,fp32 \
    --only-variants rowsu2,rowstp1k,rowstp396,rowsr4ktp660 \
    --budget 75 --jobs 14 > "$OUT/bn_sweep.log" 2>&1
echo "bn sweep rc=$?"; tail -60 "$OUT/bn_sweep.log"
timeout 50 python3 -m pytest -q tests/kernels/test_batch_norm_kernels.py -k cuda_knob_paths 2>&1 | tail -8 | tee -a "$OUT/bn_sweep.log"
timeout 230 python3 benchmarks/ln_kernels.py --sweep --groups reduce,bwdpf,lnbwdpf,fwdpersist,fwdsplit \
    --graph --quick --budget 150 --sweep-budget 95 --out "$OUT" > "$OUT/ln_stdout.log" 2>&1
echo "ln sweep rc=$?"; tail -70 "$OUT/ln_stdout.log"
ls -la "$OUT"
