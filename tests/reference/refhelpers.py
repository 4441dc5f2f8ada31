"""Input makers and comparisons shared by the reference tests."""

import torch

F64 = torch.float64


def make(shape, layout="contig", dtype=F64, offset=0.0, constant_channel=False):
    """Fresh random input of ``shape`` in ``layout``: contig, cl (channels_last(_3d)), noncontig."""
    if layout == "noncontig":
        # Every other element of a twice-as-wide last dim: strided, not dense.
        wide = list(shape[:-1]) + [shape[-1] * 2]
        x = torch.randn(wide, dtype=dtype)[..., ::2]
    else:
        x = torch.randn(shape, dtype=dtype)
    if layout == "cl":
        x = x.contiguous(memory_format=torch.channels_last if x.dim() == 4 else torch.channels_last_3d)
    if offset:
        x.add_(offset)
    if constant_channel and x.dim() >= 2 and x.shape[1] > 0:
        x.select(1, 0).fill_(3.25)
    assert layout != "cl" or x.dim() in (4, 5)
    return x


def layouts_for(shape):
    out = ["contig", "noncontig"]
    if len(shape) in (4, 5):
        out.append("cl")
    return out


def close(actual, expected, rtol=1e-7, atol=1e-7, what=""):
    """Same None-ness, dtype, shape, and values (NaN == NaN)."""
    if expected is None or actual is None:
        assert actual is None and expected is None, f"{what}: {actual!r} vs {expected!r}"
        return
    assert actual.dtype == expected.dtype, f"{what}: dtype {actual.dtype} vs {expected.dtype}"
    assert actual.shape == expected.shape, f"{what}: shape {actual.shape} vs {expected.shape}"
    torch.testing.assert_close(actual, expected, rtol=rtol, atol=atol, equal_nan=True, msg=lambda m: f"{what}: {m}")


def raises_like(fn, expected_fn=None, exc=None, message=None):
    """``fn`` raises exactly what ``expected_fn`` raises (type and text), or ``exc(message)``."""
    if expected_fn is not None:
        try:
            expected_fn()
        except Exception as e:  # noqa: BLE001 - we compare whatever torch raises
            exc, message = type(e), str(e)
        else:
            raise AssertionError("torch did not raise")
    try:
        fn()
    except Exception as e:  # noqa: BLE001
        assert type(e) is exc, f"{type(e).__name__}: {e} (expected {exc.__name__}: {message})"
        assert str(e) == message, f"{str(e)!r} != {message!r}"
    else:
        raise AssertionError(f"did not raise {exc.__name__}: {message}")
