"""--models: whole training steps with and without ``normkit.enable()``.

Each model is built twice from the same seed (random init, nothing downloaded), trained for N steps on
one fixed random batch with bf16 autocast and SGD (momentum 0.9), once in plain eager PyTorch and once
inside ``normkit.enabled()``. Reported per setting: the mean step time over the steps after the first
``warmup`` (CUDA events), the GPU kernel time per step and the part of it in normalization kernels
(torch.profiler over 3 extra steps; kernels named like batch/layer/rms/group/instance norm, cuDNN ``bn_``
kernels, Welford kernels, normkit's Triton kernels, and any kernel launched by a normalization op or
autograd node), the loss after N steps, normkit's aten call counts.
Dropout is off in GPT-2 so that both settings see the same function.
"""

from __future__ import annotations

import contextlib
import gc
import re
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

from normkit.bench.runner import BUDGET_SKIP

NORM_KERNEL = re.compile(
    r"(batch_?norm|layer_?norm|rms_?norm|group_?norm|instance_?norm|welford|normkit|bn_fw|bn_bw|"
    r"(^|[^a-z])bn_|_bn_|_ln_|_rms_|_gn_|nhwcbatchnorm|norm_(fwd|bwd|forward|backward)|gammabeta|"
    r"rowwisemoments|computefusedparams|backwardfusedparams)", re.I)

# name -> (builder key, batch, layout); batch sizes and layouts as in suite.json's "models"
MODELS = {
    "resnet50": ("resnet50", 256, "contiguous"),
    "resnet50-cl": ("resnet50", 256, "channels_last"),
    "vit_b16": ("vit_b16", 128, "contiguous"),
    "gpt2": ("gpt2", 16, "contiguous"),
    "tiny": ("tiny", 8, "contiguous"),
    "tiny-cl": ("tiny", 8, "channels_last"),
}
DEFAULT_MODELS = ("resnet50", "resnet50-cl", "vit_b16", "gpt2")
ALIASES = {"resnet": ("resnet50", "resnet50-cl"), "resnet50": ("resnet50", "resnet50-cl"),
           "resnet50-nchw": ("resnet50",), "vit": ("vit_b16",), "vit_base_patch16_224": ("vit_b16",),
           "gpt2-small": ("gpt2",), "all": DEFAULT_MODELS}


def resolve(names) -> list:
    out = []
    for n in names or DEFAULT_MODELS:
        for m in ALIASES.get(n, (n,)):
            if m not in MODELS:
                raise ValueError(f"unknown model {m!r}; known: {', '.join(MODELS)}")
            if m not in out:
                out.append(m)
    return out


class _Tiny(nn.Module):
    """A CPU-sized stand-in touching batch, group, layer and RMS norm (for --quick)."""

    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv2d(3, 16, 3, padding=1)
        self.bn = nn.BatchNorm2d(16)
        self.c2 = nn.Conv2d(16, 16, 3, padding=1)
        self.gn = nn.GroupNorm(4, 16)
        self.ln = nn.LayerNorm(16)
        self.rms = nn.RMSNorm(16) if hasattr(nn, "RMSNorm") else nn.LayerNorm(16)
        self.fc = nn.Linear(16, 10)

    def forward(self, x):
        x = F.relu(self.bn(self.c1(x)))
        x = F.relu(self.gn(self.c2(x)))
        x = x.mean((2, 3))
        return self.fc(self.rms(self.ln(x)))


def _build(key: str, batch: int, layout: str, device: str, seed: int):
    """(model, batch tensors, loss function)"""
    torch.manual_seed(seed)
    g = torch.Generator(device="cpu").manual_seed(seed + 1)
    if key == "resnet50":
        import torchvision

        model = torchvision.models.resnet50(weights=None)
        x = torch.randn(batch, 3, 224, 224, generator=g)
        y = torch.randint(0, 1000, (batch,), generator=g)
    elif key == "vit_b16":
        import timm

        model = timm.create_model("vit_base_patch16_224", pretrained=False)
        x = torch.randn(batch, 3, 224, 224, generator=g)
        y = torch.randint(0, 1000, (batch,), generator=g)
    elif key == "gpt2":
        from transformers import GPT2Config, GPT2LMHeadModel

        cfg = GPT2Config(n_layer=12, n_embd=768, n_head=12, n_positions=1024, vocab_size=50257,
                         resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, use_cache=False)
        model = GPT2LMHeadModel(cfg)
        ids = torch.randint(0, cfg.vocab_size, (batch, 1024), generator=g)
        model = model.to(device)
        ids = ids.to(device)

        def loss_fn(m):
            return m(input_ids=ids, labels=ids).loss

        return model, loss_fn
    elif key == "tiny":
        model = _Tiny()
        x = torch.randn(batch, 3, 16, 16, generator=g)
        y = torch.randint(0, 10, (batch,), generator=g)
    else:
        raise ValueError(key)
    model = model.to(device)
    x, y = x.to(device), y.to(device)
    if layout == "channels_last":
        model = model.to(memory_format=torch.channels_last)
        x = x.contiguous(memory_format=torch.channels_last)

    def loss_fn(m):
        return F.cross_entropy(m(x), y)

    return model, loss_fn


def _normkit_context():
    import normkit

    for owner in (normkit, getattr(normkit, "aten", None)):
        if owner is not None and hasattr(owner, "enabled"):
            return owner.enabled()
    import importlib

    aten = importlib.import_module("normkit.aten")
    return aten.enabled()


def _call_counts():
    try:
        import importlib

        aten = importlib.import_module("normkit.aten")
        return dict(aten.call_counts())
    except Exception:
        return None


NORM_OP = re.compile(r"(batch_?norm|layer_?norm|rms_?norm|group_?norm|instance_?norm|^normkit::)", re.I)


def _normkit_kernel_names() -> set:
    """Names of normkit's Triton kernels (they carry generic names such as ``_fwd_rows_kernel``)."""
    names = set()
    try:
        import importlib
        import pkgutil

        import normkit.kernels as K

        for m in pkgutil.iter_modules(K.__path__):
            try:
                mod = importlib.import_module(f"normkit.kernels.{m.name}")
            except Exception:
                continue
            for attr, val in vars(mod).items():
                if type(val).__name__ in ("JITFunction", "Autotuner", "Heuristics") or \
                        (hasattr(val, "fn") and hasattr(val, "run") and attr.endswith("kernel")):
                    names.add(attr)
    except Exception:
        pass
    return names


def is_norm_kernel(name: str, extra=frozenset()) -> bool:
    return bool(NORM_KERNEL.search(name)) or name in extra or name.split("(")[0].split("<")[0].strip() in extra


def _union_us(intervals) -> float:
    """Length of the union of (start, end) intervals: GPU time during which at least one of them ran.
    Kernels launched with programmatic dependent launch start before their predecessor ends, so the sum of
    kernel durations counts that overlap twice."""
    busy, end = 0.0, float("-inf")
    for a, b in sorted(intervals):
        if b <= end:
            continue
        busy += b - max(a, end)
        end = b
    return busy


def _kernel_times(prof, device: str):
    """(total ms, norm ms, norm ms by kernel name only, top norm kernels, busy ms, norm busy ms, top other
    kernels) over the profiled steps. busy: the union of the kernels' intervals (by name only for norm), which
    overlapping kernels (programmatic dependent launch) do not inflate. other: the kernels counted in neither norm
    figure, by name (what a setting changes outside normalization).

    CUDA: a kernel counts as normalization when its name says so (ATen, cuDNN, Inductor, Liger, FlagGems,
    normkit's Triton kernels) or when the op that launched it is a normalization op or autograd node
    (which also catches the elementwise helpers those ops launch). CPU: aten op self-times by op name."""
    total = norm = by_name = 0.0
    busy = norm_busy = None
    top, other = {}, {}
    if device == "cuda":
        from torch.autograd import DeviceType

        extra = frozenset(_normkit_kernel_names())
        events = prof.events()
        # GPU time of every device event (kernels, memcpy, memset), less user annotations
        # (record_function ranges such as "Optimizer.step#SGD.step" that kineto also puts on the GPU
        # timeline and that span other kernels: torch's own tables leave them out too); kernels named like
        # normalization counted there, so that a kernel no CPU op claims is not missed
        annot = set()
        spans, norm_spans = [], []
        for evt in events:
            if getattr(evt, "device_type", None) != DeviceType.CUDA:
                continue
            if getattr(evt, "is_user_annotation", False):
                annot.add(evt.name)
                continue
            dur = evt.time_range.elapsed_us()
            total += dur
            span = (evt.time_range.start, evt.time_range.end)
            spans.append(span)
            if is_norm_kernel(evt.name, extra):
                norm_spans.append(span)
                by_name += dur
                top[evt.name[:100]] = top.get(evt.name[:100], 0.0) + dur
            else:
                other[evt.name[:100]] = other.get(evt.name[:100], 0.0) + dur
        # plus the kernels of any other name launched under a normalization op or autograd node
        anc_only = 0.0
        for evt in events:
            kernels = getattr(evt, "kernels", None)
            if getattr(evt, "device_type", None) != DeviceType.CPU or not kernels:
                continue
            anc, p = False, evt
            while p is not None and not anc:
                anc = bool(NORM_OP.search(p.name))
                p = p.cpu_parent
            if not anc:
                continue
            for k in kernels:
                if k.name in annot or is_norm_kernel(k.name, extra):
                    continue
                anc_only += k.duration
                top[k.name[:100]] = top.get(k.name[:100], 0.0) + k.duration
                other[k.name[:100]] = other.get(k.name[:100], 0.0) - k.duration
        norm = by_name + anc_only
        busy, norm_busy = _union_us(spans) / 1e3, _union_us(norm_spans) / 1e3
    else:
        for evt in prof.key_averages():
            if not evt.key.startswith("aten::"):
                continue
            t = evt.self_cpu_time_total
            total += t
            if NORM_OP.search(evt.key):
                norm += t
                by_name += t
                top[evt.key[:100]] = top.get(evt.key[:100], 0.0) + t
    top = dict(sorted(top.items(), key=lambda kv: -kv[1])[:8])
    other = dict(sorted(((k, v) for k, v in other.items() if v > 0), key=lambda kv: -kv[1])[:16])
    return (total / 1e3, norm / 1e3, by_name / 1e3, {k: v / 1e3 for k, v in top.items()}, busy, norm_busy,
            {k: v / 1e3 for k, v in other.items()})


def run_one(name: str, setting: str, device: str, steps: int, warmup: int, seed: int, lr: float = 0.01,
            profile_steps: int = 3) -> dict:
    key, batch, layout = MODELS[name]
    row = {"model": name, "setting": setting, "batch": batch, "layout": layout, "steps": steps,
           "autocast": "bfloat16", "status": None, "note": None}
    model = opt = None
    try:
        ctx = _normkit_context() if setting == "normkit" else contextlib.nullcontext()
        model, loss_fn = _build(key, batch, layout, device, seed)
        model.train()
        opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
        sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)

        def step():
            with torch.autocast(device_type=device, dtype=torch.bfloat16):
                loss = loss_fn(model)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            return loss.detach()

        with ctx:
            before = _call_counts()
            losses = []
            if device == "cuda":
                torch.cuda.reset_peak_memory_stats()
            warmup = min(warmup, max(steps - 1, 0))
            t0 = e0 = None
            for i in range(steps):
                if i == warmup:
                    sync()
                    t0 = time.perf_counter()
                    if device == "cuda":
                        e0 = torch.cuda.Event(enable_timing=True)
                        e0.record()
                losses.append(step())
            if device == "cuda":
                e1 = torch.cuda.Event(enable_timing=True)
                e1.record()
                e1.synchronize()
                step_ms = e0.elapsed_time(e1) / (steps - warmup)
                row["peak_mem_gib"] = torch.cuda.max_memory_allocated() / 2**30
            else:
                step_ms = (time.perf_counter() - t0) * 1e3 / (steps - warmup)
            after = _call_counts()
            from torch.profiler import ProfilerActivity, profile

            acts = [ProfilerActivity.CPU, ProfilerActivity.CUDA] if device == "cuda" else [ProfilerActivity.CPU]
            with profile(activities=acts) as prof:
                for _ in range(profile_steps):
                    step()
                sync()
        total, norm, by_name, top, busy, norm_busy, other = _kernel_times(prof, device)
        row.update(step_ms=step_ms, gpu_kernel_ms=total / profile_steps, norm_ms=norm / profile_steps,
                   gpu_busy_ms=busy / profile_steps if busy is not None else None,
                   norm_busy_ms=norm_busy / profile_steps if norm_busy is not None else None,
                   norm_ms_by_kernel_name=by_name / profile_steps,
                   norm_share=(norm / total) if total else None, top_norm_kernels=top,
                   top_other_kernels={k: v / profile_steps for k, v in other.items()},
                   losses=[float(v) for v in torch.stack(losses).float().cpu()],
                   final_loss=float(losses[-1].float().item()), status="ok")
        if device != "cuda":
            row["note"] = "CPU: times are aten op self-times, not GPU kernels"
        if before is not None and after is not None:
            row["normkit_calls"] = {k: after.get(k, 0) - before.get(k, 0) for k in after
                                    if after.get(k, 0) - before.get(k, 0)}
            if setting == "normkit":
                n_calls = sum(row["normkit_calls"].values())
                row["note"] = (row["note"] + "; " if row["note"] else "") + \
                    f"{n_calls} aten calls through normkit in {steps} steps"
    except Exception as e:
        row["status"] = "error"
        row["note"] = f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"[:300]
    finally:
        del model, opt
        gc.collect()
        if device == "cuda":
            try:
                torch.cuda.synchronize()
                torch.cuda.empty_cache()
            except Exception:
                pass
    return row


def run_models(names, device: str, steps: int = 20, warmup: int = 5, seed: int = 0, progress=None,
               over_budget=lambda: False, on_pair=None) -> list:
    """Both settings of each model in turn; ``on_pair(rows so far)`` after each model (incremental JSON).
    ``names`` are keys of MODELS, as ``resolve`` returns them: resolving them again would widen ``resnet50``
    (the NCHW model, what ``resnet50-nchw`` resolves to) to both layouts."""
    out = []
    for name in names:
        pair = {}
        for setting in ("eager", "normkit"):
            if over_budget():
                r = {"model": name, "setting": setting, "status": "skipped", "note": f"{BUDGET_SKIP} (--budget) spent"}
            else:
                r = run_one(name, setting, device, steps, warmup, seed)
            pair[setting] = r
            out.append(r)
            if progress:
                progress.update(1, f"model {name} {setting}")
        e, n = pair["eager"], pair["normkit"]
        if e.get("status") == "ok" and n.get("status") == "ok":
            n["speedup"] = e["step_ms"] / n["step_ms"]
            n["loss_rel_diff"] = abs(n["final_loss"] - e["final_loss"]) / max(abs(e["final_loss"]), 1e-12)
            n["note"] = (n.get("note") + "; " if n.get("note") else "") + \
                f"loss vs eager: rel diff {n['loss_rel_diff']:.2e}"
        if on_pair is not None:
            on_pair(list(out))
    return out
