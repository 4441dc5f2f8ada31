"""`python -m normkit {check,bench,info}`: each subcommand owns its own argument parser."""

import os
import sys
from typing import Optional

USAGE = """usage: python -m normkit {check,bench,info} [options]
       python -m normkit --version

  check   conformance of a backend against the ATen contract (python -m normkit check -h)
  bench   side-by-side benchmarks against the peers (python -m normkit bench -h)
  info    versions, device, available kernels, whether enable() is active
"""


def cannot_write_file(path: str) -> Optional[str]:
    """Why a file cannot be written at ``path`` (asked before a run of minutes, so that a bad path is a usage error
    up front, not a crash after the run), or None. Missing folders above it are made, as ``--out``'s are; a file
    the probe creates is removed again."""
    if os.path.isdir(path):
        return "it is a folder"
    parent = os.path.dirname(path)
    if parent:
        try:
            os.makedirs(parent, exist_ok=True)
        except OSError as e:
            return e.strerror or str(e)
    existed = os.path.exists(path)
    try:
        with open(path, "a"):
            pass
    except OSError as e:
        return e.strerror or str(e)
    if not existed:
        os.remove(path)
    return None


def cannot_make_folder(path: str) -> Optional[str]:
    """Why ``path`` cannot be (made) a writable folder, or None; the folder is made."""
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as e:
        return e.strerror or str(e)
    return None if os.access(path, os.W_OK) else "it is not writable"


def split_names(values: Optional[list]) -> Optional[list]:
    """The names a list option was given, as one or more arguments, each comma-separated ("a,b c" -> [a, b, c]);
    None when the option was not given."""
    if values is None:
        return None
    return [name.strip() for value in values for name in str(value).split(",") if name.strip()]


def ops_error(ops: list, known) -> Optional[str]:
    """Why the op families given to --ops cannot be run (none named, or unknown ones), or None."""
    if not ops:  # a blank --ops would otherwise read as "every family" (minutes)
        return f"--ops names no op family; choose from {', '.join(known)}"
    unknown = [op for op in ops if op not in known]
    if unknown:
        return f"unknown op family {', '.join(unknown)}; choose from {', '.join(known)}"
    return None


def main(argv=None) -> int:
    try:
        status = _dispatch(list(sys.argv[1:] if argv is None else argv))
        sys.stdout.flush()  # inside the try: a reader gone before the last buffered line is a broken pipe too
    except BrokenPipeError:
        # the reader left (`... | head -2`): no traceback; stdout to devnull, so that Python's own flush at exit
        # does not hit the closed pipe again
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    return status


def _dispatch(argv: list) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE, file=sys.stdout if argv else sys.stderr)
        return 0 if argv else 2
    if argv[0] in ("-V", "--version"):
        from normkit import __version__

        print(f"normkit {__version__}")
        return 0
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
