"""`python -m normkit bench`: argument parsing and the run's orchestration."""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time

import torch

from normkit.bench import cases as C
from normkit.bench import models as M
from normkit.bench import report
from normkit.bench.impls import ALL_PEERS, make_impls
from normkit.bench.runner import (Context, accuracy_units, copy_bandwidth, copy_nbytes, estimate_seconds, fmt_s,
                                  headline_dtypes, run_accuracy, run_case, run_metadata, skipped_for_budget,
                                  unscoped)
from normkit.bench.timing import Progress, Timer
from normkit.cli import cannot_make_folder, cannot_write_file, ops_error, split_names

COMPILE_NOTE = ("torch.compile(dynamic={dyn}) of the eager F.* call, compiled {once}{scope}; every "
                "implementation (compile included) is timed on CUDA as the replay of a CUDA graph that holds the "
                "rotated calls, so Python, dispatcher, guard and launch overhead are excluded; the first call "
                "(compilation) is reported as first_call_s, not timed")
TIMING_NOTE = ("median over replays of a CUDA graph holding the calls, rotating among {{k}} input sets so "
               "that the working set is >= 4x L2 (CUDA events; eager CUDA events where capture fails: "
               "timer=cuda-events); warmup {w} ms, rep {r} ms; {n} rounds per case with the implementations "
               "in alternating order, each row keeping its fastest round (ms_rounds lists them)")

EPILOG = """examples:
  python -m normkit bench                                 # the suite at each op's headline dtype, every peer
  python -m normkit bench --dtype-slots 1,2,3             # the suite's other dtypes
  python -m normkit bench --all-dtypes --peer-scope all --compile-dynamic   # everything (est. ~15 min on an
                                                          # H200; benchmarks/run_h200.sh splits it in two)
  python -m normkit bench --ops layer_norm,rms_norm --dtypes bf16 --peers aten,liger
  python -m normkit bench --ops batch_norm --shapes 256x64x56x56 --layouts channels_last --modes train
  python -m normkit bench --accuracy                      # error vs float64, randn and randn+1000
  python -m normkit bench --models resnet50 --steps 20    # whole training steps, with / without enable()
  python -m normkit bench --quick --json out.json --out outdir   # tiny sizes on CPU (CI)
"""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m normkit bench", epilog=EPILOG,
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                description="Side-by-side benchmarks of normkit against ATen eager (cuDNN on/off), "
                                            "torch.compile, Liger-Kernel and FlagGems, checked against float64.")
    p.add_argument("--quick", action="store_true", help="tiny sizes on CPU: tests the harness (CI)")
    p.add_argument("--device", choices=["cuda", "cpu"], default=None, help="default: cuda when available")
    p.add_argument("--suite", default=None, help="suite JSON (default: the packaged copy of the public suite)")
    p.add_argument("--ops", nargs="+", default=None, help=f"subset of {','.join(C.OPS)}")
    p.add_argument("--shapes", nargs="+", default=None,
                   help="suite shapes to keep, like 256x64x56x56 (group norm: 32x256x64x64/g32); a shape the suite "
                        "lacks (e.g. 16384x5120) is benchmarked too, for each op whose input it can be")
    p.add_argument("--dtypes", nargs="+", default=None, help="input dtypes (bf16, fp32, ...) or pairs bf16:fp32")
    p.add_argument("--dtype-slots", nargs="+", default=None,
                   help="positions in each op's suite dtype list, e.g. 1,2,3 (0 = the op's first, headline "
                        "dtype). Default on CUDA: 0 alone, unless --dtypes or --all-dtypes is given")
    p.add_argument("--all-dtypes", action="store_true",
                   help="every dtype of the suite (--dry-run prints the estimated time)")
    p.add_argument("--layouts", nargs="+", default=None, help="contiguous, channels_last")
    p.add_argument("--modes", nargs="+", default=None, help="train (fwd+bwd), eval (batch norm fwd)")
    p.add_argument("--peers", nargs="+", default=None,
                   help=f"subset of {','.join(ALL_PEERS)}, 'all' or 'none' (normkit always runs); "
                        "default: all on CUDA, aten,aten-native on CPU")
    p.add_argument("--peer-scope", "--compile-scope", dest="peer_scope", choices=["headline", "all"],
                   default="headline",
                   help="headline (default): torch.compile and FlagGems (the peers that compile or autotune "
                        "per shape) run on each op's first suite dtype only; all: every row (--dry-run "
                        "prints the estimated time)")
    p.add_argument("--compile-dynamic", action="store_true",
                   help="compile with dynamic=True, one compiled fn per (op, mode, dtypes, layout, ndim)")
    p.add_argument("--compile-mode", default=None, help="torch.compile mode (default: torch's default)")
    p.add_argument("--warmup-ms", type=float, default=None, help="default 5 (CUDA), 1 (CPU)")
    p.add_argument("--rep-ms", type=float, default=None,
                   help="default 25 (CUDA; each replay holds >= 1 ms of calls), 3 (CPU)")
    p.add_argument("--rounds", type=int, default=None,
                   help="timing rounds per case, implementations in alternating order, each row keeping its "
                        "fastest (default 2 on CUDA, 1 on CPU)")
    p.add_argument("--no-graphs", action="store_true", help="time eagerly with CUDA events (no CUDA graphs)")
    p.add_argument("--budget", type=_positive_float, default=None,
                   help="seconds; rows not started when it is spent are recorded as skipped (the run is then "
                        "incomplete: 'complete' is false in --json)")
    p.add_argument("--perf", action="store_true", help="run the timing suite too when --accuracy/--models are given")
    p.add_argument("--accuracy", action="store_true", help="error against float64 per op/dtype, randn and randn+1000")
    p.add_argument("--accuracy-ops", nargs="+", default=None,
                   help="ops for --accuracy (default: --ops, else all), e.g. 'all' while --ops narrows the suite")
    p.add_argument("--models", nargs="*", default=None, metavar="MODEL",
                   help="whole training steps, with and without normkit.enable(), of the models named: "
                        f"{', '.join(sorted(set(M.MODELS) | set(M.ALIASES)))} (resnet and resnet50: both layouts; "
                        "all: the suite's models); no names = the suite's models (tiny on CPU)")
    p.add_argument("--steps", type=_positive_int, default=20, help="training steps per model and setting (default 20)")
    p.add_argument("--seed", type=int, default=0, help="seed of the inputs and the models' weights (default 0)")
    p.add_argument("--json", dest="json_path", default=None, help="write results JSON here")
    p.add_argument("--out", default=None, help="directory for summary.md and PNG plots")
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    p.add_argument("--dry-run", action="store_true", help="list the cases, estimate the GPU time, exit")
    p.add_argument("--strict", action="store_true", help="exit 1 when a normkit row is WRONG or an error")
    p.add_argument("--save-every", type=float, default=10.0,
                   help="seconds between rewrites of --json while running (default 10; a cut run keeps its rows)")
    return p


class _Stop(BaseException):
    """SIGTERM (e.g. from `timeout`): stop the run, write what there is."""


def _on_term(signum, frame):  # pragma: no cover - signal path
    raise _Stop(f"signal {signum}")


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:  # (NaN too) a budget of 0 or less skipped every row, and called the run complete
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value


def skipped_rows(result: dict) -> dict:
    """How many rows (suite, accuracy, models) were not run: in all, and for --budget."""
    rows = result["rows"] + result["accuracy"] + result["models"]
    return {"all": sum(r.get("status") == "skipped" for r in rows), "budget": sum(map(skipped_for_budget, rows))}


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    t_start = time.time()
    # output paths are checked before the run (minutes): a bad one used to crash, or be skipped, after it
    for flag, path, why in (("--json", args.json_path, args.json_path and cannot_write_file(args.json_path)),
                            ("--out", args.out, args.out and cannot_make_folder(args.out))):
        if why:
            print(f"bench: {flag} {path}: cannot write there ({why})", file=sys.stderr)
            return 2
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        print("bench: --device cuda but no CUDA device", file=sys.stderr)
        return 2
    quick = args.quick
    if device == "cpu" and not quick and not args.dry_run:
        print("bench: no CUDA device: running the --quick sizes on CPU", file=sys.stderr)
        quick = True
    try:
        suite = C.load_suite(args.suite)
    except Exception as e:
        print(f"bench: cannot read suite: {e}", file=sys.stderr)
        return 2
    ops = split_names(args.ops)
    why = ops is not None and ops_error(ops, C.OPS)
    if why:
        print(f"bench: {why}", file=sys.stderr)
        return 2
    peers = split_names(args.peers)
    if peers is None:
        peers = list(ALL_PEERS) if device == "cuda" else ["aten", "aten-native"]
    elif peers in (["all"],):
        peers = list(ALL_PEERS)
    elif peers in (["none"],):
        peers = []
    bad = [x for x in peers if x not in ALL_PEERS]
    if bad:
        print(f"bench: unknown peer(s) {bad}; known: {', '.join(ALL_PEERS)}", file=sys.stderr)
        return 2
    for flag, given, known in (("--layouts", split_names(args.layouts), C.LAYOUTS),
                               ("--modes", split_names(args.modes), C.MODES)):
        bad = [v for v in given or [] if v not in known]
        if bad:  # a misspelt filter would otherwise select nothing and "pass" with 0 rows
            print(f"bench: unknown {flag[2:-1]}(s) {bad}; known: {', '.join(known)}", file=sys.stderr)
            return 2
    if args.dtype_slots:
        try:
            slots = [int(v) for v in split_names(args.dtype_slots)]
        except ValueError as e:
            print(f"bench: --dtype-slots takes integers: {e}", file=sys.stderr)
            return 2
    elif args.all_dtypes or args.dtypes or quick:
        slots = None
    else:
        # the default narrowing: each op's headline dtype, every shape, layout, mode and peer; the other
        # dtypes with --all-dtypes or --dtype-slots 1,2,3
        slots = [0]
        if not (args.accuracy or args.models is not None) or args.perf:
            print("bench: each op's headline dtype only (the suite's first); --all-dtypes or --dtype-slots "
                  "1,2,3 for the others", file=sys.stderr)
    try:
        cases = C.expand_suite(suite, ops=ops, shapes=split_names(args.shapes), dtypes=split_names(args.dtypes),
                               layouts=split_names(args.layouts), modes=split_names(args.modes), quick=quick,
                               dtype_slots=slots)
    except ValueError as e:
        print(f"bench: {e}", file=sys.stderr)
        return 2
    if not cases and (args.perf or not (args.accuracy or args.models is not None)):
        print("bench: no suite case matches --ops / --dtypes / --dtype-slots / --layouts / --modes", file=sys.stderr)
        return 2
    acc_ops = split_names(args.accuracy_ops)
    if acc_ops in (None, []):
        acc_ops = ops or list(C.OPS)
    elif acc_ops == ["all"]:
        acc_ops = list(C.OPS)
    bad = [o for o in acc_ops if o not in C.OPS]
    if bad:
        print(f"bench: unknown --accuracy-ops {bad}; known: {', '.join(C.OPS)}", file=sys.stderr)
        return 2
    want_models = args.models is not None
    sections = {"perf": args.perf or not (args.accuracy or want_models), "accuracy": args.accuracy,
                "models": want_models}
    warmup = args.warmup_ms if args.warmup_ms is not None else (5.0 if device == "cuda" else 1.0)
    rep = args.rep_ms if args.rep_ms is not None else (25.0 if device == "cuda" else 3.0)
    impls = make_impls(peers, compile_dynamic=args.compile_dynamic, compile_mode=args.compile_mode)
    heads = headline_dtypes(suite)
    rounds = max(1, args.rounds or (2 if device == "cuda" else 1))

    if args.dry_run:
        est_dev = "cuda"  # a dry run plans a GPU run, also from a machine without one
        if device == "cpu" and not args.quick:
            print("bench: the cases a CUDA run would time (this machine's real run takes the --quick sizes)",
                  file=sys.stderr)
        if args.json_path:
            print(f"bench: --dry-run writes no {args.json_path}", file=sys.stderr)
        n_rows = sum(len(c.directions) for c in cases) * len(impls)
        for c in cases:
            print(c.label())
        est, seen = 0.0, set()
        for op in C.OPS:
            oc = [c for c in cases if c.op == op]
            if oc:
                t = estimate_seconds(oc, impls, scope=args.peer_scope, heads=heads, device=est_dev,
                                     seen_compile_keys=seen, rounds=max(1, args.rounds or 2))
                est += t
                print(f"  {op}: {len(oc)} cases, ~{fmt_s(t)}")
        print(f"{len(cases)} cases, {n_rows} rows ({len(impls)} implementations: "
              f"{', '.join(i.name for i in impls)}); estimated H200 time {fmt_s(est)} for the suite rows "
              f"(peer scope: {args.peer_scope}; a rough model, see runner.estimate_seconds; --models and "
              "--accuracy come on top)")
        return 0

    if device == "cpu" and quick:
        # tiny CPU ops on a shared machine: one thread avoids thread-pool wake-up stalls (ms-long) that
        # would dominate the timings and the CI run time
        torch.set_num_threads(1)
    timer = Timer(device, warmup_ms=warmup, rep_ms=rep, graphs=not args.no_graphs)
    ctx = Context(device=device, timer=timer, seed=args.seed, quick=quick, budget_s=args.budget, t0=t_start,
                  peer_scope=args.peer_scope, headline_dtypes=heads,
                  rounds=rounds)
    if device == "cuda":
        props = torch.cuda.get_device_properties(0)
        ctx.l2_bytes = getattr(props, "L2_cache_size", None) or (60 << 20)

    meta = run_metadata(device)
    versions = meta["versions"]  # the peers' and the models' libraries join it below
    for impl in impls:
        if impl.name in ("liger", "flaggems"):
            why = impl.unavailable()
            versions[impl.name] = impl.version if why is None else None
            why = why or ("it runs on CUDA only" if impl.cuda_only and device != "cuda" else None)
            if why:  # on every device: a table of n/a cells must say why
                print(f"bench: {impl.name}'s rows read n/a: {why}", file=sys.stderr)
    scope_txt = "" if args.peer_scope == "all" else \
        " (only on each op's first suite dtype, as FlagGems: --peer-scope all for every row)"
    result = {
        "schema": report.SCHEMA,
        "complete": False,
        **meta,
        "quick": quick,
        "config": {k: v for k, v in vars(args).items()} | {"peers": peers, "device": device, "dtype_slots": slots},
        "suite_file": os.path.abspath(args.suite) if args.suite else "packaged suite.json",
        "timing": {
            "method": (TIMING_NOTE.format(w=warmup, r=rep, n=ctx.rounds).replace("{k}", "k") if device == "cuda" else
                       f"CPU wall clock (time.perf_counter), median of batches; warmup {warmup} ms, rep {rep} ms"),
            "compile": COMPILE_NOTE.format(
                dyn=args.compile_dynamic, scope=scope_txt,
                once=("once per (op, mode, dtypes, layout, rank): one graph with symbolic sizes serves every "
                      "shape" if args.compile_dynamic else "once per case"))
            if device == "cuda" else (f"torch.compile(dynamic={args.compile_dynamic}) of the eager F.* call; "
                                      "timed on the CPU wall clock like every implementation, first call not "
                                      "timed"),
            "warmup_ms": warmup, "rep_ms": rep, "graphs": timer.graphs, "rounds": ctx.rounds,
        },
        "implementations": {i.name: i.note for i in impls},
        "oracle": "normkit.reference in float64 (torch float64 where a row's oracle field says so)",
        "copy_bytes": copy_nbytes(device, suite.get("copy_bytes", 1 << 30)),
        "copy_bandwidth_gbps": None,
        "rows": [],
        "accuracy": [],
        "models": [],
    }

    last_save = [0.0]

    def save(final=False, force=False):
        """Rewrite --json (throttled to one write per --save-every seconds unless forced): a run cut short
        keeps its rows."""
        if not args.json_path:
            return
        if not (final or force) and time.time() - last_save[0] < args.save_every:
            return
        result["elapsed_s"] = time.time() - t_start
        result["skipped_rows"] = skipped_rows(result)
        result["complete"] = bool(final and not result.get("interrupted") and not result["skipped_rows"]["budget"])
        try:
            report.write_json(report.clean_floats(result), args.json_path)
            last_save[0] = time.time()
            return True
        except Exception as e:
            print(f"bench: could not write {args.json_path}: {e}", file=sys.stderr)
            return False

    units = 1
    if sections["perf"]:
        units += len(cases) * len(impls)
    if sections["accuracy"]:
        units += accuracy_units(acc_ops, suite)
    if sections["models"]:
        try:
            model_names = M.resolve(split_names(args.models) or (["tiny"] if device == "cpu" else None))
        except ValueError as e:
            print(f"bench: {e}", file=sys.stderr)
            return 2
        units += 2 * len(model_names)
    progress = Progress(units, "bench", enabled=not args.no_progress)

    # SIGTERM (`timeout`) and Ctrl-C stop the run between rows and still write the tables, plots and JSON
    old_term = signal.signal(signal.SIGTERM, _on_term) if _main_thread() else None
    try:
        # copy bandwidth, the SOL ceiling of this run
        try:
            result["copy_bandwidth_gbps"] = ctx.copy_gbps = copy_bandwidth(ctx, int(result["copy_bytes"]))
        except Exception as e:
            print(f"bench: copy bandwidth failed: {type(e).__name__}: {e}", file=sys.stderr)
        progress.update(1, "copy bandwidth")
        save(force=True)

        # --models and --accuracy first: bounded and wanted whole; the suite rows, which a budget can cut
        # row by row, take what is left
        if sections["models"]:
            steps = args.steps if not quick else min(args.steps, 4)

            def model_done(rows_so_far):
                result["models"] = rows_so_far
                save(force=True)

            result["models"] = M.run_models(model_names, device, steps=steps,
                                            warmup=min(5, max(steps // 4, 1)), seed=args.seed,
                                            progress=progress, over_budget=ctx.over_budget,
                                            on_pair=model_done)
            for k in ("torchvision", "timm", "transformers"):
                versions[k] = _dist_version(k)
            save(force=True)
        if sections["accuracy"]:
            result["accuracy"] = run_accuracy(acc_ops, suite, impls, ctx, progress)
            save(force=True)

        if sections["perf"]:
            _run_perf(args, cases, impls, ctx, heads, progress, result, save, t_start)
    except (KeyboardInterrupt, _Stop) as e:
        result["interrupted"] = f"{type(e).__name__}: {e}".strip()
        print(f"\nbench: interrupted ({result['interrupted']}); writing what there is", file=sys.stderr)
    finally:
        if old_term is not None:
            signal.signal(signal.SIGTERM, old_term)
    progress.close()

    plots = []
    if args.out:
        if result["rows"]:
            try:
                plots = report.plot(result, args.out)
            except Exception as e:
                print(f"bench: plots failed: {type(e).__name__}: {e}", file=sys.stderr)
    result["elapsed_s"] = time.time() - t_start
    print(report.console_report(result))
    skipped = skipped_rows(result)
    print(f"\n{len(result['rows'])} rows, {len(result['accuracy'])} accuracy rows, {len(result['models'])} model "
          f"rows in {fmt_s(result['elapsed_s'])}"
          + (f"; {skipped['all']} skipped, {skipped['budget']} of them for --budget" if skipped["all"] else ""))
    if args.out:
        with open(os.path.join(args.out, "summary.md"), "w") as f:
            f.write(report.summary_markdown(result, plots))
        print(f"wrote {os.path.join(args.out, 'summary.md')}" + (f" and {len(plots)} plots" if plots else ""))
    if args.json_path:
        if not save(final=True):
            return 1
        print(f"wrote {args.json_path}")
    if args.strict:
        bad = [r for r in result["rows"] + result["accuracy"] if r["impl"] == "normkit"
               and r.get("status") in ("WRONG", "error")]
        return 1 if bad else 0
    return 0


def _main_thread() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()


def _run_perf(args, cases, impls, ctx, heads, progress, result, save, t_start):
    """The suite rows, op by op. With --budget, each op gets a slice of what is left in proportion to its
    estimated time (time an op leaves unused passes on to the next), so a budget-limited run still covers
    every op; inside a slice, torch.compile and FlagGems rows give way once running them would leave too
    little for the normkit / eager / Liger rows still to come (ctx.scoped_reserve_s)."""
    seen = set()
    est = {}
    for op in C.OPS:
        est[op] = estimate_seconds([c for c in cases if c.op == op], impls, scope=args.peer_scope, heads=heads,
                                   device=ctx.device, seen_compile_keys=seen, rounds=ctx.rounds)
    total_est = sum(est.values()) or 1.0
    perf_budget = None
    if args.budget is not None:
        perf_budget = args.budget - (time.time() - t_start)
    cheap = unscoped(impls)
    slice_start = time.time()
    spent_share = 0.0
    try:
        for op in C.OPS:
            op_cases = [c for c in cases if c.op == op]
            if not op_cases:
                continue
            if perf_budget is not None:
                spent_share += est[op] / total_est
                ctx.deadline = slice_start + perf_budget * spent_share
            for i, case in enumerate(op_cases):
                if perf_budget is not None:
                    rest = estimate_seconds(op_cases[i + 1:], cheap, scope=args.peer_scope, heads=heads,
                                            device=ctx.device, rounds=ctx.rounds)
                    ctx.scoped_reserve_s = 1.25 * rest
                result["rows"].extend(run_case(case, impls, ctx, progress))
                save()
            save(force=True)
    finally:
        ctx.deadline = None
        ctx.scoped_reserve_s = 0.0


def _dist_version(name):
    try:
        from importlib.metadata import version

        return version(name)
    except Exception:
        return None


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
