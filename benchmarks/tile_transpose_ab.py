"""A/B of group norm's `tile_transpose` knob: instance norm of channels_last inputs (the suite's rows), forward and
forward + backward, knob off (torch's strided copy) against on (normkit.kernels.layout), with aten's instance norm
and a plain copy of the input's bytes for scale. CUDA graph timing (triton.testing.do_bench_cudagraph), ms.

    python benchmarks/tile_transpose_ab.py [--json FILE]
"""

import argparse
import json

import torch
import triton.testing

import normkit
from normkit.kernels import group_norm

CASES = [((16, 64, 128, 128), torch.bfloat16), ((16, 64, 128, 128), torch.float32),
         ((2, 32, 128, 128, 128), torch.bfloat16), ((2, 32, 128, 128, 128), torch.float32)]


def _time(fn) -> float:
    return triton.testing.do_bench_cudagraph(fn, rep=50)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", help="write the rows here")
    args = ap.parse_args()
    rows = []
    for shape, dtype in CASES:
        fmt = torch.channels_last if len(shape) == 4 else torch.channels_last_3d
        x = torch.randn(shape, device="cuda", dtype=dtype).contiguous(memory_format=fmt).requires_grad_()
        w = torch.randn(shape[1], device="cuda", requires_grad=True)
        b = torch.randn(shape[1], device="cuda", requires_grad=True)
        g = torch.randn(shape, device="cuda", dtype=dtype)
        copy_out = torch.empty_like(x)
        row = {"shape": list(shape), "dtype": str(dtype).split(".")[-1],
               "copy_ms": _time(lambda: copy_out.copy_(x.detach()))}
        impls = {"aten": torch.nn.functional.instance_norm, "normkit": normkit.instance_norm}
        for knob in (0, 1):
            group_norm._CFG["tile_transpose"] = knob
            for name, fn in impls.items():
                if name == "aten" and knob:
                    continue
                key = name if name == "aten" else f"normkit_knob{knob}"
                with torch.no_grad():
                    row[key + "_fwd_ms"] = _time(lambda: fn(x, weight=w, bias=b))

                def step():
                    x.grad = w.grad = b.grad = None
                    fn(x, weight=w, bias=b).backward(g)
                row[key + "_fwd_bwd_ms"] = _time(step)
        group_norm._CFG["tile_transpose"] = 0
        rows.append(row)
        print(json.dumps({k: (round(v, 4) if isinstance(v, float) else v) for k, v in row.items()}))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
