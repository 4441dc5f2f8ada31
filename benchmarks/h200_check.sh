#!/usr/bin/env bash
# Correctness on one H200 before a kernel change lands (through the device tool, from the repo root):
#   run(command="bash benchmarks/h200_check.sh", timeout_s=420)
# Writes under $OUT: pytest_cuda.log, check_normkit_cuda.{json,txt}, check_torch_cuda.{json,txt}
# (IMPLS="normkit" checks normkit alone).
set -u -o pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=src
OUT=${OUT:-/tmp/normkit-out}
mkdir -p "$OUT"
python3 -m pytest -q -m cuda tests 2>&1 | tee "$OUT/pytest_cuda.log" | tail -15
for impl in ${IMPLS:-normkit torch}; do
    python3 -m normkit check --impl "$impl" --device cuda --quiet --json "$OUT/check_${impl}_cuda.json" \
        > "$OUT/check_${impl}_cuda.txt" 2>&1
    echo "check --impl $impl --device cuda: rc=$?"; sed -n '1,10p' "$OUT/check_${impl}_cuda.txt"
done
