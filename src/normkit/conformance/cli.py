"""`python -m normkit check`: conformance of a backend against the ATen contract."""

from __future__ import annotations

import argparse
import shlex
import sys
import time

from normkit.cli import cannot_write_file, ops_error, split_names
from normkit.conformance import report
from normkit.conformance.cases import FAMILIES


def _count(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid int value: {text!r}") from None
    if n < 0:  # a negative limit would report failures that never happened ("... and 1 more")
        raise argparse.ArgumentTypeError(f"must be >= 0, got {n}")
    return n


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m normkit check",
        description="Check a backend's normalization ops against the ATen contract (float64 oracle: "
                    "normkit.reference). Exit status 1 when any case fails.")
    p.add_argument("--impl", default="normkit",
                   help="torch (torch.ops.aten + torch.nn.functional), normkit (normkit.ops + "
                        "normkit.functional), or an importable MODULE exposing aten-named functions "
                        "(default: normkit)")
    p.add_argument("--within", default=None, metavar="CONTEXT",
                   help="run the backend's calls inside this context manager: a dotted name of a callable "
                        "returning one, or a call of it with literal arguments. E.g. --impl torch --within "
                        "normkit.enabled checks torch's ops as normkit.enable() overrides them (CUDA); --within "
                        "'flag_gems.use_gems(include=[\"native_layer_norm\"])' as FlagGems does. torch's own "
                        "kernels, outside it, stay the baseline")
    p.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N or mps (default: cpu)")
    p.add_argument("--ops", nargs="+", default=None,
                   help=f"op families, comma or space separated (default: all: {','.join(FAMILIES)})")
    p.add_argument("--case", default=None, help="only cases whose name contains this substring")
    p.add_argument("--exact", action="store_true", help="--case must match the whole case name")
    p.add_argument("--json", dest="json_path", default=None, metavar="FILE", help="write a JSON report")
    p.add_argument("--list", action="store_true", help="list the selected cases and exit")
    p.add_argument("--no-errors", action="store_true", help="skip the error (bad input) cases")
    p.add_argument("--max-failures", type=_count, default=200, help="failures printed in full (default 200)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument("--oracle", default="normkit.reference", help=argparse.SUPPRESS)
    return p


def normkit_path(device: str) -> str:
    """Which of normkit's implementations runs on ``device``: its Triton kernels or its float64-accurate
    reference (the choice of normkit.ops._select)."""
    import torch

    from normkit import kernels

    probe = torch.empty(0, device=device)
    if kernels.runs_kernels_on(probe):
        where = "interpreter" if probe.device.type == "cpu" else "CUDA"
        return f"Triton kernels ({where}; float64 cases run the reference)"
    if probe.device.type == "cpu" and kernels.available():
        return "reference (CPU; set TRITON_INTERPRET=1 to check the Triton kernels through the interpreter)"
    return f"reference ({probe.device.type}{'' if kernels.available() else '; Triton does not import'})"


def run_cases(runner, todo: list, quiet: bool):
    """(outcomes, interrupted): the outcomes of the cases in ``todo``, those before a Ctrl-C if one stops the run."""
    bar = None if quiet else report.Progress(len(todo))
    outcomes = []
    try:
        for outcome in runner.run(todo, progress=bar.step if bar else None):
            outcomes.append(outcome)
    except KeyboardInterrupt:
        return outcomes, True
    finally:
        if bar:
            bar.close()
    return outcomes, False


def _conflict(args) -> str | None:
    """Why the flags given cannot go together (one would be silently ignored), or None."""
    if args.exact and args.case is None:
        return "--exact: matches --case's name exactly; give --case NAME"
    if args.list and args.json_path:
        return "--list prints the case names only; --json writes a run's report: give one of them"
    return None


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    families = list(FAMILIES) if args.ops is None else split_names(args.ops)
    why = ops_error(families, FAMILIES) or _conflict(args)
    if why:
        print(why, file=sys.stderr)
        return 2

    if args.json_path:
        # checked before the run (minutes): a bad path used to crash after it, with the "cases failed" status
        why = cannot_write_file(args.json_path)
        if why:
            print(f"--json {args.json_path}: cannot write a file there ({why})", file=sys.stderr)
            return 2

    import torch

    from normkit.conformance.backends import ScopedBackend, load_backend, load_context
    from normkit.conformance.runner import Runner, load_oracle, select

    try:
        dev = torch.device(args.device)
    except RuntimeError as e:  # exit status 1 means "a case failed": a bad flag is a usage error
        print(f"--device {args.device}: {e}", file=sys.stderr)
        return 2
    if dev.type not in ("cpu", "cuda", "mps", "meta"):  # torch knows the name; its cases would crash on it
        print(f"--device {args.device}: check runs on cpu, cuda, cuda:N or mps", file=sys.stderr)
        return 2
    if dev.type == "meta":  # the rules compare values: meta tensors have none (the run would crash)
        print("--device meta: meta tensors hold no values to check; use cpu, cuda or mps", file=sys.stderr)
        return 2
    if dev.type == "cuda" and not torch.cuda.is_available():
        print(f"--device {args.device}: no CUDA device available", file=sys.stderr)
        return 2
    if dev.type == "cuda" and (dev.index or 0) >= torch.cuda.device_count():
        print(f"--device {args.device}: no such CUDA device ({torch.cuda.device_count()} available)", file=sys.stderr)
        return 2
    if dev.type == "mps" and not (hasattr(torch.backends, "mps") and torch.backends.mps.is_available()):
        print(f"--device {args.device}: no MPS device available", file=sys.stderr)
        return 2

    cases, errs = select(families, args.case, args.exact, not args.no_errors)
    if not cases and not errs:  # a misspelt --case would otherwise "pass" with nothing checked
        print(f"no case matches --case {args.case!r} in {', '.join(families) or 'any family'}"
              " (--list shows the names)", file=sys.stderr)
        return 2
    if args.list:
        for c in cases + errs:
            print(c.name)
        return 0

    try:
        oracle, missing = load_oracle(args.oracle, families)
    except Exception as e:  # noqa: BLE001
        print(f"cannot import the oracle {args.oracle}: {type(e).__name__}: {e}", file=sys.stderr)
        return 2
    if missing:
        print(f"the oracle {args.oracle} lacks {', '.join(missing)}", file=sys.stderr)
        return 2
    try:
        backend = load_backend(args.impl)
    except Exception as e:  # noqa: BLE001
        print(f"cannot load --impl {args.impl}: {type(e).__name__}: {e}", file=sys.stderr)
        return 2
    if args.within:
        try:
            backend = ScopedBackend(backend, load_context(args.within), args.within)
            with backend.scope():  # once up front: a context that cannot be entered would fail every case
                pass
        except Exception as e:  # noqa: BLE001
            print(f"--within {args.within}: {type(e).__name__}: {e}", file=sys.stderr)
            return 2
    impl = args.impl + (f" --within {shlex.quote(args.within)}" if args.within else "")
    # named where normkit's code is what is checked: --impl normkit, or another backend within normkit's enabled()
    checks_normkit = args.impl == "normkit" or (args.within or "").startswith("normkit.")
    path = normkit_path(args.device) if checks_normkit else None

    runner = Runner(backend, args.device, oracle)
    todo = runner.applicable(cases + errs)
    t0 = time.monotonic()
    outcomes, interrupted = run_cases(runner, todo, args.quiet)
    elapsed = time.monotonic() - t0

    print(f"normkit check --impl {impl} --device {args.device}  (torch {torch.__version__}; "
          f"oracle {args.oracle} in float64; {elapsed:.1f}s)")
    if path:
        print(f"normkit path: {path}")
    stopped = f"INTERRUPTED (Ctrl-C): {len(outcomes)} of {len(todo)} cases checked" if interrupted else ""
    if stopped:
        print(stopped + "; the table holds those")
    print(report.format_table(report.summarize(outcomes)))
    if runner.not_present:
        print("not present: " + ", ".join(f"{k} ({v})" for k, v in sorted(runner.not_present.items())))
    if args.within:
        unchanged = runner.ops_with_torchs_bits()
        if unchanged:
            print(f"same bits as torch's own kernels in every output compared: {', '.join(unchanged)} "
                  f"(--within {args.within} may not override them on {args.device})")
    hazards = sorted({r.case for o in outcomes for r in o.results if r.detail.startswith("raw aten ")})
    if hazards:
        print(f"unchecked by aten (would crash): {len(hazards)} bad-input case(s) fed through F.batch_norm "
              "instead of raw aten (contract §2.5): " + ", ".join(hazards))
    failures = report.format_failures(outcomes, args.impl, args.device, args.max_failures, args.within,
                                      args.json_path)
    if failures:
        print("\n" + failures)
    if args.json_path:
        from normkit.bench.runner import run_metadata

        meta = {"impl": args.impl, "within": args.within, "normkit_path": path, **run_metadata(args.device),
                "seconds": round(elapsed, 2), "oracle": args.oracle, "ops": families, "interrupted": interrupted,
                "same_bits_as_torch": runner.ops_with_torchs_bits() if args.within else None}
        report.write_json(args.json_path, report.to_json(outcomes, runner.not_present, meta))
    failed = sum(1 for o in outcomes if not o.passed)
    if not outcomes and not interrupted:  # nothing checked is no pass: a backend without any of the functions
        print("no case ran: the backend has none of the selected functions (see 'not present')")
        return 1
    print(f"\n{len(outcomes) - failed} of {len(outcomes)} cases passed" + (f", {failed} FAILED" if failed else "")
          + (f"; {stopped}" if stopped else ""))
    if interrupted:
        return 130  # the shell's status for a run stopped by SIGINT
    return 1 if failed else 0
