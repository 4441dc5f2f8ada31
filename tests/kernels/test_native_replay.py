"""normkit.kernels._native: plans replayed by the compiled ``_replay.cpp``.

Without a GPU the extension is built as on the GPU machine and pointed at a stand-in CUDA driver (a small
C library compiled here) that records each ``cuLaunchKernelEx`` call: grid, block, shared memory, stream,
function, attributes and the parameter values. The tests check that the recorded parameters are what
Triton 3.6's launcher passes (one value per non-constexpr parameter in its signature type, then the two
scratch pointers), that outputs are allocated as the Python replay allocates them, and that a replay
falls back where it must. The CUDA tests compare native and Python replays bit for bit on the H200.
"""

import ctypes
import os
import shutil
import struct
import subprocess
from types import SimpleNamespace as NS

import pytest
import torch

from normkit.kernels import _launch, _native, _plan
from plan_fakes import CudaLike, fake_cuda

_FAKE_DRIVER = r"""
#include "cuda.h"
#include <string.h>

#define MAXL 16
#define MAXP 64
static unsigned long long rec[MAXL][16 + MAXP];
static int n_launches = 0, ctx_made = 0;
static CUcontext current = 0;

CUresult cuLaunchKernelEx(const CUlaunchConfig* c, CUfunction f, void** params, void** extra) {
  if (n_launches == MAXL) return CUDA_ERROR_INVALID_VALUE;
  unsigned long long* r = rec[n_launches++];
  r[0] = c->gridDimX; r[1] = c->gridDimY; r[2] = c->gridDimZ; r[3] = c->blockDimX;
  r[4] = c->blockDimY * 1000 + c->blockDimZ; r[5] = c->sharedMemBytes;
  r[6] = (unsigned long long)c->hStream; r[7] = (unsigned long long)f; r[8] = c->numAttrs;
  for (unsigned i = 0; i < c->numAttrs && i < 2; ++i) {
    r[9 + 2 * i] = c->attrs[i].id;
    r[10 + 2 * i] = (unsigned long long)c->attrs[i].value.cooperative;  /* the union's first int */
  }
  int n = 0;
  while (n < MAXP && params[n] != 0) { memcpy(&r[16 + n], params[n], 8); ++n; }
  r[13] = n;
  r[14] = extra == 0;
  return c->gridDimX == 777 ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS;
}
CUresult cuCtxGetCurrent(CUcontext* c) { *c = current; return CUDA_SUCCESS; }
CUresult cuCtxSetCurrent(CUcontext c) { current = c; return CUDA_SUCCESS; }
CUresult cuDeviceGet(CUdevice* d, int i) { *d = i; return CUDA_SUCCESS; }
CUresult cuDevicePrimaryCtxRetain(CUcontext* c, CUdevice d) {
  ++ctx_made; *c = (CUcontext)(unsigned long)(0x1000 + d); return CUDA_SUCCESS;
}
CUresult cuGetErrorString(CUresult e, const char** s) { *s = "stand-in error"; return CUDA_SUCCESS; }
int nk_launches(void) { return n_launches; }
int nk_contexts(void) { return ctx_made; }
void nk_record(int i, unsigned long long* out) { memcpy(out, rec[i], sizeof(rec[i])); }
void nk_reset(void) { n_launches = 0; }
"""


def _cuda_include():
    try:
        import triton
    except ImportError:
        return None
    d = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "include")
    return d if os.path.exists(os.path.join(d, "cuda.h")) else None


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """(extension module pointed at the stand-in driver, the driver via ctypes)."""
    inc = _cuda_include()
    if inc is None or shutil.which(os.environ.get("CXX", "c++")) is None or shutil.which("cc") is None:
        pytest.skip("needs a C / C++ compiler and Triton's cuda.h")
    d = tmp_path_factory.mktemp("native")
    src = d / "fake_driver.c"
    src.write_text(_FAKE_DRIVER)
    lib = d / "libfakecuda.so"
    subprocess.run(["cc", "-O1", "-shared", "-fPIC", f"-I{inc}", str(src), "-o", str(lib)], check=True)
    mod = _native.load(_native.build(), str(lib))
    yield mod, ctypes.CDLL(str(lib)), str(lib)
    _real_driver(mod)


def _real_driver(mod):
    """An extension is loaded once per process: the real replay shares ``mod``'s driver, so point it back."""
    if torch.cuda.is_available():
        mod.init("libcuda.so.1")




class _Kernel:
    """A JITFunction stand-in whose compiled kernel has a Triton 3.6 signature and launcher attributes."""

    def __init__(self, signature, num_warps=4, shared=0, coop=False, pdl=False, function=0xF00D):
        def fn(x, y, out, n, scale, BLOCK: "tl.constexpr"):
            pass

        self.fn = fn
        run = type("CudaLauncher", (), {})()
        run.global_scratch_size = run.profile_scratch_size = 0
        run.launch_cooperative_grid, run.launch_pdl = coop, pdl
        run.launch = lambda *a: pytest.fail("the Python replay ran")
        self.compiled = NS(function=function, packed_metadata=(num_warps, 1, shared), run=run,
                           src=NS(signature=signature))

    def __getitem__(self, grid):
        return lambda *a, **k: self.compiled


_SIG = {"x": "*fp32", "y": "*fp32", "out": "*fp32", "n": "i32", "scale": "fp32", "BLOCK": "constexpr"}


@pytest.fixture
def native(built, monkeypatch):
    mod, drv, lib = built
    mod.init(lib)
    monkeypatch.setattr(torch._C, "_cuda_getDevice", lambda: 0, raising=False)
    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", lambda dev: 0xABC, raising=False)
    monkeypatch.setattr(_launch, "_RAW_TRITON", True)
    monkeypatch.setattr(_launch, "_runtime_knobs", NS(launch_enter_hook=None, launch_exit_hook=None))
    monkeypatch.setattr(_native, "_module", mod)
    monkeypatch.setattr(_native, "_on", True)
    _launch.set_direct(True)
    was = _plan.enabled()
    _plan.set_plans(True)
    drv.nk_reset()
    yield drv
    _real_driver(mod)
    _plan.set_plans(was)
    _launch.set_direct(True)


def _launches(drv):
    out = []
    for i in range(drv.nk_launches()):
        buf = (ctypes.c_ulonglong * 80)()
        drv.nk_record(i, buf)
        r = list(buf)
        out.append(NS(grid=tuple(r[0:3]), block=r[3], block_yz=r[4], shared=r[5], stream=r[6], function=r[7],
                      attrs=[(r[9 + 2 * k], r[10 + 2 * k]) for k in range(r[8])], params=r[16:16 + r[13]],
                      extra_null=r[14]))
    return out


def _f32(v):
    return struct.unpack("<I", struct.pack("<f", v))[0]


def _run_two_launches(kernel, x, y, scale2=2.0):
    out = _launch.alloc(torch.empty(6, 4).as_subclass(CudaLike))
    scratch = _launch.alloc(torch.empty(3, dtype=torch.int32).as_subclass(CudaLike))
    _launch.launch(kernel, (2,), x, y, out, 24, 0.5, BLOCK=32)
    _launch.launch(kernel, (1, 3), out, out, scratch, -3, scale2, BLOCK=16)
    return out, x


def test_native_replay_packs_what_tritons_launcher_packs(native):
    k = _Kernel(_SIG, num_warps=8, shared=1024)
    x, y = fake_cuda(), fake_cuda()
    _plan.planned("nat", (x, y), lambda: _run_two_launches(k, x, y))  # recorded, launched by "Triton"
    assert native.nk_launches() == 0
    x2, y2 = fake_cuda(), fake_cuda(offset=4)  # (16 bytes in: the same alignment)
    out, xr = _plan.planned("nat", (x2, y2), lambda: pytest.fail("not replayed"))
    assert xr is x2 and out.shape == (6, 4) and out.stride() == (4, 1) and out.dtype == torch.float32
    first, second = _launches(native)
    for r in (first, second):
        assert (r.block, r.block_yz, r.shared, r.stream, r.function) == (256, 1001, 1024, 0xABC, 0xF00D)
        assert r.attrs == [] and r.extra_null
    assert first.grid == (2, 1, 1) and second.grid == (1, 3, 1)
    # x, y, out, n (i32), scale (fp32 bits), then the global and profile scratch pointers; BLOCK is constexpr
    assert first.params == [x2.data_ptr(), y2.data_ptr(), out.data_ptr(), 24, _f32(0.5), 0, 0]
    scratch_ptr = second.params[2]
    assert second.params == [out.data_ptr(), out.data_ptr(), scratch_ptr, (-3) & 0xFFFFFFFF, _f32(2.0), 0, 0]
    assert scratch_ptr not in (0, out.data_ptr(), x2.data_ptr()) and scratch_ptr % 16 == 0
    assert native.nk_contexts() == 1, "a thread without a current context got the primary one, once"


def test_native_replay_scalar_holes_and_types(native):
    sig = {"x": "*bf16", "y": "*fp32", "out": "*fp32", "n": "i64", "scale": "fp32", "BLOCK": "constexpr"}
    k = _Kernel(sig, pdl=True, coop=True)
    x, y = fake_cuda(dtype=torch.bfloat16), fake_cuda()

    def run(x, y, m):
        out = _launch.alloc(torch.empty(5).as_subclass(CudaLike))
        _launch.launch(k, (3, 2, 2), x, y, out, -(1 << 40), _launch.scalar(m, 0), BLOCK=4)
        return (out,)

    _plan.planned("sc", (x, y), lambda: run(x, y, 0.1), (0.1,))
    for m in (0.25, 1e-3, -0.4):
        (out,) = _plan.planned("sc", (x, y), lambda: pytest.fail("not replayed"), (m,))
        r = _launches(native)[-1]
        assert r.grid == (3, 2, 2) and r.block == 128
        assert r.params == [x.data_ptr(), y.data_ptr(), out.data_ptr(), (-(1 << 40)) & (2 ** 64 - 1), _f32(m), 0, 0]
        # programmatic stream serialization (6) and cooperative (2), as Triton's launcher orders them
        assert r.attrs == [(6, 1), (2, 1)]


def test_native_replay_clocks(native, built):
    mod = built[0]
    k = _Kernel(_SIG)
    x, y = fake_cuda(), fake_cuda()
    _plan.planned("clk", (x, y), lambda: _run_two_launches(k, x, y))
    mod.set_timing(True)
    try:
        for _ in range(3):
            _plan.planned("clk", (x, y), lambda: pytest.fail("not replayed"))
        t = mod.timings()
    finally:
        mod.set_timing(False)
    assert t["replays"] == 3 and native.nk_launches() == 6
    assert 0 < t["alloc_ns"] < t["total_ns"] and 0 < t["launch_ns"] < t["total_ns"]
    assert t["alloc_ns"] + t["launch_ns"] <= t["total_ns"]


def test_native_replay_falls_back_on_alignment_and_skips_empty_grids(native):
    k = _Kernel(_SIG)
    k.compiled.run.launch = lambda *a: None  # (the launcher path, when a replay does not apply)
    x, y = fake_cuda(), fake_cuda()
    calls = []

    def run(x, y):
        calls.append(1)
        return _run_two_launches(k, x, y)

    _plan.planned("al", (x, y), lambda: run(x, y))
    _plan.planned("al", (fake_cuda(offset=1), y), lambda: run(x, y))  # x 4 bytes off 16: another binary
    assert len(calls) == 2 and native.nk_launches() == 0

    def empty(x, y):
        out = _launch.alloc(torch.empty(2).as_subclass(CudaLike))
        _launch.launch(k, (0,), x, y, out, 2, 1.0, BLOCK=2)
        return (out,)

    _plan.planned("em", (x, y), lambda: empty(x, y))
    (out,) = _plan.planned("em", (x, y), lambda: pytest.fail("not replayed"))
    assert out.shape == (2,) and native.nk_launches() == 0


def test_native_replay_raises_the_drivers_error(native):
    k = _Kernel(_SIG)
    x, y = fake_cuda(), fake_cuda()

    def run():
        out = _launch.alloc(torch.empty(2).as_subclass(CudaLike))
        _launch.launch(k, (777,), x, y, out, 2, 1.0, BLOCK=2)
        return (out,)

    _plan.planned("err", (x, y), run)
    with pytest.raises(RuntimeError, match="cuLaunchKernelEx: CUDA error 1 .stand-in error"):
        _plan.planned("err", (x, y), run)


def test_native_replay_raises_torchs_allocation_error(built):
    mod = built[0]
    huge = ((1 << 50,), (1,), torch.uint8)
    plan = mod.make_plan(0, 1, [], [huge], 0, [], [1])
    with pytest.raises(Exception) as native_err:
        mod.replay(plan, (torch.randn(4),), (), 0)
    with pytest.raises(Exception) as torch_err:
        torch.empty_strided(*huge[:2], dtype=huge[2])
    assert native_err.type is torch_err.type and str(native_err.value)[:40] == str(torch_err.value)[:40]


def test_make_plan_and_replay_check_their_slots(built):
    mod = built[0]
    step = (1, 1, 1, 1, 32, 0, False, False, [(1, 3, 0)])  # a pointer from slot 3: one input, two allocations
    alloc = ((2,), (1,), torch.float32)
    with pytest.raises(ValueError, match="slot out of range"):
        mod.make_plan(0, 1, [], [alloc, 0], 64, [step], [1])
    with pytest.raises(ValueError, match="slot out of range"):
        mod.make_plan(0, 1, [(1, 0, True)], [alloc], 0, [], [1])  # an alignment check on a non-input slot
    plan = mod.make_plan(0, 1, [], [alloc], 0, [(1, 1, 1, 1, 32, 0, False, False, [(2, 1, 0)])], [1])
    with pytest.raises(ValueError, match="another length"):
        mod.replay(plan, (fake_cuda(),), (), 0)  # the step takes scalar slot 1
    with pytest.raises(ValueError, match="another length"):
        mod.replay(plan, (fake_cuda(), fake_cuda()), (0.5, 0.5), 0)


def test_unsupported_signatures_keep_the_python_replay(native, monkeypatch):
    log = []
    real_params = _plan._native_params
    bad_kind = lambda *a: [(9, 0, 0)]  # noqa: E731  (make_plan refuses it: ValueError)
    for sig, params in (({**_SIG, "n": "fp16"}, real_params), (None, real_params), ({"x": "*fp32"}, real_params),
                        (_SIG, bad_kind)):
        monkeypatch.setattr(_plan, "_native_params", params)
        k = _Kernel(sig)
        k.compiled.run.launch = lambda *a: log.append(a)
        x, y = fake_cuda(), fake_cuda()
        key = ("un", str(sig))
        _plan.planned(key, (x, y), lambda: _run_two_launches(k, x, y))
        _plan.planned(key, (x, y), lambda: pytest.fail("not replayed"))
        (plan,) = [p for (kk, _), p in _plan._plans.items() if kk == key]
        assert plan.native is None
    assert len(log) == 8 and native.nk_launches() == 0


def test_signature_keys_shapes_strides_dtypes_and_absent_inputs(built):
    mod = built[0]
    x = torch.randn(4, 6)
    w = torch.randn(6)
    sig = mod.signature((x, w, None))
    assert isinstance(sig, bytes) and sig == mod.signature((torch.randn(4, 6), torch.randn(6), None))
    others = [(x.t(), w, None), (x[:, :3], w, None), (x.double(), w, None), (x, w, w.clone()), (x, None, w),
              (x.reshape(4, 6, 1), w, None), (x, w[:3], None)]
    sigs = {mod.signature(o) for o in others} | {sig}
    assert len(sigs) == len(others) + 1
    assert mod.signature((x, w, w)) is None and mod.signature((x, x)) is None  # one tensor in two slots
    assert mod.signature(()) == b"" and mod.signature((None,)) == b"\xff"
    assert mod.signature((x.to_sparse(), w)) is None and mod.signature((x.to_sparse_csr(),)) is None
    assert mod.signature((torch.nested.nested_tensor([w, w[:2]]),)) is None
    assert mod.signature((x, w.to("meta"))) != mod.signature((x, w))  # the device is keyed
    with pytest.raises(TypeError):
        mod.signature((x, 3))


def test_const_bits_match_tritons_packing():
    assert _plan._const_bits("i32", -1) == 0xFFFFFFFF and _plan._const_bits("i1", True) == 1
    assert _plan._const_bits("u64", 2 ** 63) == 2 ** 63 and _plan._const_bits("i16", -2) == 0xFFFE
    assert _plan._const_bits("fp32", 1e39) == 0x7F800000  # (float)1e39 is inf, as in C
    assert _plan._const_bits("bf16", 1.0) == 0x3F80 and _plan._const_bits("fp64", 0.5) == 0x3FE0000000000000
    assert _plan._const_bits("*fp32", None) == 0 and _plan._const_bits("fp16", 1.0) is None


_STRUCT = {"i1": "<b", "i8": "<b", "i16": "<h", "i32": "<i", "i64": "<q", "u1": "<B", "u8": "<B", "u16": "<H",
           "u32": "<I", "u64": "<Q", "fp32": "<f", "fp64": "<d"}


@pytest.mark.parametrize("seed", range(3))
def test_native_replay_packs_random_signatures_as_c_would(native, seed):
    """Random signatures of every type the replay packs, random values in range: each parameter's bytes are the
    little-endian bytes C gets from the launcher's typed locals (struct.pack), zero-padded to the 8-byte slot."""
    import random

    rnd = random.Random(seed)
    types = [rnd.choice(list(_STRUCT) + ["bf16", "constexpr", "*fp32"]) for _ in range(12)]
    ints = {"i1": (0, 1), "i8": (-128, 127), "i16": (-2 ** 15, 2 ** 15 - 1), "i32": (-2 ** 31, 2 ** 31 - 1),
            "i64": (-2 ** 63, 2 ** 63 - 1), "u1": (0, 1), "u8": (0, 255), "u16": (0, 2 ** 16 - 1),
            "u32": (0, 2 ** 32 - 1), "u64": (0, 2 ** 64 - 1)}
    values = [rnd.randint(*ints[t]) if t in ints else rnd.uniform(-1e30, 1e30) if t in ("fp32", "fp64", "bf16")
              else 0 for t in types]
    sig = {"x": "*fp32", **{f"a{i}": t for i, t in enumerate(types)}}

    def fn(x, *a):
        pass

    k = _Kernel(sig)
    k.fn = fn  # (its parameters: x then twelve more; the signature says what each one is)
    x = fake_cuda()

    def run():
        _launch.launch(k, (1,), x, *values)
        return (x,)

    key = ("rand", seed)
    _plan.planned(key, (x,), run)
    _plan.planned(key, (x,), lambda: pytest.fail("not replayed"))
    got = _launches(native)[-1].params
    want = [x.data_ptr()]
    for t, v in zip(types, values):
        if t == "constexpr":
            continue
        if t.startswith("*"):
            want.append(v)
        elif t == "bf16":
            want.append(struct.unpack("<I", struct.pack("<f", v))[0] >> 16)
        else:
            raw = struct.pack(_STRUCT[t], v)
            want.append(int.from_bytes(raw, "little"))
    assert got == want + [0, 0]


def test_the_build_is_cached_and_atomic(tmp_path, monkeypatch):
    if _cuda_include() is None or shutil.which(os.environ.get("CXX", "c++")) is None:
        pytest.skip("needs a C++ compiler and Triton's cuda.h")
    monkeypatch.setenv("NORMKIT_CACHE_DIR", str(tmp_path))
    broken = tmp_path / "broken.cpp"
    broken.write_text("this is not C++\n")
    with pytest.raises(RuntimeError, match="compiling broken.cpp failed"):
        _native.build(str(broken))
    assert [p.name for p in tmp_path.iterdir()] == ["broken.cpp"]  # no half-written module left
    tiny = tmp_path / "tiny.cpp"
    tiny.write_text("extern \"C\" int nk_tiny() { return 7; }\n")
    first = _native.build(str(tiny))
    stamp = os.stat(first).st_mtime_ns
    assert _native.build(str(tiny)) == first and os.stat(first).st_mtime_ns == stamp
    assert ctypes.CDLL(first).nk_tiny() == 7


def test_start_reports_why_it_is_unavailable(monkeypatch):
    monkeypatch.setattr(_native, "_thread", None)
    monkeypatch.setattr(_native, "_module", None)
    monkeypatch.setattr(_native, "_on", True)
    monkeypatch.setattr(_native, "build", lambda: (_ for _ in ()).throw(RuntimeError("no compiler here")))
    _native.start()
    assert _native.wait(60) is False
    assert _native.status() == "unavailable: RuntimeError: no compiler here"
    monkeypatch.setattr(_native, "_on", False)
    assert _native.status() == "off"


@pytest.mark.cuda
@pytest.mark.parametrize("layout", ["contiguous", "channels_last"])
def test_cuda_native_replay_same_bits_as_python(layout):
    """Batch norm forward and backward, layer and RMS norm through native replays: the bits of the
    Python replays (the plans' CUDA tests in test_plan.py compare those with the launchers)."""
    if not torch.cuda.is_available():
        pytest.skip("CUDA")
    from normkit import functional as F

    _native.start()
    assert _native.wait(300), _native.status()
    torch.manual_seed(0)
    fmt = torch.channels_last if layout == "channels_last" else torch.contiguous_format
    x = torch.randn(8, 24, 7, 9, device="cuda", dtype=torch.bfloat16).to(memory_format=fmt)
    w, b = torch.rand(24, device="cuda") + 0.5, torch.randn(24, device="cuda")
    h = torch.randn(64, 3000, device="cuda", dtype=torch.bfloat16)
    wh = torch.rand(3000, device="cuda", dtype=torch.bfloat16) + 0.5
    gy, gh = torch.randn_like(x), torch.randn_like(h)

    def step():
        rm, rv = torch.zeros(24, device="cuda"), torch.ones(24, device="cuda")
        outs = []
        for training, mom in ((True, 0.1), (True, 0.3), (False, 0.1)):
            xi = x.detach().requires_grad_()
            y = F.batch_norm(xi, rm, rv, w, b, training=training, momentum=mom)
            y.backward(gy)
            outs += [y, xi.grad, rm.clone(), rv.clone()]
        hi = h.detach().requires_grad_()
        for fn in (lambda t: F.layer_norm(t, (3000,), wh, None), lambda t: F.rms_norm(t, (3000,), wh)):
            hi.grad = None
            y = fn(hi)
            y.backward(gh)
            outs += [y, hi.grad]
        return outs

    _native.set_native(False)
    step()
    python = step()
    _native.set_native(True)
    step()  # (each plan made native on its first replay)
    native = step()
    assert all(p.native is not None for p in _plan._plans.values() if p is not None), "every plan native"
    for a, b_ in zip(python, native):
        assert torch.equal(a, b_) and a.stride() == b_.stride()
