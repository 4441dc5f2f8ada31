"""One batch-norm layer of a model_zoo.py model, captured and replayed: where does a gradient error come from?

    PYTHONPATH=src python benchmarks/zoo_bn_dump.py --model tv_mobilenet_v3_small --layer features.5.block.0.1 \
        --layout channels_last --seed 237 --out DIR [--device cpu]

Runs the model's fp32 step (as model_zoo.py's agreement does: same seed, input and cotangent) eagerly and with
``normkit.enabled()``, captures the layer's input, grad_output, weight and the saved statistics each path used,
saves them to ``DIR/bn_dump.pt``, and replays normkit's batch-norm backward on the captured tensors in several
forms (as captured, grad_output in x's layout, contiguous, launch plans off) against float64, printing the errors.
"""

import argparse
import contextlib
import copy
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))
import model_zoo as Z  # noqa: E402

import normkit  # noqa: E402
from normkit.kernels import _plan  # noqa: E402


class _GradOf(torch.autograd.Function):
    """Identity that hands its incoming gradient to ``sink`` (a full backward hook would break on the in-place
    activations that follow batch norms in torchvision models: hardswish_, relu_)."""

    @staticmethod
    def forward(ctx, y, sink):
        ctx.sink = sink
        return y.view_as(y)

    @staticmethod
    def backward(ctx, g):
        ctx.sink["g"] = g.detach().clone()
        ctx.sink["g_strides"] = g.stride()
        return g, None


def capture(model, x, layer, cot_seed):
    mod = dict(model.named_modules())[layer]
    got = {}
    plain = mod.forward

    def forward(inp):
        got["x"] = inp.detach().clone()
        got["x_strides"] = inp.stride()
        return _GradOf.apply(plain(inp), got).clone()  # the clone takes the in-place activation

    mod.forward = forward
    try:
        Z.one_step(model, x, cot_seed)
    finally:
        del mod.forward
    got["weight"] = mod.weight.detach().clone()
    got["dw"] = mod.weight.grad.detach().clone() if mod.weight.grad is not None else None
    return got


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--layer", required=True)
    ap.add_argument("--layout", default="channels_last")
    ap.add_argument("--seed", type=int, required=True)
    ap.add_argument("--out", default=".")
    ap.add_argument("--device", default="cuda", help="cpu: normkit at the CPU key (the interpreter's kernels under "
                    "TRITON_INTERPRET=1), to compare with a GPU run of the same model and seed")
    a = ap.parse_args()
    key = "CPU" if a.device == "cpu" else "CUDA"
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    spec = Z.MODELS[a.model]
    model, make_input = Z.build(a.model, spec, a.seed)
    x = make_input(spec["batch"], torch.Generator(device="cpu").manual_seed(a.seed + 1))
    runs = {}
    runs["fp64"] = capture(*Z._prep(copy.deepcopy(model), x, torch.float64, a.layout, a.device), a.layer, a.seed + 2)
    runs["eager"] = capture(*Z._prep(copy.deepcopy(model), x, torch.float32, a.layout, a.device), a.layer, a.seed + 2)
    with normkit.enabled(_dispatch_key=key):
        runs["normkit"] = capture(*Z._prep(copy.deepcopy(model), x, torch.float32, a.layout, a.device), a.layer,
                                  a.seed + 2)
    os.makedirs(a.out, exist_ok=True)
    torch.save({k: {n: (v.cpu() if isinstance(v, torch.Tensor) else v) for n, v in r.items()}
                for k, r in runs.items()}, os.path.join(a.out, "bn_dump.pt"))
    ref = runs["fp64"]["dw"]
    for k in ("eager", "normkit"):
        r = runs[k]
        print(f"{k}: in-model dw rel err {Z._rel(r['dw'], ref):.2e}; x strides {r['x_strides']} g strides "
              f"{r['g_strides']}; x vs fp64 x {Z._rel(r['x'], runs['fp64']['x']):.2e}, "
              f"g vs fp64 g {Z._rel(r['g'], runs['fp64']['g']):.2e}")
    # replay on the normkit run's captured tensors: what each backward gives on identical inputs
    r = runs["normkit"]
    xx, gg, w = r["x"], r["g"], r["weight"]

    def dw_of(xin, gin, plans=True, on=True):  # plans: CUDA only (a no-op on the CPU)
        _plan.set_plans(plans)
        xi = xin.clone().requires_grad_()
        wi = w.clone().requires_grad_()
        bi = torch.zeros_like(w).requires_grad_()
        ctx = normkit.enabled(_dispatch_key=key) if on else contextlib.nullcontext()
        with ctx:
            y = torch.nn.functional.batch_norm(xi, None, None, wi, bi, training=True)
            y.backward(gin)
        _plan.set_plans(True)
        return wi.grad, xi.grad

    x64, g64 = xx.double(), gg.double()
    w64 = w.double().requires_grad_()
    xi64 = x64.clone().requires_grad_()
    torch.nn.functional.batch_norm(xi64, None, None, w64, torch.zeros_like(w64), training=True).backward(g64)
    fmt = torch.channels_last if xx.dim() == 4 else torch.contiguous_format
    for name, args in [("normkit, as captured", (xx, gg)),
                       ("normkit, g in x's layout", (xx, gg.contiguous(memory_format=fmt))),
                       ("normkit, both contiguous", (xx.contiguous(), gg.contiguous())),
                       ("normkit, plans off", (xx, gg, False)),
                       ("eager (cuDNN), as captured", (xx, gg, True, False)),
                       ("eager (cuDNN), both contiguous", (xx.contiguous(), gg.contiguous(), True, False))]:
        dw, dx = dw_of(*args)
        print(f"{name:30s} dw rel err {Z._rel(dw, w64.grad):.2e}  dx rel err {Z._rel(dx, xi64.grad):.2e}")
    per_c = ((dw_of(xx, gg)[0].double() - w64.grad).abs() / w64.grad.abs().clamp_min(1e-30))
    worst = per_c.argsort(descending=True)[:5].tolist()
    for c in worst:
        xc = x64[:, c]
        gc = g64[:, c]
        print(f"channel {c}: dw64 {w64.grad[c].item():.3e} rel err {per_c[c].item():.2e}; x mean {xc.mean():.3e} "
              f"std {xc.std():.3e}; g mean {gc.mean():.3e} std {gc.std():.3e}; first x {xc.flatten()[0]:.3e}")


if __name__ == "__main__":
    main()
