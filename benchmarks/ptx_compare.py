"""Which kernels two revisions compile to the same sm_90 instructions, without a GPU.

    git worktree add /tmp/rev <REV>      # or: mkdir /tmp/rev && git archive <REV> src | tar -x -C /tmp/rev
    PYTHONPATH=<triton 3.6 site>:/tmp/rev/src python benchmarks/offline_audit.py --ops batch_norm --json before.json
    PYTHONPATH=<triton 3.6 site>:src python benchmarks/offline_audit.py --ops batch_norm --json after.json
    python benchmarks/ptx_compare.py before.json after.json [--default C_ALIGN=1 ...]

Specializations are matched by kernel name, declared constexprs and launch options; ``code`` is offline_audit's digest of
the PTX instructions (parameter loads and debug information left out). A change meant to keep some kernels as
they were (a refactor, a knob off by default) then shows which did and which did not, before any GPU time:
session 13 checked its batch-norm change this way (NOTES-batch_norm.md). ``--default NAME=VALUE``: a constexpr added
since, left out of the match where it holds its default (session 37's C_ALIGN).
"""

import argparse
import json
import sys


def _key(row, defaults):
    consts = {k: v for k, v in row["constexprs"].items() if defaults.get(k, object()) != str(v)}
    return row["kernel"], json.dumps(consts, sort_keys=True), json.dumps(row["options"], sort_keys=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("before")
    ap.add_argument("after")
    ap.add_argument("--default", action="append", default=[], metavar="NAME=VALUE",
                    help="a constexpr left out of the match where it has this value")
    a = ap.parse_args()
    defaults = dict(d.split("=", 1) for d in a.default)
    rows = []
    for path in (a.before, a.after):
        with open(path) as f:
            rows.append({_key(r, defaults): r for r in json.load(f)})
    before, after = rows
    same = changed = 0
    for key in sorted(set(before) | set(after)):
        b, c = before.get(key), after.get(key)
        if b is None or c is None:
            print(f"{'only after ' if b is None else 'only before'} {key[0]} {key[1]} {key[2]}")
            continue
        if b["code"] == c["code"]:
            same += 1
        else:
            changed += 1
            print(f"changed     {key[0]} {key[1]} {key[2]} (registers {b['registers']} -> {c['registers']})")
    print(f"{same} specializations the same, {changed} changed, "
          f"{len(set(before) ^ set(after))} in one revision only")
    return 0


if __name__ == "__main__":
    sys.exit(main())
