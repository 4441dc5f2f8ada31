#!/usr/bin/env bash
# normkit's complete benchmark on one H200: two device calls of at most 9 minutes each, from the repository
# root (carry the peers' wheels):
#
#   run(command="NORMKIT_GIT_SHA=<sha> PART=1 bash benchmarks/run_h200.sh", carry=[".whl"], timeout_s=600)
#   run(command="NORMKIT_GIT_SHA=<sha> PART=2 bash benchmarks/run_h200.sh", carry=[".whl"], timeout_s=600)
#
# (<sha>: `git rev-parse --short HEAD` run HERE, plus "-dirty" if the tree is; never on the device: its copy
# may lack .git or hold the session-start checkout, and reported a stale sha on 2026-11-30.)
# Make the second call right after the first: a machine still warm keeps Triton's, Inductor's and FlagGems'
# caches (faster, same numbers); a fresh one is fine too. Copy each call's files to
# benchmarks/results/h200-<date>/part1 and .../part2 afterwards (the two summary.md files are the report:
# part1 holds batch and group norm, part2 layer, RMS and instance norm, the models and the accuracy table).
#
# THE PLAN. The whole suite (every op, shape, layout, dtype and mode; 219 cases, 2244 rows) with every peer
# (ATen eager cuDNN on / off, Liger-Kernel, torch.compile, FlagGems), plus --models and --accuracy, is split
# by op so that the two calls carry about the same load. Estimated H200 time (runner.estimate_seconds,
# calibrated on the 2026-11-30 run: 336 rows in 68 s = ~0.06 s per timed direction, ~0.1 s per case for
# inputs + float64 oracle, Triton JIT ~0.7 s per batch-norm case / ~0.5 s per other case for normkit and
# Liger (~5 s per group-norm case for Liger: its 65536-element blocks take ~18 s each to compile); plus
# ~1.5 s per compiled direction for torch.compile(dynamic=True): one graph per (op, mode,
# dtypes, layout, ndim), 63 graphs instead of 219 cases x directions with dynamic=False; FlagGems' per-shape
# autotuning at a 5/20 ms do_bench instead of 25/100, and its kernels that hold a row or group of more
# than 32768 elements in one Triton block skipped (their compile alone: 15 s at 65536, minutes above; see
# impls.FG_MAX_BLOCK); ~+-50%; `python -m normkit bench --dry-run --all-dtypes --peer-scope all
# --peers all --compile-dynamic --ops ...` prints the model):
#   PART=1  batch_norm (128 cases, ~5.9 min), group_norm (20, ~3.0 min): ~8.9 min of suite rows, every
#           dtype, every peer.
#   PART=headline (one call, ~7.2 min): batch_norm, layer_norm, rms_norm in every dtype; torch.compile
#           and FlagGems on each op's headline dtype only; --models.
#   PART=2  --models: resnet50 NCHW + channels_last, ViT-B/16, GPT-2 small, each eager and inside
#           normkit.enable(), 20 steps, bf16 autocast (~1.5 min); --accuracy --accuracy-ops all: every op
#           and dtype, randn and randn + 1000, every peer incl. torch.compile (~1.7 min; most of its
#           compiled graphs are reused by the suite rows); then the suite rows of layer_norm (36 cases,
#           ~2.9 min), rms_norm (27, ~1.5 min), instance_norm (8, ~0.9 min): ~8.5 min.
# Both parts are estimated ~10% over their ~8 min budget: expect the last torch.compile / FlagGems rows of
# an op (its last dtype) to read "skip" if the estimates hold, none if they were pessimistic.
# Each call ends in time whatever the estimates' error: the bench gets --budget = what is left of DEADLINE
# (530 s from the script's start) less TAIL (40 s for the row in flight, plots, summary, JSON). Models and
# accuracy run first; the suite rows then get slices of what is left, op by op in proportion to their
# estimates, and inside a slice torch.compile and FlagGems give way first (rows "skip", note "time budget")
# so that normkit's and the eager peers' rows are kept. `timeout` sends SIGTERM at DEADLINE - 15 s (the
# bench then writes what it has) and SIGKILL 15 s later. bench.json is rewritten every 10 s and after each
# op, model and section, so even a killed run keeps its rows.
#
# Files under $OUT (<= 7, no folders): bench.json summary.md bench.log and up to 3 PNGs (batch_norm.png,
# layer_rms_norm.png, group_instance_norm.png), bench.json.tmp only if killed while writing.
#
# Knobs: PART (1|2|headline), HEADLINE_OPS / MODELS (PART=headline: ops, model names; default all; none: no
# models), OUT, DEADLINE (s, whole script), TAIL (s), OPS1 / OPS2 (the ops of each part),
# EXTRA (more bench arguments, e.g. "--rep-ms 20").
# Liger-Kernel 0.8.5 and FlagGems 5.0.2 (+ sqlalchemy, greenlet for FlagGems) travel as wheels in .whl/;
# without them their rows read n/a.
set -u -o pipefail

PART=${PART:-1}
OUT=${OUT:-benchmarks/results/h200-local}
DEADLINE=${DEADLINE:-530}
TAIL=${TAIL:-40}
OPS1=${OPS1:-batch_norm group_norm}
OPS2=${OPS2:-layer_norm rms_norm instance_norm}
EXTRA=${EXTRA:-}
export PYTHONUNBUFFERED=1
export PYTHONPATH=src

mkdir -p "$OUT"
LOG="$OUT/bench.log"
: > "$LOG"
echo "run_h200: PART=$PART DEADLINE=${DEADLINE}s git $(git rev-parse --short HEAD 2>/dev/null)" | tee -a "$LOG"

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

COMMON=(--all-dtypes --peer-scope all --compile-dynamic --peers all --json "$OUT/bench.json" --out "$OUT")
if [ "$PART" = 1 ]; then
    # shellcheck disable=SC2206
    ARGS=(--ops $OPS1)
elif [ "$PART" = headline ]; then
    # one call: batch, layer and RMS norm in every dtype, torch.compile / FlagGems on each op's headline
    # dtype only (~5.7 min estimated), then the four models (~1.5 min)
    COMMON=(--all-dtypes --peer-scope headline --compile-dynamic --peers all --json "$OUT/bench.json" --out "$OUT")
    # shellcheck disable=SC2206
    ARGS=(--ops ${HEADLINE_OPS:-batch_norm layer_norm rms_norm} --perf)
    if [ "${MODELS:-}" != none ]; then
        # shellcheck disable=SC2206
        ARGS+=(--models ${MODELS:-} --steps 20)
    fi
else
    # shellcheck disable=SC2206
    ARGS=(--ops $OPS2 --perf --models --accuracy --accuracy-ops all --steps 20)
fi
BUDGET=$(( DEADLINE - SECONDS - TAIL ))
KILL_AT=$(( DEADLINE - SECONDS - 15 ))
if [ "$BUDGET" -lt 60 ]; then
    echo "run_h200: only ${BUDGET}s of budget left: not running" | tee -a "$LOG"
else
    echo "run_h200: bench budget ${BUDGET}s, SIGTERM after ${KILL_AT}s" | tee -a "$LOG"
    # shellcheck disable=SC2086
    timeout -s TERM -k 15 "$KILL_AT" python3 -m normkit bench "${ARGS[@]}" "${COMMON[@]}" --budget "$BUDGET" \
        $EXTRA 2>&1 | tee -a "$LOG"
    echo "run_h200: bench exit ${PIPESTATUS[0]}" | tee -a "$LOG"
fi
echo "run_h200: done in ${SECONDS}s; files:" | tee -a "$LOG"
find "$OUT" -type f | sort | tee -a "$LOG"
# the end of the output is what the device tool shows: repeat the headline (and the models) there
section() { awk -v h="$1" 'index($0, h) == 1 {f = 1; print; next} /^## / {f = 0} f' "$2"; }
[ -f "$OUT/summary.md" ] && section "## Headline" "$OUT/summary.md"
[ -f "$OUT/summary.md" ] && section "## Whole training steps" "$OUT/summary.md"
exit 0
