"""Triton kernels and their host launchers. No autograd, no validation, no registration here."""

import functools
import os


@functools.lru_cache(maxsize=None)
def available() -> bool:
    """Whether Triton imports (it need not: normkit falls back to the reference)."""
    try:
        import triton  # noqa: F401
        import triton.language  # noqa: F401
    except Exception:  # pragma: no cover - depends on the machine
        return False
    return True


def interpreting() -> bool:
    """Whether Triton kernels run through the interpreter on CPU tensors (how CI tests them)."""
    return os.environ.get("TRITON_INTERPRET") == "1"


def runs_kernels_on(tensor) -> bool:
    """Whether normkit's Triton kernels (rather than the reference) handle tensors on this device."""
    if not available():
        return False
    if tensor.device.type == "cuda":
        return True
    return tensor.device.type == "cpu" and interpreting()


def cdiv(a: int, b: int) -> int:
    """Ceiling division of positive ints (plain Python: ``triton.cdiv`` called from the host goes through
    Triton's function wrapper, ~4 µs a call on Triton 3.9)."""
    return -(-a // b)


def dense_param(t):
    """A per-channel / per-column tensor (weight, bias, running or saved statistics) as the kernels index it,
    element i at offset i: a strided view copied once (None stays None)."""
    return t if t is None or t.is_contiguous() else t.contiguous()


def next_pow2(n: int) -> int:
    """The smallest power of two >= n (1 for n <= 1); plain Python, like ``cdiv``."""
    n = max(1, int(n))
    return 1 << (n - 1).bit_length()


def prev_pow2(n: int) -> int:
    """The largest power of two <= n (1 for n <= 1); plain Python."""
    n = max(1, int(n))
    return 1 << (n.bit_length() - 1)


def _knob_tables(name: str) -> list:
    """The heuristic tables holding knob ``name``: batch norm's ``_TUNE``, layer norm's and group norm's ``_CFG``."""
    from normkit.kernels import batch_norm, group_norm, layer_norm

    return [t for t in (batch_norm._TUNE, layer_norm._CFG, group_norm._CFG) if name in t]


def knob_items(names) -> list:
    """The current value of each named knob as ``"NAME=INT"`` (what ``set_knobs`` takes back: a run's defaults
    to restore). An unknown name raises."""
    items = []
    for name in names:
        tables = _knob_tables(name)
        if not tables:
            raise ValueError(f"unknown knob: {name!r}")
        items.append(f"{name}={int(tables[0][name])}")
    return items


def set_knobs(items) -> None:
    """Set heuristic knobs by name from ``"NAME=INT"`` strings (benchmark scripts' ``--set``): batch norm's
    ``_TUNE``, layer norm's and group norm's ``_CFG``, every table that has the name. An unknown name or a value
    that is no int raises before any knob changes."""
    updates = []
    for item in items:
        name, _, value = item.partition("=")
        tables = _knob_tables(name)
        try:
            number = int(value)
        except ValueError:
            number = None
        if not tables or number is None:
            raise ValueError(f"unknown knob or no int value: {item!r} (NAME=INT)")
        updates += [(t, name, number) for t in tables]
    for t, name, number in updates:
        t[name] = number
