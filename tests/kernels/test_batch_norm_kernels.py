"""Batch norm Triton kernels against a float64 plain-torch reference.

Without CUDA these run on CPU tensors through the Triton interpreter (``TRITON_INTERPRET=1``, set
here before triton is imported). If another test module imported the kernels compiled (no
interpreter), the CPU checks rerun in a subprocess (``test_cpu_checks_in_subprocess``).
Tests marked ``cuda`` need a GPU (large shapes, > 2^31 elements, timing-free).

Every check draws fresh random inputs (never zeros), poisons every buffer the launchers allocate
(NaN), and compares on the same rounded inputs with a float64 reference.
"""

import os

import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"

import itertools  # noqa: E402
import math  # noqa: E402
import zlib  # noqa: E402

import pytest  # noqa: E402

triton = pytest.importorskip("triton")

from normkit.kernels import batch_norm as B  # noqa: E402
from normkit.kernels.batch_norm import _config as BCFG  # noqa: E402
from interp_rerun import rerun_cpu_checks  # noqa: E402
from pdl_check import assert_pdl_same_bits  # noqa: E402

INTERPRETED = type(B._bn_ew_rows_kernel).__name__ == "InterpretedFunction"
interp = pytest.mark.skipif(
    not INTERPRETED, reason="kernels were imported compiled; see test_cpu_checks_in_subprocess"
)

DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64]
# relative L2 error allowed (output rounding dominates in half precision; ATen shows ~1.7e-3 in bf16)
TOL = {torch.float64: 1e-12, torch.float32: 2e-6, torch.float16: 2e-3, torch.bfloat16: 1.2e-2}
TOL_BWD = {torch.float64: 1e-11, torch.float32: 1e-5, torch.float16: 4e-3, torch.bfloat16: 2e-2}
TOL_STAT = {torch.float64: 1e-13, torch.float32: 1e-6, torch.float16: 1e-6, torch.bfloat16: 1e-6}

# tiny tiles and few programs: many programs per channel, several grid-stride steps, several
# channel blocks and ragged edges even on small shapes
TINY = {"red_tile_bytes": 128, "red_tile_bytes_fwd_fp32": 128, "target_programs_rows_fwd_fp32": 5,
        "red_tile_bytes_ncs_fwd": 128, "red_tile_bytes_ncs_bwd": 64,
        "ew_tile_bytes": 64, "ew_tile_bytes_ncs": 64, "target_programs_rows_fwd": 5, "target_programs": 6,
        "target_programs_ncs_fwd_16bit": 6, "min_rows": 2, "combine_elems": 16,
        "combine_elems_bwd": 16, "combine_max_channels_fwd": 2, "fused_max_rows": 0}


# ------------------------------------------------------------------------------------------------
# helpers


def relerr(a, b):
    a = a.double()
    b = b.double()
    d = torch.linalg.vector_norm(a - b)
    n = torch.linalg.vector_norm(b)
    return (d / n).item() if n > 0 else d.item()


def err_vs_scale(a, ref, scale):
    """||a - ref|| / ||scale||: for grad_input, whose terms (each ~ g*invstd*w) can cancel to ~0
    on tiny batches, so its own size is no yardstick."""
    return (torch.linalg.vector_norm(a.double() - ref.double()) / torch.linalg.vector_norm(scale.double())).item()


def bits(t):
    return t.view({2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])


def seed(*key):
    torch.manual_seed(zlib.crc32(repr(key).encode()))


def dims_of(x):
    return [0] + list(range(2, x.dim()))


def bshape(x):
    return [1, -1] + [1] * (x.dim() - 2)


def ref_fwd(x, w, b, eps):
    xd = x.double()
    d = dims_of(x)
    m = xd.mean(d)
    var = ((xd - m.view(bshape(x))) ** 2).mean(d)
    r = 1.0 / torch.sqrt(var + eps)
    y = (xd - m.view(bshape(x))) * r.view(bshape(x))
    if w is not None:
        y = y * w.double().view(bshape(x))
    if b is not None:
        y = y + b.double().view(bshape(x))
    return y, m, r, var


def ref_bwd(g, x, w, mean, invstd, train):
    gd, xd = g.double(), x.double()
    d = dims_of(x)
    n = x.numel() // x.shape[1]
    sh = bshape(x)
    m = mean.double().view(sh)
    r = invstd.double().view(sh)
    wd = w.double().view(sh) if w is not None else torch.ones_like(r)
    xmu = xd - m
    s1 = gd.sum(d)
    s2 = (gd * xmu).sum(d)
    if train:
        dx = (gd - s1.view(sh) / n - xmu * r * r * s2.view(sh) / n) * r * wd
    else:
        dx = gd * r * wd
    return dx, s2 * invstd.double(), s1


def make_x(shape, dtype, layout, offset=0.0):
    """layout: 'contig', 'cl' (channels_last / channels_last_3d), 'strided' (a non-dense view)."""
    if layout == "strided":
        big = torch.randn(shape[:-1] + (shape[-1] * 2,), dtype=torch.float64) * 1.5 + 0.3 + offset
        x = big.to(dtype)[..., ::2]
        assert not x.is_contiguous()
        return x
    x = (torch.randn(shape, dtype=torch.float64) * 1.5 + 0.3 + offset).to(dtype)
    if layout == "cl":
        fmt = torch.channels_last if x.dim() == 4 else torch.channels_last_3d
        x = x.contiguous(memory_format=fmt)
    return x


def expected_strides(x):
    fmt = BCFG._suggest_format(x)
    return torch.empty(x.shape).contiguous(memory_format=fmt).stride()


@pytest.fixture
def poison(monkeypatch):
    """Every empty tensor the launchers allocate starts as NaN (ints: -1)."""
    real_empty, real_empty_like = torch.empty, torch.empty_like

    def fill(t):
        if t.is_floating_point():
            t.fill_(float("nan"))
        else:
            t.fill_(-1)
        return t

    monkeypatch.setattr(B.torch, "empty", lambda *a, **k: fill(real_empty(*a, **k)))
    monkeypatch.setattr(B.torch, "empty_like", lambda *a, **k: fill(real_empty_like(*a, **k)))
    yield


# every training call on the one-launch kernels, whatever its size
ALWAYS_ONE_LAUNCH = {"fused_max_rows": 1 << 40, "fused_max_numel": 1 << 40, "fused_max_tiles": 1 << 40}
# ... with tiny tiles: many tiles a program, a channel block per channel (plane tiles) or 16 channels (row tiles)
FUSED = dict(ALWAYS_ONE_LAUNCH, fused_tile_elems=8, fused_min_programs=1 << 20)


@pytest.fixture(params=["default", "tiny", "fused"])
def tune(request, monkeypatch):
    for k, v in {"tiny": TINY, "fused": FUSED}.get(request.param, {}).items():
        monkeypatch.setitem(B._TUNE, k, v)
    return request.param


# (shape, layout) cases: 2-D, NCL, NCHW, NHWC, NCDHW, NDHWC, HW = 1, strided copies, C = 1;
# short planes not a multiple of 16 take the compile-time-S kernels
CASES = [
    ((7, 5), "contig"),
    ((3, 4, 9), "contig"),
    ((3, 5, 4, 3), "contig"),
    ((3, 5, 4, 3), "cl"),
    ((2, 6, 3, 2), "cl"),  # rows of C % 16 == 2 and 8 elements: their alignment passed (C_ALIGN)
    ((2, 24, 2, 3), "cl"),
    ((2, 3, 2, 3, 4), "contig"),
    ((2, 3, 2, 3, 4), "cl"),
    ((6, 4, 1, 1), "contig"),
    ((3, 5, 4, 3), "strided"),
    ((5, 1, 3, 2), "contig"),
    ((3, 5, 4, 8), "contig"),  # S = 32: aligned planes (run-time S kernels)
    ((2, 3, 1030), "contig"),  # S > 1024, not a multiple of 16: run-time S, unaligned config
    ((2, 4), "contig"),  # N*HW = 2, the smallest training batch
    ((1, 3, 2), "contig"),
]


def _params(C, dtype, pdt, affine, stats):
    pd = dtype if pdt == "input" else (torch.float64 if dtype == torch.float64 else torch.float32)
    w = (torch.rand(C, dtype=torch.float64) + 0.5).to(pd) if affine else None
    b = torch.randn(C, dtype=torch.float64).to(pd) if affine else None
    rm = torch.randn(C, dtype=torch.float64).to(pd) if stats else None
    rv = (torch.rand(C, dtype=torch.float64) + 0.5).to(pd) if stats else None
    return w, b, rm, rv


# ------------------------------------------------------------------------------------------------
# forward / backward against the reference, every dtype and layout


@interp
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).split(".")[-1])
@pytest.mark.parametrize("shape,layout", CASES, ids=[f"{s}-{l}" for s, l in CASES])
def test_train_forward_backward(shape, layout, dtype, tune, poison):
    seed(shape, layout, str(dtype), tune)
    x = make_x(shape, dtype, layout)
    C = shape[1]
    pdt = "input" if dtype in (torch.bfloat16, torch.float64) else "fp32"
    w, b, rm, rv = _params(C, dtype, pdt, True, True)
    rm0, rv0 = rm.clone(), rv.clone()
    eps, mom = 1e-5, 0.1
    y, mean, invstd = B.bn_forward_train(x, w, b, rm, rv, mom, eps)
    acc = torch.float64 if dtype == torch.float64 else torch.float32
    assert y.dtype == dtype and y.shape == x.shape and y.stride() == expected_strides(x)
    assert mean.dtype == acc and invstd.dtype == acc and mean.shape == (C,) and invstd.shape == (C,)
    yr, mr, ir, vr = ref_fwd(x, w, b, eps)
    assert not torch.isnan(y).any()
    assert relerr(y, yr) < TOL[dtype]
    # the mean against the channel's spread: a mean near 0 (tiny batches) makes its own size no yardstick
    assert err_vs_scale(mean, mr, 1 / ir) < TOL_STAT[dtype]
    assert relerr(invstd, ir) < TOL_STAT[dtype]
    n = x.numel() // C
    rs_tol = 1e-13 if rm.dtype == torch.float64 else (1e-6 if rm.dtype == torch.float32 else 8e-3)
    assert relerr(rm, (1 - mom) * rm0.double() + mom * mr) < rs_tol
    assert relerr(rv, (1 - mom) * rv0.double() + mom * vr * n / (n - 1)) < rs_tol

    g = make_x(shape, dtype, layout)
    dx, gw, gb = B.bn_backward(g, x, w, mean, invstd, True, [True, True, True])
    dxr, gwr, gbr = ref_bwd(g, x, w, mean, invstd, True)
    assert dx.dtype == dtype and dx.stride() == expected_strides(x)
    assert gw.dtype == w.dtype and gb.dtype == w.dtype
    scale = g.double() * (invstd.double() * w.double()).view(bshape(x))
    assert err_vs_scale(dx, dxr, scale) < TOL_BWD[dtype]
    assert relerr(gw, gwr) < TOL_BWD[dtype]
    assert relerr(gb, gbr) < TOL_BWD[dtype]


@interp
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=lambda d: str(d).split(".")[-1])
@pytest.mark.parametrize("shape,layout", CASES, ids=[f"{s}-{l}" for s, l in CASES])
def test_sync_primitives(shape, layout, dtype, tune, poison):
    """SyncBatchNorm's primitives on the kernels: local stats, elemt with given (global) stats, the backward's
    local sums and grads, and backward_elemt with global sums and counts, against float64."""
    x = make_x(shape, dtype, layout, offset=2.0)
    C = shape[1]
    w, b, _, _ = _params(C, dtype, "fp32", True, False)
    g = torch.randn_like(x)
    mean, invstd = B.bn_stats(x, 1e-5)
    _, m_ref, r_ref, _ = ref_fwd(x, None, None, 1e-5)
    assert mean.dtype == invstd.dtype == torch.float32
    assert relerr(mean, m_ref) < TOL_STAT[dtype] * 4 and relerr(invstd, r_ref) < TOL_STAT[dtype] * 4
    # "global" statistics as other ranks would shift them, and a global count of 3 ranks' worth
    gm, gr = mean + 0.25, invstd * 0.75
    y = B.bn_elemt(x, w, b, gm, gr)
    want = (x.double() - gm.double().view(bshape(x))) * (gr.double() * w.double()).view(bshape(x)) \
        + b.double().view(bshape(x))
    assert y.dtype == x.dtype and y.stride() == expected_strides(x)
    assert relerr(y, want) < TOL[dtype]
    sum_dy, sum_dy_xmu, gw, gb = B.bn_backward_reduce(g, x, gm, gr, w, True, True, True)
    gd, xmu = g.double(), x.double() - gm.double().view(bshape(x))
    s1, s2 = gd.sum(dims_of(x)), (gd * xmu).sum(dims_of(x))
    assert relerr(sum_dy, s1) < TOL_BWD[dtype] and relerr(sum_dy_xmu, s2) < TOL_BWD[dtype]
    assert gw.dtype == gb.dtype == torch.float32
    assert relerr(gw, s2 * gr.double()) < TOL_BWD[dtype] and relerr(gb, s1) < TOL_BWD[dtype]
    assert B.bn_backward_reduce(g, x, gm, gr, None, False, True, False)[0::3] == (None, None)
    n = x.numel() // C
    counts = torch.tensor([n, n + 3.0, 2 * n - 1.0])
    N = counts.sum().double()
    gsum, gsum_xmu = s1 * 2.5, s2 * 1.5  # the all-reduced sums
    dx = B.bn_backward_elemt(g, x, gm, gr, w, gsum.float(), gsum_xmu.float(), counts)
    sh = bshape(x)
    want = (gd - gsum.view(sh) / N - xmu * (gr.double() ** 2 * gsum_xmu / N).view(sh)) \
        * (gr.double() * w.double()).view(sh)
    assert dx.dtype == x.dtype and dx.stride() == expected_strides(x)
    assert relerr(dx, want) < TOL_BWD[dtype]


@interp
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).split(".")[-1])
@pytest.mark.parametrize("shape,layout", CASES, ids=[f"{s}-{l}" for s, l in CASES])
def test_eval_forward_backward(shape, layout, dtype, tune, poison):
    seed(shape, layout, str(dtype), tune, "eval")
    x = make_x(shape, dtype, layout)
    C = shape[1]
    w, b, rm, rv = _params(C, dtype, "fp32" if dtype != torch.float64 else "input", True, True)
    eps = 1e-3
    y = B.bn_forward_eval(x, w, b, rm, rv, eps)
    assert y.dtype == dtype and y.stride() == expected_strides(x)
    sh = bshape(x)
    yr = (x.double() - rm.double().view(sh)) / torch.sqrt(rv.double().view(sh) + eps)
    yr = yr * w.double().view(sh) + b.double().view(sh)
    assert relerr(y, yr) < TOL[dtype]

    g = make_x(shape, dtype, layout)
    acc = torch.float64 if dtype == torch.float64 else torch.float32
    invstd = (1.0 / torch.sqrt(rv.to(acc) + eps)).to(acc)
    dx, gw, gb = B.bn_backward(g, x, w, rm, invstd, False, [True, True, True])
    dxr, gwr, gbr = ref_bwd(g, x, w, rm, invstd, False)
    assert dx.stride() == expected_strides(x)
    assert relerr(dx, dxr) < TOL[dtype]
    assert relerr(gw, gwr) < TOL_BWD[dtype]
    assert relerr(gb, gbr) < TOL_BWD[dtype]


# ------------------------------------------------------------------------------------------------
# options: weight/bias None, running stats None, momentum verbatim, output_mask, n == 1


@interp
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("layout", ["contig", "cl"])
def test_no_affine_no_stats(dtype, layout, poison):
    torch.manual_seed(3)
    x = make_x((4, 3, 3, 5), dtype, layout)
    y, mean, invstd = B.bn_forward_train(x, None, None, None, None, 0.1, 1e-5)
    yr, mr, ir, _ = ref_fwd(x, None, None, 1e-5)
    assert relerr(y, yr) < TOL[dtype]
    g = make_x((4, 3, 3, 5), dtype, layout)
    dx, gw, gb = B.bn_backward(g, x, None, mean, invstd, True, [True, True, True])
    dxr, gwr, gbr = ref_bwd(g, x, None, mean, invstd, True)
    assert gw.dtype == torch.float32 and gb.dtype == torch.float32
    assert relerr(dx, dxr) < TOL_BWD[dtype]
    assert relerr(gw, gwr) < TOL_BWD[dtype] and relerr(gb, gbr) < TOL_BWD[dtype]
    rm = torch.randn(3)
    rv = torch.rand(3) + 0.5
    ye = B.bn_forward_eval(x, None, None, rm, rv, 1e-5)
    sh = bshape(x)
    yer = (x.double() - rm.double().view(sh)) / torch.sqrt(rv.double().view(sh) + 1e-5)
    assert relerr(ye, yer) < TOL[dtype]


@interp
@pytest.mark.parametrize("mom", [-1.2, 0.0, 0.5, 1.0, 1.7])
def test_momentum_verbatim(mom):
    torch.manual_seed(4)
    x = make_x((5, 4, 6), torch.float64, "contig")
    rm = torch.randn(4, dtype=torch.float64)
    rv = torch.rand(4, dtype=torch.float64) + 0.5
    rm0, rv0 = rm.clone(), rv.clone()
    _, mean, _ = B.bn_forward_train(x, None, None, rm, rv, mom, 1e-5)
    _, mr, _, vr = ref_fwd(x, None, None, 1e-5)
    n = 30
    torch.testing.assert_close(rm, (1 - mom) * rm0 + mom * mr, rtol=1e-13, atol=1e-14)
    torch.testing.assert_close(rv, (1 - mom) * rv0 + mom * vr * n / (n - 1), rtol=1e-13, atol=1e-14)


@interp
@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_single_value_per_channel():
    """n == 1 at the kernel level: no error, invstd = 1/sqrt(eps), y = bias, running_var NaN."""
    x = torch.randn(1, 3)
    w, b = torch.rand(3) + 0.5, torch.randn(3)
    rm, rv = torch.randn(3), torch.rand(3) + 0.5
    rm0 = rm.clone()
    y, mean, invstd = B.bn_forward_train(x, w, b, rm, rv, 0.1, 1e-5)
    torch.testing.assert_close(y[0], b)
    torch.testing.assert_close(mean, x[0])
    torch.testing.assert_close(invstd, torch.full((3,), 1e-5 ** -0.5))
    torch.testing.assert_close(rm, 0.9 * rm0 + 0.1 * x[0])
    assert torch.isnan(rv).all()


@interp
@pytest.mark.parametrize("train", [True, False])
@pytest.mark.parametrize("layout", ["contig", "cl"])
def test_output_mask(train, layout, poison):
    torch.manual_seed(5)
    x = make_x((3, 4, 3, 3), torch.float32, layout)
    g = make_x((3, 4, 3, 3), torch.float32, layout)
    w = torch.rand(4) + 0.5
    if train:
        _, mean, invstd = B.bn_forward_train(x, w, None, None, None, 0.1, 1e-5)
    else:
        mean, invstd = torch.randn(4), torch.rand(4) + 0.5
    full = ref_bwd(g, x, w, mean, invstd, train)
    for mask in itertools.product([False, True], repeat=3):
        outs = B.bn_backward(g, x, w, mean, invstd, train, list(mask))
        for want, got, ref in zip(mask, outs, full):
            if not want:
                assert got is None
            else:
                assert relerr(got, ref) < 1e-5


@interp
@pytest.mark.parametrize("layout", ["contig", "cl"])
def test_grad_out_other_layout(layout):
    """grad_out in the other memory format than x: dx still keeps x's format."""
    torch.manual_seed(6)
    x = make_x((3, 4, 3, 5), torch.float32, layout)
    g = make_x((3, 4, 3, 5), torch.float32, "cl" if layout == "contig" else "contig")
    _, mean, invstd = B.bn_forward_train(x, None, None, None, None, 0.1, 1e-5)
    dx, _, _ = B.bn_backward(g, x, None, mean, invstd, True, [True, False, False])
    assert dx.stride() == x.stride()
    assert relerr(dx, ref_bwd(g, x, None, mean, invstd, True)[0]) < 1e-5


# ------------------------------------------------------------------------------------------------
# determinism, layout agreement, large offsets


@interp
@pytest.mark.parametrize("layout", ["contig", "cl"])
def test_deterministic(layout, tune):
    torch.manual_seed(7)
    x = make_x((4, 6, 5, 3), torch.bfloat16, layout)
    g = make_x((4, 6, 5, 3), torch.bfloat16, layout)
    w, b = torch.rand(6) + 0.5, torch.randn(6)
    outs = []
    for _ in range(2):
        rm, rv = torch.zeros(6) + 0.25, torch.ones(6)
        y, m, r = B.bn_forward_train(x, w, b, rm, rv, 0.1, 1e-5)
        dx, gw, gb = B.bn_backward(g, x, w, m, r, True, [True, True, True])
        outs.append((y, m, r, rm, rv, dx, gw, gb))
    for a, c in zip(*outs):
        assert torch.equal(bits(a), bits(c))


FUSED_CASES = [((40, 37), "contig"), ((3, 40, 5, 7), "cl"), ((3, 40, 5, 7), "contig"), ((2, 3, 1030), "contig"),
               ((2, 5, 2, 3, 4), "cl"), ((5, 3, 4, 4), "contig")]


@interp
@pytest.mark.parametrize("knobs", [{"fused_tile_elems": 4096, "fused_min_programs": 1},
                                   {"fused_tile_elems": 64, "fused_min_programs": 128}], ids=["wide", "narrow"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64], ids=lambda d: str(d).split(".")[-1])
@pytest.mark.parametrize("shape,layout", FUSED_CASES, ids=[f"{s}-{l}" for s, l in FUSED_CASES])
def test_fused_one_launch_per_direction(shape, layout, dtype, knobs, monkeypatch, poison):
    """The one-launch kernels (``fused_max_rows``): exactly one launch per direction (training forward, training
    backward, eval backward with weight / bias gradients), several channels a program (wide) or one program a
    channel block with several tiles (narrow), against float64."""
    for k, v in dict(ALWAYS_ONE_LAUNCH, **knobs).items():
        monkeypatch.setitem(B._TUNE, k, v)
    launched = []
    real = B.launch
    monkeypatch.setattr(B, "launch", lambda kernel, *a, **k: (launched.append(kernel.__name__), real(kernel, *a, **k)))
    seed(shape, layout, str(dtype), repr(knobs))
    x = make_x(shape, dtype, layout)
    C = shape[1]
    w, b, rm, rv = _params(C, dtype, "fp32" if dtype != torch.float64 else "input", True, True)
    rm0, rv0 = rm.clone(), rv.clone()
    y, mean, invstd = B.bn_forward_train(x, w, b, rm, rv, 0.1, 1e-5)
    assert launched == ["_bn_fused_fwd_kernel"]
    yr, mr, ir, vr = ref_fwd(x, w, b, 1e-5)
    assert y.stride() == expected_strides(x) and y.dtype == dtype
    assert relerr(y, yr) < TOL[dtype] and relerr(invstd, ir) < TOL_STAT[dtype]
    assert err_vs_scale(mean, mr, 1 / ir) < TOL_STAT[dtype]
    n = x.numel() // C
    rs_tol = 1e-13 if dtype == torch.float64 else 1e-6
    assert relerr(rm, 0.9 * rm0.double() + 0.1 * mr) < rs_tol
    assert relerr(rv, 0.9 * rv0.double() + 0.1 * vr * n / (n - 1)) < rs_tol
    g = make_x(shape, dtype, layout)
    for train, (m, r) in ((True, (mean, invstd)), (False, (rm, (1.0 / torch.sqrt(rv.double() + 1e-5)).to(mean.dtype)))):
        launched.clear()
        dx, gw, gb = B.bn_backward(g, x, w, m, r, train, [True, True, True])
        assert launched == ["_bn_fused_bwd_kernel"]
        dxr, gwr, gbr = ref_bwd(g, x, w, m, r, train)
        assert dx.stride() == expected_strides(x) and dx.dtype == dtype
        scale = g.double() * (r.double() * w.double()).view(bshape(x))
        assert err_vs_scale(dx, dxr, scale) < TOL_BWD[dtype]
        assert relerr(gw, gwr) < TOL_BWD[dtype] and relerr(gb, gbr) < TOL_BWD[dtype]
    launched.clear()
    B.bn_backward(g, x, w, rm, r, False, [True, False, False])  # eval grad_input alone: the one elementwise pass
    assert len(launched) == 1 and launched[0].startswith("_bn_ew_"), launched


@interp
def test_fused_thresholds(monkeypatch):
    """``fused_max_rows`` bounds N * spatial (the elements of a channel), ``fused_max_numel`` all elements and
    ``fused_max_tiles`` the tiles a program sweeps: within all three one launch, past any three launches."""
    launched = []
    real = B.launch
    monkeypatch.setattr(B, "launch", lambda kernel, *a, **k: (launched.append(kernel.__name__), real(kernel, *a, **k)))
    monkeypatch.setitem(B._TUNE, "fused_tile_elems", 16)
    # 4 planes of 30: [1 sample, 16] tiles, 2 a plane; 120 rows of 3 channels: [4 rows, 4 channels] tiles
    for layout, tiles in (("contig", 8), ("cl", 30)):
        x = make_x((4, 3, 5, 6), torch.float32, layout)
        assert BCFG._fused_cfg(B._View(x))["NT"] == tiles
        for max_rows, max_numel, max_tiles, want in ((120, 360, tiles, 1), (119, 360, tiles, 3),
                                                     (120, 359, tiles, 3), (120, 360, tiles - 1, 3)):
            monkeypatch.setitem(B._TUNE, "fused_max_rows", max_rows)
            monkeypatch.setitem(B._TUNE, "fused_max_numel", max_numel)
            monkeypatch.setitem(B._TUNE, "fused_max_tiles", max_tiles)
            launched.clear()
            B.bn_forward_train(x, None, None, None, None, 0.1, 1e-5)
            assert len(launched) == want, (layout, max_rows, max_numel, max_tiles, launched)


@interp
@pytest.mark.parametrize("layout", ["contig", "cl"])
def test_fused_backward_sums_exact(layout, monkeypatch):
    """The one-launch backward's sums take every term in fp64, exact for fp32 inputs: grad_weight = sum(dy (x -
    mean)) invstd with x ~ 1000 and a running mean far from it (eval), and sum(dy) are float64's rounded once to
    fp32; a 2-sample training grad_input (all cancellation) is float64's to a few fp32 ulps of dy."""
    for k, v in FUSED.items():
        monkeypatch.setitem(B._TUNE, k, v)
    torch.manual_seed(23)
    x = make_x((4, 3, 5, 6), torch.float32, layout) + 1000
    dy = make_x((4, 3, 5, 6), torch.float32, layout)
    rm, invstd = torch.randn(3), torch.rand(3) + 0.5
    # dy nearly orthogonal to x - mean in each channel: the sum is ~1e-4 of its terms, so fp32-rounded terms
    # (a relative 6e-8 each) would miss float64's by far more than one final rounding
    xc = (x - rm[:, None, None]).double()
    dyd = dy.double()
    dy = (dyd - xc * (dyd * xc).sum((0, 2, 3), keepdim=True) / (xc * xc).sum((0, 2, 3), keepdim=True) * 0.9999).float()
    _, gw, gb = B.bn_backward(dy, x, None, rm, invstd, False, (False, True, True))
    xd, dyd = x.double(), dy.double()
    want_gw = ((dyd * (xd - rm.double()[:, None, None])).sum((0, 2, 3)) * invstd.double()).float()
    assert torch.equal(gb, dyd.sum((0, 2, 3)).float())
    assert torch.allclose(gw, want_gw, rtol=2 ** -23, atol=0), (gw - want_gw)
    x2, dy2 = make_x((2, 4), torch.float32, "contig"), make_x((2, 4), torch.float32, "contig")
    mean, invstd2 = x2.double().mean(0), 1 / torch.sqrt(x2.double().var(0, unbiased=False) + 1e-5)
    dx = B.bn_backward(dy2, x2, None, mean.float(), invstd2.float(), True, (True, False, False))[0]
    xh = (x2.double() - mean.float().double()) * invstd2.float().double()
    d = dy2.double()
    want = (d - d.mean(0) - xh * (d * xh).mean(0)) * invstd2.float().double()
    assert (dx.double() - want).abs().max() <= 8 * 2 ** -24 * d.abs().max() * invstd2.max(), (dx.double() - want)


@interp
def test_eval_same_bits_nchw_nhwc():
    torch.manual_seed(8)
    x = make_x((3, 5, 4, 6), torch.float32, "contig")
    w, b, rm, rv = _params(5, torch.float32, "fp32", True, True)
    y1 = B.bn_forward_eval(x, w, b, rm, rv, 1e-5)
    y2 = B.bn_forward_eval(x.contiguous(memory_format=torch.channels_last), w, b, rm, rv, 1e-5)
    assert y2.is_contiguous(memory_format=torch.channels_last)
    assert torch.equal(y1, y2)


@interp
@pytest.mark.parametrize("layout", ["contig", "cl"])
def test_large_offset_keeps_digits(layout):
    """randn + 1000 in fp32: the shifted sums keep the output error at fp32 rounding level
    (ATen loses about 3 digits here)."""
    torch.manual_seed(9)
    x = make_x((8, 4, 6, 6), torch.float32, layout, offset=1000.0)
    y, mean, invstd = B.bn_forward_train(x, None, None, None, None, 0.1, 1e-5)
    yr, mr, ir, _ = ref_fwd(x, None, None, 1e-5)
    assert relerr(y, yr) < 2e-6
    assert relerr(invstd, ir) < 1e-6


def shift_samples(shape, layout):
    """The three elements each channel's shift is the median of, as index tuples into a tensor of ``shape``
    (channel dim a full slice): the channel's first, middle and last element in the view the kernels take.
    Rows view (channels_last / channels_last_3d, or spatial size S = prod(shape[2:]) == 1, e.g. 2-D (N, C)): the
    (M, C) matrix of M = N * S rows, flat row r = n * S + s, rows 0, (M - 1) // 2 and M - 1. ncs view (contiguous,
    S > 1): (n, s) = (0, 0), ((N - 1) // 2, (S - 1) // 2), (N - 1, S - 1), s the flattened spatial index. The two
    views pick different middle elements of the same logical tensor."""
    N, sp = shape[0], tuple(shape[2:])
    S = math.prod(sp)
    if layout == "cl" or S == 1:
        M = N * S
        ns = [divmod(r, S) for r in (0, (M - 1) // 2, M - 1)]
    else:
        ns = [(0, 0), ((N - 1) // 2, (S - 1) // 2), (N - 1, S - 1)]
    out = []
    for n, s in ns:
        idx = (n, slice(None))
        for d in reversed(sp):  # s unravelled, the last spatial dim fastest
            idx = idx[:2] + (s % d,) + idx[2:]
            s //= d
        out.append(idx)
    return out


def _far_at(shape, layout, where, dist, key):
    """randn + 1000 (float64) with each channel's elements at ``where`` (indices into shift_samples) moved
    ``dist[i]`` of the channel's std out, then rounded to fp32 in ``layout``."""
    seed(*key)
    x = torch.randn(shape, dtype=torch.float64) + 1000.0
    std = x.std(dims_of(x))
    samples = shift_samples(shape, layout)
    for i, k in zip(where, dist):
        x[samples[i]] += k * std
    x = x.float()
    if layout == "cl":
        x = x.contiguous(memory_format=torch.channels_last if x.dim() == 4 else torch.channels_last_3d)
    return x


# the split path (reduction + combine) with several programs a channel (P = 8-12; 3 with several grid-stride steps on
# the aligned ncs plane): TINY's tiles, the partials cap lifted
SPLIT_MANY = dict(TINY, partial_frac=1.0, partial_frac_rows=1.0, target_programs=12, target_programs_rows_fwd_fp32=8)


@pytest.fixture(params=["default", "split"])
def shift_tune(request, monkeypatch):
    """The one-launch kernel ("default": these small shapes take it) or the split path ("split": SPLIT_MANY)."""
    if request.param == "split":
        for k, v in SPLIT_MANY.items():
            monkeypatch.setitem(B._TUNE, k, v)
    return request.param


def _assert_stats_to_rounding(x, tune, monkeypatch):
    """Training forward (momentum 1: running var = the unbiased batch var) at fp32 rounding level against float64,
    with no allowance for the shift's distance from the mean: invstd within 4 eps32, running var 8 eps32, y 2e-6
    (relative L2). Checks the path ``tune`` means: "split" the reduction and combine over several programs a
    channel, "default" the one-launch kernel."""
    launched = []
    real = B.launch
    monkeypatch.setattr(B, "launch", lambda kernel, *a, **k: (launched.append(kernel.__name__), real(kernel, *a, **k)))
    C = x.shape[1]
    rm, rv = torch.zeros(C), torch.ones(C)
    y, mean, invstd = B.bn_forward_train(x, None, None, rm, rv, 1.0, 1e-5)
    if tune == "split":
        assert "_bn_combine_fwd_kernel" in launched, launched
        assert BCFG._reduce_cfg(B._View(x), 4)["P"] > 1  # several programs a channel
    else:
        assert launched == ["_bn_fused_fwd_kernel"], launched
    yr, mr, ir, var = ref_fwd(x, None, None, 1e-5)
    n = x.numel() // C
    eps32 = torch.finfo(torch.float32).eps
    errs = dict(invstd=relerr(invstd, ir), running_var=relerr(rv, var * n / (n - 1)), y=relerr(y, yr))
    assert errs["invstd"] <= 4 * eps32 and errs["running_var"] <= 8 * eps32 and errs["y"] <= 2e-6, errs


# contiguous 4-D (ncs: a short unaligned plane, a longer aligned one), channels_last 4-D and 5-D and 2-D (rows)
OUTLIER_CASES = [((6, 4, 7, 7), "contig"), ((3, 4, 16, 24), "contig"), ((6, 4, 9, 9), "cl"), ((486, 4), "contig"),
                 ((2, 3, 5, 7, 7), "cl")]


@interp
@pytest.mark.parametrize("dist", [4.0, 1000.0], ids=["4std", "1000std"])
@pytest.mark.parametrize("pos", [0, 1, 2], ids=["first", "middle", "last"])
@pytest.mark.parametrize("shape,layout", OUTLIER_CASES, ids=[f"{s}-{l}" for s, l in OUTLIER_CASES])
def test_outliers_at_the_shift_samples_cost_no_digits(shape, layout, pos, dist, shift_tune, monkeypatch):
    """The sums are shifted by the median of three samples of each channel (``shift_samples``), so a lone outlier
    (4 or 1000 std out), even at a sample, is never the shift: the statistics stay at fp32 rounding level of the
    channel's own spread, with no factor for the distance. Shifted by the first element, the fp32 rounding of the
    sums reached the variance multiplied by 1 + ((mean - first) / std)^2: the first-1000std cases failed on the split
    path at 16-32x these bounds (invstd 0.8e-5..1.5e-5 off) and (3, 4, 16, 24) on the one-launch kernel (y 2.4e-6);
    4 std first passed there at up to 0.66 of them (0.03-0.18 with the median)."""
    x = _far_at(shape, layout, [pos], [dist], ("outlier", shape, layout, pos, dist))
    _assert_stats_to_rounding(x, shift_tune, monkeypatch)


@interp
@pytest.mark.parametrize("pair", [(0, 1), (0, 2), (1, 2)], ids=["first+middle", "first+last", "middle+last"])
@pytest.mark.parametrize("shape,layout", OUTLIER_CASES, ids=[f"{s}-{l}" for s, l in OUTLIER_CASES])
def test_shift_is_the_median_of_three_samples(shape, layout, pair, shift_tune, monkeypatch):
    """Two of the three samples 1000 std out on opposite sides: their median is the third, an ordinary element, so
    the statistics stay at fp32 rounding level. Every sample is an outlier in some case, so on the split path no
    shift by one fixed sample passes them all (by the first element: first+middle and first+last failed at 3-22x
    these bounds); with one outlier (test_outliers_at_the_shift_samples_cost_no_digits) neither would the mean of
    the three."""
    x = _far_at(shape, layout, pair, [1000.0, -1000.0], ("median", shape, layout, pair))
    _assert_stats_to_rounding(x, shift_tune, monkeypatch)


@interp
@pytest.mark.parametrize("shape", [(1, 2, 1, 1), (3, 2), (1, 2, 3), (5, 2, 1, 1), (7, 2, 1), (2, 2, 3, 3)])
def test_constant_channel_exact_for_any_count(shape):
    """A constant channel's sums about its first element are exactly 0 whatever the element count, so
    eps == 0 gives ATen's invstd = 0 there."""
    x = torch.full(shape, 0.3).float()
    y, mean, invstd = B.bn_forward_train(x, None, None, None, None, 0.1, 0.0)
    assert torch.equal(mean, torch.full((2,), 0.3)) and torch.equal(invstd, torch.zeros(2))
    assert torch.equal(y, torch.zeros(shape))


@interp
def test_supports():
    assert B.supports(torch.randn(2, 3))
    assert B.supports(torch.randn(2, 3, 4, dtype=torch.bfloat16))
    assert not B.supports(torch.randn(3))
    assert not B.supports(torch.randn(0, 3))
    assert not B.supports(torch.randint(0, 3, (2, 3)))
    assert not B.supports(torch.randn(2, 3, dtype=torch.complex64))


def test_cpu_checks_in_subprocess():
    rerun_cpu_checks(__file__, INTERPRETED)


# ------------------------------------------------------------------------------------------------
# CUDA: large shapes (run by the lead on the GPU machine)


def _var_mean_f64(x):
    """Per-channel biased variance and mean in float64, two passes over chunks of 2^26 elements (a
    float64 copy of a > 2^31-element input would not fit; its fp32 reduction is no reference)."""
    per_channel = x.transpose(0, 1).reshape(x.shape[1], -1)
    step = max(1, 2**26 // x.shape[1])
    chunks = per_channel.split(step, dim=1)
    mean = sum(c.double().sum(1) for c in chunks) / per_channel.shape[1]
    var = sum(((c.double() - mean[:, None]) ** 2).sum(1) for c in chunks) / per_channel.shape[1]
    return var, mean


def _cuda_check(x, dtype_tol, params_dtype=torch.float32):
    C = x.shape[1]
    w = (torch.rand(C, device=x.device) + 0.5).to(params_dtype)
    b = torch.randn(C, device=x.device).to(params_dtype)
    rm, rv = torch.zeros(C, device=x.device, dtype=params_dtype), torch.ones(C, device=x.device, dtype=params_dtype)
    y, mean, invstd = B.bn_forward_train(x, w, b, rm, rv, 0.1, 1e-5)
    d = dims_of(x)
    xf = x.float()
    var, mr = _var_mean_f64(x)
    # the batch mean of randn is ~0: measure its error against the channel's std, not its size
    assert ((mean.double() - mr.double()).abs() * torch.sqrt(var.double())).max() < 1e-5
    assert relerr(invstd, 1 / torch.sqrt(var.double() + 1e-5)) < 1e-5
    sh = bshape(x)
    yr = (xf - mean.view(sh)) * (invstd * w.float()).view(sh) + b.float().view(sh)
    assert y.stride() == x.stride()
    assert relerr(y, yr) < dtype_tol
    del yr, y
    g = torch.randn_like(x)
    dx, gw, gb = B.bn_backward(g, x, w, mean, invstd, True, [True, True, True])
    gf = g.float()
    xmu = xf - mean.view(sh)
    del xf
    n = x.numel() // C
    s1 = gf.sum(d, dtype=torch.float64)
    s2 = (gf * xmu).sum(d, dtype=torch.float64)
    assert relerr(gb, s1) < 1e-4 and relerr(gw, s2 * invstd.double()) < 1e-4
    dxr = (gf - (s1 / n).float().view(sh) - xmu * (invstd**2 * s2.float() / n).view(sh)) * (invstd * w.float()).view(sh)
    assert dx.stride() == x.stride()
    assert relerr(dx, dxr) < 2 * dtype_tol


@pytest.mark.cuda
@pytest.mark.parametrize("layout", ["contig", "cl"])
@pytest.mark.parametrize("shape", [(256, 64, 56, 56), (256, 2048, 7, 7), (256, 256, 14, 14), (16, 64, 32, 64, 64)])
def test_cuda_large(shape, layout):
    x = torch.randn(shape, device="cuda", dtype=torch.bfloat16)
    if layout == "cl":
        x = x.contiguous(memory_format=torch.channels_last if x.dim() == 4 else torch.channels_last_3d)
    _cuda_check(x, 1.2e-2)




@pytest.mark.cuda
def test_cuda_rows_1d():
    _cuda_check(torch.randn(1048576, 64, device="cuda", dtype=torch.bfloat16), 1.2e-2)
    _cuda_check(torch.randn(65536, 1024, device="cuda", dtype=torch.float32) + 100, 1e-5)


@pytest.mark.cuda
@pytest.mark.parametrize("kind", ["rows", "ncs"])
def test_cuda_over_2_31_elements(kind):
    """> 2^31 elements in bf16 (about 4.3 GB a tensor; the float64 checks peak past 64 GiB: an H100's 79 GiB ran out
    in session 38, an H200 passes)."""
    torch.cuda.empty_cache()  # the other case's blocks, still cached, would count as used
    free, _ = torch.cuda.mem_get_info()
    if free < 96 * 2**30:
        pytest.skip("needs ~96 GiB free")
    shape = (2**25 + 3, 64) if kind == "rows" else (3, 3, 2**28 + 7)
    x = torch.randn(shape, device="cuda", dtype=torch.bfloat16)
    assert x.numel() > 2**31
    _cuda_check(x, 1.2e-2)


def _assert_forward_same_bits(x):
    """Two training forwards of x (random affine parameters) give the same bits; returns (w, b)."""
    w, b = torch.rand(x.shape[1], device=x.device) + 0.5, torch.randn(x.shape[1], device=x.device)
    r1 = B.bn_forward_train(x, w, b, None, None, 0.1, 1e-5)
    r2 = B.bn_forward_train(x, w, b, None, None, 0.1, 1e-5)
    for a, c in zip(r1, r2):
        assert torch.equal(a, c)
    return w, b


@pytest.mark.cuda
def test_cuda_deterministic_and_eval_layouts():
    x = torch.randn(64, 256, 28, 28, device="cuda", dtype=torch.bfloat16)
    w, b = _assert_forward_same_bits(x)
    rm, rv = torch.randn(256, device="cuda"), torch.rand(256, device="cuda") + 0.5
    y1 = B.bn_forward_eval(x, w, b, rm, rv, 1e-5)
    y2 = B.bn_forward_eval(x.contiguous(memory_format=torch.channels_last), w, b, rm, rv, 1e-5)
    assert torch.equal(y1, y2)


def _cuda_train_step(shape, layout, dtype):
    """(x, run): fresh CUDA inputs, and run() giving every output of a training forward + backward (fresh
    running statistics each call)."""
    x = torch.randn(shape, device="cuda", dtype=dtype) + 3
    if layout == "cl":
        x = x.contiguous(memory_format=torch.channels_last)
    C = shape[1]
    w, b = torch.rand(C, device="cuda") + 0.5, torch.randn(C, device="cuda")
    dy = torch.randn_like(x)
    rm0, rv0 = torch.randn(C, device="cuda"), torch.rand(C, device="cuda") + 0.5

    def run():
        rm, rv = rm0.clone(), rv0.clone()
        y, m, s = B.bn_forward_train(x, w, b, rm, rv, 0.1, 1e-5)
        return (y, m, s, rm, rv) + B.bn_backward(dy, x, w, m, s, True, (True, True, True))

    return x, run


@pytest.mark.cuda
@pytest.mark.parametrize("shape,layout,dtype", [
    ((64, 256, 28, 28), "cl", torch.bfloat16),     # rows view
    ((64, 256, 28, 28), "contig", torch.float32),  # ncs, S a multiple of 16
    ((64, 512, 7, 7), "contig", torch.bfloat16),   # ncs 7x7 as the spread rows view
    ((64, 512, 7, 7), "contig", torch.float32),
    ((64, 36, 7, 7), "contig", torch.bfloat16),    # ncs, S compiled in, flat elementwise pass (x loaded before
                                                   # the PDL wait): 36 x 49 elements a sample, not spread
    ((64, 128, 14, 14), "contig", torch.float16),  # ncs, 14x14
    ((4096, 96), "contig", torch.float32),          # 2-D
])
def test_cuda_pdl_same_bits(shape, layout, dtype, monkeypatch):
    """Programmatic dependent launch changes when kernels start, never what they compute: every output
    of the training forward and backward (and inside a captured CUDA graph) has the same bits with and
    without it, and matches the float64 reference."""
    monkeypatch.setitem(B._TUNE, "fused_max_rows", 0)  # PDL links the split path's three launches
    x, run = _cuda_train_step(shape, layout, dtype)
    assert_pdl_same_bits(monkeypatch, run, B._TUNE, "pdl", 1)
    _cuda_check(x, 1.2e-2 if dtype != torch.float32 else 1e-5)


# the spread elementwise pass off for every plane (the odd-plane cap spreads planes the 64-element one does not)
SPREAD_EW_OFF = {"spread_max_plane_ew": 0, "spread_max_plane_ew_odd": 0}


@pytest.mark.cuda
@pytest.mark.parametrize("shape,dtype", [((128, 576, 7, 7), torch.bfloat16), ((64, 64, 3, 3), torch.float32),
                                         ((512, 32, 49), torch.float16), ((256, 2048, 7, 7), torch.float32),
                                         ((256, 512, 7, 7), torch.bfloat16)])
def test_cuda_spread(shape, dtype, monkeypatch):
    """The spread rows view on the GPU (fp32 too, off by default there): against float64 (forward, backward,
    eval), and its elementwise pass with the same bits as the flat pass's in every mode."""
    monkeypatch.setitem(B._TUNE, "fused_max_rows", 0)
    monkeypatch.setitem(B._TUNE, "spread_max_esize", 4)
    x = torch.randn(shape, device="cuda", dtype=dtype) + 3
    assert B._spread(B._View(x)) == B._spread(B._View(x), ew=True) == x[0, 0].numel()
    _cuda_check(x, 1e-5 if dtype == torch.float32 else 1.2e-2)
    C = shape[1]
    w, b = torch.rand(C, device="cuda") + 0.5, torch.randn(C, device="cuda")
    _same_bits_either_way(monkeypatch, SPREAD_EW_OFF, {"spread_max_plane_ew": 64}, x, torch.randn_like(x),
                          w, b)


# ------------------------------------------------------------------------------------------------
# rows-view reduction knobs: forward row chunks in flight per loop step (red_unroll_rows_fwd, 4 by
# default, 2 still supported; backward always 2) and the backward grid target

# (the split path's knobs: fused_max_rows = 0 keeps small shapes off the one-launch kernels)
ROWS4 = {"red_unroll_rows_fwd": 4, "red_unroll_rows_fwd_fp32": 4, "fused_max_rows": 0}
ROWS4_TINY = dict(TINY, red_unroll_rows_fwd=4, red_unroll_rows_fwd_fp32=4, target_programs_rows_bwd=5)
ROWS2_TINY = dict(TINY, red_unroll_rows_fwd=2, red_unroll_rows_fwd_fp32=2, target_programs_rows_bwd=5)
KNOBS = {"rows4": ROWS4, "rows4_tiny": ROWS4_TINY,
         "rows2": {"red_unroll_rows_fwd": 2, "red_unroll_rows_fwd_fp32": 2, "fused_max_rows": 0},
         "rows2_tiny": ROWS2_TINY}
ROWS_CASES = [
    ((3, 5, 4, 3), "cl"),  # rows view
    ((2, 3, 2, 3, 4), "cl"),
    ((37, 6), "contig"),
]


@pytest.fixture(params=list(KNOBS))
def knobs(request, monkeypatch):
    for k, v in KNOBS[request.param].items():
        monkeypatch.setitem(B._TUNE, k, v)
    return request.param


@interp
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).split(".")[-1])
@pytest.mark.parametrize("shape,layout", ROWS_CASES, ids=[f"{s}-{l}" for s, l in ROWS_CASES])
def test_knob_paths_train_eval(shape, layout, dtype, knobs, poison):
    test_train_forward_backward(shape, layout, dtype, knobs, poison)
    test_eval_forward_backward(shape, layout, dtype, knobs, poison)


def _all_modes(x, dy, w, b, rm, rv):
    """Every elementwise mode's outputs: train forward (y, stats, running stats), train backward, eval
    forward, eval backward."""
    rm1, rv1 = rm.clone(), rv.clone()
    y, mean, invstd = B.bn_forward_train(x, w, b, rm1, rv1, 0.1, 1e-5)
    out = [y, mean, invstd, rm1, rv1]
    out += list(B.bn_backward(dy, x, w, mean, invstd, True, (True, True, True)))
    out.append(B.bn_forward_eval(x, w, b, rm, rv, 1e-5))
    inv = torch.rsqrt(rv.to(mean.dtype) + 1e-5)
    out += [t for t in B.bn_backward(dy, x, w, rm.to(mean.dtype), inv, False, (True, False, False)) if t is not None]
    return out


def _same_bits_either_way(monkeypatch, off: dict, on: dict, x, dy, w, b):
    """Every mode's outputs under the ``off`` and the ``on`` knob settings: asserted bit-identical;
    returns the ``on`` ones."""
    C = x.shape[1]
    rm, rv = torch.randn(C, device=x.device) * 0.1, torch.rand(C, device=x.device) + 0.5
    outs = []
    for knobs in (off, on):
        for k, val in knobs.items():
            monkeypatch.setitem(B._TUNE, k, val)
        outs.append(_all_modes(x, dy, w, b, rm, rv))
    for a, c in zip(*outs):
        assert torch.equal(a, c)
    return outs[1]


def _cuda_knob_case(shape, dtype, knobs, chosen, monkeypatch, cl=True):
    """x of ``shape`` (channels_last where 4-D / 5-D and ``cl``) under the given ``_TUNE`` knobs, which ``chosen(x)``
    confirms take effect: against float64, and every mode's bits the same on a second call."""
    for k, v in knobs.items():
        monkeypatch.setitem(B._TUNE, k, v)
    x = torch.randn(shape, device="cuda", dtype=dtype)
    if cl and x.dim() > 2:
        x = x.contiguous(memory_format=torch.channels_last if x.dim() == 4 else torch.channels_last_3d)
    assert chosen(x)
    _cuda_check(x, 1.2e-2 if dtype == torch.bfloat16 else 1e-5)
    C = shape[1]
    w, b = torch.rand(C, device="cuda") + 0.5, torch.randn(C, device="cuda")
    _same_bits_either_way(monkeypatch, {}, {}, x, torch.randn_like(x), w, b)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
@pytest.mark.parametrize("shape", [(64, 3, 224, 224), (4096, 3, 32, 32), (256, 5, 56, 56), (65536, 7),
                                   (8, 3, 16, 4, 4)])
def test_cuda_fold_rows(shape, dtype, monkeypatch):
    """``fold_max_c`` (odd C; 2-byte inputs since session 38, fp32 since session 39): channels_last / 2-D rows of
    C = 3 / 5 / 7 as folded rows whose programs sum each channel's columns."""
    _cuda_knob_case(shape, dtype, {"fused_max_rows": 0}, lambda x: BCFG._fold(B._View(x)) > 1, monkeypatch)


@pytest.mark.cuda
@pytest.mark.parametrize("shape", [(128, 160, 17, 17), (32, 288, 35, 35), (32, 80, 73, 73), (64, 16, 9, 9)])
def test_cuda_spread_odd_planes(shape, monkeypatch):
    """Odd planes through the spread elementwise pass (``spread_max_plane_ew_odd``, on since session 38): float64
    agreement, and the same bits as the ncs elementwise pass in every mode."""
    monkeypatch.setitem(B._TUNE, "fused_max_rows", 0)
    x = torch.randn(shape, device="cuda", dtype=torch.bfloat16)
    v = B._View(x)
    assert B._spread(v, ew=True) == v.S and B._spread(v) == 0
    _cuda_check(x, 1.2e-2)
    C = shape[1]
    w, b = torch.rand(C, device="cuda") + 0.5, torch.randn(C, device="cuda")
    _same_bits_either_way(monkeypatch, SPREAD_EW_OFF, {"spread_max_plane_ew_odd": 8192}, x, torch.randn_like(x), w, b)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
@pytest.mark.parametrize("shape", [(32, 512, 38, 38), (16, 64, 150, 150), (8, 6, 1030), (4, 16, 50, 50)])
def test_cuda_plane_align(shape, dtype, monkeypatch):
    """``plane_align`` (on since session 38): contiguous run-time planes of S % 16 in (2, 4, 8)."""
    def chosen(x):
        v = B._View(x)
        return v.kind == "ncs" and not BCFG._const_s(v) and BCFG._plane_align(v) > 1 and not B._spread(v)

    _cuda_knob_case(shape, dtype, {"plane_align": 1, "fused_max_rows": 0}, chosen, monkeypatch, cl=False)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
@pytest.mark.parametrize("shape", [(64, 24, 28, 28), (32, 40, 14, 14), (256, 4, 56, 56), (16, 6, 9, 9), (4096, 1000),
                                   (8, 24, 14, 14), (2, 8, 4, 8, 8)])
@pytest.mark.parametrize("path", ["split", "default"])
def test_cuda_row_align(shape, dtype, path, monkeypatch):
    """Rows of C % 16 in (2, 4, 8) elements told their alignment (``row_align``: vector loads, session 37), on the
    split path and the default (one launch for the small layers). (Not the bits of element-by-element loads: Triton
    gives a vectorized tile another thread layout, so its sums reduce in another order, H200 session 37.)"""
    _cuda_knob_case(shape, dtype, {"fused_max_rows": 0} if path == "split" else {},
                    lambda x: B._View(x).kind == "rows" and BCFG._row_align(shape[1]) > 1, monkeypatch)


@interp
@pytest.mark.parametrize("shape", [(2, 3, 1030), (2, 3, 38, 38), (3, 2, 1156)])
def test_plane_align(shape, monkeypatch):
    """``plane_align`` (on since session 38): the run-time-plane ncs kernels (planes > 1024, S % 16 != 0) told S's
    power-of-two factor, every mode against float64."""
    monkeypatch.setitem(B._TUNE, "plane_align", 1)
    monkeypatch.setitem(B._TUNE, "fused_max_rows", 0)
    hints = []
    real = B.launch
    monkeypatch.setattr(B, "launch", lambda k, *a, **kw: (hints.append((k.__name__, kw.get("S_ALIGN"))),
                                                          real(k, *a, **kw))[1])
    x = make_x(shape, torch.bfloat16, "contig")
    C = shape[1]
    w, b, rm, rv = _params(C, torch.bfloat16, "fp32", True, True)
    eps = 1e-5
    y, mean, invstd = B.bn_forward_train(x, w, b, rm, rv, 0.1, eps)
    yr, mr, ir, _ = ref_fwd(x, w, b, eps)
    assert relerr(y, yr) < TOL[torch.bfloat16] and relerr(invstd, ir) < TOL_STAT[torch.bfloat16]
    g = make_x(shape, torch.bfloat16, "contig")
    dx, gw, gb = B.bn_backward(g, x, w, mean, invstd, True, [True, True, True])
    dxr, gwr, gbr = ref_bwd(g, x, w, mean, invstd, True)
    scale = g.double() * (invstd.double() * w.double()).view(bshape(x))
    assert err_vs_scale(dx, dxr, scale) < TOL_BWD[torch.bfloat16] and relerr(gw, gwr) < TOL_BWD[torch.bfloat16]
    ye = B.bn_forward_eval(x, w, b, rm, rv, eps)
    inv_r = 1 / torch.sqrt(rv.double() + eps)
    yer = (x.double() - rm.double().view(bshape(x))) * (inv_r * w.double()).view(bshape(x)) + b.double().view(bshape(x))
    assert relerr(ye, yer) < TOL[torch.bfloat16]
    S = math.prod(shape[2:])
    ncs = {a for name, a in hints if name in ("_bn_reduce_ncs_kernel", "_bn_ew_ncs_kernel")}
    assert ncs == {math.gcd(S, 16)}, hints


# rows that fold (M divisible by K): C = 3 / 5 / 9 / 7 / 21 channels_last, 2-D and 3-D
FOLD_CASES = [((4, 3, 4, 4), "cl"), ((2, 5, 4, 8), "cl"), ((2, 9, 4, 8), "cl"), ((48, 7), "contig"),
              ((2, 3, 2, 4, 4), "cl"), ((2, 21, 4, 4), "cl")]


@interp
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("shape,layout", FOLD_CASES, ids=[f"{s}-{l}" for s, l in FOLD_CASES])
def test_fold_rows(shape, layout, dtype, monkeypatch, poison):
    """``fold_max_c``: rows of a small odd C taken as (M / K, K * C) rows, column j -> channel j % C, each program
    summing its columns of each channel: training, eval and SyncBatchNorm's primitives against float64."""
    for k, v in {"fold_max_c": 31, "fold_min_cols": 16, "fused_max_rows": 0}.items():
        monkeypatch.setitem(B._TUNE, k, v)
    assert BCFG._fold(B._View(make_x(shape, dtype, layout))) > 1
    folds = []
    real = B.launch
    monkeypatch.setattr(B, "launch", lambda k, *a, **kw: (folds.append(kw.get("FOLD", 0)), real(k, *a, **kw))[1])
    test_train_forward_backward(shape, layout, dtype, "fold", poison)
    test_eval_forward_backward(shape, layout, dtype, "fold", poison)
    test_sync_primitives(shape, layout, dtype, "fold", poison)
    assert shape[1] in folds
    monkeypatch.setitem(B._TUNE, "fold_max_c", 0)
    assert BCFG._fold(B._View(make_x(shape, dtype, layout))) == 0


def test_fold_choice(monkeypatch):
    """K: the least multiple of 16 giving >= fold_min_cols columns, or the largest smaller one dividing M, else no
    fold; only odd C >= 3 up to fold_max_c, rows inputs of at most fold_max_esize bytes an element (by default:
    2- and 4-byte inputs of C = 3 .. 15, odd)."""
    def fold(shape, cl=True, dtype=torch.float32):
        x = torch.empty(shape, dtype=dtype)
        if cl and x.dim() == 4:
            x = x.contiguous(memory_format=torch.channels_last)
        return BCFG._fold(B._View(x))

    assert fold((4096, 5), dtype=torch.bfloat16) == fold((4096, 5), dtype=torch.float16) == fold((4096, 5)) == 32
    assert fold((4096, 5), dtype=torch.float64) == 0  # never measured
    for c in (1, 2, 4, 6, 12, 17):  # even C load vectors through row_align; C = 1 and even C lost folded
        assert fold((4096, c), dtype=torch.bfloat16) == 0
    monkeypatch.setitem(B._TUNE, "fold_max_c", 63)
    monkeypatch.setitem(B._TUNE, "fold_min_cols", 128)
    monkeypatch.setitem(B._TUNE, "fold_max_esize", 8)
    for c in (1, 2, 24, 62):
        assert fold((4096, c), dtype=torch.bfloat16) == 0
    assert fold((64, 3, 8, 8)) == 32  # 4096 rows: 48 (144 columns) does not divide them, 32 (96 columns) does
    assert fold((48, 3, 4, 4)) == 48  # 768 rows: 48 divides them
    assert fold((2, 3, 5, 5)) == 0  # 50 rows: no multiple of 16 divides
    assert fold((64, 33, 4, 4)) == 16  # 16 x 33 = 528 columns >= 128 already
    assert fold((64, 24, 4, 4)) == 0 and fold((64, 32, 4, 4)) == 0 and fold((64, 65, 4, 4)) == 0
    assert fold((64, 3, 8, 8), cl=False) == 0
    assert fold((4096, 5)) == 32  # 2-D: 32 x 5 = 160 columns


def test_fold_sum_grid(monkeypatch):
    """A folded program sums its columns of each channel: NCB partials a program and channel, not K, so the partials
    cap leaves the grid a GPU's worth of programs (256x5x56x56 bf16: K partials left it 155, session 38)."""
    x = torch.empty(256, 5, 56, 56, dtype=torch.bfloat16, device="meta").contiguous(memory_format=torch.channels_last)
    v = B._View(x)
    rv = BCFG._FoldView(v, BCFG._fold(v))
    cfg = BCFG._reduce_cfg(rv, 2)
    assert cfg["P"] * cfg["NCB"] >= 256
    launched = []
    monkeypatch.setattr(B, "launch", lambda kernel, grid, *a, **kw: launched.append((grid, kw.get("FOLD_SUM"))))
    part, n_part = B._reduce(v, None, None, False, B.tl.float32, torch.float32)
    assert n_part == cfg["P"] * cfg["NCB"] and tuple(part.shape) == (2, n_part, 5)
    assert launched == [((n_part,), 8)]  # one program a partial row, FOLD_SUM the power of two >= C


def test_row_align(monkeypatch):
    """C_ALIGN: the power of two below 16 dividing C, 1 where Triton knows (C % 16 == 0) or for odd C; passed to
    every rows kernel of a channels_last input, one launch or split."""
    for n in range(1, 200):
        a = BCFG._row_align(n)
        assert n % a == 0 and a & (a - 1) == 0 and a < 16
        assert a == (1 if n % 16 == 0 else math.gcd(n, 16))
    launched = []
    monkeypatch.setattr(B, "launch", lambda kernel, grid, *a, **k: launched.append((kernel.__name__, k.get("C_ALIGN"))))
    x = torch.empty(8, 24, 5, 5, device="meta").contiguous(memory_format=torch.channels_last)
    w = torch.empty(24, device="meta")
    for knobs in (ALWAYS_ONE_LAUNCH, {"fused_max_rows": 0}):
        for k, v in knobs.items():
            monkeypatch.setitem(B._TUNE, k, v)
        B.bn_forward_train(x, w, w, w.clone(), w.clone(), 0.1, 1e-5)
        B.bn_backward(torch.empty_like(x), x, w, w, w, True, (True, True, True))
    rows = [name for name, a in launched if "combine" not in name]
    assert "_bn_fused_fwd_kernel" in rows and "_bn_reduce_rows_kernel" in rows and "_bn_ew_rows_kernel" in rows
    assert all(a == 8 for name, a in launched if "combine" not in name), launched
    monkeypatch.setitem(B._TUNE, "row_align", 0)
    assert BCFG._row_align(24) == 1


def test_flat_planes_choice():
    """The flat elementwise pass: planes up to 64 elements in every mode (7x7), up to 256 in the
    backward only (14x14: it lost 2-6 % on the bf16 forward), never aligned planes or the rows view."""
    def flat(shape, mode, cl=False):
        x = torch.empty(shape)
        if cl:
            x = x.contiguous(memory_format=torch.channels_last)
        return B._flat_planes(B._View(x), mode)

    for mode in (B._FWD_TRAIN, B._FWD_EVAL, B._BWD_TRAIN, B._BWD_EVAL):
        assert flat((2, 3, 7, 7), mode) and flat((2, 3, 5), mode)
        assert not flat((2, 3, 7, 7), mode, cl=True) and not flat((2, 3, 4, 4), mode)
        assert flat((2, 3, 14, 14), mode) == (mode in (B._BWD_TRAIN, B._BWD_EVAL))
        assert not flat((2, 3, 17, 17), mode)


@interp
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64], ids=lambda d: str(d).split(".")[-1])
@pytest.mark.parametrize("shape", [(3, 5, 7, 7), (2, 3, 14, 14), (40, 6, 3), (5, 30, 3, 1), (4, 5, 1023),
                                   (9, 1, 5, 5)],
                         ids=["7x7", "14x14", "S3", "S3-R>C", "S1023", "C1"])
def test_ew_flat_short_planes_same_bits(shape, dtype, monkeypatch):
    """Short unaligned planes as one flat array of 16-byte vectors (_bn_ew_flat_kernel): the same
    per-element arithmetic as the [planes, S] tiles, so the same bits in every mode; whole and partial
    last tiles, tiles spanning more planes than there are channels."""
    monkeypatch.setitem(B._TUNE, "ew_tile_bytes_ncs", 512)  # several programs on these small shapes
    monkeypatch.setitem(B._TUNE, "fused_max_rows", 0)  # training too through the split path's elementwise pass
    x = make_x(shape, dtype, "contig")
    dy = make_x(shape, dtype, "contig")
    C = shape[1]
    w, b = torch.rand(C) + 0.5, torch.randn(C)
    v = B._View(x)
    assert B._const_s(v)
    fc = B._flat_cfg_cached(v.N, v.C, v.S, x.element_size(), 512)
    assert fc["NT"] > 1
    tiles = {"ew_flat_max_plane": 0, "ew_flat_max_plane_bwd": 0}
    flat = {"ew_flat_max_plane": 1024, "ew_flat_max_plane_bwd": 1024}
    got = _same_bits_either_way(monkeypatch, tiles, flat, x, dy, w, b)
    yr = ref_fwd(x, w, b, 1e-5)[0]
    tol = 2e-2 if dtype == torch.bfloat16 else 1e-5
    assert (got[0].double() - yr).abs().max().item() <= tol * (1 + yr.abs().max().item())


def test_spread_choice():
    """Short unaligned ncs planes (S % 16 != 0, S <= spread_max_plane) whose (N, C*S) rows are 16-element
    multiples take the spread rows view; aligned planes, channels_last, long planes and ragged rows do not."""
    def spread(shape, cl=False, ew=False, dtype=torch.bfloat16):
        x = torch.empty(shape, dtype=dtype)
        if cl:
            x = x.contiguous(memory_format=torch.channels_last)
        return B._spread(B._View(x), ew)

    for ew in (False, True):
        assert spread((2, 16, 7, 7), ew=ew) == 49 and spread((4, 32, 5, 5), ew=ew) == 25
        assert spread((3, 16, 3), ew=ew) == 3  # (N, C, L)
        assert spread((2, 3, 7, 7), ew=ew) == 0  # 3 x 49 elements a row: rows off 16-element boundaries
        assert spread((2, 16, 7, 7), cl=True, ew=ew) == 0 and spread((2, 16, 4, 4), ew=ew) == 0
        assert spread((2, 16, 14, 14), ew=ew) == 0  # 196 > 64
        assert spread((2, 16, 97, 97), ew=ew) == 0  # odd, 9409 > spread_max_plane_ew_odd
        assert spread((2, 16, 7, 7), ew=ew, dtype=torch.float16) == 49
        assert spread((2, 16, 7, 7), ew=ew, dtype=torch.float32) == 0  # 4-byte accesses already: slower spread
    # odd planes (scalar ncs loads) up to spread_max_plane_ew_odd in the elementwise pass only
    assert spread((2, 16, 9, 9), ew=True) == 81 and spread((2, 16, 73, 73), ew=True) == 73 * 73
    assert spread((2, 16, 9, 9)) == 0 and spread((2, 16, 73, 73)) == 0
    assert spread((2, 16, 9, 9), ew=True, dtype=torch.float32) == 0
    big = B._View(torch.empty((1, 2**26, 49), dtype=torch.bfloat16, device="meta"))  # rows past int32 columns
    assert B._spread(big) == 0
    v = B._SpreadView(B._View(torch.empty(256, 2048, 7, 7)))
    assert (v.kind, v.N, v.C, v.M) == ("spread", 256, 2048 * 49, 256)
    # the reduction's column blocks: the narrowest (>= spread_red_min_cols) within the target programs; two register
    # sets and 256 programs where a program sums >= red_two_buf_min_chunks row chunks, else one set and 512
    for N, C, BC, P, two in ((256, 2048, 512, 1, True), (256, 512, 128, 1, True), (32, 512, 128, 1, False)):
        for bwd in (False, True):
            cfg = BCFG._reduce_cfg_uncached(B._SpreadView(B._View(torch.empty(N, C, 7, 7))), 2, bwd)
            target = B._TUNE["target_programs_spread_two_buf" if two else "target_programs_spread"]
            assert (cfg["BC"], cfg["P"], cfg.get("TWO_BUF", False)) == (BC, P, two)
            assert cfg["P"] * cfg["NCB"] <= target


# tiny spread tiles: several column blocks, several programs down the rows (P > 1), ragged edges
SPREAD_TINY = {"spread_red_min_cols": 16, "target_programs_spread": 4096, "spread_max_esize": 8, "spread_ew_cols": 16,
               "red_tile_bytes": 256, "red_tile_bytes_fwd_fp32": 256,
               "ew_tile_bytes": 256, "target_programs_rows_fwd": 4096, "target_programs_rows_fwd_fp32": 4096,
               "target_programs_rows_bwd": 4096, "partial_frac_spread": 4.0, "combine_elems": 64, "combine_elems_bwd": 64,
               "fused_max_rows": 0}
SPREAD_SHAPES = [(9, 16, 7, 7), (9, 32, 5, 5), (21, 16, 3), (10, 48, 3, 3)]


@interp
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).split(".")[-1])
@pytest.mark.parametrize("shape", SPREAD_SHAPES, ids=["7x7", "5x5", "L3", "3x3"])
def test_spread_rows_view(shape, dtype, monkeypatch, poison):
    """The spread rows view (_spread): training forward / backward and eval against float64, the reduction split
    over several programs down the rows (S partials each) and over column blocks that cut planes."""
    for k, v in SPREAD_TINY.items():
        monkeypatch.setitem(B._TUNE, k, v)
    v = B._View(torch.empty(shape, dtype=dtype))
    assert B._spread(v) == B._spread(v, ew=True) == v.S
    cfg = BCFG._reduce_cfg_uncached(B._SpreadView(v), torch.empty((), dtype=dtype).element_size())
    assert cfg["P"] > 1 and cfg["NCB"] > 1 and cfg["BC"] % v.S != 0
    test_train_forward_backward(shape, "contig", dtype, "spread", poison)
    test_eval_forward_backward(shape, "contig", dtype, "spread", poison)


@interp
@pytest.mark.parametrize("programs", [16, 24])
def test_spread_two_buf_same_bits(programs, monkeypatch):
    """The spread reduction's two register sets (red_two_buf_spread) sum the same steps in the same order: every
    mode's outputs have the same bits as with one set, with odd and even step counts."""
    for k, v in dict(SPREAD_TINY, target_programs_spread_two_buf=programs, red_two_buf_min_chunks=2).items():
        monkeypatch.setitem(B._TUNE, k, v)
    shape = (40, 16, 7, 7)
    x, dy = make_x(shape, torch.bfloat16, "contig"), make_x(shape, torch.bfloat16, "contig")
    v = B._View(x)
    assert B._spread(v)
    cfgs = [BCFG._reduce_cfg_uncached(B._SpreadView(v), 2, bwd) for bwd in (False, True)]
    assert all(c.get("TWO_BUF") for c in cfgs)
    n_iter = {c["n_iter"] for c in cfgs}
    assert max(n_iter) > 2 and {n % 2 for n in n_iter} == {0, 1}  # both register sets used, both parities
    C = shape[1]
    w, b = torch.rand(C) + 0.5, torch.randn(C)
    # (one set on the same grid: the two-set grid's program target)
    got = _same_bits_either_way(monkeypatch, {"red_two_buf_spread": 0, "target_programs_spread": programs},
                                {"red_two_buf_spread": 1}, x, dy, w, b)
    assert relerr(got[0], ref_fwd(x, w, b, 1e-5)[0]) < TOL[torch.bfloat16]


@interp
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=lambda d: str(d).split(".")[-1])
def test_rows_two_buf_same_bits(dtype, monkeypatch):
    """The rows view's two register sets (red_two_buf_rows_max_blocks): the bits of one set on the same grid, in every
    mode; 49 / 98 steps (odd / even), 4 / 2 chunks a step (forward / backward), two column blocks."""
    programs = 5
    for k, v in dict(ROWS4_TINY, target_programs_rows_two_buf=programs, red_two_buf_min_chunks=2,
                     red_two_buf_rows_max_blocks=64, partial_frac_rows_bwd=0.005).items():
        monkeypatch.setitem(B._TUNE, k, v)
    shape = (13, 100, 5, 3)
    x, dy = make_x(shape, dtype, "cl"), make_x(shape, dtype, "cl")
    v = B._View(x)
    cfgs = [BCFG._reduce_cfg_uncached(v, x.element_size(), bwd) for bwd in (False, True)]
    assert [c["n_iter"] for c in cfgs] == [49, 98] and cfgs[0]["NCB"] > 1
    # (the fp32 backward keeps one set)
    assert [c.get("TWO_BUF", False) for c in cfgs] == [True, dtype != torch.float32]
    C = shape[1]
    w, b = torch.rand(C) + 0.5, torch.randn(C)
    same_grid = {"red_two_buf_rows_max_blocks": 0, "target_programs_rows_fwd": programs,
                 "target_programs_rows_fwd_fp32": programs, "target_programs_rows_bwd": programs}
    got = _same_bits_either_way(monkeypatch, same_grid, {"red_two_buf_rows_max_blocks": 64}, x, dy, w, b)
    assert relerr(got[0], ref_fwd(x, w, b, 1e-5)[0]) < TOL[dtype]


@interp
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=lambda d: str(d).split(".")[-1])
@pytest.mark.parametrize("shape", [(13, 40, 5, 3), (150, 48)], ids=["cl", "2d"])
def test_rows_full_width_blocks(shape, dtype, monkeypatch, poison):
    """16-bit rows of >= red_rows_full_min_cols_16bit channels: one column block as wide as the tile allows, the
    partials cap of partial_frac_rows_full, many programs down the rows; training forward / backward and eval against
    float64, both directions on the full-width grid (and 16-bit only: fp32 keeps min_rows' blocks)."""
    knobs = dict(TINY, red_rows_full_min_cols_16bit=32, partial_frac_rows_full=1.0, red_tile_bytes=128,
                 target_programs_rows_bwd=5)
    for k, v in knobs.items():
        monkeypatch.setitem(B._TUNE, k, v)
    layout = "cl" if len(shape) == 4 else "contig"
    v = B._View(make_x(shape, dtype, layout))
    for bwd in (False, True):
        cfg = BCFG._reduce_cfg_uncached(v, 2, bwd)
        assert cfg["NCB"] == 1 and cfg["BC"] >= shape[1] and cfg["P"] > 1, cfg
    assert BCFG._reduce_cfg_uncached(v, 4, False)["NCB"] > 1  # fp32: min_rows splits C
    test_train_forward_backward(shape, layout, dtype, "full", poison)
    test_eval_forward_backward(shape, layout, dtype, "full", poison)


# (shape, the knobs that spread its elementwise pass): short planes, and odd planes past spread_max_plane (81
# elements, compiled in; 1225, a run-time plane) whose reduction stays on the ncs kernels
SPREAD_EW_CASES = {"7x7": ((9, 16, 7, 7), {"spread_max_plane_ew": 64}),
                   "5x5": ((9, 32, 5, 5), {"spread_max_plane_ew": 64}),
                   "9x9-odd": ((5, 16, 9, 9), {"spread_max_plane_ew_odd": 8192}),
                   "35x35-odd": ((3, 32, 35, 35), {"spread_max_plane_ew_odd": 8192})}


@interp
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=lambda d: str(d).split(".")[-1])
@pytest.mark.parametrize("case", list(SPREAD_EW_CASES))
def test_spread_ew_same_bits(case, dtype, monkeypatch):
    """The spread elementwise pass does _bn_ew_apply's arithmetic with the same coefficients as the flat and
    [planes, S] passes: the same bits in every mode (the reduction kept on one path), and float64 agreement."""
    shape, on = SPREAD_EW_CASES[case]
    for k, v in SPREAD_TINY.items():
        monkeypatch.setitem(B._TUNE, k, v)
    x, dy = make_x(shape, dtype, "contig"), make_x(shape, dtype, "contig")
    v = B._View(x)
    assert B._spread(v) == (v.S if v.S <= B._TUNE["spread_max_plane"] else 0)
    with monkeypatch.context() as m:  # (the off side does take the ncs / flat pass)
        for k, val in SPREAD_EW_OFF.items():
            m.setitem(B._TUNE, k, val)
        assert B._spread(v, ew=True) == 0
    C = shape[1]
    w, b = torch.rand(C) + 0.5, torch.randn(C)
    got = _same_bits_either_way(monkeypatch, SPREAD_EW_OFF, on, x, dy, w, b)
    assert B._spread(v, ew=True) == v.S
    assert relerr(got[0], ref_fwd(x, w, b, 1e-5)[0]) < TOL[dtype]


@interp
@pytest.mark.parametrize("knob", ["rows4_tiny", "rows2_tiny"])
@pytest.mark.parametrize("layout", ["contig", "cl"])
def test_knob_paths_deterministic(layout, knob, monkeypatch):
    for k, v in KNOBS[knob].items():
        monkeypatch.setitem(B._TUNE, k, v)
    test_deterministic(layout, knob)


@interp
@pytest.mark.parametrize("layout", ["contig", "cl"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_eps_zero_constant_channel_like_aten(layout, dtype):
    """eps == 0 and a constant channel: ATen's InvStd gives invstd = 0 (not inf; CPU and CUDA
    kernels alike), hence y = bias and dx = 0 on that channel. The kernels do the same."""
    torch.manual_seed(12)
    x = torch.randn(4, 3, 7, 7, dtype=dtype)
    x[:, 1] = 0.75
    if layout == "cl":
        x = x.contiguous(memory_format=torch.channels_last)
    w, b = (torch.rand(3) + 0.5).to(dtype), torch.randn(3).to(dtype)
    y, mean, invstd = B.bn_forward_train(x, w, b, None, None, 0.1, 0.0)
    ya, ma, ia = torch.native_batch_norm(x, w, b, None, None, True, 0.1, 0.0)
    assert ia[1] == 0 and invstd[1] == 0
    assert not torch.isnan(y).any()
    torch.testing.assert_close(invstd, ia)
    torch.testing.assert_close(y, ya)
    g = torch.randn_like(x)
    dx, gw, gb = B.bn_backward(g, x, w, mean, invstd, True, [True, True, True])
    dxa, gwa, gba = torch.ops.aten.native_batch_norm_backward(g, x, w, None, None, ma, ia, True, 0.0,
                                                              [True, True, True])
    assert (dx[:, 1] == 0).all()
    torch.testing.assert_close(dx, dxa)
    torch.testing.assert_close(gw, gwa)
    torch.testing.assert_close(gb, gba)


@interp
@pytest.mark.parametrize("layout", ["contig", "cl"])
def test_fp64_eps_exact(layout):
    """fp64 input: eps reaches the kernels as three fp32 parts summed in fp64 (exact), so a tiny
    variance next to eps = 1e-5 (not an fp32 value) keeps fp64 accuracy; an fp32-rounded eps would
    be off by ~5e-8 relative here."""
    torch.manual_seed(13)
    x = make_x((4, 3, 7, 7), torch.float64, layout) * 1e-3
    eps = 1e-5
    _, _, invstd = B.bn_forward_train(x, None, None, None, None, 0.1, eps)
    _, _, ir, _ = ref_fwd(x, None, None, eps)
    assert relerr(invstd, ir) < 1e-14
    rm, rv = torch.zeros(3, dtype=torch.float64), torch.full((3,), 1e-6, dtype=torch.float64)
    y = B.bn_forward_eval(x, None, None, rm, rv, eps)
    assert relerr(y, x / torch.sqrt(torch.tensor(1e-6 + eps, dtype=torch.float64))) < 1e-14


@pytest.mark.cuda
@pytest.mark.parametrize("shape,dtype", [((256, 512, 7, 7), torch.bfloat16), ((256, 2048, 7, 7), torch.bfloat16),
                                         ((96, 160, 5, 5), torch.float16), ((7, 48, 3, 3), torch.bfloat16)])
def test_cuda_spread_two_buf(shape, dtype, monkeypatch):
    """The spread reduction's two register sets (red_two_buf_spread): the outputs against float64 with the default
    rule, then two sets on every shape (1-32 steps a program) give the bits of one set on the same grid."""
    monkeypatch.setitem(B._TUNE, "fused_max_rows", 0)
    x = torch.randn(shape, device="cuda", dtype=dtype)
    assert B._spread(B._View(x))
    _cuda_check(x, 1.2e-2)
    C = shape[1]
    w, b = torch.rand(C, device="cuda") + 0.5, torch.randn(C, device="cuda")
    monkeypatch.setitem(B._TUNE, "red_two_buf_min_chunks", 1)
    same_grid = B._TUNE["target_programs_spread_two_buf"]
    _same_bits_either_way(monkeypatch, {"red_two_buf_spread": 0, "target_programs_spread": same_grid},
                          {"red_two_buf_spread": 1}, x, torch.randn_like(x), w, b)


@pytest.mark.cuda
@pytest.mark.parametrize("shape,dtype", [((256, 64, 56, 56), torch.bfloat16), ((256, 256, 14, 14), torch.float32),
                                         ((65536, 200), torch.bfloat16), ((16, 32, 16, 32, 32), torch.float16)])
def test_cuda_rows_two_buf(shape, dtype, monkeypatch):
    """The rows view's two register sets (the default where columns split into <= 8 blocks, but for the fp32
    backward): the outputs against float64, then the bits of one set on the same grid in every mode."""
    monkeypatch.setitem(B._TUNE, "fused_max_rows", 0)
    x = torch.randn(shape, device="cuda", dtype=dtype)
    if x.dim() > 2:
        x = x.contiguous(memory_format=torch.channels_last if x.dim() == 4 else torch.channels_last_3d)
    v = B._View(x)
    assert v.kind == "rows" and BCFG._reduce_cfg_uncached(v, x.element_size(), False).get("TWO_BUF")
    _cuda_check(x, 1.2e-2 if dtype == torch.bfloat16 else 4e-3 if dtype == torch.float16 else 1e-5)
    C = shape[1]
    w, b = torch.rand(C, device="cuda") + 0.5, torch.randn(C, device="cuda")
    monkeypatch.setitem(B._TUNE, "red_two_buf_min_chunks", 1)
    P2 = B._TUNE["target_programs_rows_two_buf"]
    same_grid = {"red_two_buf_rows_max_blocks": 0, "target_programs_rows_fwd": P2,
                 "target_programs_rows_fwd_fp32": P2, "target_programs_rows_bwd": P2}
    _same_bits_either_way(monkeypatch, same_grid, {"red_two_buf_rows_max_blocks": 8}, x, torch.randn_like(x), w, b)


@pytest.mark.cuda
@pytest.mark.parametrize("shape,dtype", [((256, 2048, 7, 7), torch.bfloat16), ((256, 1024, 14, 14), torch.float16),
                                         ((65536, 1024), torch.bfloat16), ((4096, 1500), torch.bfloat16)])
def test_cuda_rows_full_width(shape, dtype, monkeypatch):
    """16-bit rows of >= 1024 channels take 1024-column blocks (the default): outputs against float64 in every
    mode, the same bits on a second call."""
    monkeypatch.setitem(B._TUNE, "fused_max_rows", 0)
    x = torch.randn(shape, device="cuda", dtype=dtype)
    if x.dim() == 4:
        x = x.contiguous(memory_format=torch.channels_last)
    v = B._View(x)
    for bwd in (False, True):
        assert BCFG._reduce_cfg_uncached(v, 2, bwd)["BC"] == 1024
    _cuda_check(x, 1.2e-2 if dtype == torch.bfloat16 else 4e-3)
    _assert_forward_same_bits(x)


@pytest.mark.cuda
@pytest.mark.parametrize("knob,shape,layout,dtype", [
    ("rows4", (256, 512, 28, 28), "cl", torch.bfloat16),
    ("rows4", (65536, 1024), "contig", torch.bfloat16),
    ("rows2", (256, 512, 28, 28), "cl", torch.bfloat16),
])
def test_cuda_knob_paths(knob, shape, layout, dtype, monkeypatch):
    for k, v in KNOBS[knob].items():
        monkeypatch.setitem(B._TUNE, k, v)
    x = torch.randn(shape, device="cuda", dtype=dtype)
    if layout == "cl":
        x = x.contiguous(memory_format=torch.channels_last)
    _cuda_check(x, 1.2e-2 if dtype == torch.bfloat16 else 1e-5)
    _assert_forward_same_bits(x)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
@pytest.mark.parametrize("shape,layout", [((8, 240, 14, 14), "contig"), ((8, 240, 14, 14), "cl"),
                                          ((8, 64, 56, 56), "contig"), ((8, 64, 56, 56), "cl"),
                                          ((32, 1024), "contig"), ((4, 96, 8, 28, 28), "cl"), ((2, 16, 1000), "contig")])
def test_cuda_fused_one_launch(shape, layout, dtype, monkeypatch):
    """The one-launch kernels on the GPU at model-sized small layers (every layer here fused): against float64 as
    the split path is checked, the same bits on a second call and through a launch plan's replay."""
    for k, v in ALWAYS_ONE_LAUNCH.items():
        monkeypatch.setitem(B._TUNE, k, v)
    launched = []
    real = B.launch
    monkeypatch.setattr(B, "launch", lambda kernel, *a, **k: (launched.append(kernel.__name__), real(kernel, *a, **k)))
    x = torch.randn(shape, device="cuda", dtype=dtype)
    if layout == "cl":
        x = x.contiguous(memory_format=torch.channels_last if x.dim() == 4 else torch.channels_last_3d)
    _cuda_check(x, 1.2e-2 if dtype == torch.bfloat16 else 1e-5)
    C = shape[1]
    w, b = torch.rand(C, device="cuda") + 0.5, torch.randn(C, device="cuda")
    g = torch.randn_like(x)
    runs = []
    for _ in range(3):  # the first call records the plan, the others replay it
        rm, rv = torch.zeros(C, device="cuda"), torch.ones(C, device="cuda")
        y, m, r = B.bn_forward_train(x, w, b, rm, rv, 0.1, 1e-5)
        runs.append((y, m, r, rm, rv) + B.bn_backward(g, x, w, m, r, True, [True, True, True]))
    for later in runs[1:]:
        for a, c in zip(runs[0], later):
            assert torch.equal(bits(a), bits(c))
    assert set(launched) == {"_bn_fused_fwd_kernel", "_bn_fused_bwd_kernel"}, launched


def test_rows_forward_config_by_element_size():
    """2-byte inputs take the bf16 sweep's rows-forward winners, 4-byte ones run 2's fp32 configuration
    (the bf16 winners measured 10-37 % slower on fp32 rows); the backward config is shared."""
    x16 = torch.empty(4096, 256, dtype=torch.bfloat16)
    x32 = torch.empty(4096, 256, dtype=torch.float32)
    v16, v32 = B._View(x16), B._View(x32)
    f16 = BCFG._reduce_cfg_uncached(v16, 2)
    f32 = BCFG._reduce_cfg_uncached(v32, 4)
    assert f16["UNROLL"] == B._TUNE["red_unroll_rows_fwd"] == 4
    assert f32["UNROLL"] == B._TUNE["red_unroll_rows_fwd_fp32"] == 2
    assert f16["BM"] * f16["BC"] * 2 == B._TUNE["red_tile_bytes"]
    assert f32["BM"] * f32["BC"] * 4 == B._TUNE["red_tile_bytes_fwd_fp32"]
    b16 = BCFG._reduce_cfg_uncached(v16, 2, bwd=True)
    b32 = BCFG._reduce_cfg_uncached(v32, 4, bwd=True)
    assert b16["UNROLL"] == b32["UNROLL"] == 2
    assert b16["BM"] * b16["BC"] * 2 == b32["BM"] * b32["BC"] * 4 == B._TUNE["red_tile_bytes"]


def _meta(shape, dtype, cl=False):
    x = torch.empty(shape, dtype=dtype, device="meta")
    return x.contiguous(memory_format=torch.channels_last) if cl else x


def test_rows_reduction_warps_by_row_segment():
    """Rows reduction programs (forward and backward) run 4 warps where a program's row segment is >= 256 bytes,
    8 below (bf16 NHWC at 64 channels; H200 A/B, session 20)."""
    cases = [((256, 1024, 14, 14), torch.bfloat16, 4), ((65536, 1024), torch.bfloat16, 4),
             ((256, 64, 56, 56), torch.bfloat16, 8), ((256, 2048, 7, 7), torch.bfloat16, 4),
             ((256, 512, 7, 7), torch.bfloat16, 8),
             ((256, 2048, 7, 7), torch.float32, 4), ((256, 64, 56, 56), torch.float32, 4)]
    for shape, dt, warps in cases:
        v = B._View(_meta(shape, dt, cl=len(shape) == 4))
        esize = torch.empty((), dtype=dt).element_size()
        for bwd in (False, True):
            cfg = BCFG._reduce_cfg_uncached(v, esize, bwd)
            assert (cfg["BC"] * esize >= 256) == (warps == 4)
            assert B._rows_reduce_warps(cfg, esize) == warps, (shape, dt, bwd)


def test_ncs_forward_program_target():
    """The ncs forward of aligned 16-bit planes takes its own program target (longer loops per program); fp32,
    unaligned planes (7x7, 14x14) and the backward keep the common one."""
    def programs(shape, dt, bwd=False):
        v = B._View(_meta(shape, dt))
        cfg = BCFG._reduce_cfg_uncached(v, torch.empty((), dtype=dt).element_size(), bwd)
        return cfg["P"] * cfg["NCB"]

    small, common = B._TUNE["target_programs_ncs_fwd_16bit"], B._TUNE["target_programs"]
    assert small < common
    assert programs((256, 64, 56, 56), torch.bfloat16) <= small
    assert programs((16, 64, 32, 64, 64), torch.float16) <= small
    assert programs((256, 64, 56, 56), torch.float32) > small
    assert programs((256, 64, 56, 56), torch.bfloat16, bwd=True) > small
    assert programs((256, 1024, 14, 14), torch.bfloat16) > small  # unaligned: its own target, not reduced


def test_combine_programs_bounded():
    """The forward combine takes at most combine_max_channels_fwd channels a program however few partials
    there are (2-D inputs: 1-2 partials gave one or two programs of 4096 channels, spilling); the backward's
    tile bounds its channels already."""
    cap = B._TUNE["combine_max_channels_fwd"]
    for C, P in ((4096, 1), (8192, 2), (512, 4), (65536, 1), (3, 1), (1000, 700)):
        for bwd in (False, True):
            BP, BCC, nprog = B._combine_cfg(C, P, bwd)
            assert BP >= min(P, 512) and nprog * BCC >= C and (nprog - 1) * BCC < C
            assert BP * BCC <= max(BP, B._TUNE["combine_elems_bwd" if bwd else "combine_elems"])
            assert BCC <= (B._TUNE["combine_elems_bwd"] if bwd else cap)
    assert B._combine_cfg(4096, 1)[2] == 4096 // cap


def test_set_knobs_by_name(monkeypatch):
    """normkit.kernels.set_knobs (the benchmark scripts' --set): a named knob of any family's table takes the int;
    an unknown name or a missing value raises before anything changes. knob_items reads them back as set_knobs
    takes them (knob_ab.py restores its defaults so)."""
    from normkit.kernels import knob_items, set_knobs
    from normkit.kernels import layer_norm as L

    name = next(iter(L._CFG))
    monkeypatch.setitem(B._TUNE, "fused_max_rows", B._TUNE["fused_max_rows"])  # restored after the test
    monkeypatch.setitem(L._CFG, name, L._CFG[name])
    before = knob_items(["fused_max_rows", name])
    assert before == [f"fused_max_rows={B._TUNE['fused_max_rows']}", f"{name}={int(L._CFG[name])}"]
    set_knobs(["fused_max_rows=4096", f"{name}=7"])
    assert knob_items(["fused_max_rows", name]) == ["fused_max_rows=4096", f"{name}=7"]
    set_knobs(before)
    assert knob_items(["fused_max_rows", name]) == before
    with pytest.raises(ValueError):
        knob_items(["no_such_knob"])
    set_knobs(["fused_max_rows=4096", f"{name}=7"])
    assert B._TUNE["fused_max_rows"] == 4096 and L._CFG[name] == 7
    for bad in ("no_such_knob=1", "fused_max_rows", "fused_max_rows=", "fused_max_rows=1.5"):
        with pytest.raises(ValueError):
            set_knobs(["fused_max_rows=1", bad])
    assert B._TUNE["fused_max_rows"] == 4096
