#!/usr/bin/env bash
# normkit's benchmark run on one H200, through the device tool, from the repository root:
#
#   run(command="bash benchmarks/run_h200.sh", carry=[".whl"], timeout_s=600)            # ~8 min
#   run(command="PART=2 bash benchmarks/run_h200.sh", carry=[".whl"], timeout_s=600)     # optional, ~5 min
#
# PART=1 (default, <= 8 min):
#   1. the suite at each op's headline dtype (suite.json's first dtype per op), every shape, layout and
#      mode, every peer: normkit, ATen eager (cuDNN on / off), torch.compile, Liger-Kernel, FlagGems
#      (--budget SUITE_BUDGET s, split between the ops; rows not reached read "skip");
#   2. --models (resnet50 NCHW + channels_last, ViT-B/16, GPT-2 small; with and without normkit.enable())
#      and --accuracy (randn and randn + 1000, every dtype; torch.compile left out to save its compile
#      time), in what is left of 470 s.
#   Files under $OUT (8): bench.json summary.md batch_norm.png layer_rms_norm.png group_instance_norm.png
#   bench.log extra/extra.json extra/summary.md
# PART=2: the suite's other dtypes (slots 1-3; torch.compile and FlagGems stay on the headline dtype
#   unless PEER_SCOPE=all). Files: bench.json summary.md 3 PNGs bench.log (6).
#
# Liger-Kernel 0.8.5 and FlagGems 5.0.2 (+ sqlalchemy, greenlet for FlagGems) travel as wheels in .whl/;
# without them their rows read n/a. Copy $OUT to benchmarks/results/h200-<date>[-part2]/ afterwards.
set -u -o pipefail

PART=${PART:-1}
OUT=${OUT:-benchmarks/results/h200-local}
SUITE_BUDGET=${SUITE_BUDGET:-340}
TOTAL_BUDGET=${TOTAL_BUDGET:-470}
PEER_SCOPE=${PEER_SCOPE:-headline}
export PYTHONUNBUFFERED=1
export PYTHONPATH=src

mkdir -p "$OUT"
LOG="$OUT/bench.log"
: > "$LOG"

if ls .whl/*.whl >/dev/null 2>&1; then
    if python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
            --target /tmp/site .whl/*.whl >>"$LOG" 2>&1; then
        export PYTHONPATH=/tmp/site:src
    else
        echo "run_h200: wheel install failed: Liger-Kernel / FlagGems rows will read n/a" | tee -a "$LOG" >&2
    fi
else
    echo "run_h200: no .whl/ (carry it): Liger-Kernel / FlagGems rows will read n/a" | tee -a "$LOG" >&2
fi

nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.max.sm,clocks.mem,temperature.gpu,power.draw \
    --format=csv 2>&1 | tee -a "$LOG"
python3 - <<'EOF' 2>&1 | tee -a "$LOG"
import importlib, torch, triton
print("torch", torch.__version__, "triton", triton.__version__, "cuda", torch.version.cuda,
      torch.cuda.get_device_name(0) if torch.cuda.is_available() else "NO CUDA")
for m in ("liger_kernel", "flag_gems", "normkit.functional", "normkit.aten"):
    try:
        importlib.import_module(m)
        print("import", m, "ok")
    except Exception as e:
        print("import", m, "FAILED:", type(e).__name__, str(e)[:200])
EOF

if [ "$PART" = 1 ]; then
    python3 -m normkit bench --budget "$SUITE_BUDGET" --peer-scope "$PEER_SCOPE" \
        --json "$OUT/bench.json" --out "$OUT" 2>&1 | tee -a "$LOG"
    REMAIN=$(( TOTAL_BUDGET - SECONDS ))
    if [ "$REMAIN" -gt 60 ]; then
        mkdir -p "$OUT/extra"
        python3 -m normkit bench --models --accuracy --steps 20 --budget "$REMAIN" \
            --peers aten,aten-native,liger,flaggems \
            --json "$OUT/extra/extra.json" --out "$OUT/extra" 2>&1 | tee -a "$LOG"
    else
        echo "run_h200: ${REMAIN}s left: --models / --accuracy not run" | tee -a "$LOG"
    fi
else
    python3 -m normkit bench --dtype-slots 1,2,3 --budget "$SUITE_BUDGET" --peer-scope "$PEER_SCOPE" \
        --json "$OUT/bench.json" --out "$OUT" 2>&1 | tee -a "$LOG"
fi
echo "run_h200: done in ${SECONDS}s; files:" | tee -a "$LOG"
find "$OUT" -type f | sort | tee -a "$LOG"
# the end of the output is what the device tool shows: repeat the headline (and the models) there
section() { awk -v h="$1" 'index($0, h) == 1 {f = 1; print; next} /^## / {f = 0} f' "$2"; }
[ -f "$OUT/summary.md" ] && section "## Headline" "$OUT/summary.md"
[ -f "$OUT/extra/summary.md" ] && section "## Whole training steps" "$OUT/extra/summary.md"
exit 0
