"""Triton helpers shared by the kernel packages."""

import math

import triton
import triton.language as tl


@triton.jit
def load_three(first, o_mid, o_last, mask, DT: tl.constexpr):
    """The elements at ``first``, ``first + o_mid`` and ``first + o_last`` (element offsets, taken as int64), in
    DT. (An int equal to 1 arrives as a constant: tl.cast, not .to.)"""
    a = tl.load(first, mask=mask, other=0.0).to(DT)
    b = tl.load(first + tl.cast(o_mid, tl.int64), mask=mask, other=0.0).to(DT)
    c = tl.load(first + tl.cast(o_last, tl.int64), mask=mask, other=0.0).to(DT)
    return a, b, c


@triton.jit
def median3(a, b, c):
    return tl.maximum(tl.minimum(a, b), tl.minimum(tl.maximum(a, b), c))


@triton.jit
def median_of_three(first, o_mid, o_last, mask, DT: tl.constexpr):
    """The median of ``load_three``'s elements: a shift or reference that is an element of the data and never a
    lone outlier, whose distance from the data the fp32 sums about it would carry (sessions 34-35: a channel's
    outlier first element cost batch norm's invstd 3e-3 and instance norm's rstd 1.5e-4)."""
    a, b, c = load_three(first, o_mid, o_last, mask, DT)
    return median3(a, b, c)


@triton.jit
def known_multiple(n, K: tl.constexpr):
    """n, which the host knows is a multiple of K (a power of two), in a form whose divisibility the compiler sees.
    Triton marks an int argument divisible by 16 or by nothing, so row offsets r * n with n = 24 or 40 were loaded
    element by element (sm_90 PTX: channels_last batch norm at C % 16 != 0, session 37); with (n // K) * K the
    compiler proves r * n + j aligned to K and loads K elements at once."""
    if K > 1:
        n = (n // K) * K
    return n


def alignment_hint(*values) -> int:
    """K for ``known_multiple``: the power of two below 16 that every value (row lengths, strides) is a multiple
    of, or 1 where Triton already knows (all multiples of 16) or there is none (an odd value)."""
    g = 0
    for v in values:
        g = math.gcd(g, int(v))
    k = g & -g
    return 1 if g == 0 or k >= 16 else k
