"""How a result is judged: tolerances, value comparison, and the helpers the rules share.

Rules (the ``rule`` field of every result):

* ``values``        forward outputs against the float64 oracle
* ``saved_stats``   saved mean / invstd (rstd): values, shape, dtype; eval: empty or the device variant
* ``running_stats`` in-place update with the unbiased variance; untouched in eval
* ``meta``          output dtype, shape and memory format
* ``grads``         the aten backward (grad_input, grad_weight, grad_bias) against the oracle; for the
                    SyncBatchNorm primitives also batch_norm_backward_reduce's (sum_dy, sum_dy_xmu, ...)
* ``autograd``      gradients through the functional API's autograd against the oracle
* ``gradgrad``      double backward (F-level, float64): d(grad_input · v)/d(input, weight, grad_out) against
                    the same through the oracle's (plain, differentiable torch) forward; a backend without
                    double backward fails it, saying so
* ``error``         error type and message for bad input
* ``error_state``   a call that raises leaves its tensor arguments (running stats) untouched
* ``inputs``        every call leaves its tensor arguments' values as they were, but the running statistics a
                    training call updates (shown only where it fails)
* ``aliasing``      no output shares memory with an argument: outputs are new tensors, an eval call's saved
                    statistics copies (shown only where it fails)

Value tolerance (contract §10 and design.md "Tests"):

* criterion A: torch.testing's default ``|a - ref| <= atol + rtol*|ref|`` for the compared tensor's
  dtype (fp16 1e-3/1e-5, bf16 1.6e-2/1e-5, fp32 1.3e-6/1e-5, fp64 1e-7/1e-7);
* criterion B: "at most 2x the error of PyTorch's own kernel on the same device and the same rounded
  inputs, plus a small atol" (max abs error; the atol is 2 ulps of the tensor's largest value for
  fp16/bf16 results, 8 ulps of max(1, largest value) for fp32/fp64).

Which one applies:

* fp32/fp64 inputs, ATen meets A: both (the stricter wins);
* case marked ill-conditioned (large offset, constant channel, negative eps; ATen is documented to
  lose digits there), or any result computed from fp16/bf16 inputs (where the roundings fall decides
  which elements are worst, and ATen's CPU kernels keep half statistics, contract §2.2, so ATen
  itself often misses A): either suffices, i.e. within the default or within 2x ATen's max error;
* ATen misses A anywhere else: A alone (so ATen itself fails: a finding about ATen).

For ``--impl torch`` B holds by construction, so torch is judged by A except where the rules above
waive it.
"""

from __future__ import annotations

import dataclasses

import torch

# torch.testing.assert_close defaults (rtol, atol), contract §10
DEFAULT_TOL = {
    torch.float16: (1e-3, 1e-5),
    torch.bfloat16: (1.6e-2, 1e-5),
    torch.float32: (1.3e-6, 1e-5),
    torch.float64: (1e-7, 1e-7),
}


@dataclasses.dataclass
class Result:
    op: str
    case: str
    rule: str
    passed: bool
    detail: str
    ratio: float = 0.0  # worst error as a fraction of its tolerance (values rules)
    family: str = ""

    def as_json(self) -> dict:
        return {"op": self.op, "case": self.case, "rule": self.rule, "passed": bool(self.passed),
                "detail": self.detail}


def _finite_err(a: torch.Tensor, ref: torch.Tensor) -> tuple:
    """abs error with matching non-finite values counted as exact; (err, mismatched_nonfinite)."""
    a = a.detach().to("cpu", torch.float64)
    ref = ref.detach().to("cpu", torch.float64)
    both_nan = torch.isnan(a) & torch.isnan(ref)
    same_inf = torch.isinf(a) & torch.isinf(ref) & (torch.sign(a) == torch.sign(ref))
    ok_special = both_nan | same_inf
    err = (a - ref).abs()
    err = torch.where(ok_special, torch.zeros_like(err), err)
    bad = (~torch.isfinite(a) | ~torch.isfinite(ref)) & ~ok_special
    return err, int(bad.sum())


@dataclasses.dataclass
class Verdict:
    passed: bool
    ratio: float
    detail: str


def judge(name: str, got: torch.Tensor, ref: torch.Tensor, baseline: torch.Tensor | None, *,
          dtype: torch.dtype | None = None, sensitive: bool = False, half: bool = False,
          self_baseline: bool = False) -> Verdict:
    """Compare `got` with the float64 oracle `ref`; `baseline` is torch's own result on the same inputs.

    `self_baseline`: the impl under test is torch (criterion B holds trivially).
    """
    dtype = dtype or got.dtype
    if tuple(got.shape) != tuple(ref.shape):
        return Verdict(False, float("inf"), f"{name}: shape {tuple(got.shape)} != expected {tuple(ref.shape)}")
    if got.numel() == 0:
        return Verdict(True, 0.0, f"{name}: empty")
    rtol, atol = DEFAULT_TOL.get(dtype, DEFAULT_TOL[torch.float32])
    err, bad = _finite_err(got, ref)
    if bad:
        return Verdict(False, float("inf"), f"{name}: {bad} non-finite value(s) where the oracle differs")
    ref64 = ref.detach().to("cpu", torch.float64).nan_to_num(0.0, 0.0, 0.0)
    ratio_a = float((err / (atol + rtol * ref64.abs())).max())
    max_err = float(err.max())
    eps = torch.finfo(dtype).eps
    # the "small atol" of criterion B: a few roundings at the tensor's scale. Half results are rounded
    # once at the end: 2 ulps of the largest value (not of max(1, it): 2 bf16 ulps of 1.0 = 0.0156 hid
    # any error of results whose values are all below ~0.01, e.g. a missing gradient term under a large
    # offset). fp32/fp64 results carry the reduction order's rounding: 8 ulps of max(1, largest value).
    half_result = dtype in (torch.float16, torch.bfloat16)
    atol_b = (2.0 if half_result else 8.0) * eps * max(0.0 if half_result else 1.0, float(ref64.abs().max()))
    if baseline is None or self_baseline:
        base_err = max_err if self_baseline else None
    else:
        b_err, b_bad = _finite_err(baseline, ref)
        base_err = float("inf") if b_bad else float(b_err.max())
    if base_err is None:  # no torch kernel to compare with on this device: criterion A alone
        ok = ratio_a <= 1.0
        return Verdict(ok, ratio_a, f"{name}: max err {max_err:.3g}, {ratio_a:.3g} of default tol")
    denom_b = 2 * base_err + atol_b
    ratio_b = max_err / denom_b if denom_b > 0 else (0.0 if max_err == 0 else float("inf"))
    base_ratio_a = float((_finite_err(baseline, ref)[0] / (atol + rtol * ref64.abs())).max()) \
        if (baseline is not None and not self_baseline) else ratio_a
    if sensitive:  # ill-conditioned by design: within the default tol, or within 2x ATen
        ratio = min(ratio_a, ratio_b)
        how = f"ill-conditioned: default tol or 2x ATen (ATen at {base_ratio_a:.3g}x the default)"
    elif half:
        # computed from fp16/bf16 inputs: where the roundings fall decides which elements are worst, and
        # ATen's CPU kernels keep half statistics (contract §2.2): default tol or 2x ATen's max error
        ratio = min(ratio_a, ratio_b)
        how = f"half input: default tol or 2x ATen (ATen at {base_ratio_a:.3g}x the default)"
    elif base_ratio_a <= 1.0:  # ATen meets the default tolerance: both criteria (the stricter wins)
        ratio = max(ratio_a, ratio_b)
        how = "stricter of default tol and 2x ATen"
    else:
        ratio = ratio_a
        how = f"default tol (ATen misses it: {base_ratio_a:.3g}x)"
    return Verdict(ratio <= 1.0, ratio,
                   f"{name}: max err {max_err:.3g} (ATen {base_err:.3g}), {ratio:.3g} of tol [{how}]")


def memory_format_of(t: torch.Tensor) -> str:
    if t.dim() == 4 and t.is_contiguous(memory_format=torch.channels_last) and not t.is_contiguous():
        return "channels_last"
    if t.dim() == 5 and t.is_contiguous(memory_format=torch.channels_last_3d) and not t.is_contiguous():
        return "channels_last_3d"
    if t.is_contiguous():
        return "contiguous"
    return "strided"


def suggested_format(t: torch.Tensor) -> str:
    """What torch's suggest_memory_format() says for `t` (channels_last only when dense CL)."""
    if t.dim() == 4 and t.is_contiguous(memory_format=torch.channels_last) and not t.is_contiguous():
        return "channels_last"
    if t.dim() == 5 and t.is_contiguous(memory_format=torch.channels_last_3d) and not t.is_contiguous():
        return "channels_last_3d"
    return "contiguous"


def has_format(t: torch.Tensor, fmt: str) -> bool:
    mf = {"contiguous": torch.contiguous_format, "channels_last": torch.channels_last,
          "channels_last_3d": torch.channels_last_3d}[fmt]
    return t.is_contiguous(memory_format=mf)


def check_meta(name: str, got: torch.Tensor, shape, dtype: torch.dtype, formats) -> tuple:
    """(ok, detail) for shape/dtype/memory format; `formats` = accepted memory formats (first = main)."""
    problems = []
    if tuple(got.shape) != tuple(shape):
        problems.append(f"shape {tuple(got.shape)} != {tuple(shape)}")
    if got.dtype != dtype:
        problems.append(f"dtype {got.dtype} != {dtype}")
    seen = None
    if formats and got.numel() > 1:
        for f in formats:
            if has_format(got, f):
                seen = f
                break
        if seen is None:
            problems.append(f"memory format {memory_format_of(got)} not in {list(formats)}")
    if problems:
        return False, f"{name}: " + "; ".join(problems)
    extra = f", {seen}" if seen and len(formats) > 1 and seen != formats[0] else ""
    return True, f"{name}: ok{extra}"
