"""Layer/RMS norm Triton kernels against a float64 plain-torch reference.

Without CUDA these run on CPU tensors through the Triton interpreter (``TRITON_INTERPRET=1``, set
here before triton is imported). If another test module imported the kernels compiled (no
interpreter), the CPU checks rerun in a subprocess. Tests marked ``cuda`` need a GPU.
"""

import math
import os

import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"


import pytest  # noqa: E402

triton = pytest.importorskip("triton")

from normkit.kernels import layer_norm as L  # noqa: E402
from interp_rerun import rerun_cpu_checks  # noqa: E402
from pdl_check import assert_pdl_same_bits  # noqa: E402

INTERPRETED = type(L._fwd_rows_kernel).__name__ == "InterpretedFunction"
interp = pytest.mark.skipif(not INTERPRETED, reason="kernels were imported compiled; see test_cpu_checks_in_subprocess")

DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64]
# relative L2 error allowed, per dtype: about 2x what ATen shows on the same inputs (output rounding
# dominates in half precision), with room for the rounded fp32 mean a +1000 offset implies in backward
TOL = {torch.float64: 1e-12, torch.float32: 2e-6, torch.float16: 2e-3, torch.bfloat16: 1.2e-2}
TOL_BWD = {torch.float64: 1e-11, torch.float32: 1e-4, torch.float16: 4e-3, torch.bfloat16: 2e-2}


# ------------------------------------------------------------------------------------------------
# reference (float64, plain torch, on the same rounded inputs)


def ref_ln(x, w, b, eps):
    xd = x.double()
    m = xd.mean(1, keepdim=True)
    var = ((xd - m) ** 2).mean(1, keepdim=True)
    r = (var + eps).rsqrt()
    y = (xd - m) * r
    if w is not None:
        y = y * w.double()
    if b is not None:
        y = y + b.double()
    return y, m.squeeze(1), r.squeeze(1)


def ref_rms(x, w, eps):
    xd = x.double()
    r = ((xd * xd).mean(1, keepdim=True) + eps).rsqrt()
    y = xd * r
    if w is not None:
        y = y * w.double()
    return y, r.squeeze(1)


def ref_ln_bwd(dy, x, w, b, eps):
    xd = x.double().requires_grad_()
    wd = None if w is None else w.double().requires_grad_()
    bd = None if b is None else b.double().requires_grad_()
    y, _, _ = ref_ln(xd, wd, bd, eps)
    y.backward(dy.double())
    return xd.grad, None if wd is None else wd.grad, None if bd is None else bd.grad


def ref_rms_bwd(dy, x, w, eps):
    xd = x.double().requires_grad_()
    wd = None if w is None else w.double().requires_grad_()
    y, _ = ref_rms(xd, wd, eps)
    y.backward(dy.double())
    return xd.grad, None if wd is None else wd.grad


def rel(a, ref, scale=None):
    """Relative L2 error; ``scale`` (the size of the terms that cancel, for dx) sets a floor on the
    denominator, so that results that are all cancellation (width 1) are judged against their terms."""
    a = a.double()
    assert torch.isfinite(a).all(), "non-finite values (unwritten or poisoned output)"
    den = ref.norm().item()
    if scale is not None:
        den = max(den, 1e-2 * scale)
    num = (a - ref).norm().item()
    return num / den if den > 1e-6 else num


def _dx_scale(dy, w, rstd):
    g = dy.double() * (1.0 if w is None else w.double()) * rstd.double()[:, None]
    return g.norm().item()


def _inputs(M, N, dtype, offset=0.0, device="cpu"):
    x = (torch.randn(M, N, dtype=torch.float64, device=device) * 1.5 + offset).to(dtype)
    dy = torch.randn(M, N, dtype=torch.float64, device=device).to(dtype)
    return x, dy


def _params(N, dtype, kind, device="cpu"):
    if kind == "none":
        return None, None
    pd = dtype if kind == "same" else torch.float32
    w = (torch.rand(N, dtype=torch.float64, device=device) + 0.5).to(pd)
    b = torch.randn(N, dtype=torch.float64, device=device).to(pd)
    return w, b


@pytest.fixture(autouse=True)
def _poison(monkeypatch):
    """Every buffer the launchers allocate starts as NaN (integers: garbage), so unwritten outputs show."""

    def alloc(shape, dtype, device):
        t = torch.empty(shape, dtype=dtype, device=device)
        if t.is_floating_point():
            t.fill_(float("nan"))
        return t

    monkeypatch.setattr(L, "_alloc", alloc)


@pytest.fixture
def small_regimes(monkeypatch):
    """Shrink the regime limits so that the looped/column kernels run on interpreter-sized rows."""
    monkeypatch.setitem(L._CFG, "fwd_max_block", 128)
    monkeypatch.setitem(L._CFG, "bwd_max_block", 128)
    monkeypatch.setitem(L._CFG, "bwd_max_block_ln", 128)
    monkeypatch.setitem(L._CFG, "fwd_chunk", 64)
    monkeypatch.setitem(L._CFG, "bwd_chunk", 64)
    monkeypatch.setitem(L._CFG, "bwd_col_block", 32)
    monkeypatch.setitem(L._CFG, "bwd_col_rows", 2)
    monkeypatch.setitem(L._CFG, "loop_progs_per_sm", 1)  # 4 persistent programs: several rows each


# ------------------------------------------------------------------------------------------------
# checks shared by the CPU (interpreter) and CUDA tests


def check_ln(M, N, dtype, kind="same", offset=0.0, device="cpu", eps=1e-5, bwd=True, x=None):
    if x is None:
        x, dy = _inputs(M, N, dtype, offset, device)
    else:
        dy = torch.randn(x.shape, device=device).to(dtype)
    w, b = _params(N, dtype, kind, device)
    y, mean, rstd = L.ln_forward(x, w, b, eps)
    assert y.shape == (M, N) and y.dtype == dtype and y.is_contiguous()
    sd = torch.float64 if dtype == torch.float64 else torch.float32
    assert mean.shape == (M,) and rstd.shape == (M,) and mean.dtype == sd and rstd.dtype == sd
    yr, mr, rr = ref_ln(x, w, b, eps)
    tag = f"ln M={M} N={N} {dtype} {kind} off={offset}"
    assert rel(y, yr) <= TOL[dtype], tag
    assert rel(rstd, rr) <= TOL[dtype], tag
    # the fp32 mean of N terms: rounding grows with the width (seen: 1.5e-6 at N=262144 on the H200)
    mtol = (abs(offset) + 4) * (1e-14 if sd == torch.float64 else 3e-7) * (1 + N / 32768)
    assert (mean.double() - mr).abs().max().item() <= mtol, tag
    if not bwd:
        return
    dx, dw, db = L.ln_backward(dy, x, mean, rstd, w, (True, w is not None, b is not None),
                               bias_dtype=None if b is None else b.dtype)
    gx, gw, gb = ref_ln_bwd(dy, x, w, b, eps)
    assert dx.dtype == dtype and dx.shape == (M, N)
    assert rel(dx, gx, _dx_scale(dy, w, rstd)) <= TOL_BWD[dtype], tag + " dx"
    if w is not None:
        pt = max(TOL_BWD[dtype], TOL_BWD[w.dtype])  # dw/db come back rounded to the param dtype
        assert dw.dtype == w.dtype and rel(dw, gw) <= pt, tag + " dw"
        assert db.dtype == b.dtype and rel(db, gb) <= pt, tag + " db"
    else:
        assert dw is None and db is None


def check_rms(M, N, dtype, kind="same", offset=0.0, device="cpu", eps=1e-6, bwd=True):
    x, dy = _inputs(M, N, dtype, offset, device)
    w, _ = _params(N, dtype, kind, device)
    y, rstd = L.rms_forward(x, w, eps)
    sd = torch.float64 if dtype == torch.float64 else torch.float32
    assert y.dtype == dtype and rstd.dtype == sd and rstd.shape == (M,)
    yr, rr = ref_rms(x, w, eps)
    tag = f"rms M={M} N={N} {dtype} {kind} off={offset}"
    assert rel(y, yr) <= TOL[dtype], tag
    assert rel(rstd, rr) <= TOL[dtype], tag
    if not bwd:
        return
    dx, dw = L.rms_backward(dy, x, rstd, w, (True, w is not None))
    gx, gw = ref_rms_bwd(dy, x, w, eps)
    assert rel(dx, gx, _dx_scale(dy, w, rstd)) <= TOL_BWD[dtype], tag + " dx"
    if w is not None:
        pt = max(TOL_BWD[dtype], TOL_BWD[w.dtype])
        assert dw.dtype == w.dtype and rel(dw, gw) <= pt, tag + " dw"


# ------------------------------------------------------------------------------------------------
# interpreter tests (CPU)

WIDTHS = [1, 7, 64, 100, 1000, 3000, 5120]


@interp
@pytest.mark.parametrize("N", WIDTHS)
def test_ln_widths_dtypes(N):
    M = 3 if N >= 1000 else 5
    for dtype in DTYPES:
        check_ln(M, N, dtype, "same")


@interp
@pytest.mark.parametrize("N", [12288, 65537, 262144])
def test_wide_widths_default_config(N):
    """The issue's wide widths with the shipped _CFG (one-row, split-row and column regimes), 2 rows
    (bf16 with fp32 params here; every dtype at these widths runs on the GPU in test_cuda_widths)."""
    check_ln(2, N, torch.bfloat16, "fp32")
    check_rms(2, N, torch.bfloat16, "same")


@interp
@pytest.mark.parametrize("N", WIDTHS)
def test_rms_widths_dtypes(N):
    M = 3 if N >= 1000 else 5
    for dtype in DTYPES:
        check_rms(M, N, dtype, "same")


@interp
@pytest.mark.parametrize("kind", ["none", "fp32"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_params_none_and_fp32(kind, dtype):
    check_ln(4, 100, dtype, kind)
    check_rms(4, 100, dtype, kind)


@interp
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("N", [64, 1000])
def test_offset_1000(N, dtype):
    check_ln(4, N, dtype, "same", offset=1000.0)
    check_rms(4, N, dtype, "same", offset=1000.0)


@interp
@pytest.mark.parametrize("N", [1023, 1024, 1025, 2048])
def test_regime_boundaries(N):
    # 1024: last width with several rows per program; above: one row per program
    check_ln(3, N, torch.float32, "same")
    check_rms(3, N, torch.bfloat16, "fp32")


@interp
@pytest.mark.parametrize("N", [1, 100, 128, 129, 300, 1000])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_looped_regimes(N, dtype, small_regimes):
    # fwd_max_block/bwd_max_block shrunk to 128: widths above take the looped forward and the
    # row-sum + column backward, with partial last chunks
    check_ln(5, N, dtype, "same", offset=1000.0 if dtype != torch.float64 else 0.0)
    check_ln(3, N, dtype, "none")
    check_rms(5, N, dtype, "fp32")


@interp
@pytest.mark.parametrize("vec, evict", [(1, 0), (1, 1), (0, 1)])
@pytest.mark.parametrize("N", [130, 300, 1025])
def test_looped_forward_variants(N, vec, evict, small_regimes, monkeypatch):
    # the looped forward's off knobs (ln_kernels.py sweep "fwdloopvec"): RMS's per-lane sums, evict-first re-reads.
    # Widths past small_regimes' 128 with partial last chunks; the residual forms are the loop's users today
    torch.manual_seed(N)
    x = (torch.randn(5, N, dtype=torch.float64) * 1.5 + 3).to(torch.bfloat16)
    r = torch.randn(5, N, dtype=torch.float64).to(torch.bfloat16)
    w = (torch.rand(N, dtype=torch.float64) + 0.5).to(torch.bfloat16)

    def run():
        return (L.rms_forward(x, w, 1e-6), L.add_rms_forward(x, r, w, 1e-6), L.ln_forward(x, w, None, 1e-5),
                L.add_ln_forward(x, r, w, None, 1e-5))

    base = run()
    monkeypatch.setitem(L._CFG, "fwd_loop_vec_acc", vec)
    monkeypatch.setitem(L._CFG, "fwd_loop_evict_first", evict)
    out, again = run(), run()
    assert all(torch.equal(a, b) for o, p in zip(out, again) for a, b in zip(o, p) if a is not None)  # run to run
    # the hint alone changes no bits; per-lane sums change RMS's (another order), not layer norm's
    for i, (o, p) in enumerate(zip(out, base)):
        same = not vec or i >= 2
        for a, b in zip(o, p):
            if a is not None and same:
                assert torch.equal(a, b), (i, N)
    check_rms(5, N, torch.bfloat16, "same")
    check_rms(4, N, torch.float32, "none")
    check_ln(3, N, torch.bfloat16, "same", offset=1000.0)
    s = (x.double() + r.double()).to(torch.bfloat16).double()  # the fused sum, rounded as the kernels store it
    y, _, rstd = out[1]
    ref = s * torch.rsqrt(s.square().mean(-1, keepdim=True) + 1e-6) * w.double()
    assert (y.double() - ref).norm() / ref.norm() < 1.6e-2 and rstd.shape == (5,)


@interp
@pytest.mark.parametrize("wide", [False, True])
def test_row_stride_and_many_rows(wide, monkeypatch):
    if wide:
        monkeypatch.setitem(L._CFG, "fwd_max_block", 64)
        monkeypatch.setitem(L._CFG, "bwd_max_block", 64)
        monkeypatch.setitem(L._CFG, "bwd_max_block_ln", 64)
        monkeypatch.setitem(L._CFG, "fwd_chunk", 32)
        monkeypatch.setitem(L._CFG, "bwd_chunk", 32)
        monkeypatch.setitem(L._CFG, "bwd_col_block", 32)
    M, N = 67, 100  # several programs, several row blocks per program, a partial last block
    big = torch.randn(M, N + 28).to(torch.bfloat16)
    x = big[:, :N]
    assert x.stride(0) == N + 28
    check_ln(M, N, torch.bfloat16, "same", x=x)


@interp
@pytest.mark.parametrize("N", [64, 3000])
def test_output_mask(N):
    x, dy = _inputs(6, N, torch.float32)
    w, b = _params(N, torch.float32, "same")
    y, mean, rstd = L.ln_forward(x, w, b, 1e-5)
    gx, gw, gb = ref_ln_bwd(dy, x, w, b, 1e-5)
    for mask in [(True, False, False), (False, True, False), (False, False, True), (False, True, True)]:
        dx, dw, db = L.ln_backward(dy, x, mean, rstd, w, mask)
        for got, ref, m in zip((dx, dw, db), (gx, gw, gb), mask):
            if m:
                assert rel(got, ref) <= TOL_BWD[torch.float32]
            else:
                assert got is None
    y, rstd = L.rms_forward(x, w, 1e-5)
    gx, gw = ref_rms_bwd(dy, x, w, 1e-5)
    dx, dw = L.rms_backward(dy, x, rstd, w, (False, True))
    assert dx is None and rel(dw, gw) <= TOL_BWD[torch.float32]
    dx, dw = L.rms_backward(dy, x, rstd, w, (True, False))
    assert dw is None and rel(dx, gx) <= TOL_BWD[torch.float32]


def _check_sum(s, s_ref):
    assert s.dtype == s_ref.dtype
    if s.dtype == torch.bfloat16 and s.device.type == "cpu":
        # the interpreter converts fp32 -> bf16 by truncation (the GPU rounds to nearest even):
        # allow one bf16 ulp there; on the GPU the sum must equal torch's bit for bit
        ulp = torch.finfo(torch.bfloat16).eps * s_ref.float().abs().clamp_min(1e-30)
        assert ((s.float() - s_ref.float()).abs() <= ulp).all()
    else:
        assert torch.equal(s, s_ref)


@interp
@pytest.mark.parametrize("N", [64, 100, 1000])
def test_persistent_forward(N, monkeypatch):
    # the persistent rows forward (default at BLOCK_N == 16384): w/b held per program over several row
    # blocks, the next block's x / residual prefetched; here on several-row tiles, partial last block
    monkeypatch.setitem(L._CFG, "fwd_persist_min_block", 1)
    monkeypatch.setitem(L._CFG, "fwd_persist_max_block", 1 << 20)
    monkeypatch.setitem(L._CFG, "fwd_persist_progs_per_sm", 1)
    monkeypatch.setitem(L._CFG, "tile_elems", 256)
    for dtype, kind in ((torch.bfloat16, "fp32"), (torch.float32, "same"), (torch.float64, "none")):
        check_ln(37, N, dtype, kind, offset=1000.0 if dtype == torch.float32 else 0.0, bwd=False)
        check_rms(37, N, dtype, kind, bwd=False)
    x, _ = _inputs(37, N, torch.float16)
    r, _ = _inputs(37, N, torch.float16)
    w, b = _params(N, torch.float16, "same")
    y, s, mean, rstd = L.add_ln_forward(x, r, w, b, 1e-5)
    _check_sum(s, x + r)
    assert rel(y, ref_ln(s, w, b, 1e-5)[0]) <= TOL[torch.float16]


@interp
@pytest.mark.parametrize("N", [64, 3000])
def test_bias_only_and_nothing(N):
    x, dy = _inputs(5, N, torch.bfloat16)
    _, b = _params(N, torch.bfloat16, "fp32")
    y, mean, rstd = L.ln_forward(x, None, b, 1e-5)
    assert L.ln_backward(dy, x, mean, rstd, None, (False, False, False)) == (None, None, None)
    dx, dw, db = L.ln_backward(dy, x, mean, rstd, None, (False, False, True), bias_dtype=torch.float32)
    assert dx is None and dw is None and db.dtype == torch.float32
    assert rel(db, dy.double().sum(0)) <= 1e-6


@interp
@pytest.mark.parametrize("N", [64, 1000, 300])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.float16])
def test_fused_add(N, dtype, monkeypatch):
    if N == 300:  # looped forward
        monkeypatch.setitem(L._CFG, "fwd_max_block", 128)
        monkeypatch.setitem(L._CFG, "fwd_chunk", 64)
    x, _ = _inputs(5, N, dtype)
    r, _ = _inputs(5, N, dtype, offset=3.0)
    w, b = _params(N, dtype, "fp32")
    s_ref = x + r  # torch's own rounding of the sum in x's dtype
    y, s, mean, rstd = L.add_ln_forward(x, r, w, b, 1e-5)
    _check_sum(s, s_ref)
    yr, _, rr = ref_ln(s, w, b, 1e-5)  # normalised value computed from the rounded sum
    assert rel(y, yr) <= TOL[dtype] and rel(rstd, rr) <= TOL[dtype]
    y2, s2, rstd2 = L.add_rms_forward(x, r, w, 1e-5)
    _check_sum(s2, s_ref)
    yr2, rr2 = ref_rms(s2, w, 1e-5)
    assert rel(y2, yr2) <= TOL[dtype] and rel(rstd2, rr2) <= TOL[dtype]


@interp
@pytest.mark.parametrize("wide", [False, True])
def test_deterministic(wide, monkeypatch):
    if wide:
        monkeypatch.setitem(L._CFG, "fwd_max_block", 64)
        monkeypatch.setitem(L._CFG, "bwd_max_block", 64)
        monkeypatch.setitem(L._CFG, "bwd_max_block_ln", 64)
        monkeypatch.setitem(L._CFG, "fwd_chunk", 32)
        monkeypatch.setitem(L._CFG, "bwd_chunk", 32)
        monkeypatch.setitem(L._CFG, "bwd_col_block", 32)
    x, dy = _inputs(37, 200, torch.bfloat16)
    w, b = _params(200, torch.bfloat16, "fp32")
    outs = []
    for _ in range(2):
        y, mean, rstd = L.ln_forward(x, w, b, 1e-5)
        outs.append((y, mean, rstd) + L.ln_backward(dy, x, mean, rstd, w, (True, True, True)))
    for a, c in zip(*outs):
        assert torch.equal(a, c)


@interp
def test_zero_sizes():
    x = torch.randn(0, 8)
    y, mean, rstd = L.ln_forward(x, None, None, 1e-5)
    assert y.shape == (0, 8) and mean.shape == (0,)
    dx, dw, db = L.ln_backward(x, x, mean, rstd, torch.ones(8), (True, True, True))
    assert dx.shape == (0, 8) and torch.equal(dw, torch.zeros(8)) and torch.equal(db, torch.zeros(8))
    x = torch.randn(3, 0)
    y, mean, rstd = L.ln_forward(x, None, None, 1e-5)
    assert y.shape == (3, 0) and torch.equal(mean, torch.zeros(3)) and torch.isnan(rstd).all()


@interp
def test_supports():
    x = torch.randn(4, 8)
    assert L.supports(x, torch.randn(8), None)
    assert L.supports(x.bfloat16(), torch.randn(8), torch.randn(8).bfloat16())
    assert not L.supports(x.bfloat16(), torch.randn(8).half())
    assert not L.supports(x.int())
    assert not L.supports(torch.randn(2, 3, 4))


def test_cpu_checks_in_subprocess():
    rerun_cpu_checks(__file__, INTERPRETED)


# ------------------------------------------------------------------------------------------------
# CUDA (compiled kernels)


@pytest.mark.cuda
@pytest.mark.parametrize("N", [64, 256, 320, 1600, 4000, 5120, 8192, 16385, 20480, 65537, 262144])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.float16])
def test_cuda_widths(N, dtype):
    # 256 / 320 / 1600: the prefetching backward at 256 (fp32) / 512 / 2048 wide; 4000 / 5120 / 8192: w/b loaded with
    # x (fwd_wb_early_*); 16385 / 20480: two-part forward rows (a one-lane second part at 16385)
    M = max(4, min(4096, 2 ** 22 // N))
    check_ln(M, N, dtype, "same", offset=1000.0 if dtype == torch.float32 else 0.0, device="cuda")
    check_ln(M, N, dtype, "fp32", device="cuda")
    check_rms(M, N, dtype, "same", device="cuda")


@pytest.mark.cuda
@pytest.mark.parametrize("N", [6, 100, 1000, 3000, 5000, 20008, 70008])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_cuda_row_align(N, dtype, monkeypatch):
    """``row_align`` (on since session 38): widths of a multiple of 2 / 4 / 8 through every regime
    (rows, prefetching, row-sum + columns, split, cooperative) against float64, and the same bits on a second call."""
    monkeypatch.setitem(L._CFG, "row_align", 1)
    M = max(4, min(4096, 2 ** 22 // N))
    check_ln(M, N, dtype, "same", device="cuda")
    check_rms(M, N, dtype, "fp32", device="cuda")
    x, dy = _inputs(M, N, dtype, 0.0, "cuda")
    w, b = _params(N, dtype, "same", "cuda")
    runs = [L.ln_forward(x, w, b, 1e-5) for _ in range(2)]
    runs += [L.ln_backward(dy, x, runs[0][1], runs[0][2], w, (True, True, True), bias_dtype=b.dtype) for _ in range(2)]
    for a, c in ((runs[0], runs[1]), (runs[2], runs[3])):
        assert all(torch.equal(u, v) for u, v in zip(a, c))


@pytest.mark.cuda
@pytest.mark.parametrize("op,N,dtype", [("ln", 4000, torch.float32), ("ln", 8192, torch.float32),
                                        ("rms", 4096, torch.bfloat16), ("rms", 5120, torch.float16)])
def test_cuda_forward_early_wb_same_bits(op, N, dtype, monkeypatch):
    # compiled, w/b loaded with x (the default at these widths) gives the bits of the late loads
    x, _ = _inputs(300, N, dtype, device="cuda")
    w, b = _params(N, dtype, "same", device="cuda")
    run = (lambda: L.rms_forward(x, w, 1e-6)) if op == "rms" else (lambda: L.ln_forward(x, w, b, 1e-5))
    early = run()
    monkeypatch.setitem(L._CFG, "fwd_wb_early_min_block", 1 << 30)
    late = run()
    for a, c in zip(early, late):
        assert (a is None and c is None) or torch.equal(a, c)


@pytest.mark.cuda
def test_cuda_bsh_and_fp64():
    x3 = torch.randn(4, 333, 1024, device="cuda", dtype=torch.bfloat16)
    check_ln(4 * 333, 1024, torch.bfloat16, "same", device="cuda", x=x3.reshape(-1, 1024))
    check_ln(100, 3000, torch.float64, "same", device="cuda")
    check_rms(100, 65537, torch.float64, "none", device="cuda")


@pytest.mark.cuda
def test_cuda_over_2_31_elements():
    free, _ = torch.cuda.mem_get_info()
    M, N = 2 ** 21 + 3, 1024  # 2^31 + 3072 elements
    if free < 8 * M * N * 2 + (2 << 30):
        pytest.skip("not enough device memory")
    x = torch.randn(M, N, device="cuda", dtype=torch.bfloat16)
    w = torch.rand(N, device="cuda", dtype=torch.bfloat16) + 0.5
    y, mean, rstd = L.ln_forward(x, w, None, 1e-5)
    tail = slice(M - 1000, M)
    yr, _, _ = ref_ln(x[tail], w, None, 1e-5)
    assert rel(y[tail], yr) <= TOL[torch.bfloat16]
    dy = torch.randn_like(x)
    dx, dw, _ = L.ln_backward(dy, x, mean, rstd, w, (True, True, False))
    gx, _, _ = ref_ln_bwd(dy[tail], x[tail], w, None, 1e-5)
    assert rel(dx[tail], gx) <= TOL_BWD[torch.bfloat16]
    xhat = (x.float() - mean[:, None]) * rstd[:, None]
    gw = (dy.float() * xhat).sum(0, dtype=torch.float64)
    assert rel(dw, gw) <= TOL_BWD[torch.bfloat16]


# ------------------------------------------------------------------------------------------------
# tuned variants (prefetching backward, persistent and split forward, reduce blocks): each also checked
# on small shapes with a shrunk _CFG


@interp
@pytest.mark.parametrize("wide", [False, True])
@pytest.mark.parametrize("N", [7, 64, 100, 1000])
def test_prefetch_backward(N, wide, monkeypatch):
    # the software-pipelined backward rows kernel: several row blocks per program (4 programs under
    # the interpreter), a partial last block, programs whose last blocks lie past M. wide: one row per
    # block (multi_row_max shrunk, so these widths take the wide knobs)
    monkeypatch.setitem(L._CFG, "bwd_pf_min_block", 1)
    monkeypatch.setitem(L._CFG, "bwd_pf_max_block", 1 << 20)
    monkeypatch.setitem(L._CFG, "bwd_pf_tile_elems", 256)
    monkeypatch.setitem(L._CFG, "bwd_pf_ept", 4)
    monkeypatch.setitem(L._CFG, "bwd_pf_progs_per_sm", 1)
    if wide:
        monkeypatch.setitem(L._CFG, "multi_row_max", 4)
        monkeypatch.setitem(L._CFG, "bwd_pf_wide_max_block", 1 << 20)
        monkeypatch.setitem(L._CFG, "bwd_pf_wide_ept", 4)
        monkeypatch.setitem(L._CFG, "bwd_pf_wide_progs_per_sm", 2)
    M = 37 if N < 1000 else 11
    for dtype, kind in ((torch.bfloat16, "fp32"), (torch.float32, "same"), (torch.float64, "none")):
        check_ln(M, N, dtype, kind, offset=1000.0 if dtype == torch.float32 else 0.0)
        check_rms(M, N, dtype, kind)


@interp
def test_prefetch_backward_masks_and_stride(monkeypatch):
    monkeypatch.setitem(L._CFG, "bwd_pf_min_block", 1)
    monkeypatch.setitem(L._CFG, "bwd_pf_max_block", 1 << 20)
    monkeypatch.setitem(L._CFG, "bwd_pf_tile_elems", 256)
    monkeypatch.setitem(L._CFG, "bwd_pf_progs_per_sm", 2)
    M, N = 67, 100
    big = torch.randn(M, N + 28).to(torch.bfloat16)
    check_ln(M, N, torch.bfloat16, "same", x=big[:, :N])
    x, dy = _inputs(29, N, torch.float32)
    w, b = _params(N, torch.float32, "same")
    y, mean, rstd = L.ln_forward(x, w, b, 1e-5)
    gx, gw, gb = ref_ln_bwd(dy, x, w, b, 1e-5)
    for mask in [(True, False, False), (False, True, False), (False, False, True)]:
        got = L.ln_backward(dy, x, mean, rstd, w, mask)
        for g, ref, m in zip(got, (gx, gw, gb), mask):
            assert (g is None) != m and (g is None or rel(g, ref) <= TOL_BWD[torch.float32])
    outs = [L.ln_backward(dy, x, mean, rstd, w, (True, True, True)) for _ in range(2)]
    for a, c in zip(*outs):
        assert torch.equal(a, c)


@interp
@pytest.mark.parametrize("red", [(32, 128), (64, 8), (1024, 32)])
def test_reduce_blocks(red, monkeypatch):
    # dw/db partials reduction with other column / row blocks: same sums (another fixed order)
    monkeypatch.setitem(L._CFG, "red_block_n", red[0])
    monkeypatch.setitem(L._CFG, "red_block_p", red[1])
    for N in (64, 300):
        check_ln(23, N, torch.bfloat16, "fp32")
        check_rms(23, N, torch.float32, "same")


def _split_cfg(monkeypatch):
    """The split forward at every width, 32-wide chunks, the last program's pass in 16-wide steps."""
    monkeypatch.setitem(L._CFG, "fwd_split_min_block", 1)
    for pre in ("fwd_split_", "fwd_split_fused_"):
        monkeypatch.setitem(L._CFG, pre + "chunk", 32)
        monkeypatch.setitem(L._CFG, pre + "warps", 1)
    monkeypatch.setitem(L._CFG, "fwd_split_fin_block", 16)


@interp
@pytest.mark.parametrize("N", [7, 100, 300])
def test_split_forward(N, monkeypatch):
    # split-row forward (default at BLOCK_N >= 32768, no residual): several (row, chunk) programs per row,
    # one launch (the row's last program writes y), chunk statistics merged in a fixed order
    _split_cfg(monkeypatch)
    for dtype, kind in ((torch.bfloat16, "fp32"), (torch.float32, "same"), (torch.float64, "none"),
                        (torch.float16, "same")):
        check_ln(9, N, dtype, kind, offset=1000.0 if dtype == torch.float32 else 0.0)
        check_rms(9, N, dtype, kind)
    x, _ = _inputs(9, N, torch.bfloat16)
    w, b = _params(N, torch.bfloat16, "same")
    a = L.ln_forward(x, w, b, 1e-5)
    c = L.ln_forward(x, w, b, 1e-5)
    assert all(torch.equal(u, v) for u, v in zip(a, c))
    r, _ = _inputs(9, N, torch.bfloat16)  # with a residual: the regular kernels
    y, s, rstd = L.add_rms_forward(x, r, w, 1e-5)
    assert rel(y, ref_rms(s, w, 1e-5)[0]) <= TOL[torch.bfloat16]


@interp
@pytest.mark.parametrize("regime", ["default", "looped", "split", "prefetch"])
@pytest.mark.parametrize("N", [6, 100, 1000, 3000])
def test_row_align(N, regime, monkeypatch, request):
    """Rows and row strides of a multiple of 2 / 4 / 8 elements told to every kernel (``row_align``, on since
    session 38): every regime within the reference's tolerance, strided
    rows and a residual included, and the hint the launches get is what the row length and strides share."""
    monkeypatch.setitem(L._CFG, "row_align", 1)
    if regime == "looped":
        request.getfixturevalue("small_regimes")
    elif regime == "split":
        _split_cfg(monkeypatch)
    elif regime == "prefetch":
        for k, v in (("bwd_pf_min_block", 1), ("bwd_pf_max_block", 1 << 20), ("bwd_pf_tile_elems", 256)):
            monkeypatch.setitem(L._CFG, k, v)
    hints = []
    real = L.launch
    monkeypatch.setattr(L, "launch", lambda k, *a, **kw: (hints.append(kw.get("ALIGN")), real(k, *a, **kw))[1])
    for dtype, kind in ((torch.bfloat16, "fp32"), (torch.float32, "same")):
        check_ln(3, N, dtype, kind)
        check_rms(3, N, dtype, kind)
    assert hints and set(hints) == {math.gcd(N, 16) % 16 or 1}, hints
    hints.clear()
    big = torch.randn(5, N + 4, dtype=torch.float64).to(torch.bfloat16)
    check_ln(5, N, torch.bfloat16, "same", x=big[:, :N])  # row stride N + 4: the hint is what both share
    shared = math.gcd(math.gcd(N, N + 4), 16) % 16 or 1
    assert hints[0] == shared and set(hints) <= {shared, math.gcd(N, 16) % 16 or 1}, hints  # (dw/db partials: N)
    x, _ = _inputs(4, N, torch.bfloat16)
    r, _ = _inputs(4, N, torch.bfloat16)
    w, _ = _params(N, torch.bfloat16, "same")
    y, s, rstd = L.add_rms_forward(x, r, w, 1e-5)
    assert rel(y, ref_rms(s, w, 1e-5)[0]) <= TOL[torch.bfloat16]
    monkeypatch.setitem(L._CFG, "row_align", 0)
    assert L._align(N) == 1


def _split_outputs(x, w, b, is_rms, fused, monkeypatch, rows=1):
    for sfx in ("", "_heavy_params"):
        monkeypatch.setitem(L._CFG, "fwd_split_fused_max_block" + sfx, 1 << 30 if fused else 0)
        monkeypatch.setitem(L._CFG, "fwd_split_apply_rows" + sfx, rows)
    monkeypatch.setattr(L, "_num_sms", lambda t: 1)  # rows a program not capped by the grid's size
    if is_rms:
        return L.rms_forward(x, w, 1e-6)
    return L.ln_forward(x, w, b, 1e-5)


def _check_split_fused(x, w, b, is_rms, monkeypatch, offset=0.0):
    """The one-launch split forward: bit-identical to the two-launch path (same merge, same order), whose
    second launch gives the same bits with one row or several per program (3: a partial last block where
    M is not a multiple), and within tolerance of the float64 reference."""
    fused = _split_outputs(x, w, b, is_rms, True, monkeypatch)
    M, N = x.shape
    tag = f"{'rms' if is_rms else 'ln'} {M}x{N} {x.dtype} w={w is not None} b={b is not None}"
    for rows in (1, 3, 4):
        two = _split_outputs(x, w, b, is_rms, False, monkeypatch, rows)
        for got, want in zip(fused, two):
            assert torch.equal(got, want), (tag, rows)
    tol = TOL[x.dtype]
    if is_rms:
        yr, rr = ref_rms(x, w, 1e-6)
    else:
        yr, mr, rr = ref_ln(x, w, b, 1e-5)
        mtol = (abs(offset) + 4) * (1e-14 if x.dtype == torch.float64 else 3e-7) * (1 + N / 32768)
        assert (fused[1].double() - mr).abs().max().item() <= mtol, tag
    assert rel(fused[0], yr) <= tol and rel(fused[-1], rr) <= tol, tag


@interp
@pytest.mark.parametrize("N", [70, 200])  # chunk 32: S = 3 and 7, a partial last chunk
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_split_fused_matches_two_launch(N, dtype, monkeypatch):
    _split_cfg(monkeypatch)
    xd = torch.randn(5, N, dtype=torch.float64) * 1.5
    xd[2] += 1000.0  # a row far from zero: the layer norm's shift by x[row, 0]
    x = xd.to(dtype)
    w, b = _params(N, dtype, "same")
    wf, bf = _params(N, dtype, "fp32")
    for pw, pb in ((w, b), (None, None), (wf, None), (None, bf)):
        _check_split_fused(x, pw, pb, False, monkeypatch, offset=1000.0)
    xr, _ = _inputs(5, N, dtype)
    for pw in (w, None, wf):
        _check_split_fused(xr, pw, None, True, monkeypatch)


@pytest.mark.cuda
@pytest.mark.parametrize("N", [65537, 262144])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_cuda_split_fused_matches_two_launch(N, dtype, monkeypatch):
    # compiled, the row's last program to arrive can be any chunk and many rows are in flight; repeated
    # runs must agree bit for bit (a pair read before it was visible would show). Same bits need the
    # same chunks: the two launches take the one launch's
    monkeypatch.setitem(L._CFG, "fwd_split_chunk", L._CFG["fwd_split_fused_chunk"])
    monkeypatch.setitem(L._CFG, "fwd_split_warps", L._CFG["fwd_split_fused_warps"])
    M = 2 ** 24 // N
    xd = torch.randn(M, N, dtype=torch.float64, device="cuda") * 1.5
    xd[M // 2] += 1000.0
    x = xd.to(dtype)
    w, b = _params(N, dtype, "same", "cuda")
    _check_split_fused(x, w, b, False, monkeypatch, offset=1000.0)
    _check_split_fused(x, None, None, False, monkeypatch, offset=1000.0)
    _check_split_fused(x, w, None, True, monkeypatch)
    first = _split_outputs(x, w, b, False, True, monkeypatch)
    for _ in range(5):
        again = _split_outputs(x, w, b, False, True, monkeypatch)
        assert all(torch.equal(u, v) for u, v in zip(first, again))


_KERNELS = ("_fwd_rows_kernel", "_fwd_loop_kernel", "_fwd_split_kernel", "_fwd_split_apply_kernel", "_bwd_rows_kernel",
            "_bwd_coop_kernel", "_bwd_rows_pf_kernel", "_bwd_rowsum_kernel", "_bwd_cols_kernel", "_bwd_db_rows_kernel")

# default _CFG: width -> (forward launches, layer-norm backward launches, RMS backward launches)
# (forward entries: kernel, PERSIST or FUSED, and the rows kernel's second column part NB; bf16 here, so the
# two-part rows at full warps are persistent and layer norm's backward from 12288 wide splits off db)
_ROUTES = [
    (64, [("_fwd_rows_kernel", False, 0)], ["_bwd_rows_kernel"], ["_bwd_rows_kernel"]),
    (256, [("_fwd_rows_kernel", False, 0)], ["_bwd_rows_kernel"], ["_bwd_rows_kernel"]),
    (320, [("_fwd_rows_kernel", False, 0)], ["_bwd_rows_pf_kernel"], ["_bwd_rows_pf_kernel"]),
    (1000, [("_fwd_rows_kernel", False, 0)], ["_bwd_rows_pf_kernel"], ["_bwd_rows_pf_kernel"]),
    (1600, [("_fwd_rows_kernel", False, 0)], ["_bwd_rows_pf_kernel"], ["_bwd_rows_pf_kernel"]),
    (3000, [("_fwd_rows_kernel", False, 0)], ["_bwd_rows_pf_kernel"], ["_bwd_rows_pf_kernel"]),
    (8192, [("_fwd_rows_kernel", False, 0)], ["_bwd_rows_pf_kernel"], ["_bwd_rows_pf_kernel"]),
    (12288, [("_fwd_rows_kernel", True, 4096)], ["_bwd_rows_kernel", "_bwd_db_rows_kernel"], ["_bwd_rows_kernel"]),
    (16384, [("_fwd_rows_kernel", False, 0)], ["_bwd_rows_kernel", "_bwd_db_rows_kernel"], ["_bwd_rows_kernel"]),
    (20000, [("_fwd_rows_kernel", True, 4096)], ["_bwd_rowsum_kernel", "_bwd_cols_kernel"],
     ["_bwd_rowsum_kernel", "_bwd_cols_kernel"]),
    (40000, [("_fwd_split_kernel", True)], ["_bwd_rowsum_kernel", "_bwd_cols_kernel"],
     ["_bwd_rowsum_kernel", "_bwd_cols_kernel"]),
]


@interp
@pytest.mark.parametrize("N,fwd,ln_bwd,rms_bwd", _ROUTES)
def test_default_routing(N, fwd, ln_bwd, rms_bwd, monkeypatch):
    # which kernels the default _CFG launches per width (the regimes of the module docstring), with the
    # results checked; the fused residual forward takes the looped kernel past fwd_max_block
    seen = _record_launches(monkeypatch)

    def routes():  # the routing kernels launched: (name, PERSIST / FUSED where given)
        return [(n,) + tuple(kw[k] for k in ("PERSIST", "FUSED", "NB") if k in kw) for n, kw in seen if n in _KERNELS]
    x, dy = _inputs(3, N, torch.bfloat16)
    w, b = _params(N, torch.bfloat16, "same")
    for is_rms, bwd in ((False, ln_bwd), (True, rms_bwd)):
        seen.clear()
        if is_rms:
            y, rstd = L.rms_forward(x, w, 1e-6)
            assert rel(y, ref_rms(x, w, 1e-6)[0]) <= TOL[torch.bfloat16]
        else:
            y, mean, rstd = L.ln_forward(x, w, b, 1e-5)
            assert rel(y, ref_ln(x, w, b, 1e-5)[0]) <= TOL[torch.bfloat16]
        assert routes() == fwd, (N, is_rms)
        seen.clear()
        if is_rms:
            dx, dw = L.rms_backward(dy, x, rstd, w, (True, True))
            gx, gw = ref_rms_bwd(dy, x, w, 1e-6)
        else:
            dx, dw, db = L.ln_backward(dy, x, mean, rstd, w, (True, True, True))
            gx, gw, gb = ref_ln_bwd(dy, x, w, b, 1e-5)
            assert rel(db, gb) <= TOL_BWD[torch.bfloat16]
        assert rel(dx, gx, _dx_scale(dy, w, rstd)) <= TOL_BWD[torch.bfloat16]
        assert rel(dw, gw) <= TOL_BWD[torch.bfloat16]
        assert [e[0] for e in routes()] == bwd, (N, is_rms)
    seen.clear()
    r, _ = _inputs(3, N, torch.bfloat16)
    y, s, rstd = L.add_rms_forward(x, r, w, 1e-6)
    _check_sum(s, x + r)
    assert rel(y, ref_rms(s, w, 1e-6)[0]) <= TOL[torch.bfloat16]
    assert [e[0] for e in routes()] == ["_fwd_loop_kernel" if N > 24576 else "_fwd_rows_kernel"]


@interp
def test_narrow_backward_32bit_routing(monkeypatch):
    # fp32 rows from bwd_pf_min_block_32bit (256) wide take the prefetching backward; 16-bit rows (bf16 w or fp32
    # w) keep the plain kernel below bwd_pf_min_block; all checked against float64
    seen = _record_launches(monkeypatch)
    for N, dtype, kind, want in ((256, torch.float32, "same", "_bwd_rows_pf_kernel"),
                                 (200, torch.float32, "same", "_bwd_rows_pf_kernel"),
                                 (128, torch.float32, "same", "_bwd_rows_kernel"),
                                 (256, torch.bfloat16, "same", "_bwd_rows_kernel"),
                                 (256, torch.bfloat16, "fp32", "_bwd_rows_kernel")):
        x, dy = _inputs(37, N, dtype)
        w, b = _params(N, dtype, kind)
        y, mean, rstd = L.ln_forward(x, w, b, 1e-5)
        seen.clear()
        dx, dw, db = L.ln_backward(dy, x, mean, rstd, w, (True, True, True), bias_dtype=b.dtype)
        gx, gw, gb = ref_ln_bwd(dy, x, w, b, 1e-5)
        tol = TOL_BWD[dtype]
        assert rel(dx, gx, _dx_scale(dy, w, rstd)) <= tol and rel(dw, gw) <= tol and rel(db, gb) <= tol, (N, dtype)
        assert [n for n, _ in seen if n in _KERNELS] == [want], (N, dtype, kind)


@interp
def test_forward_register_cap_routing(monkeypatch):
    # fwd_maxnreg caps fp32 layer norm's one-row forward from fwd_maxnreg_min_block wide (one column part, not
    # persistent); RMS norm, 16-bit rows and two-part rows keep Triton's register choice
    seen = _record_launches(monkeypatch)
    cases = ((False, 16384, torch.float32, 64), (False, 16000, torch.float32, 64), (True, 16384, torch.float32, None),
             (False, 16384, torch.bfloat16, None), (False, 12000, torch.float32, None), (False, 8192, torch.float32, None))
    for is_rms, N, dtype, regs in cases:
        seen.clear()
        x, _ = _inputs(2, N, dtype)
        w, b = _params(N, dtype, "same")
        if is_rms:
            assert rel(L.rms_forward(x, w, 1e-6)[0], ref_rms(x, w, 1e-6)[0]) <= TOL[dtype]
        else:
            assert rel(L.ln_forward(x, w, b, 1e-5)[0], ref_ln(x, w, b, 1e-5)[0]) <= TOL[dtype]
        assert [kw.get("maxnreg") for n, kw in seen if n == "_fwd_rows_kernel"] == [regs], (is_rms, N, dtype)


@interp
def test_forward_elements_per_thread_routing(monkeypatch):
    # the one-row forward's warps follow its elements a thread: fp32 rows up to 1024 wide at fwd_ept_4byte, RMS
    # rows of the 8192 class with weights of x's dtype at fwd_ept_wide_rms, layer norm and mixed-dtype RMS there
    # at fwd_ept_wide
    seen = _record_launches(monkeypatch)
    cases = (("rms", 8192, torch.bfloat16, "same", 8192 // L._CFG["fwd_ept_wide_rms"]),
             ("rms", 5000, torch.float32, "same", 8192 // L._CFG["fwd_ept_wide_rms"]),
             ("ln", 8192, torch.bfloat16, "same", 8192 // L._CFG["fwd_ept_wide"]),
             ("rms", 1024, torch.float32, "same", 1024 // L._CFG["fwd_ept_4byte"]),
             ("ln", 1024, torch.bfloat16, "same", 1024 // L._CFG["fwd_ept"]))
    for op, N, dtype, pk, threads in cases:
        seen.clear()
        x, _ = _inputs(2, N, dtype)
        w, b = _params(N, dtype, pk)
        if op == "rms":
            assert rel(L.rms_forward(x, w, 1e-6)[0], ref_rms(x, w, 1e-6)[0]) <= TOL[dtype]
        else:
            assert rel(L.ln_forward(x, w, b, 1e-5)[0], ref_ln(x, w, b, 1e-5)[0]) <= TOL[dtype]
        want = min(L._CFG["max_warps"], threads // 32)
        assert [kw["num_warps"] for n, kw in seen if n == "_fwd_rows_kernel"] == [want], (op, N, dtype)
    assert L._CFG["fwd_ept_wide_rms"] != L._CFG["fwd_ept_wide"]  # (else the cases above tell nothing apart)


@interp
@pytest.mark.parametrize("op,N,dtype,pk,early", [
    ("ln", 5000, torch.float32, "same", True), ("ln", 3000, torch.bfloat16, "same", False),
    ("ln", 3000, torch.bfloat16, "fp32", False), ("rms", 5000, torch.bfloat16, "same", True),
    ("rms", 8192, torch.float16, "none", True), ("rms", 2048, torch.float32, "same", False)])
def test_forward_early_wb_same_bits(op, N, dtype, pk, early, monkeypatch):
    # w/b loaded with x (fwd_wb_early_*: RMS norm and 4-byte layer norm at 4096 / 8192, weights of x's dtype) where
    # the rule says so, and then the same bits as with them loaded after the statistics (the same products)
    x, _ = _inputs(5, N, dtype)
    w, b = _params(N, dtype, pk)
    run = (lambda: L.rms_forward(x, w, 1e-6)) if op == "rms" else (lambda: L.ln_forward(x, w, b, 1e-5))
    seen = _record_launches(monkeypatch)
    got = run()
    assert [kw.get("EARLY_WB", False) for n, kw in seen if n == "_fwd_rows_kernel"] == [early]
    if early:
        monkeypatch.setitem(L._CFG, "fwd_wb_early_min_block", 1 << 30)
        late = run()
        assert [kw.get("EARLY_WB", False) for n, kw in seen if n == "_fwd_rows_kernel"] == [True, False]
        for a, c in zip(got, late):
            assert (a is None and c is None) or torch.equal(a, c)


@interp
def test_split_forward_heavy_params_routing(monkeypatch):
    # layer norm with 16-bit x and fp32 w and b (more parameter bytes per column than twice x's) takes the two
    # launches at every split width, several rows per program, capped so the grid keeps 2 programs per SM;
    # RMS with fp32 w (twice x's bytes) keeps the one launch
    seen = _record_launches(monkeypatch)
    N = 40000
    x, _ = _inputs(7, N, torch.bfloat16)
    w, b = _params(N, torch.bfloat16, "fp32")
    y, mean, rstd = L.ln_forward(x, w, b, 1e-5)
    yr, mr, rr = ref_ln(x, w, b, 1e-5)
    assert rel(y, yr) <= TOL[torch.bfloat16] and rel(rstd, rr) <= TOL[torch.bfloat16]
    assert (mean.double() - mr).abs().max().item() <= 1e-5
    S = -(-N // L._CFG["fwd_split_chunk"])
    rows = max(1, min(L._CFG["fwd_split_apply_rows_heavy_params"], 7 * S // (2 * L._num_sms(x))))
    assert [(n, kw.get("FUSED"), kw.get("ROWS")) for n, kw in seen if n in _KERNELS] == [
        ("_fwd_split_kernel", False, None), ("_fwd_split_apply_kernel", None, rows)]
    assert rows > 1
    seen.clear()
    y, rstd = L.rms_forward(x, w, 1e-6)
    assert rel(y, ref_rms(x, w, 1e-6)[0]) <= TOL[torch.bfloat16]
    assert [(n, kw.get("FUSED")) for n, kw in seen if n in _KERNELS] == [("_fwd_split_kernel", True)]


@interp
@pytest.mark.parametrize("N", [40, 320, 768, 1536, 3000, 5120, 12288, 20000])
def test_two_part_rows_forward(N, monkeypatch):
    # widths that are not powers of two held as two power-of-two column parts (_two_parts: 5120 = 4096 +
    # 1024): each checked against float64 for layer / RMS norm, with and without the fused residual, with
    # weight/bias in x's dtype, fp32 and absent, with the persistent kernel (w/b held per part, the next
    # tile prefetched) and with rows of a partial last block; and within rounding of the one-part tile.
    # Two parts at every width here (by default only from the 16384 class up)
    monkeypatch.setitem(L._CFG, "fwd_two_part_min_block", 1)
    monkeypatch.setitem(L._CFG, "tile_elems", 512)
    seen = _record_launches(monkeypatch)
    na, nb = L._two_parts(N)
    assert nb > 0 and na + nb >= N and na + nb < L.next_pow2(N)
    for dtype, kind in ((torch.bfloat16, "same"), (torch.float32, "fp32"), (torch.bfloat16, "none")):
        for persist in (False, True):
            monkeypatch.setitem(L._CFG, "fwd_persist_min_block", 1 if persist else 1 << 30)
            monkeypatch.setitem(L._CFG, "fwd_persist_max_block", 1 << 20)
            monkeypatch.setitem(L._CFG, "fwd_persist_two_part", int(persist))
            seen.clear()
            check_ln(5, N, dtype, kind, bwd=False)
            check_rms(5, N, dtype, kind, bwd=False)
            x, _ = _inputs(5, N, dtype)
            r, _ = _inputs(5, N, dtype)
            w, b = _params(N, dtype, kind)
            y, s, mean, rstd = L.add_ln_forward(x, r, w, b, 1e-5)
            _check_sum(s, x + r)
            assert rel(y, ref_ln(s, w, b, 1e-5)[0]) <= TOL[dtype]
            parts = [(kw["BLOCK_N"], kw["NB"], kw["PERSIST"]) for name, kw in seen if name == "_fwd_rows_kernel"]
            assert parts == [(na, nb, persist)] * 3
    x, _ = _inputs(5, N, torch.float32)
    w, b = _params(N, torch.float32, "same")
    two = L.ln_forward(x + 1000.0, w, b, 1e-5)
    monkeypatch.setitem(L._CFG, "fwd_two_part_max", 0)
    seen.clear()
    one = L.ln_forward(x + 1000.0, w, b, 1e-5)
    assert [kw["NB"] for name, kw in seen if name == "_fwd_rows_kernel"] in ([0], [])
    for u, v in zip(two, one):
        assert torch.allclose(u, v, rtol=1e-5, atol=1e-5)


@interp
@pytest.mark.parametrize("N, nw16, persist16, nw32, nwmix",
                         [(20480, 16, True, 16, 16), (10240, 8, False, 16, 8), (9216, 4, False, 8, 16)])
def test_two_part_rows_default_routing(N, nw16, persist16, nw32, nwmix, monkeypatch):
    # the default routing of two-part rows, checked against float64 with more rows than programs: 16-bit
    # rows at the warps that give the second part 16 bytes a thread (fewer made Triton convert the first
    # part between layouts), persistent where that leaves the warps uncapped; fp32 rows the same cap (4
    # elements a thread), never persistent; bf16 x / fp32 w persistent, capped only while the first part
    # keeps <= 32 elements a thread
    monkeypatch.setattr(L, "_num_sms", lambda x: 2)
    seen = _record_launches(monkeypatch)
    na, nb = L._two_parts(N)
    for dtype, kind, nw, persist in ((torch.bfloat16, "same", nw16, persist16), (torch.float32, "same", nw32, False),
                                     (torch.bfloat16, "fp32", nwmix, True)):
        seen.clear()
        check_ln(5, N, dtype, kind, bwd=False)
        check_rms(5, N, dtype, kind, bwd=False)
        got = [(kw["BLOCK_N"], kw["NB"], kw["PERSIST"], kw["num_warps"]) for name, kw in seen
               if name == "_fwd_rows_kernel"]
        assert got == [(na, nb, persist, nw)] * 2, (dtype, kind)


def _record_launches(monkeypatch):
    """Wraps the launcher: returns the list that collects (kernel name, constexpr kwargs) per launch."""
    seen = []
    real = L.launch

    def rec(kernel, grid, *args, **kw):
        seen.append((getattr(kernel, "__name__", None) or kernel.fn.__name__, kw))
        return real(kernel, grid, *args, **kw)

    monkeypatch.setattr(L, "launch", rec)
    return seen


@interp
@pytest.mark.parametrize("N", [100, 1000])
def test_persistent_forward_for_wide_params_only(N, monkeypatch):
    # fwd_persist_min_block_wide_params: the persistent forward where w/b are wider than x (16-bit x,
    # fp32 w/b), the one-row-per-program kernel otherwise; both exact
    monkeypatch.setitem(L._CFG, "fwd_persist_min_block", 1 << 30)
    monkeypatch.setitem(L._CFG, "fwd_persist_min_block_wide_params", 1)
    monkeypatch.setitem(L._CFG, "fwd_persist_max_block", 1 << 20)
    monkeypatch.setitem(L._CFG, "tile_elems", 256)
    monkeypatch.setitem(L._CFG, "tile_elems_wide_params", 256)
    seen = _record_launches(monkeypatch)
    for dtype, kind, wide in ((torch.bfloat16, "fp32", True), (torch.bfloat16, "same", False),
                              (torch.float32, "same", False)):
        seen.clear()
        check_ln(37, N, dtype, kind, bwd=False)
        check_rms(37, N, dtype, kind, bwd=False)
        persist = [kw["PERSIST"] for name, kw in seen if name == "_fwd_rows_kernel"]
        assert persist == [wide, wide]


@interp
def test_backward_row_bytes_cap(monkeypatch):
    # bwd_pf_wide_max_row_bytes: one-row blocks of more bytes than the cap take the plain rows kernel
    # (fp32 here), narrower byte rows the prefetching one (bf16 at the same width); both exact
    monkeypatch.setitem(L._CFG, "multi_row_max", 4)
    monkeypatch.setitem(L._CFG, "bwd_pf_wide_max_block", 1 << 20)
    monkeypatch.setitem(L._CFG, "bwd_pf_mid_block", 0)
    monkeypatch.setitem(L._CFG, "bwd_pf_wide_max_row_bytes", 256)  # 128 wide: bf16 256 B, fp32 512 B
    seen = _record_launches(monkeypatch)
    for dtype, kernel in ((torch.bfloat16, "_bwd_rows_pf_kernel"), (torch.float32, "_bwd_rows_kernel")):
        seen.clear()
        check_ln(37, 100, dtype, "same")
        check_rms(37, 100, dtype, "same")
        used = [name for name, _ in seen if name.startswith("_bwd_rows")]
        assert used == [kernel, kernel]


@interp
@pytest.mark.parametrize("rows", [2, 4])
def test_several_rows_per_program_for_wide_params(rows, monkeypatch):
    # fwd_rows_wide_params: one-row widths with w/b wider than x take several rows per program
    # (a partial last block: 37 rows), exact as one row per program
    monkeypatch.setitem(L._CFG, "multi_row_max", 16)
    monkeypatch.setitem(L._CFG, "fwd_persist_min_block_wide_params", 1 << 30)
    monkeypatch.setitem(L._CFG, "fwd_rows_wide_params", rows)
    seen = _record_launches(monkeypatch)
    check_ln(37, 100, torch.bfloat16, "fp32", bwd=False)
    check_rms(37, 100, torch.bfloat16, "fp32", bwd=False)
    assert [kw["BLOCK_M"] for name, kw in seen if name == "_fwd_rows_kernel"] == [rows, rows]
    seen.clear()
    check_ln(37, 100, torch.bfloat16, "same", bwd=False)  # w/b as narrow as x: one row a program
    assert [kw["BLOCK_M"] for name, kw in seen if name == "_fwd_rows_kernel"] == [1]
    # the fused residual add takes the same tiles
    x, _ = _inputs(37, 100, torch.bfloat16)
    r, _ = _inputs(37, 100, torch.bfloat16)
    w, b = _params(100, torch.bfloat16, "fp32")
    seen.clear()
    y, s, mean, rstd = L.add_ln_forward(x, r, w, b, 1e-5)
    assert [kw["BLOCK_M"] for name, kw in seen if name == "_fwd_rows_kernel"] == [rows]
    _check_sum(s, x + r)
    assert rel(y, ref_ln(s, w, b, 1e-5)[0]) <= TOL[torch.bfloat16]


@interp
def test_plain_backward_programs_per_sm(monkeypatch):
    # bwd_plain_wide_progs_per_sm: the plain rows backward on one-row blocks with 1 or 3 persistent
    # programs per SM (the interpreter counts 4 SMs): several blocks per program, exact either way
    monkeypatch.setitem(L._CFG, "multi_row_max", 16)
    monkeypatch.setitem(L._CFG, "bwd_pf_wide_max_block", 0)
    for pps in (1, 3):
        monkeypatch.setitem(L._CFG, "bwd_plain_wide_progs_per_sm", pps)
        check_ln(37, 100, torch.float32, "same")
        check_rms(37, 100, torch.float32, "same")


@interp
@pytest.mark.parametrize("pf", [0, 1])
def test_backward_for_wide_params(pf, monkeypatch):
    # bwd_pf_wide_params: one-row blocks with w wider than x (bf16 x, fp32 w) take the prefetching
    # kernel (1) or the plain one with bwd_plain_progs_per_sm_wide_params programs per SM (0); w as
    # narrow as x keeps the prefetching kernel; all exact
    monkeypatch.setitem(L._CFG, "multi_row_max", 4)
    monkeypatch.setitem(L._CFG, "bwd_pf_wide_max_block", 1 << 20)
    monkeypatch.setitem(L._CFG, "bwd_pf_mid_block", 0)
    monkeypatch.setitem(L._CFG, "bwd_pf_wide_params", pf)
    monkeypatch.setitem(L._CFG, "bwd_plain_progs_per_sm_wide_params", 3)
    seen = _record_launches(monkeypatch)
    for kind, kernel in (("fp32", "_bwd_rows_pf_kernel" if pf else "_bwd_rows_kernel"), ("same", "_bwd_rows_pf_kernel")):
        seen.clear()
        check_ln(37, 100, torch.bfloat16, kind)
        check_rms(37, 100, torch.bfloat16, kind)
        assert [name for name, _ in seen if name.startswith("_bwd_rows")] == [kernel, kernel]


@interp
def test_backward_holding_w(monkeypatch):
    # bwd_hold_w: the plain rows backward on one-row blocks with w loaded once per program (several
    # rows per program: 37 rows over 4 SMs) or reloaded per row; both exact, params fp32 or x's dtype
    monkeypatch.setitem(L._CFG, "multi_row_max", 16)
    monkeypatch.setitem(L._CFG, "bwd_pf_wide_max_block", 0)
    seen = _record_launches(monkeypatch)
    for hold in (0, 1):
        monkeypatch.setitem(L._CFG, "bwd_hold_w", hold)
        seen.clear()
        for dtype, kind in ((torch.bfloat16, "fp32"), (torch.float32, "same")):
            check_ln(37, 100, dtype, kind)
            check_rms(37, 100, dtype, kind)
        assert [kw["HOLD_W"] for n, kw in seen if n == "_bwd_rows_kernel"] == [bool(hold)] * 4


def _coop_on(monkeypatch, chunk=1024):
    """The cooperative wide backward at interpreter sizes (rows past 64 wide). The interpreter runs
    programs one after another, so there it only ever runs with one chunk per row (chunk >= N); with
    more, the host must route around it (test_coop_never_waits_in_the_interpreter)."""
    monkeypatch.setitem(L._CFG, "bwd_max_block", 64)
    monkeypatch.setitem(L._CFG, "bwd_max_block_ln", 64)
    monkeypatch.setitem(L._CFG, "bwd_coop_max_block", 1 << 30)
    monkeypatch.setitem(L._CFG, "bwd_coop_max_block_16bit", 1 << 30)
    monkeypatch.setitem(L._CFG, "bwd_coop_chunk", chunk)
    monkeypatch.setitem(L._CFG, "bwd_coop_ept", 32)


@interp
@pytest.mark.parametrize("N", [100, 300, 1000])
def test_coop_backward(N, monkeypatch):
    # _bwd_coop_kernel (ticket order, arrival counters, the merge of the chunk sums, the row-group walk
    # with its dw/db partials): params in x's dtype, fp32 or none, a large common offset, fp64, 37 rows
    # over 4 SMs x 4 programs (a partial last row group)
    _coop_on(monkeypatch)
    seen = _record_launches(monkeypatch)
    for dtype, kind in ((torch.bfloat16, "fp32"), (torch.float32, "same"), (torch.float16, "none"),
                        (torch.float64, "same")):
        seen.clear()
        check_ln(37, N, dtype, kind, offset=1000.0 if dtype == torch.float32 else 0.0)
        check_rms(37, N, dtype, kind)
        assert [n for n, _ in seen if n.startswith("_bwd")] == ["_bwd_coop_kernel"] * 2


@interp
@pytest.mark.parametrize("N,pf_off", [(200, False), (2000, True)])
def test_db_split_same_bits(N, pf_off, monkeypatch):
    # bwd_db_split_min_width: layer norm's plain rows kernel without its db accumulator, db summed by
    # _bwd_db_rows_kernel over the same row blocks in the same order: dx, dw and db bit-identical to the
    # one-kernel form; several rows per block (200 wide) and one (2000, the prefetching kernel off). Only
    # 16-bit x with 16-bit w/b splits (fp32 w/b: more registers held, measured slower; no bias: no db;
    # fp32 x never)
    seen = _record_launches(monkeypatch)
    if pf_off:
        monkeypatch.setitem(L._CFG, "bwd_pf_wide_max_block", 0)
    monkeypatch.setitem(L._CFG, "bwd_pf_min_block_32bit", L._CFG["bwd_pf_min_block"])  # fp32 200 wide: plain too
    M = 45
    for dtype, kind in ((torch.bfloat16, "same"), (torch.float16, "same"), (torch.float16, "fp32"),
                        (torch.bfloat16, "none"), (torch.float32, "same")):
        x = (torch.randn(M, N, dtype=torch.float64) + 2).to(dtype)
        dy = torch.randn(M, N, dtype=torch.float64).to(dtype)
        w, b = _params(N, dtype, kind)
        _, mean, rstd = L.ln_forward(x, w, b, 1e-5)
        mask = (True, w is not None, b is not None)
        bdt = b.dtype if b is not None else None
        runs = []
        for width in (1 << 30, 100):
            monkeypatch.setitem(L._CFG, "bwd_db_split_min_width", width)
            seen.clear()
            runs.append(L.ln_backward(dy, x, mean, rstd, w, mask, bias_dtype=bdt))
            kernels = [n for n, _ in seen if n.startswith("_bwd")]
            splits = width == 100 and kind == "same" and dtype != torch.float32
            assert kernels == (["_bwd_rows_kernel", "_bwd_db_rows_kernel"] if splits else ["_bwd_rows_kernel"])
        for a, c in zip(*runs):
            assert (a is None and c is None) or torch.equal(a, c)
        if b is not None:
            for got, ref in zip(runs[1], ref_ln_bwd(dy, x, w, b, 1e-5)):
                assert rel(got, ref) <= TOL_BWD[dtype]
        if splits:  # db alone: the db kernel only, the same bits
            seen.clear()
            only_db = L.ln_backward(dy, x, mean, rstd, w, (False, False, True), bias_dtype=bdt)
            assert [n for n, _ in seen if n.startswith("_bwd")] == ["_bwd_db_rows_kernel"]
            assert only_db[0] is None and only_db[1] is None and torch.equal(only_db[2], runs[1][2])


def test_pdl_never_changes_the_kernels(monkeypatch):
    # programmatic dependent launch changes when kernels start, never which kernels run (H200 session 14:
    # the db split once depended on it, so test_cuda_pdl_same_bits compared two algorithms); recorded on meta
    # tensors as on a GPU, widths of every backward regime
    seen = []
    monkeypatch.setattr(L, "launch", lambda kernel, grid, *a, **kw: seen.append((kernel.fn.__name__, grid)))
    monkeypatch.setattr(L, "_num_sms", lambda x: 132)
    monkeypatch.setattr(L, "_coop_chunk", lambda x, N, B: 0 if B > 65536 or (x.element_size() == 2 and B > 16384)
                        else min(B, max(2048, L.next_pow2(L.cdiv(N, 32)))))
    for N in (256, 1024, 4096, 12288, 16384, 65536, 262144):
        for dtype in (torch.bfloat16, torch.float32):
            x = torch.empty(64, N, dtype=dtype, device="meta")
            w = torch.empty(N, dtype=dtype, device="meta")
            mean, rstd = torch.empty(64, device="meta"), torch.empty(64, device="meta")
            kernels = []
            for on in (False, True):
                monkeypatch.setattr(L, "pdl_on", lambda t, enabled, on=on: on and bool(enabled))
                monkeypatch.setitem(L._CFG, "pdl_max_block", 1 << 30)
                seen.clear()
                L.ln_backward(x, x, mean, rstd, w, (True, True, True), bias_dtype=dtype)
                L.rms_backward(x, x, rstd, w, (True, True))
                kernels.append(list(seen))
            assert kernels[0] == kernels[1], (N, dtype)


@pytest.mark.parametrize("smem", [232448, 166912, 101376, 65536])  # H200, A100, RTX / A10 / L4 / L40S, T4
def test_backward_pipeline_stages_fit_the_devices_shared_memory(monkeypatch, smem):
    """The pipelined backward kernels' stages (chosen on the H200) are cut to what a program may take on the
    device: the fp32 4097-8192-wide rows kernel asked for 128 KB at 3 stages, which a 99 KB GPU cannot launch
    (found compiling for sm_86 offline). Buffers in flight (stages - 1 of them) + 4 KB scratch <= smem, and on
    the H200 the stages stay as configured. Recorded on meta tensors, as on a GPU."""
    from normkit.kernels import _launch

    seen = []
    monkeypatch.setattr(L, "launch", lambda kernel, grid, *a, **kw: seen.append((kernel.fn.__name__, a, kw)))
    monkeypatch.setattr(L, "_num_sms", lambda x: 132)
    monkeypatch.setattr(L, "_coop_chunk", lambda x, N, B: 0)  # the 5-pass path at the wide widths
    monkeypatch.setattr(_launch, "shared_memory_per_block", lambda t: smem)
    for N in (6144, 8192, 65536):
        for dtype, pdtype in ((torch.float32, torch.float32), (torch.bfloat16, torch.float32),
                              (torch.bfloat16, torch.bfloat16)):
            x = torch.empty(64, N, dtype=dtype, device="meta")
            w = torch.empty(N, dtype=pdtype, device="meta")
            mean, rstd = torch.empty(64, device="meta"), torch.empty(64, device="meta")
            seen.clear()
            L.ln_backward(x, x, mean, rstd, w, (True, True, True), bias_dtype=pdtype)
            for name, args, kw in seen:
                if "STAGES" not in kw:
                    continue
                es, ws = dtype.itemsize, pdtype.itemsize
                per_stage = {"_bwd_rows_kernel": 2 * kw.get("BLOCK_M", 1) * kw.get("BLOCK_N", 0) * es,
                             "_bwd_rowsum_kernel": kw.get("CHUNK", 0) * (2 * es + ws),
                             "_bwd_cols_kernel": kw.get("BLOCK_R", 0) * kw.get("BLOCK_N", 0) * 2 * es}[name]
                assert (kw["STAGES"] - 1) * per_stage + 4096 <= smem, (name, N, dtype, kw["STAGES"])
                configured = {"_bwd_rows_kernel": "bwd_rows_stages", "_bwd_rowsum_kernel": "bwd_rowsum_stages",
                              "_bwd_cols_kernel": "bwd_cols_stages"}[name]
                if smem == 232448:
                    assert kw["STAGES"] == L._CFG[configured], (name, N, dtype)
                assert kw["STAGES"] >= 2 or per_stage + 4096 > smem  # cut only as far as it must be


@interp
def test_coop_backward_masks_and_determinism(monkeypatch):
    # every output_mask combination against the float64 reference; the same bits on a second call;
    # a row stride wider than N; fewer rows than programs
    _coop_on(monkeypatch)
    M, N = 9, 200
    big = torch.randn(M, N + 24, dtype=torch.float64).to(torch.bfloat16)
    x = big[:, :N]
    dy = torch.randn(M, N, dtype=torch.float64).to(torch.bfloat16)
    w, b = _params(N, torch.bfloat16, "fp32")
    y, mean, rstd = L.ln_forward(x, w, b, 1e-5)
    gx, gw, gb = ref_ln_bwd(dy, x, w, b, 1e-5)
    for mask in ((True, True, True), (True, False, False), (False, True, True), (False, False, True)):
        got = L.ln_backward(dy, x, mean, rstd, w, mask, bias_dtype=torch.float32)
        again = L.ln_backward(dy, x, mean, rstd, w, mask, bias_dtype=torch.float32)
        for want, ref, g, a in zip(mask, (gx, gw, gb), got, again):
            if not want:
                assert g is None
                continue
            assert torch.equal(g, a)
            assert rel(g, ref) <= TOL_BWD[torch.bfloat16]


@interp
@pytest.mark.parametrize("rms", [False, True])
def test_pf_hold_w_wide_params_same_bits(rms, monkeypatch):
    # narrow rows in the prefetching kernel with fp32 w and bf16 x, w held per program
    # (bwd_pf_hold_w_wide_params, the default): the same values as reloading it, so the same bits;
    # several row blocks per program; against float64 too
    seen = _record_launches(monkeypatch)
    M, N = 45, 1000
    x = (torch.randn(M, N, dtype=torch.float64) + 3).to(torch.bfloat16)
    dy = torch.randn(M, N, dtype=torch.float64).to(torch.bfloat16)
    w, b = _params(N, torch.bfloat16, "fp32")
    if rms:
        _, rstd = L.rms_forward(x, w, 1e-6)
        run = lambda: L.rms_backward(dy, x, rstd, w, (True, True))  # noqa: E731
    else:
        _, mean, rstd = L.ln_forward(x, w, b, 1e-5)
        run = lambda: L.ln_backward(dy, x, mean, rstd, w, (True, True, True), bias_dtype=torch.float32)  # noqa: E731
    assert L._CFG["bwd_pf_hold_w_wide_params"] == 1
    seen.clear()
    held = run()
    assert [kw.get("HOLD_W") for n, kw in seen if n == "_bwd_rows_pf_kernel"] == [True]
    monkeypatch.setitem(L._CFG, "bwd_pf_hold_w_wide_params", 0)
    reload = run()
    for a, c in zip(reload, held):
        assert torch.equal(a, c)
    if not rms:
        gx, gw, gb = ref_ln_bwd(dy, x, w, b, 1e-5)
        for got, ref in zip(held, (gx, gw, gb)):
            assert rel(got, ref) <= TOL_BWD[torch.bfloat16]


@interp
def test_coop_never_waits_in_the_interpreter(monkeypatch):
    # with several chunks per row the interpreter (one program after another) would spin forever: the
    # host takes the row-sum + column backward instead
    _coop_on(monkeypatch, chunk=64)
    seen = _record_launches(monkeypatch)
    check_ln(5, 300, torch.bfloat16, "same")
    check_rms(5, 300, torch.float32, "same")
    assert [n for n, _ in seen if n.startswith("_bwd")] == ["_bwd_rowsum_kernel", "_bwd_cols_kernel"] * 2


@interp
def test_wide_backward_stages_reach_the_kernels(monkeypatch):
    # bwd_rowsum_stages / bwd_cols_stages go to the row-sum and column kernels (Triton's pipeliner, which the
    # interpreter ignores; test_cuda_wide_backward_stages_same_bits checks the bits compiled)
    _coop_on(monkeypatch, chunk=64)
    monkeypatch.setitem(L._CFG, "bwd_rowsum_stages", 3)
    monkeypatch.setitem(L._CFG, "bwd_cols_stages", 2)
    seen = _record_launches(monkeypatch)
    check_ln(5, 300, torch.bfloat16, "same")
    assert [(n, kw["STAGES"]) for n, kw in seen if n.startswith("_bwd")] == [("_bwd_rowsum_kernel", 3),
                                                                             ("_bwd_cols_kernel", 2)]


@interp
def test_rows_stages_reach_the_plain_kernel_within_the_shared_memory_cap(monkeypatch):
    # bwd_rows_stages goes to the plain rows kernel from bwd_rows_stages_min_block wide, capped so that the
    # stages - 1 blocks of x and dy in flight fit bwd_rows_stages_smem (the interpreter ignores the pipelining;
    # test_cuda_rows_stages_same_bits checks the compiled bits)
    monkeypatch.setitem(L._CFG, "bwd_rows_stages_min_block", 256)
    monkeypatch.setitem(L._CFG, "bwd_rows_stages", 3)
    monkeypatch.setitem(L._CFG, "bwd_pf_min_block_32bit", 512)  # fp32 200 wide: the plain kernel
    seen = _record_launches(monkeypatch)
    check_rms(40, 200, torch.float32, "same")
    (kw,) = [kw for n, kw in seen if n == "_bwd_rows_kernel"]
    block_bytes = 2 * kw["BLOCK_M"] * kw["BLOCK_N"] * 4
    assert kw["STAGES"] == 3
    monkeypatch.setitem(L._CFG, "bwd_rows_stages_smem", block_bytes)  # room for one block ahead only
    seen.clear()
    check_ln(40, 200, torch.float32, "same")
    assert [kw["STAGES"] for n, kw in seen if n == "_bwd_rows_kernel"] == [2]
    for lo, hi in ((512, 1 << 30), (256, 128)):  # rows' block (256) outside [min_block, max_block]: not pipelined
        monkeypatch.setitem(L._CFG, "bwd_rows_stages_min_block", lo)
        monkeypatch.setitem(L._CFG, "bwd_rows_stages_max_block", hi)
        seen.clear()
        check_ln(40, 200, torch.float32, "same")
        assert ["STAGES" in kw for n, kw in seen if n == "_bwd_rows_kernel"] == [False]


@pytest.mark.cuda
@pytest.mark.parametrize("N", [16384, 8192, 16000])
def test_cuda_forward_maxnreg_same_bits(N, monkeypatch):
    # fp32 layer norm's one-row forward with its registers capped (fwd_maxnreg; where that spills, the spilled
    # values come back unchanged): the same bits as uncapped, eagerly and in a CUDA graph, and float64's
    monkeypatch.setitem(L._CFG, "fwd_maxnreg_min_block", 8192)
    M = 2 ** 23 // N + 3
    x, _ = _inputs(M, N, torch.float32, 0.0, "cuda")
    w, b = _params(N, torch.float32, "same", "cuda")
    seen = _record_launches(monkeypatch)
    for regs in (64, 80):  # (the last setting stays: the launch check below)
        assert_pdl_same_bits(monkeypatch, lambda: L.ln_forward(x, w, b, 1e-5), L._CFG, "fwd_maxnreg", regs, 0)
    assert any(kw.get("maxnreg") == 80 for n, kw in seen if n == "_fwd_rows_kernel"), "the registers were capped"
    check_ln(M, N, torch.float32, "same", device="cuda")


@pytest.mark.cuda
@pytest.mark.parametrize("op,N,dtype,pdt", [("ln", 16384, torch.bfloat16, "same"), ("rms", 16384, torch.bfloat16, "same"),
                                            ("rms", 16384, torch.float32, "same"), ("ln", 8192, torch.float32, "same"),
                                            ("ln", 8192, torch.bfloat16, "fp32"), ("rms", 12288, torch.float16, "fp32")])
def test_cuda_rows_stages_same_bits(op, N, dtype, pdt, monkeypatch):
    # the plain rows kernel's walk software-pipelined (bwd_rows_stages: 2 / 3 / 4, capped by its shared memory
    # budget) sums the same terms in the same order: the same bits, eagerly and in a CUDA graph, and float64's
    # (at every block: the default pipelines the 8192 block only)
    monkeypatch.setitem(L._CFG, "bwd_rows_stages_max_block", 1 << 30)
    M = 2 ** 23 // N + 3
    x, dy = _inputs(M, N, dtype, 0.0, "cuda")
    w, b = _params(N, dtype, pdt, "cuda")
    if op == "ln":
        _, mean, rstd = L.ln_forward(x, w, b, 1e-5)

        def run():
            return L.ln_backward(dy, x, mean, rstd, w, (True, True, True), bias_dtype=b.dtype)
    else:
        _, rr = L.rms_forward(x, w, 1e-6)

        def run():
            return L.rms_backward(dy, x, rr, w, (True, True))
    seen = _record_launches(monkeypatch)
    for stages in (2, 3, 4):
        assert_pdl_same_bits(monkeypatch, run, L._CFG, "bwd_rows_stages", stages, 1)
    assert any(kw.get("STAGES", 1) > 1 for n, kw in seen if n == "_bwd_rows_kernel"), "the kernel was pipelined"
    (check_ln if op == "ln" else check_rms)(M, N, dtype, pdt, device="cuda")


@pytest.mark.cuda
@pytest.mark.parametrize("N", [40000, 262144])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_cuda_wide_backward_stages_same_bits(N, dtype, monkeypatch):
    # the row-sum + column path's loops software-pipelined (bwd_rowsum_stages, bwd_cols_stages: loads issued
    # steps ahead through shared memory) sum the same terms in the same order: the same bits, eagerly and in
    # a CUDA graph, and float64's values
    monkeypatch.setitem(L._CFG, "bwd_coop_max_block", 0)
    monkeypatch.setitem(L._CFG, "bwd_coop_max_block_16bit", 0)
    M = 2 ** 22 // N + 3
    x, dy = _inputs(M, N, dtype, 0.0, "cuda")
    w, b = _params(N, dtype, "same", "cuda")
    _, mean, rstd = L.ln_forward(x, w, b, 1e-5)
    _, rr = L.rms_forward(x, w, 1e-6)

    def run():
        return (*L.ln_backward(dy, x, mean, rstd, w, (True, True, True)),
                *L.rms_backward(dy, x, rr, w, (True, True)))

    for stages in (2, 3, 4):  # (1, 1) -> (1, stages) -> (stages, stages): each step the same bits
        monkeypatch.setitem(L._CFG, "bwd_rowsum_stages", 1)
        assert_pdl_same_bits(monkeypatch, run, L._CFG, "bwd_cols_stages", stages, 1)
        assert_pdl_same_bits(monkeypatch, run, L._CFG, "bwd_rowsum_stages", stages, 1)
    check_ln(M, N, dtype, "same", device="cuda")
    check_rms(M, N, dtype, "same", device="cuda")


class _FakeCuda:
    device = torch.device("cuda")

    def __init__(self, size):
        self.size = size

    def element_size(self):
        return self.size


def test_coop_chunk_keeps_a_row_on_the_gpu(monkeypatch):
    # a row's S programs must be resident together: S <= coop_max_programs_per_row and <= the SM count;
    # the chunk grows instead, and past coop_max_chunk the cooperative path is off; 16-bit inputs stop
    # at bwd_coop_max_block_16bit
    monkeypatch.setattr(L, "interpreting", lambda: False)
    monkeypatch.setattr(L, "_num_sms", lambda t: 132)
    monkeypatch.setitem(L._CFG, "bwd_coop_chunk", 2048)
    monkeypatch.setitem(L._CFG, "bwd_coop_max_block", 1 << 30)
    f32, bf16 = _FakeCuda(4), _FakeCuda(2)
    assert L._coop_chunk(f32, 65536, 65536) == 2048  # S = 32
    assert L._coop_chunk(f32, 262144, 262144) == 8192  # S = 32, chunk grown
    assert L._coop_chunk(f32, 1 << 20, 1 << 20) == 0  # the chunk would pass 16384
    monkeypatch.setitem(L._CFG, "bwd_coop_max_block_16bit", 16384)
    assert L._coop_chunk(bf16, 16384, 16384) == 2048
    assert L._coop_chunk(bf16, 20000, 32768) == 0
    monkeypatch.setattr(L, "_num_sms", lambda t: 8)
    assert L._coop_chunk(f32, 65536, 65536) == 8192  # S = 8 on a GPU of 8 SMs
    assert L._coop_chunk(torch.empty(0), 65536, 65536) == 0  # CPU tensors: S > 1 never
    monkeypatch.setitem(L._CFG, "bwd_coop_max_block", 32768)
    assert L._coop_chunk(f32, 65536, 65536) == 0  # off past max_block


@pytest.mark.cuda
@pytest.mark.parametrize("N", [9216, 12288, 16384])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_cuda_db_split(N, dtype, monkeypatch):
    # compiled: the rows kernel without db plus _bwd_db_rows_kernel (the default from 12288 wide; forced at
    # 9216) against float64, and bit-identical to the one-kernel form (its db accumulator spills there,
    # but it runs); fp32 w/b never split
    monkeypatch.setitem(L._CFG, "bwd_db_split_min_width", min(N, L._CFG["bwd_db_split_min_width"]))
    seen = _record_launches(monkeypatch)
    M = 2 ** 24 // N + 5
    check_ln(M, N, dtype, "same", device="cuda")
    assert [n for n, _ in seen if n.startswith("_bwd")] == ["_bwd_rows_kernel", "_bwd_db_rows_kernel"]
    seen.clear()
    check_ln(M, N, dtype, "fp32", device="cuda")
    assert "_bwd_db_rows_kernel" not in [n for n, _ in seen]
    x, dy = _inputs(M, N, dtype, 0.0, "cuda")
    w, b = _params(N, dtype, "same", "cuda")
    _, mean, rstd = L.ln_forward(x, w, b, 1e-5)
    split = L.ln_backward(dy, x, mean, rstd, w, (True, True, True), bias_dtype=b.dtype)
    monkeypatch.setitem(L._CFG, "bwd_db_split_min_width", 1 << 30)
    monkeypatch.setitem(L._CFG, "bwd_max_block_ln", 16384)
    seen.clear()
    one = L.ln_backward(dy, x, mean, rstd, w, (True, True, True), bias_dtype=b.dtype)
    assert [n for n, _ in seen if n.startswith("_bwd")] == ["_bwd_rows_kernel"]
    assert all(torch.equal(a, c) for a, c in zip(split, one))


@pytest.mark.cuda
@pytest.mark.parametrize("N", [20000, 65537, 262144])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_cuda_coop_backward(N, dtype, monkeypatch):
    # compiled, many rows in flight and a row's programs on different SMs: against float64, and repeated
    # calls bit-identical (a row sum read before it was visible would show)
    monkeypatch.setitem(L._CFG, "bwd_coop_max_block", 1 << 30)
    monkeypatch.setitem(L._CFG, "bwd_coop_max_block_16bit", 1 << 30)
    seen = _record_launches(monkeypatch)
    M = max(8, 2 ** 23 // N) + 3
    check_ln(M, N, dtype, "fp32" if dtype == torch.bfloat16 else "same",
             offset=1000.0 if dtype == torch.float32 else 0.0, device="cuda")
    check_rms(M, N, dtype, "same", device="cuda")
    assert [n for n, _ in seen if n.startswith("_bwd")] == ["_bwd_coop_kernel"] * 2
    x, dy = _inputs(M, N, dtype, 0.0, "cuda")
    w, b = _params(N, dtype, "same", "cuda")
    y, mean, rstd = L.ln_forward(x, w, b, 1e-5)
    first = L.ln_backward(dy, x, mean, rstd, w, (True, True, True))
    for _ in range(3):
        again = L.ln_backward(dy, x, mean, rstd, w, (True, True, True))
        assert all(torch.equal(a, c) for a, c in zip(first, again))


@pytest.mark.cuda
@pytest.mark.parametrize("N,dtype", [(256, torch.float32), (768, torch.bfloat16), (1024, torch.float32), (4096, torch.bfloat16),
                                     (16384, torch.bfloat16), (65536, torch.bfloat16), (3000, torch.float16)])
def test_cuda_pdl_same_bits(N, dtype, monkeypatch):
    """The dw/db reduction launched with programmatic dependent launch: the same bits as without it, on
    every backward kernel (narrow and one-row, cooperative, row sums + columns), also in a CUDA graph."""
    M = max(4, (1 << 24) // N)
    x = torch.randn(M, N, device="cuda", dtype=dtype) + 2
    w, b = torch.rand(N, device="cuda", dtype=dtype) + 0.5, torch.randn(N, device="cuda", dtype=dtype)
    dy = torch.randn_like(x)
    _, mean, rstd = L.ln_forward(x, w, b, 1e-5)
    _, rrstd = L.rms_forward(x, w, 1e-6)

    def run():
        return (L.ln_backward(dy, x, mean, rstd, w, (True, True, True), bias_dtype=dtype)
                + L.rms_backward(dy, x, rrstd, w, (True, True)))

    assert_pdl_same_bits(monkeypatch, run, L._CFG, "pdl_max_block", 1 << 30)
    want = run()
    # and the sums themselves are right: db = sum of dy over rows
    assert torch.allclose(want[2].double(), dy.double().sum(0), rtol=1e-2, atol=1e-2 * M ** 0.5)
