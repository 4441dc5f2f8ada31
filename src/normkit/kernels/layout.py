"""A dense tensor copied between channels_last(_3d) and contiguous layouts, as a batched tile transpose.

Instance norm normalizes ``input.contiguous()`` (aten's contract): for a channels_last input that is a copy, and
its gradient goes back to the input's layout in the backward. Physically both are per-sample transposes of an
(R, S) matrix, (HxW, C) -> (C, HxW) and back. torch's strided copy does it at a fraction of the copy bandwidth
(a 32 MB bf16 16x64x128x128 input: ~0.12 ms on an H100, ~4x a plain copy); here each program moves one
(BR, BS) tile, read along S and written along R: Triton turns the tile around in shared memory, so both the
loads and the stores are coalesced.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from normkit.kernels import cdiv
from normkit.kernels._launch import alloc, launch
from normkit.reference._common import dense_memory_format

_TILE = 64  # 64 x 64 elements: 8 KB (16-bit) / 16 KB (fp32) a program, 16 elements a thread at 4 warps


@triton.jit
def _transpose_kernel(X, Y, R, S, n_rb, n_sb, BR: tl.constexpr, BS: tl.constexpr, I64: tl.constexpr):
    """Y[n, s, r] = X[n, r, s] for (N, R, S) contiguous X; program (n, rb, sb) moves one (BR, BS) tile."""
    pid = tl.program_id(0)
    sb = pid % n_sb
    rb = (pid // n_sb) % n_rb
    n = pid // (n_sb * n_rb)
    r = rb * BR + tl.arange(0, BR)
    s = sb * BS + tl.arange(0, BS)
    if I64:
        n, r, s = n.to(tl.int64), r.to(tl.int64), s.to(tl.int64)
    mask = (r[:, None] < R) & (s[None, :] < S)
    base = n * R * S
    tile = tl.load(X + base + r[:, None] * S + s[None, :], mask=mask)
    tl.store(Y + base + s[None, :] * R + r[:, None], tile, mask=mask)


def _rows_cols(x: torch.Tensor, channels_last_source: bool):
    """(N, R, S) of the per-sample matrix the source holds: (HxW, C) for channels_last, (C, HxW) for contiguous."""
    N, C = x.shape[0], x.shape[1]
    HW = x.numel() // (N * C)
    return (N, HW, C) if channels_last_source else (N, C, HW)


def transposable(t: torch.Tensor, fmt) -> bool:
    """Whether `to_memory_format` moves ``t`` to ``fmt``: t dense in one of contiguous and channels_last(_3d) (the
    one matching its rank), fmt the other."""
    source = dense_memory_format(t)
    return (source != fmt and torch.contiguous_format in (source, fmt) and t.is_contiguous(memory_format=source)
            and t.dim() in (4, 5))


def in_format(t: torch.Tensor, fmt, tiles: bool = True) -> torch.Tensor:
    """``t`` dense in layout ``fmt``: itself where it is, else a copy, through the tile transpose where
    `transposable` (and ``tiles``), else torch's."""
    if t.is_contiguous(memory_format=fmt):
        return t
    if tiles and transposable(t, fmt):
        return to_memory_format(t, fmt)
    return t.contiguous(memory_format=fmt)


def to_memory_format(x: torch.Tensor, fmt) -> torch.Tensor:
    """A copy of dense ``x`` (contiguous, or channels_last(_3d) matching its rank) in layout ``fmt``, the other
    one of the two (`transposable`)."""
    source_cl = not x.is_contiguous()
    N, R, S = _rows_cols(x, source_cl)
    y = alloc(torch.empty_like(x, memory_format=fmt))
    n_rb, n_sb = cdiv(R, _TILE), cdiv(S, _TILE)
    programs = N * n_rb * n_sb
    launch(_transpose_kernel, (programs,), x, y, R, S, n_rb, n_sb, BR=_TILE, BS=_TILE,
           I64=x.numel() >= 2 ** 31, num_warps=4)
    return y
