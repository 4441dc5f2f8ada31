"""A/B of the tile transpose's knobs (`normkit.kernels.layout`): batch norm's `_TUNE["tile_transpose"]` and group
norm's `_CFG["tile_transpose"]`, 0 (torch's strided copy) against 1 (the tile transpose). Rows: training forward +
backward where the input and its incoming gradient are dense in different layouts (a contiguous gradient of a
channels_last input, as after a reshape; a channels_last gradient of instance norm's contiguous output), and
instance norm of a channels_last input; aten and a plain copy of the input's bytes for scale. CUDA graph timing
(triton.testing.do_bench_cudagraph), ms.

    python benchmarks/layout_ab.py [--json FILE]
"""

import argparse
import json

import torch
import triton.testing

import normkit
from normkit.kernels import batch_norm, group_norm

F = torch.nn.functional
CL = {4: torch.channels_last, 5: torch.channels_last_3d}
# (family, shape, dtype, x channels_last, dy channels_last)
CASES = [("batch_norm", (256, 64, 56, 56), torch.bfloat16, True, False),
         ("batch_norm", (256, 64, 56, 56), torch.float32, True, False),
         ("batch_norm", (8, 64, 32, 64, 64), torch.bfloat16, True, False),
         ("batch_norm", (256, 256, 28, 28), torch.bfloat16, False, True),
         ("group_norm", (32, 256, 64, 64), torch.bfloat16, False, True),
         ("instance_norm", (16, 64, 128, 128), torch.bfloat16, True, True),
         ("instance_norm", (2, 32, 128, 128, 128), torch.bfloat16, True, True)]
IMPLS = {"batch_norm": (lambda x, w, b: F.batch_norm(x, None, None, w, b, training=True),
                        lambda x, w, b: normkit.batch_norm(x, None, None, w, b, training=True)),
         "group_norm": (lambda x, w, b: F.group_norm(x, 32, w, b), lambda x, w, b: normkit.group_norm(x, 32, w, b)),
         "instance_norm": (lambda x, w, b: F.instance_norm(x, weight=w, bias=b),
                           lambda x, w, b: normkit.instance_norm(x, weight=w, bias=b))}


def _time(fn) -> float:
    return triton.testing.do_bench_cudagraph(fn, rep=50)


def _set_knob(family: str, value: int) -> None:
    if family == "batch_norm":
        batch_norm._TUNE["tile_transpose"] = value
    else:
        group_norm._CFG["tile_transpose"] = value


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", help="write the rows here")
    args = ap.parse_args()
    rows = []
    for family, shape, dtype, x_cl, dy_cl in CASES:
        x = torch.randn(shape, device="cuda", dtype=dtype)
        g = torch.randn(shape, device="cuda", dtype=dtype)
        x = (x.contiguous(memory_format=CL[len(shape)]) if x_cl else x).requires_grad_()
        g = g.contiguous(memory_format=CL[len(shape)]) if dy_cl else g
        pdt = dtype if family == "group_norm" else torch.float32  # aten's group norm takes x's dtype only
        w = torch.randn(shape[1], device="cuda", dtype=pdt, requires_grad=True)
        b = torch.randn(shape[1], device="cuda", dtype=pdt, requires_grad=True)
        copy_out = torch.empty_like(x)
        row = {"family": family, "shape": list(shape), "dtype": str(dtype).split(".")[-1], "x_channels_last": x_cl,
               "dy_channels_last": dy_cl, "copy_ms": _time(lambda: copy_out.copy_(x.detach()))}
        aten, nk = IMPLS[family]
        for key, fn, knob in (("aten", aten, None), ("normkit_knob0", nk, 0), ("normkit_knob1", nk, 1)):
            if knob is not None:
                _set_knob(family, knob)

            def step():
                x.grad = w.grad = b.grad = None
                fn(x, w, b).backward(g)
            row[key + "_fwd_bwd_ms"] = _time(step)
        _set_knob(family, 1)
        rows.append(row)
        print(json.dumps({k: (round(v, 4) if isinstance(v, float) else v) for k, v in row.items()}))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
