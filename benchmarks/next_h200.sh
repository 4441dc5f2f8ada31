#!/usr/bin/env bash
# The next session's device calls (each within the device's 10-minute limit), run as
#   run(command="NORMKIT_GIT_SHA=<this checkout's commit> PART=<n> bash benchmarks/next_h200.sh", carry=[...],
#       timeout_s=600)
# (the device's copy of .git is not the checkout's: without the variable the bench JSON's git_sha is wrong).
# Output: $OUT/summary<n>.log (the call's stdout), $OUT/next<n>/ (logs, JSON) and $OUT/next<n>.tgz.
# The parts sessions 1-39 ran are in git history (`git log -p -- benchmarks/next_h200.sh`); every results folder's
# README names the commit and the command it ran.
#
# For the next session (written in session 43): first PART=129 (any GPU, ~580 s): the route tests on CUDA (batch norm's
# training test was rewritten in session 43, its eval-route test is new: neither has run there), the host cost a call
# with routes off / on (eval included), then the model zoo with the C++ replay loaded (session 43's full zoo ran
# without waiting for it). Turn `normkit.ops.batch_norm.EVAL_ROUTES` / `normkit.ops.group_norm.ROUTES_ON` on where
# their CUDA test passes and the A/B shows the calls cheaper (the GN rows: "fwd F.group_norm under enable()" etc.). Then, on an H200, PART=103 and 127 as below; PART=126 ran on an H100 in
# session 43 (results/h100-2026-12-06-s43).
# Then PART=130 (any GPU, ~400 s, carry .whl): the looped wide forward's off variants (RMS per-lane sums, evict-first
# re-reads, a program a row) against the split forward and FlagGems at 32768-262144 wide; the prediction is in
# NOTES-layer_norm.md, session 43.
# Written in session 42: on an H200, PART=103 (the batch-norm suite; last on an H200 in
# session 33, before the fold / plane-align / summed-fold work) and PART=126 (the layer / RMS suite + ViT / GPT-2 steps),
# then PART=127 (validation after session 42's SyncBatchNorm and reference changes); PART=120 on a multi-GPU kind if
# ever lent. Session 42 ran PART=127, 128 and 103 on an H100 (results/h100-2026-12-06-s42); PART=128 (the tile
# transpose's CUDA tests and A/B) need not run again.
# Session 40's parts (121 and 123 ran on an H100: results/h100-2026-12-06-s40):
#   PART=121 (~560 s, carry .whl): the conformance cases of the `unsqueezed` layout on CUDA (torch's kernels and
#            normkit's), then PART=103's batch-norm suite at a 450 s budget.
#   PART=122 (~560 s, carry .whl): PART=119, then resnet50 steps with and without enable().
#   PART=123 (~560 s, carry .whl; any GPU): session 40's host-side fixes on CUDA (pytest -m cuda of the ops, modules,
#            functional and aten tests), conformance of every family on CUDA (normkit; torch on the unsqueezed
#            cases), the randomized CUDA tests, then the layer / RMS suite with the peers at what is left.
# Earlier parts still useful (written in session 39):
#   PART=119 (~400 s, carry .whl): randomized CUDA tests of batch / instance / group norm at session 39's fold (fp32
#            folded), then the layer / RMS suite with Liger and FlagGems (never run with the peers on an H100).
#   PART=120 (~60 s, on nvidia-h100-x2 or larger if ever lent): SyncBatchNorm over NCCL, a GPU a rank.
#   PART=103 (~560 s, carry .whl): the batch-norm suite, bf16 in / fp32 params, with eager, FlagGems and
#            torch.compile (on an H200: not re-benched there since session 33).
#   PART=117 (~330 s, carry .whl): the layer / RMS suite, every dtype, with ATen, Liger and FlagGems.
#   PART=127 (~300 s; session 41): pytest -m cuda of the ops, modules, functional and aten tests, and every family's
#            conformance on CUDA (session 41's later fixes: one tensor in two arguments under fullgraph compile,
#            instance norm's aliased running statistics; the earlier ones ran at 6009b8f).
#   PART=128 (~150 s; session 42): the tile transpose's CUDA tests (batch norm's dy in x's layout is new) and its
#            A/B (benchmarks/layout_ab.py); keep batch norm's `tile_transpose` on if they pass and no row loses.
#   PART=126 (~480 s, carry .whl; written in session 41): PART=117, then ViT-B/16 and GPT-2 small steps with and
#            without enable() (last measured in session 10).
#   PART=110 (carry ab_old): CUDA tests, conformance and bn_kernels.py's rows, ab_old's src (before) against main's.
#   any other PART (carry .whl): every op's suite in every dtype, and resnet50 steps.
# Turn a prepared knob on only after its CUDA test passes and its A/B loses no row.
set -u -o pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=src
PART=${PART:-1}
OUT=${OUT:-/tmp/normkit-next}
W="$OUT/next$PART"
mkdir -p "$W"
T0=$(date +%s)
stamp() { echo "=== $1 at +$(( $(date +%s) - T0 ))s"; }
# the peers' wheels carried in .whl (liger-kernel, flag-gems and its needs), and the commit for the bench JSON
use_wheels() {
    if python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl; then
        export PYTHONPATH=/tmp/site:${NORMKIT_SRC:-src}  # NORMKIT_SRC: another tree's src (e.g. ab_old/src)
    fi
    export NORMKIT_GIT_SHA=${NORMKIT_GIT_SHA:-unknown}
}
# `pytest -m cuda` of the given tests within $1 s (SIGINT, so pytest still reports), its failures
cuda_tests() {
    local limit=$1; shift
    timeout -s INT "$limit" python3 -m pytest -q --tb=short -m cuda "$@" > "$W/pytest_cuda.log" 2>&1
    echo "pytest rc=$?"; tail -1 "$W/pytest_cuda.log"; grep -E "^FAILED|^E  " "$W/pytest_cuda.log" | head -20
}
# the layer / RMS suite bench in every dtype with the peers (budget $1 s) into $W/$2
ln_suite_bench() {
    timeout $(( $1 + 20 )) python3 -m normkit bench --ops layer_norm rms_norm --all-dtypes --peers aten liger flaggems \
        --budget "$1" --json "$W/$2/bench.json" --out "$W/$2" --no-progress \
        > "$W/$2.log" 2>&1; echo "bench rc=$?"; sed -n '/## Headline/,/^!\[/p' "$W/$2/summary.md" | head -30
}
{
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
if [ "$PART" = 121 ]; then  # session 40 (carry .whl): the unsqueezed-layout cases on CUDA; the batch-norm suite
    for impl in torch normkit; do
        stamp "conformance on CUDA, batch norm's unsqueezed cases, --impl $impl"
        timeout 90 python3 -m normkit check --impl $impl --device cuda --ops batch_norm --case unsqueezed \
            --json "$W/check-unsqueezed-$impl.json" > "$W/check-unsqueezed-$impl.log" 2>&1
        echo "check rc=$?"; grep -E "^FAIL|cases passed" "$W/check-unsqueezed-$impl.log" | head -20 | cut -c1-200
    done
    use_wheels
    stamp "bench: batch norm, bf16 in / fp32 params, with eager, FlagGems and torch.compile"
    timeout 490 python3 -m normkit bench --ops batch_norm --peers aten aten-native flaggems compile \
        --budget 450 --json "$W/bench/bench.json" --out "$W/bench" --no-progress \
        > "$W/bench.log" 2>&1; echo "bench rc=$?"; sed -n '/## Headline/,/^!\[/p' "$W/bench/summary.md" | head -12
elif [ "$PART" = 127 ]; then  # session 41: the host-side fixes on CUDA (tests of the ops, modules, functions, aten
    stamp "pytest -m cuda: ops, modules, functional, aten"   # routes) and every family's conformance
    cuda_tests 150 tests/ops tests/nn tests/test_functional.py tests/test_aten.py
    stamp "conformance on CUDA, every family"
    timeout 300 python3 -m normkit check --impl normkit --device cuda --quiet --json "$W/check.json" > "$W/check.log" 2>&1
    echo "check rc=$?"; grep -E "^FAIL" "$W/check.log" | head -10 | cut -c1-200; tail -2 "$W/check.log"
elif [ "$PART" = 123 ]; then  # session 40 (carry .whl): validation on whatever GPU comes, then the layer / RMS suite
    stamp "pytest -m cuda: ops, modules, functional, aten, custom ops"
    cuda_tests 150 tests/ops tests/nn tests/test_functional.py tests/test_aten.py
    stamp "conformance on CUDA, every family, normkit"
    timeout 150 python3 -m normkit check --impl normkit --device cuda --quiet --json "$W/check.json" > "$W/check.log" 2>&1
    echo "check rc=$?"; grep -E "^FAIL" "$W/check.log" | head -10 | cut -c1-200; tail -2 "$W/check.log"
    stamp "conformance on CUDA, batch norm's unsqueezed cases, torch's kernels"
    timeout 60 python3 -m normkit check --impl torch --device cuda --ops batch_norm --case unsqueezed \
        --json "$W/check-unsqueezed-torch.json" > "$W/check-unsqueezed-torch.log" 2>&1
    echo "check rc=$?"; grep -E "^FAIL|cases passed" "$W/check-unsqueezed-torch.log" | head -20 | cut -c1-200
    stamp "randomized test on CUDA: batch, instance, group norm (fresh seed)"
    seed=${SEED:-$RANDOM$RANDOM}; echo "NORMKIT_RANDOM_SEED=$seed"
    NORMKIT_RANDOM_SEED=$seed timeout -s INT 60 python3 -m pytest -q --tb=short -m cuda tests/test_randomized.py \
        -k "batch_norm or instance or group" > "$W/pytest_randomized_cuda.log" 2>&1
    echo "pytest rc=$?"; tail -1 "$W/pytest_randomized_cuda.log"; grep -E "^FAILED|^E  " "$W/pytest_randomized_cuda.log" | head -20 | cut -c1-300
    use_wheels
    stamp "bench: layer and RMS norm, every dtype, with ATen, Liger and FlagGems"
    ln_suite_bench $(( 540 - $(date +%s) + T0 )) bench-ln
elif [ "$PART" = 119 ] || [ "$PART" = 122 ]; then  # session 39 (carry .whl): randomized CUDA tests at the new fold; the layer / RMS suite
    stamp "randomized test on CUDA: batch, instance, group norm (fresh seed)"
    seed=${SEED:-$RANDOM$RANDOM}; echo "NORMKIT_RANDOM_SEED=$seed"
    NORMKIT_RANDOM_SEED=$seed timeout -s INT ${RANDOM_S:-90} python3 -m pytest -q --tb=short -m cuda tests/test_randomized.py \
        -k "batch_norm or instance or group" > "$W/pytest_randomized_cuda.log" 2>&1
    echo "pytest rc=$?"; tail -1 "$W/pytest_randomized_cuda.log"; grep -E "^FAILED|^E  " "$W/pytest_randomized_cuda.log" | head -20 | cut -c1-300
    use_wheels
    stamp "bench: layer and RMS norm, every dtype, with ATen, Liger and FlagGems"
    ln_suite_bench ${LN_S:-300} bench-ln
    if [ "$PART" = 122 ]; then
        stamp "resnet50 training steps (both layouts), with and without enable()"
        timeout 130 python3 -m normkit bench --models resnet50 --json "$W/models/bench.json" --out "$W/models" \
            --no-progress > "$W/models.log" 2>&1; echo "models rc=$?"; grep -iE "resnet|speedup|step" "$W/models/summary.md" | head -20
    fi
elif [ "$PART" = 120 ]; then  # (kind nvidia-h100-x2 or larger, where lent) SyncBatchNorm over NCCL, a GPU a rank
    stamp "SyncBatchNorm over NCCL ($(nvidia-smi -L | wc -l) GPUs) and the other distributed tests"
    timeout -s INT 300 python3 -m pytest -q --tb=short tests/test_distributed.py > "$W/pytest_distributed.log" 2>&1
    echo "pytest rc=$?"; tail -1 "$W/pytest_distributed.log"; grep -E "^FAILED|^E  |SKIP" "$W/pytest_distributed.log" | head -20
elif [ "$PART" = 103 ]; then  # (carry .whl) batch norm's headline dtype against every peer (the every-dtype bench's
    use_wheels                  # budget leaves FlagGems' slow rows out)
    stamp "bench: batch norm, bf16 in / fp32 params, with eager, FlagGems and torch.compile"
    timeout 540 python3 -m normkit bench --ops batch_norm --peers aten aten-native flaggems compile \
        --budget 500 --json "$W/bench/bench.json" --out "$W/bench" --no-progress \
        > "$W/bench.log" 2>&1; echo "bench rc=$?"; sed -n '/## Headline/,/^!\[/p' "$W/bench/summary.md" | head -12
    grep -cE "\| (ok|skip)" "$W/bench.log"; grep -E "unavailable|skip" "$W/bench.log" | head -5
elif [ "$PART" = 117 ] || [ "$PART" = 126 ]; then  # the layer / RMS suite with the peers
    use_wheels
    stamp "bench: layer and RMS norm, every dtype, with ATen, Liger and FlagGems"
    ln_suite_bench ${LN_S:-300} bench-ln
    if [ "$PART" = 126 ]; then  # session 41: the transformer steps, last measured in session 10
        stamp "ViT-B/16 and GPT-2 small training steps, with and without enable()"
        timeout 150 python3 -m normkit bench --models vit_b16 gpt2 --json "$W/models/bench.json" --out "$W/models" \
            --no-progress > "$W/models.log" 2>&1; echo "models rc=$?"; grep -iE "vit|gpt" "$W/models/summary.md" | head -12
    fi
elif [ "$PART" = 129 ]; then  # session 43: route tests on CUDA, then the model zoo with the native replay loaded
    stamp "pytest -m cuda: fast routes (batch norm's test rewritten in session 43), layer-norm ops"
    cuda_tests 150 tests/ops/test_bn_routes.py tests/ops/test_ln_routes.py tests/ops/test_gn_routes.py \
        tests/ops/test_ops_layer_norm.py
    stamp "host cost a call: the routes off / on (batch norm's eval and group norm's routes, session 43, with them)"
    timeout 170 python3 benchmarks/host_overhead.py --out "$W/host" --calls 100 --rounds 2 --ab-rounds 4 \
        > "$W/host.log" 2>&1; echo "host rc=$?"; grep -E "eval|routes off" "$W/host.log" | head -12
    stamp "model zoo, every model, with and without enable()"
    timeout 330 python3 benchmarks/model_zoo.py --out "$W/zoo" --budget 270 > "$W/zoo.log" 2>&1
    echo "zoo rc=$?"; head -1 "$W/zoo.log"; tail -1 "$W/zoo.log"
    grep "^| [a-z]" "$W/zoo/model_zoo.md" | awk -F'|' '{print $2,$3,$4,$12,$16}' | head -40
elif [ "$PART" = 130 ]; then  # session 43 (any GPU, ~400 s, carry .whl): the looped wide forward's variants against
    # today's split forward, and FlagGems / Liger on the same rows in the same lease (NOTES-layer_norm, session 43)
    stamp "ln_kernels.py sweep fwdloopvec"
    timeout 300 python3 benchmarks/ln_kernels.py --sweep --groups fwdloopvec --no-rows --budget 560 \
        --sweep-budget 280 --out "$W/sweep" > "$W/sweep.log" 2>&1; echo "sweep rc=$?"; grep -E "fwdloopvec|best" "$W/sweep.log" | head -60
    use_wheels
    stamp "bench: the same rows with FlagGems and Liger"
    timeout 100 python3 -m normkit bench --ops rms_norm layer_norm --shapes 2048x65536 4096x32768 512x262144 \
        --all-dtypes --peers flaggems liger --budget 80 --json "$W/bench/bench.json" --out "$W/bench" --no-progress \
        > "$W/bench.log" 2>&1; echo "bench rc=$?"; grep -E "^\| (rms|layer)_norm|^\| [0-9]+x[0-9]+" "$W/bench/summary.md" | grep fwd | head -20
elif [ "$PART" = 128 ]; then  # session 42 (~150 s): the tile transpose's uses (batch norm's knob new, group norm's on)
    stamp "pytest -m cuda: the tile transpose, instance norm, batch / group norm with dy in the other layout"
    cuda_tests 100 tests/kernels/test_layout.py tests/test_aten.py -k "layout or transpose or instance or other_layout"
    stamp "layout A/B: tile_transpose 0 against 1, aten, copy"
    timeout 120 python3 benchmarks/layout_ab.py --json "$W/layout_ab.json" > "$W/layout_ab.log" 2>&1
    echo "ab rc=$?"; cat "$W/layout_ab.log" | tail -8
elif [ "$PART" = 110 ]; then  # (carry ab_old: another tree's src) the CUDA tests, conformance, bn_kernels.py before / after
    stamp "pytest -m cuda: ${TESTS:-batch-norm and group-norm kernels}"
    cuda_tests ${PYTEST_S:-220} ${TESTS:-tests/kernels/test_batch_norm_kernels.py tests/kernels/test_group_norm_kernels.py}
    if [ "${CHECK_S:-120}" != 0 ]; then
        stamp "conformance on CUDA: ${CHECK_OPS:=batch_norm,group_norm,instance_norm}"
        timeout ${CHECK_S:-120} python3 -m normkit check --impl normkit --device cuda --ops $CHECK_OPS \
            --quiet --json "$W/check.json" > "$W/check.log" 2>&1; echo "check rc=$?"; tail -4 "$W/check.log" | cut -c1-160
    fi
    for round in ${AB_ROUNDS:-1}; do
        for side in before after; do
            stamp "batch norm ${AB_MODES:-fwd}, every kernel path's rows, $side (round $round)"
            src=src; [ "$side" = before ] && src=ab_old/src
            PYTHONPATH=$src timeout 110 python3 benchmarks/bn_kernels.py --out "$W/$side$round" --no-variants \
                --modes ${AB_MODES:-fwd} --dtypes bf16,fp32 --budget ${AB_BUDGET:-35} ${AB_SHAPES:+--shapes $AB_SHAPES} \
                > "$W/$side$round.log" 2>&1
            echo "bn_kernels rc=$?"
        done
        python3 benchmarks/ab_compare.py "$W/before$round/bn_kernels.jsonl" "$W/after$round/bn_kernels.jsonl" \
            --json "$W/ab$round.json" | tail -${AB_TAIL:-50}
    done
else
    use_wheels
    stamp "bench: batch, layer, RMS norm, every dtype"
    timeout 300 python3 -m normkit bench --ops batch_norm layer_norm rms_norm --all-dtypes \
        --peers aten aten-native liger flaggems --budget 270 --json "$W/bench/bench.json" --out "$W/bench" --no-progress \
        > "$W/bench.log" 2>&1; echo "bench rc=$?"; sed -n '/## Headline/,/^!\[/p' "$W/bench/summary.md" | head -30
    stamp "bench: group and instance norm"
    timeout 130 python3 -m normkit bench --ops group_norm instance_norm --all-dtypes --peers aten liger flaggems \
        --budget 110 --json "$W/bench-gn/bench.json" --out "$W/bench-gn" --no-progress \
        > "$W/bench-gn.log" 2>&1; echo "bench rc=$?"; sed -n '/## Headline/,/^!\[/p' "$W/bench-gn/summary.md" | head -30
    stamp "resnet50 training steps (both layouts), with and without enable()"
    timeout 120 python3 -m normkit bench --models resnet50 --json "$W/models/bench.json" --out "$W/models" --no-progress \
        > "$W/models.log" 2>&1; echo "models rc=$?"; grep -iE "resnet|speedup|step" "$W/models/summary.md" | head -20
fi
stamp "done"
} 2>&1 | tee "$OUT/summary$PART.log"
tar czf "$OUT/next$PART.tgz" -C "$OUT" "next$PART"
