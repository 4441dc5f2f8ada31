"""Which launch path normkit's kernels take on this GPU: launches a batch-norm forward + backward and a
layer-norm forward twice (misses, then hits) and prints `_launch.raw_summary()` with, for each cached
compiled kernel, its launcher's type and the attributes the raw C-launcher call needs.

    PYTHONPATH=src python benchmarks/probe_raw.py
"""

import torch
import triton

from normkit.kernels import _launch
from normkit.kernels import batch_norm as B
from normkit.kernels import layer_norm as L


def main():
    print("triton", triton.__version__, "raw version gate", _launch._RAW_TRITON, flush=True)
    x = torch.randn(32, 64, 8, 8, device="cuda", dtype=torch.bfloat16)
    w, b = torch.rand(64, device="cuda") + 0.5, torch.randn(64, device="cuda")
    h = torch.randn(64, 1024, device="cuda", dtype=torch.bfloat16)
    for _ in range(2):
        y, m, s = B.bn_forward_train(x, w, b, None, None, 0.1, 1e-5)
        B.bn_backward(y, x, w, m, s, True, (True, True, True))
        L.ln_forward(h, None, None, 1e-5)
    torch.cuda.synchronize()
    print("raw_summary", _launch.raw_summary(), flush=True)
    rt = triton.knobs.runtime
    print("launch hooks", type(rt.launch_enter_hook).__name__, "none installed:",
          _launch._no_hook(rt.launch_enter_hook) and _launch._no_hook(rt.launch_exit_hook), flush=True)
    for key, (compiled, _tail, raw) in list(_launch._cache.items())[:4]:
        run = compiled.run
        attrs = {a: getattr(run, a, "MISSING") for a in ("global_scratch_size", "profile_scratch_size",
                                                          "launch_cooperative_grid", "launch_pdl")}
        print(key[0].fn.__name__, type(run).__module__, type(run).__name__, "raw" if raw else "wrapper", attrs,
              flush=True)


if __name__ == "__main__":
    main()
