"""Does the wide layer / RMS forward read x once from HBM if it runs in row groups that fit L2?

    PYTHONPATH=src python benchmarks/ln_group_probe.py --out DIR [--budget SECONDS] [--dry]

Rows of 32768+ elements take the split-row kernels: one launch up to 65536 wide (each row's last program re-reads
and writes the whole row alone) or two launches wider (statistics over every row, then y, which re-reads x from
HBM: 3 passes, at most 0.67 SOL). Here the two launches run per group of rows whose x fits a budget of L2
(``grp<MB>``): the second launch should find the group's x in L2, so HBM sees x once and y once, at the price of two
kernel boundaries per group. Timed in CUDA graphs (``normkit.bench.timing.Timer``), next to today's path
(``default``), the two launches over all rows (``split2``) and a copy (the SOL ceiling). Each line of
``DIR/ln_group_probe.jsonl`` has ms and SOL (read x + write y over the copy bandwidth).
"""

import argparse
import json
import os
import sys
import time

if "--dry" in sys.argv:  # CPU check of the script: the Triton interpreter, tiny shapes
    os.environ.setdefault("TRITON_INTERPRET", "1")

import torch  # noqa: E402

from normkit.bench.runner import Context, copy_bandwidth  # noqa: E402
from normkit.bench.timing import Timer  # noqa: E402
from normkit.kernels import layer_norm as L  # noqa: E402

SHAPES = [(2048, 65536), (512, 262144), (4096, 32768)]
GROUP_MB = (8, 16, 24, 32, 48)


def forward(op, x, w, b, eps=1e-5):
    return L.rms_forward(x, w, eps) if op == "rms" else L.ln_forward(x, w, b, eps)


def grouped(op, x, w, b, rows):
    """The forward over row groups of ``rows`` rows, each on the two-launch split path."""
    return [forward(op, x[r:r + rows], w, b) for r in range(0, x.shape[0], rows)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--budget", type=float, default=200.0)
    ap.add_argument("--dry", action="store_true")
    a = ap.parse_args()
    dev = "cpu" if a.dry else "cuda"
    shapes = [(8, 40000)] if a.dry else SHAPES
    groups = (0.2,) if a.dry else GROUP_MB
    os.makedirs(a.out, exist_ok=True)
    timer = Timer(dev)
    copy_gbps = copy_bandwidth(Context(device=dev, timer=timer), 1 << 28)
    print(f"copy {copy_gbps:.0f} GB/s", flush=True)
    base = dict(L._CFG)
    two = {"fwd_split_fused_max_block": 0, "fwd_split_fused_max_block_heavy_params": 0}
    t0 = time.time()
    with open(os.path.join(a.out, "ln_group_probe.jsonl"), "a") as f:
        for (M, N) in shapes:
            for dt in (torch.bfloat16, torch.float32):
                x = torch.randn(M, N, device=dev, dtype=dt)
                w, b = torch.rand(N, device=dev, dtype=dt) + 0.5, torch.randn(N, device=dev, dtype=dt)
                nbytes = 2 * x.numel() * x.element_size()
                for op in ("ln", "rms"):
                    if time.time() - t0 > a.budget:
                        print("budget reached", flush=True)
                        return
                    L._CFG.update(two)
                    ref = forward(op, x, w, b)[0]
                    rows_all = [("default", None), ("split2", None)]
                    rows_all += [(f"grp{mb}", max(1, int(mb * 2**20) // (N * x.element_size()))) for mb in groups]
                    for name, rows in rows_all:
                        L._CFG.clear()
                        L._CFG.update(base)
                        if name != "default":
                            L._CFG.update(two)
                        if rows is not None:
                            got = torch.cat([r[0] for r in grouped(op, x, w, b, rows)])
                            assert torch.equal(got, ref), f"{name}: not the two launches' bits"
                            fn = lambda rows=rows: grouped(op, x, w, b, rows)  # noqa: E731
                        else:
                            fn = lambda: forward(op, x, w, b)  # noqa: E731
                        ms, tname = timer.time([fn])
                        sol = nbytes / (ms * 1e-3) / 1e9 / copy_gbps
                        row = dict(op=op, shape=[M, N], dtype=str(dt).split(".")[-1], impl=name, rows=rows, ms=ms,
                                   sol=sol, copy_gbps=copy_gbps, timer=tname)
                        f.write(json.dumps(row) + "\n")
                        f.flush()
                        print(f"{op:>3} {M}x{N} {row['dtype']:>8} {name:>8} rows={rows!s:>5} {ms:8.4f} ms "
                              f"{sol:5.2f} SOL", flush=True)
                    L._CFG.clear()
                    L._CFG.update(base)
    print(f"total {time.time() - t0:.1f}s", flush=True)


if __name__ == "__main__":
    sys.exit(main())
