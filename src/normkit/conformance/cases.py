"""The case library: OpInfo-style samples of contract.md §10 plus the edge cases of §2-§7.

A `Case` is data only: which entry point to call (an aten name, or ``F.<name>`` for the
functional API), the input recipe, and the flags that decide which rules apply. Inputs are
built by `make_inputs` from a generator seeded with the case name, so every case gets its own
fresh random values (never zeros) and a failure reproduces exactly from its name.

An `ErrorCase` is a bad call and the error torch's contract says it must raise.
"""

from __future__ import annotations

import dataclasses
import math
import zlib
from typing import Callable

import torch
from normkit import _checks

FAMILIES = ("batch_norm", "layer_norm", "rms_norm", "group_norm", "instance_norm", "sync_batch_norm")

# the SyncBatchNorm primitives (contract §3): CUDA-only kernels in torch, "not present" elsewhere
SYNC_OPS = ("batch_norm_stats", "batch_norm_gather_stats", "batch_norm_gather_stats_with_counts",
            "batch_norm_elemt", "batch_norm_backward_reduce", "batch_norm_backward_elemt")

DTYPES = {
    "fp64": (torch.float64, None),
    "fp32": (torch.float32, None),
    "fp16": (torch.float16, None),
    "bf16": (torch.bfloat16, None),
    "fp16+fp32": (torch.float16, torch.float32),
    "bf16+fp32": (torch.bfloat16, torch.float32),
}
ALL_DTYPES = tuple(DTYPES)


@dataclasses.dataclass(frozen=True)
class Case:
    family: str
    op: str  # aten name, or "F.<name>" for the functional API (autograd)
    name: str
    shape: tuple
    dtype: str = "fp32"  # key of DTYPES
    layout: str = "contiguous"  # contiguous | channels_last | channels_last_3d | noncontig | unsqueezed
    training: bool = True
    momentum: float = 0.1
    eps: float | None = 1e-5
    weight: bool = True
    bias: bool = True
    stats: bool = True  # running stats passed (batch/instance norm)
    offset: float = 0.0  # common offset added to the input (randn + offset)
    scale: float = 1.0  # the input's magnitude (randn * scale + offset): small values make eps matter
    constant: bool = False  # one channel (batch/group/instance) or row (layer/rms) is constant
    norm_ndim: int = 1  # layer/rms norm: number of trailing normalized dims
    groups: int = 1  # group norm
    mask: tuple | None = None  # backward output_mask; None = every differentiable input
    sensitive: bool = False  # ill-conditioned by design: ATen may miss the default tolerance
    devices: tuple | None = None  # only run on these device types (None = all)
    backward: bool = True  # False: ATen's own backward is broken here (see the case), forward only
    gradgrad: bool = False  # F-level: also check double backward (rule gradgrad, contract §8)
    ranks: tuple | None = None  # sync_batch_norm: batch size N of each simulated rank (shape[0] = sum)
    strided_params: bool = False  # weight, bias, running stats as strided views (every other element)

    @property
    def input_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype][0]

    @property
    def param_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype][1] or DTYPES[self.dtype][0]

    @property
    def mixed(self) -> bool:
        """fp16/bf16 input with fp32 params; without any param defined the call is not mixed (§1.1)."""
        with_stats = self.stats and self.family in ("batch_norm", "instance_norm")
        return DTYPES[self.dtype][1] is not None and (self.weight or self.bias or with_stats)

    @property
    def half(self) -> bool:
        return self.input_dtype in (torch.float16, torch.bfloat16)

    def param_shape(self) -> tuple:
        if self.family in ("layer_norm", "rms_norm"):
            return tuple(self.shape[len(self.shape) - self.norm_ndim:])
        return (self.shape[1],) if len(self.shape) > 1 else (0,)


@dataclasses.dataclass(frozen=True)
class ErrorCase:
    family: str
    op: str  # the entry point that must raise (aten name or "F.<name>")
    name: str
    build: Callable  # build(device) -> (args tuple, kwargs dict)
    exc: str  # expected exception type name
    message: str | None  # expected message prefix (None: any message)
    via: str | None = None  # torch only: raw aten would crash here; check this entry instead
    via_build: Callable | None = None
    message_devices: tuple = ("cpu", "cuda", "mps")  # where the message text is contract-fixed
    devices: tuple | None = None
    torch_only: bool = False  # an ATen kernel limit (not a contract requirement of other backends)


def seed_of(name: str) -> int:
    return zlib.crc32(name.encode()) & 0x7FFFFFFF


# ---------------------------------------------------------------------------------------------
# input construction


def _layout(t: torch.Tensor, layout: str) -> torch.Tensor:
    if layout == "channels_last":
        return t.contiguous(memory_format=torch.channels_last)
    if layout == "channels_last_3d":
        return t.contiguous(memory_format=torch.channels_last_3d)
    if layout == "noncontig":
        # every other element of a tensor twice as wide in the last dim: strided, not dense
        wide = torch.empty(*t.shape[:-1], 2 * t.shape[-1], dtype=t.dtype, device=t.device)
        wide.normal_()
        wide[..., ::2] = t
        return wide[..., ::2]
    if layout == "unsqueezed":
        # (N, C, L, 1) as x.transpose(1, 2).unsqueeze(-1) leaves a (N, L, C) tensor: strides (L*C, 1, C, 1),
        # channels_last by torch's test but with the size-1 W at stride 1 (torch 2.13's CPU backward misreads it)
        assert t.dim() == 4 and t.shape[-1] == 1, t.shape
        return t[..., 0].transpose(1, 2).contiguous().transpose(1, 2).unsqueeze(-1)
    return t.contiguous()


def _randn(gen, shape, scale=1.0):
    return torch.randn(shape, generator=gen, dtype=torch.float64) * scale


def make_inputs(case: Case, device: str) -> dict:
    """Fresh inputs for `case`: x, grad_out, weight, bias, running_mean, running_var (or None)."""
    gen = torch.Generator().manual_seed(seed_of(case.name))
    x = (_randn(gen, case.shape, 1.5) + 0.3) * case.scale + case.offset
    if case.constant and x.numel():
        # eps == 0: a constant whose sums and means are exact, so the variance is exactly 0
        c = 0.75 if case.eps == 0 else float(_randn(gen, ()) + 1.0)
        if case.family in ("layer_norm", "rms_norm"):
            x.reshape(-1, math.prod(case.param_shape()))[0] = c
        else:
            x[:, 0] = c + case.offset
    g = _randn(gen, case.shape)
    pshape = case.param_shape()
    w = _randn(gen, pshape, 0.5) + 1.0
    b = _randn(gen, pshape, 0.5)
    rm = _randn(gen, pshape, 0.5)
    rv = torch.rand(pshape, generator=gen, dtype=torch.float64) + 0.5
    dt, pdt = case.input_dtype, case.param_dtype

    def param(t):
        t = t.to(pdt).to(device)
        return _layout(t, "noncontig") if case.strided_params else t

    out = {
        "x": _layout(x.to(dt), case.layout).to(device),
        "grad_out": _layout(g.to(dt), case.layout if case.layout not in ("noncontig", "unsqueezed")
                            else "contiguous").to(device),
        "weight": param(w) if case.weight else None,
        "bias": param(b) if case.bias else None,
        "running_mean": param(rm) if case.stats else None,
        "running_var": param(rv) if case.stats else None,
    }
    return out


# ---------------------------------------------------------------------------------------------
# the library

_BN_FORWARD = (
    "native_batch_norm",
    "_native_batch_norm_legit",
    "_native_batch_norm_legit_no_stats",
    "_native_batch_norm_legit_no_training",
    "_batch_norm_with_update",
    "_batch_norm_no_update",
)


def _bn_op_allows(op: str, training: bool, stats: bool) -> bool:
    if op == "_native_batch_norm_legit":
        return stats
    if op == "_native_batch_norm_legit_no_stats":
        return not stats and training
    if op in ("_native_batch_norm_legit_no_training", "_batch_norm_no_update"):
        return not training and stats
    if op == "_batch_norm_with_update":
        return training and stats
    if op == "native_batch_norm":
        return training or stats
    return True


def batch_norm_cases() -> list:
    cases = []

    def add(tag, dtypes, **kw):
        for dk in dtypes:
            for op in _BN_FORWARD + ("F.batch_norm", "batch_norm_update_stats"):
                training = kw.get("training", True)
                stats = kw.get("stats", True)
                if op == "batch_norm_update_stats":
                    if not (training and stats) or kw.get("only"):
                        continue
                elif not _bn_op_allows(op, training, stats) and not op.startswith("F."):
                    continue
                if kw.get("only") and op not in kw["only"]:
                    continue
                if op != "F.batch_norm" and 0 in kw["shape"] and training:
                    continue  # aten rejects empty training input: an error case below
                args = {k: v for k, v in kw.items() if k != "only"}
                cases.append(Case("batch_norm", op, f"{op}/{tag}/{dk}", dtype=dk, **args))

    # contract §10 OpInfo samples
    add("S5_train_m0.5_eps0.6", ALL_DTYPES, shape=(5, 5, 5), momentum=0.5, eps=0.6)
    add("3x2x4_eval_m-1.2", ALL_DTYPES, shape=(3, 2, 4), training=False, momentum=-1.2)
    add("3x1_train_m0", ("fp64", "fp32", "bf16"), shape=(3, 1), momentum=0.0)
    add("3x2x3x4_train_m-1_eps0.5", ALL_DTYPES, shape=(3, 2, 3, 4), momentum=-1.0, eps=0.5)
    add("3x2x3x4_eval_m-1_eps0.5", ("fp32", "fp16+fp32"), shape=(3, 2, 3, 4), training=False,
        momentum=-1.0, eps=0.5)
    add("2x1_eval_defaults", ("fp32", "fp64"), shape=(2, 1), training=False)
    add("1x2x3_train_no_optional", ALL_DTYPES, shape=(1, 2, 3), weight=False, bias=False, stats=False)
    add("4x3x5_train_weight_only", ("fp32", "bf16+fp32"), shape=(4, 3, 5), bias=False)
    add("4x3x5_eval_bias_only", ("fp32", "fp16"), shape=(4, 3, 5), weight=False, training=False)
    # an absent weight's gradient dtype follows the other parameters (§1.1): fp32 where fp32 statistics or bias make the
    # call mixed, not the input's (a bf16-rounded grad_bias of an fp32 bias)
    add("4x3x5_train_bias_only", ("bf16+fp32", "fp16+fp32", "bf16"), shape=(4, 3, 5), weight=False)
    add("4x3x5_train_bias_only_no_stats", ("bf16+fp32", "bf16"), shape=(4, 3, 5), weight=False, stats=False)
    add("4x3x5_eval_bias_only_mixed", ("bf16+fp32",), shape=(4, 3, 5), weight=False, training=False)
    add("4x3x5_train_no_affine", ("fp32", "fp16+fp32"), shape=(4, 3, 5), weight=False, bias=False)
    # memory formats
    add("4x3x6x6_channels_last_train", ALL_DTYPES, shape=(4, 3, 6, 6), layout="channels_last")
    add("4x3x6x6_channels_last_eval", ("fp32", "bf16", "fp16+fp32"), shape=(4, 3, 6, 6),
        layout="channels_last", training=False)
    add("2x3x4x4x4_channels_last_3d_train", ("fp64", "fp32", "bf16+fp32"), shape=(2, 3, 4, 4, 4),
        layout="channels_last_3d")
    add("2x3x4x4x4_channels_last_3d_eval", ("fp32",), shape=(2, 3, 4, 4, 4),
        layout="channels_last_3d", training=False)
    add("4x3x5x6_noncontig_train", ("fp32", "fp16", "bf16+fp32"), shape=(4, 3, 5, 6), layout="noncontig")
    add("4x3x5x6_noncontig_eval", ("fp32",), shape=(4, 3, 5, 6), layout="noncontig", training=False)
    add("3x4x5x1_unsqueezed_train", ("fp64", "fp32", "bf16+fp32"), shape=(3, 4, 5, 1), layout="unsqueezed")
    add("3x4x5x1_unsqueezed_eval", ("fp32",), shape=(3, 4, 5, 1), layout="unsqueezed", training=False)
    add("4x3x5x5_strided_params_train", ("fp32", "bf16+fp32"), shape=(4, 3, 5, 5), strided_params=True)
    add("4x3x5x5_strided_params_eval", ("fp32",), shape=(4, 3, 5, 5), strided_params=True, training=False)
    # momentum, statistics
    add("8x4x7_train_m0.1", ("fp32", "fp64"), shape=(8, 4, 7), momentum=0.1)
    add("8x4x7_train_m1.5", ("fp32",), shape=(8, 4, 7), momentum=1.5)
    add("8x4x7_train_no_stats", ("fp32", "bf16"), shape=(8, 4, 7), stats=False)
    # N*HW == 2 (smallest legal training batch)
    add("2x4_train_nhw2", ("fp64", "fp32", "fp16+fp32"), shape=(2, 4))
    add("1x3x2_train_nhw2", ("fp32",), shape=(1, 3, 2))
    # zero-size batch (F level in training; aten eval)
    add("0x5x9_train_empty", ("fp32",), shape=(0, 5, 9), only=("F.batch_norm",))
    add("0x5x9_eval_empty", ("fp32",), shape=(0, 5, 9), training=False)
    # numerics: large common offset, constant channel, eps edges
    add("8x4x16_train_offset1000", ALL_DTYPES, shape=(8, 4, 16), offset=1000.0, sensitive=True)
    add("8x4x16_eval_offset1000", ("fp32", "bf16+fp32"), shape=(8, 4, 16), offset=1000.0,
        training=False, sensitive=True)
    add("6x3x10_train_constant_channel", ("fp64", "fp32", "bf16"), shape=(6, 3, 10), constant=True,
        sensitive=True)
    add("6x3x10_train_eps1", ("fp32",), shape=(6, 3, 10), eps=1.0)
    add("6x3x10_train_eps1e-12", ("fp64",), shape=(6, 3, 10), eps=1e-12)
    if _checks.batch_norm_eps_error(0.0, False) is None:  # torch 2.13 takes eps = 0 in eval; 2.11 raises
        add("6x3x10_eval_eps0", ("fp32", "fp64"), shape=(6, 3, 10), eps=0.0, training=False)
    # eps = 0 with a constant channel, aten level: CPU's InvStd gives 0 (not inf), so out = bias (§2.3);
    # CUDA gives inf, so this one is CPU-only
    add("6x3x10_train_constant_channel_eps0", ("fp64", "fp32"), shape=(6, 3, 10), eps=0.0, constant=True,
        devices=("cpu",), only=("native_batch_norm", "_native_batch_norm_legit"))
    # past the tile and grid sizes kernels use, no count a multiple of a tile (session 43's mutants: a biased running
    # variance or an unweighted partial-chunk merge above some n, a channels_last channel tail, went unseen)
    # (sensitive: gradients summed over thousands of elements cancel to small sums, whose absolute error the
    # default tolerance would take for the sum's; torch's own fp32 CPU kernels miss it there)
    add("64x3x81_train_m0.1_large", ("fp32", "bf16+fp32"), shape=(64, 3, 81), momentum=0.1, sensitive=True)
    add("8x12x7x9_channels_last_train_large", ("fp32", "bf16"), shape=(8, 12, 7, 9), layout="channels_last",
        sensitive=True)
    # masks: only some gradients requested
    for mask in ((True, False, False), (False, True, True)):
        tag = "".join("1" if m else "0" for m in mask)
        for op in ("native_batch_norm", "_batch_norm_with_update"):
            cases.append(Case("batch_norm", op, f"{op}/4x3x5_train_mask{tag}/fp32", shape=(4, 3, 5), mask=mask))
    return cases


def layer_norm_cases() -> list:
    cases = []

    def add(tag, dtypes, fn=("native_layer_norm", "F.layer_norm"), **kw):
        for dk in dtypes:
            for op in fn:
                cases.append(Case("layer_norm", op, f"{op}/{tag}/{dk}", dtype=dk, **kw))

    add("1x2x3_ns3d_eps0.5", ALL_DTYPES, shape=(1, 2, 3), norm_ndim=3, eps=0.5)
    add("2x2x3_ns2d_eps-0.5", ("fp64", "fp32"), shape=(2, 2, 3), norm_ndim=2, eps=-0.5, sensitive=True)
    add("1_ns1", ("fp32", "fp64"), shape=(1,), norm_ndim=1)
    add("1x2_ns1", ("fp32",), shape=(1, 2), norm_ndim=1)
    add("0x1_empty_rows", ("fp32",), shape=(0, 1), norm_ndim=1)
    add("3x0_empty_rows_width0", ("fp32",), shape=(3, 0), norm_ndim=1)  # mean 0, rstd NaN (contract §4)
    add("4x5x32", ALL_DTYPES, shape=(4, 5, 32))
    add("3x4x5_ns2d", ("fp32", "bf16", "fp16+fp32"), shape=(3, 4, 5), norm_ndim=2)
    for w, b in ((False, False), (True, False), (False, True)):
        # ATen CPU rejects bias-only mixed layer norm ("expected scalar type BFloat16 but found Float")
        add(f"6x16_w{int(w)}b{int(b)}", ("fp32", "bf16+fp32") if w else ("fp32",), shape=(6, 16), weight=w, bias=b)
    add("2x3x4x5_channels_last", ("fp32", "fp16"), shape=(2, 3, 4, 5), layout="channels_last")
    add("4x6x10_noncontig", ("fp32", "bf16"), shape=(4, 6, 10), layout="noncontig")
    add("4x6x10_strided_params", ("fp32", "bf16+fp32"), shape=(4, 6, 10), strided_params=True)
    add("8x64_offset1000", ALL_DTYPES, shape=(8, 64), offset=1000.0, sensitive=True)
    add("5x40_constant_row", ("fp32", "fp64"), shape=(5, 40), constant=True, sensitive=True)
    add("4x24_eps1", ("fp32",), shape=(4, 24), eps=1.0)
    add("4x24_eps0", ("fp64",), shape=(4, 24), eps=0.0)
    add("4x256_wide", ("fp32", "bf16"), shape=(4, 256))
    # past tile and grid sizes (a dropped partial tile of a wide row, rows past a persistent grid went unseen)
    add("4x1500_wide_tail", ("fp32", "bf16"), shape=(4, 1500))
    add("300x64_many_rows", ("fp32", "bf16"), shape=(300, 64))
    # masks with weight and bias defined (frozen params): the masked-out grads must be None, not computed
    for mask in ((True, False, False), (False, True, True)):
        add("4x6x8_mask" + "".join("1" if m else "0" for m in mask), ("fp32",), fn=("native_layer_norm",),
            shape=(4, 6, 8), mask=mask)
    return cases


def rms_norm_cases() -> list:
    cases = []

    def add(tag, dtypes, fn=("_fused_rms_norm", "rms_norm", "F.rms_norm"), **kw):
        for dk in dtypes:
            for op in fn:
                cases.append(Case("rms_norm", op, f"{op}/{tag}/{dk}", dtype=dk, **kw))

    add("1x2x3_ns3d_eps0.5", ("fp64", "fp32", "bf16"), shape=(1, 2, 3), norm_ndim=3, eps=0.5)
    add("4x5x32_eps_default", ("fp64", "fp32", "fp16", "bf16"), shape=(4, 5, 32), eps=None)
    # mean(x²) ~ 2e-4: the default eps decides the result, so finfo(input dtype).eps instead of the opmath
    # type's (bf16 7.8e-3, fp16 9.8e-4 vs fp32 1.2e-7, contract §7; issue 189581) shows in every output,
    # not only in a fp32 rstd
    add("4x5x32_small_eps_default", ("fp64", "fp32", "fp16", "bf16"), shape=(4, 5, 32), eps=None, scale=1e-2)
    add("4x5x32_mixed", ("fp16+fp32", "bf16+fp32"), shape=(4, 5, 32), fn=("rms_norm", "F.rms_norm"))
    add("4x5x32", ("fp32", "fp16"), shape=(4, 5, 32), eps=1e-6)
    add("3x4x5_ns2d", ("fp32", "bf16"), shape=(3, 4, 5), norm_ndim=2)
    add("6x16_no_weight", ("fp32", "bf16"), shape=(6, 16), weight=False)
    add("6x16_strided_weight", ("fp32", "bf16"), shape=(6, 16), strided_params=True)
    add("0x8_empty_rows", ("fp32",), shape=(0, 8))
    add("2x3x4x5_channels_last", ("fp32",), shape=(2, 3, 4, 5), layout="channels_last",
        fn=("rms_norm", "F.rms_norm"))
    add("4x6x10_noncontig", ("fp32", "bf16"), shape=(4, 6, 10), layout="noncontig")
    add("4x6x10_strided_params", ("fp32", "bf16+fp32"), shape=(4, 6, 10), strided_params=True)
    add("8x64_offset1000", ("fp32", "bf16", "fp16"), shape=(8, 64), offset=1000.0, sensitive=True)  # (fp16: x^2
    # overflows where a backend squares before the upcast)
    add("4x24_eps1", ("fp32",), shape=(4, 24), eps=1.0)
    add("4x1500_wide_tail", ("fp32", "bf16"), shape=(4, 1500))
    add("300x64_many_rows", ("fp32", "bf16"), shape=(300, 64))
    return cases


def group_norm_cases() -> list:
    cases = []

    def add(tag, dtypes, fn=("native_group_norm", "F.group_norm"), **kw):
        for dk in dtypes:
            for op in fn:
                cases.append(Case("group_norm", op, f"{op}/{tag}/{dk}", dtype=dk, stats=False, **kw))

    for w, b in ((True, True), (False, False), (True, False), (False, True)):
        wb = f"w{int(w)}b{int(b)}"
        # bias without weight: ATen's CPU group-norm backward fails ("tensor does not have a device"),
        # so that combination is checked forward only
        add(f"1x6x3_G2_eps0.5_{wb}", ("fp32",) if w != b else ("fp64", "fp32"), shape=(1, 6, 3),
            groups=2, eps=0.5, weight=w, bias=b, backward=w or not b)
    # a bias alone makes a 16-bit call mixed: fp32 mean / rstd (§5), which give the backward's grad_bias its fp32
    # dtype where weight is None (forward only, as above; tests/test_functional.py checks normkit's backward)
    add("2x6x5_G3_bias_only", ("bf16+fp32", "fp16+fp32"), shape=(2, 6, 5), groups=3, weight=False, backward=False)
    add("2x6x3_G2_eps-0.5", ("fp64",), shape=(2, 6, 3), groups=2, eps=-0.5, sensitive=True)
    add("1x3_G1", ("fp32",), shape=(1, 3), groups=1, fn=("native_group_norm",))
    add("0x2_G1_empty", ("fp32",), shape=(0, 2), groups=1)
    add("S5_G1_eps0.5", ALL_DTYPES, shape=(5, 5, 5), groups=1, eps=0.5)
    add("4x6x5x5_G3", ALL_DTYPES, shape=(4, 6, 5, 5), groups=3)
    add("2x6x4x4_G6_instance", ("fp32", "bf16"), shape=(2, 6, 4, 4), groups=6)
    add("4x6x5x5_G3_channels_last", ("fp32", "bf16", "fp16+fp32"), shape=(4, 6, 5, 5), groups=3,
        layout="channels_last")
    add("2x4x3x3x3_G2_channels_last_3d", ("fp32",), shape=(2, 4, 3, 3, 3), groups=2, layout="channels_last_3d")
    add("3x6x7_G3_noncontig", ("fp32",), shape=(3, 6, 7), groups=3, layout="noncontig", fn=("F.group_norm",))
    # strided weight / bias through F.group_norm (which hands aten a dense weight: torch 2.13's CPU
    # native_group_norm and its backward read a strided one as if dense, y / dx off by ~4)
    add("3x6x7_G3_strided_params", ("fp32", "bf16+fp32"), shape=(3, 6, 7), groups=3, strided_params=True,
        fn=("F.group_norm",))
    add("4x4x32_G2_offset1000", ("fp32", "bf16"), shape=(4, 4, 32), groups=2, offset=1000.0, sensitive=True)
    add("2x4x50x51_G2_large_groups", ("fp32", "bf16"), shape=(2, 4, 50, 51), groups=2,  # 5100 elements a group
        sensitive=True)  # (as batch norm's large cases: sums that cancel)
    add("3x4x9_G2_constant_channel", ("fp32",), shape=(3, 4, 9), groups=4, constant=True, sensitive=True)
    # masks with weight and bias defined (frozen params): the masked-out grads must be None, not computed
    for mask in ((True, False, False), (False, True, True)):
        add("2x6x5_G3_mask" + "".join("1" if m else "0" for m in mask), ("fp32",), fn=("native_group_norm",),
            shape=(2, 6, 5), groups=3, mask=mask)
    return cases


def instance_norm_cases() -> list:
    cases = []

    def add(tag, dtypes, fn=("instance_norm", "F.instance_norm"), **kw):
        for dk in dtypes:
            for op in fn:
                cases.append(Case("instance_norm", op, f"{op}/{tag}/{dk}", dtype=dk, **kw))

    add("S5_m0.5_eps0.6_input_stats", ("fp64", "fp32", "bf16"), shape=(5, 5, 5), momentum=0.5, eps=0.6)
    add("S5_m0.5_eps0.6_running", ("fp32",), shape=(5, 5, 5), momentum=0.5, eps=0.6, training=False)
    add("3x2x4_m-1.2", ("fp32",), shape=(3, 2, 4), momentum=-1.2)
    add("3x2x4_m0", ("fp32",), shape=(3, 2, 4), momentum=0.0)
    add("3x2x3x4_m-1_eps0.5", ("fp64", "fp32", "fp16"), shape=(3, 2, 3, 4), momentum=-1.0, eps=0.5)
    add("3x2x3x4_weight_only", ("fp32",), shape=(3, 2, 3, 4), bias=False)
    add("3x2x3x4_no_affine_no_stats", ("fp32", "bf16"), shape=(3, 2, 3, 4), weight=False, bias=False, stats=False)
    add("1x2x3_no_kwargs", ("fp32",), shape=(1, 2, 3), weight=False, bias=False, stats=False)
    add("2x3x5x5_channels_last", ("fp32",), shape=(2, 3, 5, 5), layout="channels_last")
    add("2x3x5x5_channels_last_no_stats", ("bf16",), shape=(2, 3, 5, 5), layout="channels_last", stats=False)
    add("2x3x2x3x4_channels_last_3d_running", ("fp32",), shape=(2, 3, 2, 3, 4), layout="channels_last_3d",
        training=False)
    add("2x3x4x6_noncontig", ("fp32",), shape=(2, 3, 4, 6), layout="noncontig")
    add("2x3x4x6_strided_params", ("fp32",), shape=(2, 3, 4, 6), strided_params=True)
    add("2x3x32_offset1000", ("fp32",), shape=(2, 3, 32), offset=1000.0, sensitive=True)
    return cases


def sync_batch_norm_cases() -> list:
    """The SyncBatchNorm primitives (contract §3), each checked alone on simulated ranks.

    ``ranks`` holds each rank's batch size: the input of shape (sum(ranks), C, *) is split along dim 0
    and each rank counts ranks[r]·prod(spatial) values per channel (unequal; a 1 in a 2-D case is a
    rank with count 1). Every primitive gets the inputs the SyncBatchNorm pipeline would hand it,
    computed by the oracle and rounded to the dtypes torch's ``SyncBatchNorm`` uses.
    """
    cases = []

    def add(tag, dtypes, ops, **kw):
        for dk in dtypes:
            for op in ops:
                cases.append(Case("sync_batch_norm", op, f"{op}/{tag}/{dk}", dtype=dk, **kw))

    S, G, GC, E, BR, BE = SYNC_OPS  # stats, gather (int count), gather_with_counts, elemt, backward_*
    every = (S, GC, E, BR, BE)
    add("7x4_ranks4-1-2", ("fp64", "fp32"), every, shape=(7, 4), ranks=(4, 1, 2))
    add("6x3x5_ranks1-2-3", ("fp16", "bf16+fp32"), every, shape=(6, 3, 5), ranks=(1, 2, 3), momentum=0.3)
    add("6x3x5_ranks1-2-3", ("bf16",), (S, GC), shape=(6, 3, 5), ranks=(1, 2, 3))
    add("5x3x4x4_channels_last_ranks2-3", ("fp32", "bf16"), (S, E, BR, BE), shape=(5, 3, 4, 4), ranks=(2, 3),
        layout="channels_last")
    add("3x2x3x3x3_channels_last_3d_ranks1-2", ("fp32",), (S, E, BE), shape=(3, 2, 3, 3, 3), ranks=(1, 2),
        layout="channels_last_3d")
    add("8x4x16_offset1000_ranks3-5", ("fp32",), every, shape=(8, 4, 16), ranks=(3, 5), offset=1000.0,
        sensitive=True)
    add("8x4x16_offset1000_ranks3-5", ("bf16+fp32",), (S, GC), shape=(8, 4, 16), ranks=(3, 5), offset=1000.0,
        sensitive=True)
    add("6x3x5_no_affine_ranks2-4", ("fp32",), (E, BR, BE), shape=(6, 3, 5), ranks=(2, 4), weight=False,
        bias=False)
    add("6x3x5_no_running_stats_ranks2-4", ("fp32",), (GC,), shape=(6, 3, 5), ranks=(2, 4), stats=False)
    add("6x3x5_equal_counts_ranks2-2-2", ("fp32", "fp16"), (G,), shape=(6, 3, 5), ranks=(2, 2, 2))
    return cases


def gradgrad_cases() -> list:
    """F-level double backward (contract §8): float64, small shapes, a few per family."""
    cases = []

    def add(family, op, tag, **kw):
        cases.append(Case(family, op, f"{op}/gradgrad_{tag}/fp64", dtype="fp64", gradgrad=True, **kw))

    add("batch_norm", "F.batch_norm", "4x3x5_train", shape=(4, 3, 5))
    add("batch_norm", "F.batch_norm", "4x3x5_eval", shape=(4, 3, 5), training=False)
    add("batch_norm", "F.batch_norm", "3x2x3x3_channels_last_train", shape=(3, 2, 3, 3), layout="channels_last")
    add("layer_norm", "F.layer_norm", "3x4x5_ns2", shape=(3, 4, 5), norm_ndim=2)
    add("layer_norm", "F.layer_norm", "4x6_ns1", shape=(4, 6))
    add("rms_norm", "F.rms_norm", "3x4x5_ns1", shape=(3, 4, 5))
    add("rms_norm", "F.rms_norm", "2x3x4_ns2", shape=(2, 3, 4), norm_ndim=2)
    add("group_norm", "F.group_norm", "2x6x5_G3", shape=(2, 6, 5), groups=3, stats=False)
    add("group_norm", "F.group_norm", "2x4x3x3_G2", shape=(2, 4, 3, 3), groups=2, stats=False)
    return cases


def all_cases() -> list:
    return (batch_norm_cases() + layer_norm_cases() + rms_norm_cases() + group_norm_cases()
            + instance_norm_cases() + sync_batch_norm_cases() + gradgrad_cases())


# ---------------------------------------------------------------------------------------------
# error cases


def _t(device, *shape, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed + 17)
    if dtype in (torch.int64, torch.int32):
        return torch.randint(1, 9, shape, generator=g, dtype=dtype).to(device)
    return (torch.randn(shape, generator=g, dtype=torch.float64) + 0.5).to(dtype).to(device)


def error_cases() -> list:
    E = ErrorCase
    out = []

    def bn_args(x, w=None, b=None, rm=None, rv=None, training=True, m=0.1, eps=1e-5):
        return lambda d: ((x(d), w and w(d), b and b(d), rm and rm(d), rv and rv(d), training, m, eps), {})

    def f_bn(x, w=None, b=None, rm=None, rv=None, training=True, m=0.1, eps=1e-5):
        return lambda d: ((x(d),), dict(running_mean=rm and rm(d), running_var=rv and rv(d),
                                        weight=w and w(d), bias=b and b(d), training=training,
                                        momentum=m, eps=eps))

    def x234(d):
        return _t(d, 2, 3, 4)

    def c3(d):
        return _t(d, 3, seed=1)

    def c4(d):
        return _t(d, 4, seed=2)

    def rv3(d):
        return _t(d, 3, seed=3).abs() + 0.5

    out += [
        E("batch_norm", "F.batch_norm", "F.batch_norm/err_one_value_per_channel",
          f_bn(lambda d: _t(d, 1, 3)), "ValueError",
          "Expected more than 1 value per channel when training, got input size torch.Size([1, 3])"),
        E("batch_norm", "F.batch_norm", "F.batch_norm/err_train_eps0",
          f_bn(x234, eps=0.0), "ValueError", _checks.batch_norm_eps_error(0.0, True)),
        E("batch_norm", "F.batch_norm", "F.batch_norm/err_eval_eps_negative",
          f_bn(x234, rm=c3, rv=rv3, training=False, eps=-1.0), "ValueError",
          _checks.batch_norm_eps_error(-1.0, False)),
    ]
    if _checks.batch_norm_eps_error(0.0, False) is not None:  # the installed torch rejects eps = 0 in eval
        out.append(E("batch_norm", "F.batch_norm", "F.batch_norm/err_eval_eps0",
                     f_bn(x234, rm=c3, rv=rv3, training=False, eps=0.0), "ValueError",
                     _checks.batch_norm_eps_error(0.0, False)))
    for which in ("weight", "bias", "running_mean", "running_var"):
        kw = dict(w=c3, b=c3, rm=c3, rv=rv3)
        kw[{"weight": "w", "bias": "b", "running_mean": "rm", "running_var": "rv"}[which]] = c4
        for training in (True, False):
            mode = "train" if training else "eval"
            out.append(E("batch_norm", "native_batch_norm", f"native_batch_norm/err_{which}_size_{mode}",
                         bn_args(x234, training=training, **kw), "RuntimeError",
                         f"{which} should contain 3 elements not 4",
                         via="F.batch_norm", via_build=f_bn(x234, training=training, **kw)))
            out.append(E("batch_norm", "F.batch_norm", f"F.batch_norm/err_{which}_size_{mode}",
                         f_bn(x234, training=training, **kw), "RuntimeError",
                         f"{which} should contain 3 elements not 4"))
    for which, kw in (("running_mean", dict(rv=rv3)), ("running_var", dict(rm=c3))):
        out.append(E("batch_norm", "F.batch_norm", f"F.batch_norm/err_eval_no_{which}",
                     f_bn(x234, training=False, **kw), "RuntimeError",
                     f"{which} must be defined in evaluation mode"))
    out += [
        E("batch_norm", "native_batch_norm", "native_batch_norm/err_eval_no_running_stats",
          bn_args(x234, w=c3, b=c3, training=False), "RuntimeError",
          "running_mean must be defined in evaluation mode",
          via="F.batch_norm", via_build=f_bn(x234, w=c3, b=c3, training=False)),
        E("batch_norm", "_native_batch_norm_legit_no_stats",
          "_native_batch_norm_legit_no_stats/err_eval_no_running_stats",
          lambda d: ((_t(d, 2, 3, 4), None, None, False, 0.1, 1e-5), {}), "RuntimeError",
          "running_mean must be defined in evaluation mode",
          via="F.batch_norm", via_build=f_bn(x234, training=False)),
        E("batch_norm", "_batch_norm_no_update", "_batch_norm_no_update/err_no_running_stats",
          lambda d: ((_t(d, 2, 3, 4), None, None, None, None, 0.1, 1e-5), {}), "RuntimeError",
          "running_mean must be defined in evaluation mode",
          via="F.batch_norm", via_build=f_bn(x234, training=False)),
        E("batch_norm", "native_batch_norm", "native_batch_norm/err_only_running_mean",
          bn_args(x234, rm=c3, training=True), "ValueError",
          "running_mean and running_var must either both be None or neither be None"),
        E("batch_norm", "native_batch_norm", "native_batch_norm/err_only_running_var_eval",
          bn_args(x234, rv=rv3, training=False), "ValueError",
          "running_mean and running_var must either both be None or neither be None"),
        E("batch_norm", "native_batch_norm", "native_batch_norm/err_empty_train",
          bn_args(lambda d: _t(d, 0, 3, 4), rm=c3, rv=rv3), "RuntimeError",
          "input tensor must have at least one element, but got input_sizes = [0, 3, 4]",
          devices=("cpu",)),  # contract §2.5: raised by the CPU kernel
        E("batch_norm", "native_batch_norm", "native_batch_norm/err_long_input",
          bn_args(lambda d: _t(d, 2, 3, 4, dtype=torch.int64)), "NotImplementedError",
          "\"batch_norm\" not implemented for 'Long'", message_devices=("cpu",)),
        E("batch_norm", "F.batch_norm", "F.batch_norm/err_rank1",
          f_bn(lambda d: _t(d, 3)), "Exception", None),
        E("batch_norm", "native_batch_norm", "native_batch_norm/err_mixed_fp64_input_fp32_params",
          bn_args(lambda d: _t(d, 2, 3, 4, dtype=torch.float64), w=c3, rm=c3, rv=rv3), "RuntimeError",
          "mixed dtype (CPU): all inputs must share same datatype.", devices=("cpu",), torch_only=True),
        E("batch_norm", "native_batch_norm", "native_batch_norm/err_mixed_fp32_input_fp64_params",
          bn_args(x234, w=lambda d: _t(d, 3, dtype=torch.float64)), "RuntimeError",
          "mixed dtype (CPU): expect parameter to have scalar type of Float", devices=("cpu",),
          torch_only=True),
        E("batch_norm", "native_batch_norm", "native_batch_norm/err_long_weight",
          bn_args(x234, w=lambda d: _t(d, 3, dtype=torch.int64)), "RuntimeError",
          "mixed dtype (CPU): expect parameter to have scalar type of Float", message_devices=("cpu",)),
        E("batch_norm", "native_batch_norm", "native_batch_norm/err_mixed_bf16_input_fp16_params",
          bn_args(lambda d: _t(d, 2, 3, 4, dtype=torch.bfloat16), w=lambda d: _t(d, 3, dtype=torch.float16)),
          "RuntimeError", "mixed dtype (CPU): expect parameter to have scalar type of Float", devices=("cpu",),
          torch_only=True),
    ]

    # layer norm
    def ln(x, ns, w=None, b=None):
        return lambda d: ((x(d), ns, w and w(d), b and b(d), 1e-5), {})

    x2345 = lambda d: _t(d, 2, 3, 4, 5)  # noqa: E731
    out += [
        E("layer_norm", "native_layer_norm", "native_layer_norm/err_empty_normalized_shape", ln(x2345, []),
          "RuntimeError", "Expected normalized_shape to be at least 1-dimensional, i.e., containing at least "
          "one element, but got normalized_shape = []"),
        E("layer_norm", "native_layer_norm", "native_layer_norm/err_weight_shape",
          ln(x2345, [4, 5], w=lambda d: _t(d, 20)), "RuntimeError",
          "Expected weight to be of same shape as normalized_shape, but got weight of shape [20] and "
          "normalized_shape = [4, 5]"),
        E("layer_norm", "native_layer_norm", "native_layer_norm/err_bias_shape",
          ln(x2345, [4, 5], b=lambda d: _t(d, 20)), "RuntimeError",
          "Expected bias to be of same shape as normalized_shape, but got bias of shape [20] and "
          "normalized_shape = [4, 5]"),
        E("layer_norm", "native_layer_norm", "native_layer_norm/err_input_shape", ln(x2345, [4]),
          "RuntimeError", "Given normalized_shape=[4], expected input with shape [*, 4], but got input of "
          "size[2, 3, 4, 5]"),
        E("layer_norm", "native_layer_norm", "native_layer_norm/err_long_input",
          ln(lambda d: _t(d, 2, 3, dtype=torch.int64), [3]), "NotImplementedError",
          "\"LayerNormKernelImpl\" not implemented for 'Long'", message_devices=("cpu",)),
        E("layer_norm", "native_layer_norm", "native_layer_norm/err_long_weight",
          ln(x2345, [4, 5], w=lambda d: _t(d, 4, 5, dtype=torch.int64)), "RuntimeError",
          "mixed dtype (CPU): expect parameter to have scalar type of Float", message_devices=("cpu",)),
        E("layer_norm", "F.layer_norm", "F.layer_norm/err_float_in_normalized_shape",
          lambda d: ((_t(d, 2, 3), (3.0,)), {}), "TypeError",
          "layer_norm(): argument 'normalized_shape' (position 2) must be tuple of ints, but found element of "
          "type float at pos 0"),
        E("layer_norm", "F.layer_norm", "F.layer_norm/err_input_shape",
          lambda d: ((_t(d, 2, 3, 4, 5), [4]), {}), "RuntimeError",
          "Given normalized_shape=[4], expected input with shape [*, 4], but got input of size[2, 3, 4, 5]"),
    ]
    # rms norm (the shape checks live in rms_norm; _fused_rms_norm is the kernel)
    out += [
        E("rms_norm", "rms_norm", "rms_norm/err_input_shape",
          lambda d: ((_t(d, 2, 3, 8), [4], None, None), {}), "RuntimeError",
          "Given normalized_shape=[4], expected input with shape [*4], but got input of size[2, 3, 8]"),
        E("rms_norm", "rms_norm", "rms_norm/err_empty_normalized_shape",
          lambda d: ((_t(d, 2, 3), [], None, None), {}), "RuntimeError",
          "Expected normalized_shape to be at least 1-dimensional, i.e., containing at least one element, "
          "but got normalized_shape = []"),
        E("rms_norm", "rms_norm", "rms_norm/err_weight_shape",
          lambda d: ((_t(d, 2, 3, 4, 5), [4, 5], _t(d, 20), None), {}), "RuntimeError",
          "Expected weight to be of same shape as normalized_shape, but got weight of shape [20] and "
          "normalized_shape = [4, 5]"),
        E("rms_norm", "F.rms_norm", "F.rms_norm/err_input_shape",
          lambda d: ((_t(d, 2, 3, 8), [4]), {}), "RuntimeError",
          "Given normalized_shape=[4], expected input with shape [*4], but got input of size[2, 3, 8]"),
        E("rms_norm", "F.rms_norm", "F.rms_norm/err_long_input",
          lambda d: ((_t(d, 2, 3, dtype=torch.int64), [3]), {}), "NotImplementedError",
          "\"rms_norm\" not implemented for 'Long'", message_devices=("cpu",)),
    ]

    # group norm
    def gn(x, w=None, b=None, N=2, C=6, HxW=20, G=2):
        return lambda d: ((x(d), w and w(d), b and b(d), N, C, HxW, G, 1e-5), {})

    x2645 = lambda d: _t(d, 2, 6, 4, 5)  # noqa: E731
    out += [
        E("group_norm", "native_group_norm", "native_group_norm/err_zero_groups", gn(x2645, G=0),
          "RuntimeError", "Expected num groups to be greater than 0, got 0"),
        E("group_norm", "native_group_norm", "native_group_norm/err_channels_not_divisible", gn(x2645, G=4),
          "RuntimeError", "Expected number of channels in input to be divisible by num_groups, but got input "
          "of shape [2, 6, 4, 5] and num_groups=4"),
        E("group_norm", "native_group_norm", "native_group_norm/err_weight_size",
          gn(x2645, w=lambda d: _t(d, 5)), "RuntimeError",
          "Expected weight to be a vector of size equal to the number of channels in input, but got weight "
          "of shape [5] and input of shape [2, 6, 4, 5]"),
        E("group_norm", "native_group_norm", "native_group_norm/err_bias_size",
          gn(x2645, w=lambda d: _t(d, 6), b=lambda d: _t(d, 5)), "RuntimeError",
          "Expected bias to be a vector of size equal to the number of channels in input, but got bias "
          "of shape [6] and input of shape [2, 6, 4, 5]"),
        E("group_norm", "native_group_norm", "native_group_norm/err_numel", gn(x2645, N=3),
          "RuntimeError", "Expected X.numel() == N * C * HxW to be true, but got false."),
        E("group_norm", "native_group_norm", "native_group_norm/err_long_input",
          gn(lambda d: _t(d, 2, 6, 4, 5, dtype=torch.int64)), "NotImplementedError",
          "\"GroupNormKernelImpl\" not implemented for 'Long'", message_devices=("cpu",)),
        E("group_norm", "native_group_norm_backward", "native_group_norm_backward/err_dy_dtype",
          lambda d: ((_t(d, 2, 6, 3, dtype=torch.float64), _t(d, 2, 6, 3), _t(d, 2, 2), _t(d, 2, 2).abs(),
                      None, 2, 6, 3, 2, [True, False, False]), {}),
          "RuntimeError", "Expected scalar types of X and dY are same."),
        E("group_norm", "native_group_norm", "native_group_norm/err_long_weight",
          gn(x2645, w=lambda d: _t(d, 6, dtype=torch.int64)), "RuntimeError",
          "mixed dtype (CPU): expect parameter to have scalar type of Float", message_devices=("cpu",)),
        E("group_norm", "F.group_norm", "F.group_norm/err_float_num_groups", lambda d: ((_t(d, 2, 6, 5), 2.0), {}),
          "TypeError", "group_norm(): argument 'num_groups' (position 2) must be int, not float"),
        E("group_norm", "F.group_norm", "F.group_norm/err_rank1", lambda d: ((_t(d, 3), 1), {}),
          "RuntimeError", "Expected at least 2 dimensions for input tensor but received 1"),
        E("group_norm", "F.group_norm", "F.group_norm/err_one_value_per_channel",
          lambda d: ((_t(d, 1, 3), 3), {}), "ValueError",
          "Expected more than 1 value per channel when training, got input size [1, 3]"),
    ]
    # instance norm
    out += [
        E("instance_norm", "instance_norm", "instance_norm/err_no_running_stats",
          lambda d: ((_t(d, 2, 3, 4), None, None, None, None, False, 0.1, 1e-5, False), {}), "RuntimeError",
          "Expected running_mean and running_var to be defined when use_input_stats is false"),
        E("instance_norm", "F.instance_norm", "F.instance_norm/err_no_running_stats",
          lambda d: ((_t(d, 2, 3, 4),), dict(use_input_stats=False)), "RuntimeError",
          "Expected running_mean and running_var to be defined when use_input_stats is false"),
        E("instance_norm", "F.instance_norm", "F.instance_norm/err_one_spatial_element",
          lambda d: ((_t(d, 2, 3, 1),), {}), "ValueError",
          "Expected more than 1 spatial element when training, got input size torch.Size([2, 3, 1])"),
    ]
    # SyncBatchNorm primitives (contract §3): checks CUDA's kernels make on contiguous inputs; torch has no
    # CPU kernels for these, so on the CPU `--impl torch` reports them not present
    f64 = torch.float64
    out += [
        E("sync_batch_norm", "batch_norm_backward_reduce", "batch_norm_backward_reduce/err_mean_invstd_dtype",
          lambda d: ((_t(d, 2, 3, 4), _t(d, 2, 3, 4, seed=1), _t(d, 3, seed=2), _t(d, 3, dtype=f64, seed=3).abs(),
                      _t(d, 3, seed=4), True, True, True), {}),
          "RuntimeError", "mean and invstd need to have the same data types", devices=("cpu", "cuda")),
        E("sync_batch_norm", "batch_norm_backward_elemt", "batch_norm_backward_elemt/err_mean_invstd_dtype",
          lambda d: ((_t(d, 2, 3, 4), _t(d, 2, 3, 4, seed=1), _t(d, 3, seed=2), _t(d, 3, dtype=f64, seed=3).abs(),
                      _t(d, 3, seed=4), _t(d, 3, seed=5), _t(d, 3, seed=6),
                      torch.tensor([4, 4], dtype=torch.int32, device=d)), {}),
          "RuntimeError", "mean and invstd need to have the same data types", devices=("cpu", "cuda")),
        E("sync_batch_norm", "batch_norm_stats", "batch_norm_stats/err_long_input",
          lambda d: ((_t(d, 2, 3, 4, dtype=torch.int64), 1e-5), {}), "NotImplementedError", None,
          devices=("cpu", "cuda")),
    ]
    return out
