"""Does ``normkit.enable()`` change what real models compute, and what does it buy them? Models no issue names.

    PYTHONPATH=src python benchmarks/model_zoo.py --out DIR [--budget SECONDS] [--models a,b] [--no-timing]
    python benchmarks/model_zoo.py --plot DIR/model_zoo.jsonl
    PYTHONPATH=src python benchmarks/model_zoo.py --dry --out DIR      # CPU check of the script (built-in models)

For each model (torchvision, timm and transformers ones where installed, randomly initialised, nothing
downloaded; built-in pure-torch ones always), in every layout it lists:

1. **Agreement** (fp32, TF32 off, train mode, dropout and stochastic depth off): a float64 copy of the model
   is the oracle. Eager fp32 and fp32 under ``normkit.enabled()`` each run one forward and backward on the same
   input, with the same random cotangent on the output. Reported per run: relative L2 error against float64 of
   the output, of every parameter's gradient (the worst one), of the running statistics after the step, and of
   the eval-mode output after it. normkit passes where each of its errors is at most 2x eager's + 1e-5: torch's
   own fp32 kernels set the noise level a model amplifies to.
2. **Routing**: normkit's aten calls per op in that step, and the calls it handed back to ATen (fallbacks).
3. **Timing** (bf16 autocast, forward + backward, the model's timing batch times ``--time-batch-scale``): ms per
   step with and without ``enable()``, CUDA events around ``--steps`` steps after warm-up (host stalls included,
   as a user sees them), ``--rounds`` rounds in alternating order (the fastest kept), the host's time to issue a
   step (close to the step time: host-bound), the GPU busy time per step (torch.profiler: a step far above it is
   host-bound), and the host synchronisations of one step (CUDA's sync debug mode; normkit should add none).
   ``--set KNOB=INT`` sets kernel heuristics for the run (A/B of a kernel choice on whole models).

Writes ``DIR/model_zoo.jsonl`` (a line per model and layout, as it goes), ``DIR/model_zoo.md`` (the table)
and ``DIR/model_zoo.png`` (speedups and error ratios). Exit status 1 if any model disagrees or fails.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import math
import os
import sys
import time
import warnings

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

import normkit
from normkit.bench.report import save_png
from normkit import aten


# --- built-in models: the patterns users write by hand (no packages needed) --------------------------------

class MLPBatchNorm1d(nn.Module):
    """Linear -> BatchNorm1d on (N, C): tabular / recommender heads."""

    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(48, 96), nn.BatchNorm1d(96), nn.ReLU(), nn.Linear(96, 64),
                                 nn.BatchNorm1d(64, momentum=None), nn.ReLU(), nn.Linear(64, 10))

    def forward(self, x):
        return self.net(x)


class Conv1dBatchNorm(nn.Module):
    """Conv1d -> BatchNorm1d on (N, C, L): audio / sequence front ends."""

    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Conv1d(8, 32, 5, padding=2), nn.BatchNorm1d(32), nn.GELU(),
                                 nn.Conv1d(32, 32, 3, stride=2, padding=1), nn.BatchNorm1d(32, eps=1e-3), nn.GELU())
        self.head = nn.Linear(32, 10)

    def forward(self, x):
        return self.head(self.net(x).mean(-1))


class Conv3dNorms(nn.Module):
    """Conv3d -> BatchNorm3d and InstanceNorm3d (running statistics tracked): medical / video volumes."""

    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv3d(2, 16, 3, padding=1)
        self.bn = nn.BatchNorm3d(16)
        self.c2 = nn.Conv3d(16, 16, 3, padding=1)
        self.inorm = nn.InstanceNorm3d(16, affine=True, track_running_stats=True)
        self.head = nn.Linear(16, 4)

    def forward(self, x):
        x = F.relu(self.bn(self.c1(x)))
        x = F.relu(self.inorm(self.c2(x)))
        return self.head(x.mean((2, 3, 4)))


class UNetGroupNorm(nn.Module):
    """GroupNorm + SiLU blocks down and up (a diffusion U-Net's pattern), InstanceNorm2d on the skip."""

    def __init__(self, ch=32):
        super().__init__()
        self.inp = nn.Conv2d(3, ch, 3, padding=1)
        self.down = nn.Sequential(nn.GroupNorm(8, ch), nn.SiLU(), nn.Conv2d(ch, 2 * ch, 3, stride=2, padding=1))
        self.mid = nn.Sequential(nn.GroupNorm(16, 2 * ch, eps=1e-6), nn.SiLU(), nn.Conv2d(2 * ch, 2 * ch, 3, padding=1))
        self.up = nn.Sequential(nn.Upsample(scale_factor=2), nn.Conv2d(2 * ch, ch, 3, padding=1),
                                nn.GroupNorm(1, ch), nn.SiLU())
        self.skip = nn.InstanceNorm2d(ch, affine=True)
        self.out = nn.Conv2d(ch, 3, 3, padding=1)

    def forward(self, x):
        h = self.inp(x)
        return self.out(self.up(self.mid(self.down(h))) + self.skip(h))


class PreNormTransformer(nn.Module):
    """Pre-norm encoder layers (LayerNorm inside), a final RMSNorm, on [B, S, H]."""

    def __init__(self, width=128):
        super().__init__()
        layer = nn.TransformerEncoderLayer(width, 4, 4 * width, dropout=0.0, batch_first=True, norm_first=True)
        self.enc = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.norm = nn.RMSNorm(width) if hasattr(nn, "RMSNorm") else nn.LayerNorm(width)
        self.head = nn.Linear(width, 16)

    def forward(self, x):
        return self.head(self.norm(self.enc(x)))


class ConvNeXtBlocks(nn.Module):
    """LayerNorm over channels of an NCHW tensor through a permute (ConvNeXt's LayerNorm2d): a strided input."""

    def __init__(self, ch=48):
        super().__init__()
        self.stem = nn.Conv2d(3, ch, 4, stride=4)
        self.dw = nn.Conv2d(ch, ch, 7, padding=3, groups=ch)
        self.ln1 = nn.LayerNorm(ch, eps=1e-6)
        self.pw = nn.Sequential(nn.Linear(ch, 4 * ch), nn.GELU(), nn.Linear(4 * ch, ch))
        self.ln2 = nn.LayerNorm(ch, eps=1e-6)
        self.head = nn.Linear(ch, 10)

    def forward(self, x):
        x = self.stem(x)
        x = F.layer_norm(x.permute(0, 2, 3, 1), self.ln1.normalized_shape, self.ln1.weight, self.ln1.bias,
                         self.ln1.eps).permute(0, 3, 1, 2)
        h = self.dw(x).permute(0, 2, 3, 1)
        x = x + self.pw(self.ln2(h)).permute(0, 3, 1, 2)
        return self.head(x.mean((2, 3)))


def _builtin(cls, shape, batch, time_batch, layouts=("contiguous",)):
    return {"source": "builtin", "build": cls, "input": shape, "batch": batch, "time_batch": time_batch,
            "layouts": layouts}


BUILTIN = {
    "mlp_bn1d": _builtin(MLPBatchNorm1d, (48,), 64, 4096),
    "conv1d_bn": _builtin(Conv1dBatchNorm, (8, 200), 16, 512),
    "conv3d_bn_in": _builtin(Conv3dNorms, (2, 12, 16, 16), 4, 32, ("contiguous", "channels_last")),
    "unet_gn": _builtin(UNetGroupNorm, (3, 32, 32), 4, 64, ("contiguous", "channels_last")),
    "prenorm_transformer": _builtin(PreNormTransformer, (64, 128), 8, 64),
    "convnext_blocks": _builtin(ConvNeXtBlocks, (3, 64, 64), 4, 128),
}


def _tv(name, batch=8, time_batch=64, size=224, layouts=("contiguous", "channels_last"), **kw):
    return {"source": "torchvision", "name": name, "kwargs": kw, "input": (3, size, size), "batch": batch,
            "time_batch": time_batch, "layouts": layouts}


def _timm(name, batch=8, time_batch=64, size=224, layouts=("contiguous", "channels_last")):
    return {"source": "timm", "name": name, "input": (3, size, size), "batch": batch, "time_batch": time_batch,
            "layouts": layouts}


PACKAGED = {
    "tv_resnet18": _tv("resnet18"),
    "tv_mobilenet_v3_small": _tv("mobilenet_v3_small", time_batch=128),
    "tv_efficientnet_b0": _tv("efficientnet_b0"),
    "tv_densenet121": _tv("densenet121", time_batch=32),
    "tv_shufflenet_v2": _tv("shufflenet_v2_x1_0", time_batch=128),
    "tv_regnet_y_400mf": _tv("regnet_y_400mf", time_batch=128),
    "tv_convnext_tiny": _tv("convnext_tiny", time_batch=32),
    "tv_swin_t": _tv("swin_t", batch=4, time_batch=32, layouts=("contiguous",)),
    "tv_vit_b_16": _tv("vit_b_16", batch=4, time_batch=32, layouts=("contiguous",)),
    "tv_r3d_18": {"source": "torchvision.video", "name": "r3d_18", "kwargs": {}, "input": (3, 8, 112, 112),
                  "batch": 4, "time_batch": 16, "layouts": ("contiguous", "channels_last")},
    "timm_levit_128s": _timm("levit_128s", time_batch=128, layouts=("contiguous",)),
    "timm_resnetv2_50x1_bit": _timm("resnetv2_50x1_bit", batch=4, time_batch=32),
    "timm_poolformer_s12": _timm("poolformer_s12", time_batch=64),
    "timm_convnext_atto": _timm("convnext_atto", time_batch=128),
    "timm_efficientnet_b0": _timm("efficientnet_b0", time_batch=64),
    "timm_vit_small": _timm("vit_small_patch16_224", batch=4, time_batch=64, layouts=("contiguous",)),
    "hf_bert": {"source": "transformers", "name": "bert", "input": ("tokens", 128), "batch": 4, "time_batch": 32,
                "layouts": ("contiguous",)},
}

MODELS = {**BUILTIN, **PACKAGED}


def _no_randomness(model):
    """Dropout and stochastic depth off: the float64 oracle and both fp32 runs must compute one function."""
    for m in model.modules():
        if isinstance(m, nn.modules.dropout._DropoutNd):
            m.p = 0.0
        if isinstance(getattr(m, "drop_prob", None), float):  # timm's DropPath
            m.drop_prob = 0.0
        if type(m).__name__ == "StochasticDepth":  # torchvision's
            m.p = 0.0
    return model


def build(name, spec, seed):
    """(model on the CPU in fp32, a function batch -> random input, on the CPU, fp32)"""
    torch.manual_seed(seed)
    src = spec["source"]
    if src == "builtin":
        model = spec["build"]()
    elif src == "torchvision":
        import torchvision

        model = getattr(torchvision.models, spec["name"])(weights=None, **spec["kwargs"])
    elif src == "torchvision.video":
        import torchvision

        model = getattr(torchvision.models.video, spec["name"])(weights=None)
    elif src == "timm":
        import timm

        model = timm.create_model(spec["name"], pretrained=False)
    elif src == "transformers":
        from transformers import BertConfig, BertModel

        cfg = BertConfig(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
        model = BertModel(cfg, add_pooling_layer=False)
    else:
        raise ValueError(src)
    shape = spec["input"]

    def make_input(batch, gen):
        if shape[0] == "tokens":
            return torch.randint(0, 30000, (batch, shape[1]), generator=gen)
        return torch.randn((batch,) + tuple(shape), generator=gen)

    return _no_randomness(model), make_input


def _output(y):
    """The tensor a model's output holds (HF ModelOutput, torchvision's namedtuples, plain tensors)."""
    if isinstance(y, torch.Tensor):
        return y
    if hasattr(y, "last_hidden_state"):
        return y.last_hidden_state
    if isinstance(y, (tuple, list)):
        return y[0]
    raise TypeError(f"unknown model output {type(y).__name__}")


def _prep(model, x, dtype, layout, device):
    model = model.to(device=device, dtype=dtype)
    if x.is_floating_point():
        x = x.to(device=device, dtype=dtype)
    else:
        x = x.to(device)
    if layout == "channels_last":
        fmt = torch.channels_last if x.dim() == 4 else torch.channels_last_3d
        model = model.to(memory_format=fmt)
        x = x.contiguous(memory_format=fmt)
    return model, x


def _rel(a, b):
    a, b = a.double(), b.double()
    den = b.norm().item()
    return (a - b).norm().item() / den if den > 0 else (a - b).norm().item()


# piecewise activations (functional or module form, in-place or not) and where their derivative jumps: an input
# on the other side of a kink in fp32 than in float64 changes that element's gradient by O(1), whatever the norms did
_KINKS = {"relu": (0.0,), "relu6": (0.0, 6.0), "leaky_relu": (0.0,), "hardswish": (-3.0, 3.0),
          "hardsigmoid": (-3.0, 3.0), "hardtanh": None}  # None: from the call's min_val / max_val


def _kinks_of(func, args, kwargs):
    name = getattr(func, "__name__", "").rstrip("_")
    if name not in _KINKS:
        return None
    if name == "hardtanh":
        return (args[1] if len(args) > 1 else kwargs.get("min_val", -1.0),
                args[2] if len(args) > 2 else kwargs.get("max_val", 1.0))
    return _KINKS[name]


# max pooling: the element a window picks is its kink (another pick moves the gradient to another element); the
# position of return_indices among each function's arguments
_POOLS = {"max_pool1d": 6, "max_pool2d": 6, "max_pool3d": 6, "adaptive_max_pool1d": 2, "adaptive_max_pool2d": 2,
          "adaptive_max_pool3d": 2}


def _pool_picks(func, args, kwargs):
    """The indices a max-pooling call picks (its return_indices output), without recording gradients."""
    args, kwargs = list(args), dict(kwargs)
    pos = _POOLS[func.__name__]
    if len(args) > pos:
        args[pos] = True
    else:
        kwargs["return_indices"] = True
    with torch.no_grad():
        return func(args[0].detach(), *args[1:], **kwargs)[1]


class _KinkSides(TorchFunctionMode):
    """Records, per call of a piecewise activation (in call order), which side of each kink every input element
    lies on, before the call (in-place ones overwrite their input), and per max-pooling call the element each
    window picks. A function mode, not module hooks, so that ``F.relu`` inside a ``forward`` counts as much as
    ``nn.ReLU``."""

    def __init__(self):
        super().__init__()
        self.sides = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if not (args and isinstance(args[0], torch.Tensor)):  # (an input passed by keyword: the same in every run)
            return func(*args, **kwargs)
        if getattr(func, "__name__", None) in _POOLS:
            self.sides.append(_pool_picks(func, args, kwargs))
            return func(*args, **kwargs)
        kinks = _kinks_of(func, args, kwargs)
        if kinks is not None:
            t = args[0].detach()
            side = torch.zeros(t.shape, dtype=torch.int8, device=t.device)
            for k in kinks:
                side += (t > k).to(torch.int8)
            self.sides.append(side)
        return func(*args, **kwargs)


def one_step(model, x, cot_seed):
    """Train-mode forward + backward with a fixed random cotangent, then an eval forward: what it computed, and the
    kink sides of the train forward's piecewise activations."""
    model.train()
    model.zero_grad(set_to_none=True)
    with _KinkSides() as kinks:
        y = _output(model(x))
    g = torch.Generator(device="cpu").manual_seed(cot_seed)
    cot = torch.randn(y.shape, generator=g, dtype=torch.float64).to(device=y.device, dtype=y.dtype)
    (y * cot).sum().backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    bufs = {n: b.detach().clone() for n, b in model.named_buffers() if b.is_floating_point()}
    model.eval()
    with torch.no_grad():
        y_eval = _output(model(x))
    return y.detach(), grads, bufs, y_eval.detach(), kinks.sides


def _kink_flips(sides, ref_sides) -> int:
    """Activation inputs on another side of a kink than in the float64 run, and pooling windows that picked
    another element."""
    return sum(int((a != b).sum()) for a, b in zip(sides, ref_sides))


def compare(got, ref):
    """Relative errors against float64. ``grad``: the worst parameter's relative gradient error. A parameter
    whose float64 gradient is below 1e-6 of the norm it would have if the model's gradient were spread evenly
    (a conv bias ahead of a batch norm: zero in exact arithmetic, rounding noise in float64) is measured in
    ``grad_null`` instead, its error relative to that even-spread norm."""
    y, grads, bufs, y_eval = got[:4]
    y64, grads64, bufs64, y_eval64 = ref[:4]
    missing = [n for n in grads64 if n not in grads]
    if missing:
        return {"error": f"no gradient for {missing[0]}"}
    total = math.sqrt(sum(g.double().square().sum().item() for g in grads64.values()))
    numel = sum(g.numel() for g in grads64.values())
    worst = {"grad": (0.0, None), "grad_null": (0.0, None)}
    for n, g64 in grads64.items():
        even = total * math.sqrt(g64.numel() / numel)
        own = g64.double().norm().item()
        kind = "grad" if own >= 1e-6 * even else "grad_null"
        e = (grads[n].double() - g64.double()).norm().item() / max(own if kind == "grad" else even, 1e-300)
        if e >= worst[kind][0]:
            worst[kind] = (e, n)
    # running statistics: relative to the larger of a buffer's norm and 1e-3 of its RMS-1 norm (a running mean
    # that is zero in exact arithmetic holds rounding noise in float64 too)
    bufs_err = max([(bufs[n].double() - b.double()).norm().item() / max(b.double().norm().item(),
                                                                         1e-3 * math.sqrt(b.numel()))
                    for n, b in bufs64.items()] or [0.0])
    return {"out": _rel(y, y64), "grad": worst["grad"][0], "grad_param": worst["grad"][1],
            "grad_null": worst["grad_null"][0], "running": bufs_err, "eval": _rel(y_eval, y_eval64)}


def agreement(name, spec, layout, device, seed, dispatch_key):
    model, make_input = build(name, spec, seed)
    x = make_input(spec["batch"], torch.Generator(device="cpu").manual_seed(seed + 1))
    ref = one_step(*_prep(copy.deepcopy(model), x, torch.float64, layout, device), seed + 2)
    eager = one_step(*_prep(copy.deepcopy(model), x, torch.float32, layout, device), seed + 2)
    aten.reset_counts()
    with normkit.enabled(_dispatch_key=dispatch_key):
        nk = one_step(*_prep(copy.deepcopy(model), x, torch.float32, layout, device), seed + 2)
    calls, fallbacks = aten.call_counts(), aten.fallback_counts()
    e, n = compare(eager, ref), compare(nk, ref)
    row = {"eager_err": e, "normkit_err": n, "calls": calls, "fallbacks": fallbacks}
    if "error" in e or "error" in n:
        row["agree"] = False
        return row
    kinds = ("out", "grad", "grad_null", "running", "eval")
    worst = {k: n[k] / (2 * e[k] + 1e-5) for k in kinds}
    row["err_ratio"] = {k: (n[k] / e[k] if e[k] > 0 else None) for k in kinds}
    row["kink_flips"] = {"eager": _kink_flips(eager[4], ref[4]), "normkit": _kink_flips(nk[4], ref[4])}
    row["worst_vs_bound"] = max(worst.values())
    # a gradient past a flipped kink differs from float64 by O(1) in that element, through no fault of the norms:
    # with flips in normkit's run its gradients are unverified (reported, not passed or failed); the forward
    # quantities still must agree
    row["grads_unverified"] = row["kink_flips"]["normkit"] > 0 and max(worst["grad"], worst["grad_null"]) > 1.0
    checked = [k for k in kinds if not (row["grads_unverified"] and k.startswith("grad"))]
    row["agree"] = all(worst[k] <= 1.0 for k in checked)
    return row


def timing_model(name, spec, layout, device, seed, batch=None):
    """(model in training mode, input at the timing batch or ``batch``) on ``device`` in ``layout``."""
    model, make_input = build(name, spec, seed)
    x = make_input(batch or spec["time_batch"], torch.Generator(device="cpu").manual_seed(seed + 1))
    model, x = _prep(model, x, torch.float32, layout, device)
    return model.train(), x


def train_step(name, spec, layout, device, seed, batch=None):
    """``step()``: one bf16-autocast forward + backward of the model at its timing batch (or ``batch``)."""
    model, x = timing_model(name, spec, layout, device, seed, batch)

    def step():
        with torch.autocast(device_type=device, dtype=torch.bfloat16):
            y = _output(model(x))
        model.zero_grad(set_to_none=True)
        y.float().square().mean().backward()

    return step


def cuda_ms_per_step(step, steps):
    """(ms per step on the GPU's clock, ms the host took to issue the steps): the second near the first says
    host-bound."""
    torch.cuda.synchronize()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0.record()
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    issue = (time.perf_counter() - t0) * 1e3 / steps
    e1.record()
    e1.synchronize()
    return e0.elapsed_time(e1) / steps, issue


def add_model_args(ap):
    """The options of the in-model CUDA scripts (knob_ab.py, model_host_profile.py, graphed_steps.py)."""
    ap.add_argument("--models", required=True, help="comma-separated model_zoo names")
    ap.add_argument("--layouts", default="contiguous,channels_last")
    ap.add_argument("--seed", type=int, default=237)
    ap.add_argument("--out", default=".")


def cuda_run(args, script, **meta):
    """(meta, [(model, layout), ...]) for an in-model CUDA script's run: exits without a GPU, makes --out; meta
    holds torch, device, date and commit besides ``meta``."""
    if not torch.cuda.is_available():
        sys.exit(f"{script} runs CUDA steps: no GPU here")
    os.makedirs(args.out, exist_ok=True)
    meta = {"torch": torch.__version__, "device": torch.cuda.get_device_name(), "date": time.strftime("%Y-%m-%d"),
            "git_sha": os.environ.get("NORMKIT_GIT_SHA", "unknown"), **meta}
    cases = [(m, lay) for m in args.models.split(",") for lay in args.layouts.split(",")
             if lay in MODELS[m]["layouts"]]
    return meta, cases


def timing(name, spec, layout, device, seed, steps, dispatch_key, batch=None, warmup=3, rounds=2):
    """ms per bf16-autocast forward + backward with and without enable() (one model, same batch): ``rounds``
    rounds in alternating order (eager, normkit, normkit, eager, ...), each setting keeping its fastest round, so
    that a drift of the host (leases differ by up to 2x) weighs on both alike; then the GPU busy time per step."""
    step = train_step(name, spec, layout, device, seed, batch)

    def ctx(setting):
        return normkit.enabled(_dispatch_key=dispatch_key) if setting == "normkit" else contextlib.nullcontext()

    def ms_per_step():
        if device == "cuda":
            return cuda_ms_per_step(step, steps)
        t0 = time.perf_counter()
        for _ in range(steps):
            step()
        t = (time.perf_counter() - t0) * 1e3 / steps
        return t, t

    out = {"eager_rounds": [], "normkit_rounds": []}
    for setting in ("eager", "normkit"):
        with ctx(setting):
            for _ in range(warmup):
                step()
            if device == "cuda":
                out[setting + "_host_syncs"] = _host_syncs(step)
    for r in range(rounds):
        for setting in (("eager", "normkit") if r % 2 == 0 else ("normkit", "eager")):
            with ctx(setting):
                out[setting + "_rounds"].append(ms_per_step())
    for setting in ("eager", "normkit"):
        out[setting], out[setting + "_issue"] = min(out[setting + "_rounds"])
        if device == "cuda":
            with ctx(setting):
                out[setting + "_gpu_busy"] = _gpu_busy_ms(step)
    out["speedup"] = out["eager"] / out["normkit"]
    return out


def _host_syncs(step):
    """The host synchronisations one step makes (CUDA's sync debug mode warns at each), as messages."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            step()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    return [str(w.message)[:160] for w in caught if "synchroniz" in str(w.message).lower()]


def _gpu_busy_ms(step, n=2):
    """GPU busy time per step (the union of kernel intervals, torch.profiler): against the step time it says
    whether a step is host-bound."""
    from torch.profiler import ProfilerActivity, profile

    from normkit.bench.models import _kernel_times

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(n):
            step()
        torch.cuda.synchronize()
    return _kernel_times(prof, "cuda")[4] / n


def _fmt(v):
    return "-" if v is None else f"{v:.1e}"


def table(rows):
    lines = ["| model | layout | agree | out err nk / eager | grad err nk / eager (worst param) | zero-grad params | "
             "running stats | eval out | normkit calls | fallbacks | bf16 step ms eager / normkit | "
             "GPU busy ms eager / normkit | host issue ms eager / normkit | host syncs eager / normkit | speedup |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if r.get("status") != "ok":
            lines.append(f"| {r['model']} | {r['layout']} | {r.get('status')} | {r.get('note', '')[:120]} |"
                         " | | | | | | | | | | |")
            continue
        a = r["agreement"]
        n, e = a["normkit_err"], a["eager_err"]
        if "error" in n or "error" in e:
            lines.append(f"| {r['model']} | {r['layout']} | **NO** | {n.get('error') or e.get('error')} | | | | | | | | | | | |")
            continue
        t = r.get("timing") or {}
        calls = ", ".join(f"{k} {v}" for k, v in sorted(a["calls"].items())) or "none"
        fb = ", ".join(f"{k} {v}" for k, v in sorted(a["fallbacks"].items())) or "-"
        tm = f"{t['eager']:.2f} / {t['normkit']:.2f}" if t else "-"
        busy = (f"{t['eager_gpu_busy']:.2f} / {t['normkit_gpu_busy']:.2f}" if "eager_gpu_busy" in t else "-")
        issue = f"{t['eager_issue']:.2f} / {t['normkit_issue']:.2f}" if t else "-"
        syncs = (f"{len(t['eager_host_syncs'])} / {len(t['normkit_host_syncs'])}" if "eager_host_syncs" in t else "-")
        sp = f"{t['speedup']:.2f}x" if t else "-"
        verdict = ("yes, gradients unverified (kink flips: eager %d, normkit %d)" % (a["kink_flips"]["eager"],
                   a["kink_flips"]["normkit"]) if a["agree"] and a.get("grads_unverified") else
                   "yes" if a["agree"] else "**NO**")
        lines.append(f"| {r['model']} | {r['layout']} | {verdict} | "
                     f"{_fmt(n['out'])} / {_fmt(e['out'])} | {_fmt(n['grad'])} / {_fmt(e['grad'])} "
                     f"({n['grad_param']}) | {_fmt(n['grad_null'])} / {_fmt(e['grad_null'])} | {_fmt(n['running'])} / {_fmt(e['running'])} | "
                     f"{_fmt(n['eval'])} / {_fmt(e['eval'])} | {calls} | {fb} | {tm} | {busy} | {issue} | {syncs} | {sp} |")
    return "\n".join(lines)


def plot(path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [json.loads(line) for line in open(path)]
    rows = [r for r in rows if r.get("status") == "ok" and "err_ratio" in r["agreement"]]
    labels = [f"{r['model']} ({'cl' if r['layout'] == 'channels_last' else 'c'})" for r in rows]
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(13, 0.6 + 0.28 * len(rows)), sharey=True)
    ys = range(len(rows))
    sp = [r["timing"]["speedup"] if r.get("timing") else 0 for r in rows]
    a1.barh(ys, sp, color=["tab:green" if s >= 1 else "tab:red" for s in sp])
    a1.axvline(1.0, color="k", lw=0.8)
    a1.set_yticks(list(ys), labels, fontsize=7)
    a1.set_xlabel("bf16 step speedup with normkit.enable()")
    for k, m in (("out", "o"), ("grad", "s"), ("eval", "^")):
        a2.scatter([r["agreement"]["err_ratio"][k] or 0 for r in rows], ys, marker=m, label=k, s=14)
    a2.axvline(2.0, color="r", lw=0.8, ls="--")
    a2.set_xscale("log")
    a2.set_xlabel("fp32 error vs float64: normkit / eager (pass <= 2x + 1e-5)")
    a2.legend(fontsize=7)
    fig.tight_layout()
    out = os.path.join(os.path.dirname(path), "model_zoo.png")
    save_png(fig, out, dpi=110)
    print(f"wrote {out}")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=".")
    ap.add_argument("--models", default=None, help="comma-separated names (default: every one available)")
    ap.add_argument("--budget", type=float, default=1e9, help="seconds; later models are skipped")
    ap.add_argument("--steps", type=int, default=10, help="timed bf16 steps per setting")
    ap.add_argument("--no-timing", action="store_true")
    ap.add_argument("--rounds", type=int, default=2, help="timing rounds per setting, alternating order")
    ap.add_argument("--time-batch-scale", type=float, default=1.0,
                    help="multiply each model's timing batch (larger batches: GPU-bound steps)")
    ap.add_argument("--seed", type=int, default=int(time.time()) % 100000)
    ap.add_argument("--dry", action="store_true", help="CPU, built-in models, normkit at the CPU key")
    ap.add_argument("--plot", default=None, help="draw DIR/model_zoo.png from a jsonl and exit")
    ap.add_argument("--set", nargs="*", default=[], metavar="KNOB=INT",
                    help="kernel heuristic knobs for this run (normkit.kernels.set_knobs), e.g. fused_max_rows=8192")
    args = ap.parse_args(argv)
    if args.plot:
        plot(args.plot)
        return 0
    from normkit.kernels import set_knobs

    set_knobs(args.set)
    device = "cpu" if args.dry else "cuda"
    key = "CPU" if args.dry else "CUDA"
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    names = args.models.split(",") if args.models else list(BUILTIN if args.dry else MODELS)
    unknown = [n for n in names if n not in MODELS]
    if unknown:
        ap.error(f"unknown model(s) {', '.join(unknown)}; known: {', '.join(MODELS)}")
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "model_zoo.jsonl")
    open(path, "w").close()
    native = "n/a (CPU)"
    if not args.dry:  # time what a user sees after the first minute: plans replayed in C++ once that is built
        from normkit.kernels import _native

        _native.start()
        _native.wait(600)
        native = _native.status()
    print(f"model zoo: seed {args.seed}, torch {torch.__version__}, device {device}, knobs {args.set}, "
          f"native replay {native}", flush=True)
    t_start = time.time()
    rows = []
    jobs = [(n, lay) for n in names for lay in MODELS[n]["layouts"]]
    for i, (name, layout) in enumerate(jobs):
        spec = MODELS[name]
        row = {"model": name, "layout": layout, "source": spec["source"], "batch": spec["batch"],
               "time_batch": spec["time_batch"], "seed": args.seed, "knobs": args.set, "native_replay": native}
        if time.time() - t_start > args.budget:
            row.update(status="skipped", note="time budget spent")
        else:
            t0 = time.time()
            try:
                row["agreement"] = agreement(name, spec, layout, device, args.seed, key)
                if not args.no_timing:
                    # --dry: a check of the harness (under TRITON_INTERPRET=1 the kernels run in the interpreter)
                    row["timing"] = (timing(name, spec, layout, device, args.seed, 1, key, spec["batch"], 1)
                                     if args.dry else
                                     timing(name, spec, layout, device, args.seed, args.steps, key,
                                            round(spec["time_batch"] * args.time_batch_scale), rounds=args.rounds))
                row["status"] = "ok"
            except ImportError as e:
                row.update(status="skipped", note=f"not installed: {e.name}")
            except Exception as e:  # reported, not hidden: a failing model is a finding
                row.update(status="error", note=f"{type(e).__name__}: {str(e).strip().splitlines()[0][:200]}"
                           if str(e).strip() else type(e).__name__)
            row["seconds"] = round(time.time() - t0, 1)
            if device == "cuda":
                torch.cuda.empty_cache()
        rows.append(row)
        with open(path, "a") as f:
            f.write(json.dumps(row) + "\n")
        a = row.get("agreement", {})
        t = row.get("timing", {})
        print(f"[{i + 1}/{len(jobs)}] {name:24s} {layout:13s} {row['status']:7s} "
              f"agree={a.get('agree')} worst/bound={a.get('worst_vs_bound', math.nan):.2f} "
              f"speedup={t.get('speedup', math.nan):.2f} ({row.get('seconds', 0)} s) {row.get('note', '')}",
              flush=True)
    md = table(rows)
    with open(os.path.join(args.out, "model_zoo.md"), "w") as f:
        f.write(f"# model zoo (seed {args.seed}, torch {torch.__version__}, {device})\n\n{md}\n")
    print(md)
    bad = [r for r in rows if r.get("status") == "error" or
           (r.get("status") == "ok" and not r["agreement"]["agree"])]
    if any(r.get("status") == "ok" for r in rows):
        try:
            plot(path)
        except ImportError:
            pass
    print(f"{len(rows)} runs, {sum(r.get('status') == 'ok' for r in rows)} ok, {len(bad)} failing")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
