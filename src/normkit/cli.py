"""`python -m normkit {check,bench,info}`: each subcommand owns its own argument parser."""

import sys

USAGE = """usage: python -m normkit {check,bench,info} [options]

  check   conformance of a backend against the ATen contract (python -m normkit check -h)
  bench   side-by-side benchmarks against the peers (python -m normkit bench -h)
  info    versions, device, available kernels, whether enable() is active
"""


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    if command == "check":
        from normkit.conformance.cli import main as run
    elif command == "bench":
        from normkit.bench.cli import main as run
    elif command == "info":
        from normkit.info import main as run
    else:
        print(f"unknown command {command!r}\n\n{USAGE}", file=sys.stderr)
        return 2
    return run(rest)
