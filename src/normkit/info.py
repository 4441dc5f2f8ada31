"""`python -m normkit info`: versions, devices, available kernels, whether `enable()` is active."""

from __future__ import annotations

import argparse
import importlib
import json
import platform
import sys


def collect() -> dict:
    import torch

    import normkit
    from normkit import aten, kernels

    info: dict = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "triton": None,
        "normkit": normkit.__version__,
        "platform": platform.platform(),
    }
    if kernels.available():
        import triton

        info["triton"] = triton.__version__
    cuda = torch.cuda.is_available()
    devices = []
    if cuda:
        for i in range(torch.cuda.device_count()):
            p = torch.cuda.get_device_properties(i)
            devices.append({"index": i, "name": p.name, "capability": f"{p.major}.{p.minor}",
                            "memory_gib": round(p.total_memory / 2**30, 1), "sms": p.multi_processor_count})
    info["cuda"] = {"available": cuda, "torch_cuda": torch.version.cuda, "devices": devices}
    info["triton_interpreter"] = kernels.interpreting()
    kinfo = {}
    from normkit.ops._select import _FAMILY_MODULE

    for family, modname in _FAMILY_MODULE.items():
        if not kernels.available():
            kinfo[family] = "unavailable (triton does not import)"
            continue
        try:
            importlib.import_module(modname)
        except Exception as exc:  # module not written yet, or broken
            kinfo[family] = f"unavailable ({type(exc).__name__}: {exc})".splitlines()[0][:120]
            continue
        if cuda:
            kinfo[family] = "triton (cuda)"
        elif kernels.interpreting():
            kinfo[family] = "triton (interpreter, cpu)"
        else:
            kinfo[family] = "importable; cpu tensors run the reference (set TRITON_INTERPRET=1 for the kernels)"
    kinfo["instance_norm"] = "through group_norm (input statistics) / batch_norm (running statistics)"
    info["kernels"] = kinfo
    info["pdl"] = _pdl_info(devices)
    info["enable"] = {"active": aten.is_enabled(), "ops": aten.registered_ops()}
    info["get_kernel_fallback"] = hasattr(torch.library, "get_kernel")
    info["host_launch"] = _host_launch_info()
    return info


def _host_launch_info() -> str:
    """The host launch path's layers: direct launches, launch plans (replayed through the compiled extension,
    normkit.kernels._native, once it is built), group norm's plans and the fast routes under enable()."""
    from normkit import kernels

    if not kernels.available():
        return "no (Triton unavailable)"
    from normkit.kernels import _launch, _native, _plan, group_norm
    from normkit.ops import batch_norm

    direct = "on" if _launch.direct_enabled() else "off (NORMKIT_DIRECT_LAUNCH=0)"
    if not _plan.enabled():
        return f"direct launches: {direct}; launch plans: off (NORMKIT_LAUNCH_PLANS=0), so no replays or fast routes"
    routes = "on (batch, layer, RMS norm)" if batch_norm.fast_routes_enabled() else "off (NORMKIT_FAST_ROUTES=0)"
    gn_plans = "on" if group_norm._CFG["plans"] else "off"
    return (f"direct launches: {direct}; launch plans: on (group norm's: {gn_plans}), replayed in C++: "
            f"{_native.status()} (built in the background by the first CUDA plan); fast routes under enable(): {routes}")


def _pdl_info(devices) -> dict:
    """Programmatic dependent launch: per CUDA device whether normkit uses it, and the kernel knobs."""
    from normkit import kernels

    if not kernels.available():
        return {"devices": {}, "knobs": {}}
    from normkit.kernels import _launch, batch_norm, group_norm, layer_norm

    return {"devices": {d["index"]: _launch.pdl_supported(d["index"]) for d in devices},
            "knobs": {"batch_norm": bool(batch_norm._TUNE["pdl"]), "group_norm": bool(group_norm._CFG["pdl"]),
                      "layer/rms dw-db reduction, rows up to": layer_norm._CFG["pdl_max_block"]}}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m normkit info",
                                     description="versions, devices, available kernels, enable() state")
    parser.add_argument("--json", action="store_true", help="print the same as JSON")
    args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    info = collect()
    if args.json:
        print(json.dumps(info, indent=2))
        return 0
    print(f"normkit {info['normkit']}")
    print(f"python  {info['python']}  ({info['platform']})")
    print(f"torch   {info['torch']}  (cuda {info['cuda']['torch_cuda']})")
    print(f"triton  {info['triton'] or 'not available'}")
    print("devices:")
    print("  cpu")
    for d in info["cuda"]["devices"]:
        print(f"  cuda:{d['index']}  {d['name']}  sm_{d['capability'].replace('.', '')}  "
              f"{d['memory_gib']} GiB  {d['sms']} SMs")
    if not info["cuda"]["available"]:
        print("  (no CUDA device)")
    print(f"triton interpreter (TRITON_INTERPRET=1): {'on' if info['triton_interpreter'] else 'off'}")
    print("kernels:")
    for family, state in info["kernels"].items():
        print(f"  {family:<22} {state}")
    pdl = info["pdl"]
    if pdl["knobs"]:
        where = ", ".join(f"cuda:{i} {'yes' if on else 'no (needs NVIDIA sm_90+)'}" for i, on in pdl["devices"].items())
        knobs = ", ".join(f"{k} {v}" for k, v in pdl["knobs"].items())
        print(f"programmatic dependent launch: {where or 'no CUDA device'}; {knobs}")
    print(f"host launch path: {info['host_launch']}")
    en = info["enable"]
    print(f"enable(): {'active' if en['active'] else 'inactive'}"
          + (f" ({len(en['ops'])} aten ops overridden)" if en["active"] else ""))
    print(f"fallback to the original aten kernels: "
          f"{'torch.library.get_kernel' if info['get_kernel_fallback'] else 'unavailable (normkit reference instead)'}")
    return 0
