"""The benchmark suite: loading, expansion into cases, byte accounting and input generation."""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field

import torch

OPS = ("batch_norm", "layer_norm", "rms_norm", "group_norm", "instance_norm")
LAYOUTS = ("contiguous", "channels_last")   # what --layouts and a suite's "layouts" may name
MODES = ("train", "eval")                    # what --modes and a suite's "modes" may name

DTYPES = {
    "float64": torch.float64,
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
}
SHORT = {"float64": "fp64", "float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}
_ALIASES = {v: k for k, v in SHORT.items()}
_ALIASES.update({"half": "float16", "float": "float32", "double": "float64", "bfloat": "bfloat16"})

EPS = 1e-5
RMS_EPS = 1e-6
MOMENTUM = 0.1

SUITE_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "suite.json")

# --quick: the same ops, dtypes, layouts and modes as the suite, at sizes a CPU handles in milliseconds.
QUICK_SHAPES = {
    "batch_norm": [[8, 4, 5, 5], [64, 8]],
    "layer_norm": [[64, 32], [16, 100]],
    "rms_norm": [[64, 32], [16, 100]],
    "group_norm": [[4, 8, 6, 6, 4], [2, 8, 3, 4, 4, 2]],
    "instance_norm": [[4, 4, 6, 6], [2, 3, 3, 4, 4]],
}

# --accuracy: one moderate shape per op (error against float64, randn and randn + 1000 inputs).
ACCURACY_SHAPES = {
    "batch_norm": [64, 128, 28, 28],
    "layer_norm": [4096, 4096],
    "rms_norm": [4096, 4096],
    "group_norm": [16, 256, 32, 32, 32],
    "instance_norm": [16, 64, 64, 64],
}
QUICK_ACCURACY_SHAPES = {
    "batch_norm": [8, 4, 5, 5],
    "layer_norm": [32, 64],
    "rms_norm": [32, 64],
    "group_norm": [4, 8, 6, 6, 4],
    "instance_norm": [4, 4, 6, 6],
}


def canon_dtype(name: str) -> str:
    name = str(name).strip().lower().replace("torch.", "")
    name = _ALIASES.get(name, name)
    if name not in DTYPES:
        raise ValueError(f"unknown dtype {name!r} (expected one of {sorted(DTYPES) + sorted(SHORT.values())})")
    return name


@dataclass(frozen=True)
class Case:
    """One benchmarked configuration; each direction of it is a row per implementation."""

    op: str
    shape: tuple            # input shape (group_norm: without num_groups)
    dtype: str              # input dtype name
    params: str             # weight / bias / running-stat dtype name
    layout: str = "contiguous"   # contiguous | channels_last (4-D: channels_last, 5-D: channels_last_3d)
    mode: str = "train"     # train (fwd + bwd) | eval (fwd; batch norm only)
    groups: int = 0         # group_norm only

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def itemsize(self) -> int:
        return torch.empty((), dtype=DTYPES[self.dtype]).element_size()

    @property
    def tensor_bytes(self) -> int:
        return self.numel * self.itemsize

    @property
    def channels(self) -> int:
        return self.shape[-1] if self.op in ("layer_norm", "rms_norm") else self.shape[1]

    @property
    def directions(self) -> tuple:
        return ("fwd", "bwd") if self.mode == "train" else ("fwd",)

    @property
    def shape_label(self) -> str:
        s = "x".join(str(d) for d in self.shape)
        return f"{s}/g{self.groups}" if self.op == "group_norm" else s

    @property
    def dtype_label(self) -> str:
        if self.params == self.dtype:
            return SHORT[self.dtype]
        return f"{SHORT[self.dtype]}/{SHORT[self.params]}"

    @property
    def layout_label(self) -> str:
        if self.layout == "contiguous":
            return {2: "NC", 3: "NCL", 4: "NCHW", 5: "NCDHW"}.get(len(self.shape), "contig") \
                if self.op not in ("layer_norm", "rms_norm") else "rows"
        return {4: "NHWC", 5: "NDHWC"}.get(len(self.shape), self.layout)

    @property
    def memory_format(self):
        if self.layout == "channels_last":
            return torch.channels_last if len(self.shape) == 4 else torch.channels_last_3d
        return torch.contiguous_format

    def label(self) -> str:
        return f"{self.op} {self.shape_label} {self.dtype_label} {self.layout_label} {self.mode}"

    def key(self) -> dict:
        return {
            "op": self.op, "shape": list(self.shape), "groups": self.groups or None, "dtype": self.dtype,
            "params": self.params, "layout": self.layout, "mode": self.mode,
        }


def min_bytes(case: Case, direction: str) -> int:
    """The physical minimum traffic: forward reads x and writes y (2 passes); backward reads x and dy and
    writes dx (3 passes). Parameters and statistics are O(C) and left out."""
    passes = {"fwd": 2, "bwd": 3}[direction]
    return passes * case.tensor_bytes


def load_suite(path: str | None = None) -> dict:
    """The suite JSON, its structure checked up front (ValueError naming the first problem), so that a malformed
    file fails before any row runs, not with a traceback in the middle of the expansion."""
    with open(path or SUITE_PATH) as f:
        suite = json.load(f)
    check_suite(suite)
    return suite


def check_suite(suite) -> None:
    if not isinstance(suite, dict):
        raise ValueError(f"a JSON object with an entry per op is expected, not a {type(suite).__name__}")
    for op in OPS:
        spec = suite.get(op)
        if spec is None:
            continue
        if not isinstance(spec, dict):
            raise ValueError(f"{op}: an object with 'shapes' and 'dtypes' is expected")
        for key in ("shapes", "dtypes"):
            if not isinstance(spec.get(key), list) or not spec[key]:
                raise ValueError(f"{op}: '{key}' must be a non-empty list")
        for shape in spec["shapes"]:
            if not (isinstance(shape, list) and len(shape) >= 2
                    and all(isinstance(d, int) and not isinstance(d, bool) and d > 0 for d in shape)):
                raise ValueError(f"{op}: shape {shape!r} is not a list of two or more positive ints")
        for dt in spec["dtypes"]:
            pair = [dt] if isinstance(dt, str) else dt
            if not (isinstance(pair, list) and 1 <= len(pair) <= 2 and all(isinstance(d, str) for d in pair)):
                raise ValueError(f"{op}: dtype {dt!r} is neither a name nor an [input, params] pair")
            for d in pair:
                canon_dtype(d)
        for key, allowed in (("layouts", LAYOUTS), ("modes", MODES)):
            values = spec.get(key, [])
            bad = [v for v in values if v not in allowed] if isinstance(values, list) else [values]
            if bad:
                raise ValueError(f"{op}: unknown {key} {bad}; known: {', '.join(allowed)}")


def _shape_matches(case: Case, wanted):
    """True without a filter; else the first --shapes entry naming this case's shape (or None)."""
    if not wanted:
        return True
    labels = {case.shape_label, "x".join(str(d) for d in case.shape)}
    if case.op == "group_norm":
        labels.add(case.shape_label.replace("/g", ":"))
    return next((w for w in wanted if w.replace(",", "x").replace("*", "x") in labels), None)


def _dtype_matches(dtype: str, params: str, wanted) -> bool:
    if not wanted:
        return True
    for w in wanted:
        if ":" in w or "/" in w:
            a, b = w.replace("/", ":").split(":", 1)
            if canon_dtype(a) == dtype and canon_dtype(b) == params:
                return True
        elif canon_dtype(w) == dtype:
            return True
    return False


# ranks an ad-hoc --shapes entry may have per op (group norm: N x C x ..., with its groups)
_RANKS = {"batch_norm": (2, 3, 4, 5), "layer_norm": (2, 3, 4), "rms_norm": (2, 3, 4), "group_norm": (3, 4, 5),
          "instance_norm": (3, 4, 5)}


def _parse_shape(text: str):
    """'16384x5120' -> ([16384, 5120], 0); group norm's '32x256x64x64/g32' (or ':32') -> ([32, 256, 64, 64],
    32). None if it is not such a shape."""
    body = text.replace(",", "x").replace("*", "x").replace("/g", ":")
    body, _, groups = body.partition(":")
    try:
        dims = [int(d) for d in body.split("x")]
        g = int(groups) if groups else 0
    except ValueError:
        return None
    if not dims or min(dims) < 1 or g < 0 or (groups and g < 1):
        return None
    return dims, g


def _extra_shapes(op: str, suite_shapes, wanted) -> list:
    """The --shapes entries the suite lacks for ``op`` that are valid input shapes of it (suite form: group
    norm's groups last): they are benchmarked too, with the op's suite dtypes, layouts and modes."""
    have = {tuple(s) for s in suite_shapes}
    extra = []
    for w in wanted or []:
        parsed = _parse_shape(w)
        if parsed is None:
            continue
        dims, g = parsed
        if (g > 0) != (op == "group_norm") or len(dims) not in _RANKS[op] or (g and dims[1] % g):
            continue
        entry = dims + ([g] if g else [])
        if tuple(entry) not in have:
            extra.append(entry)
            have.add(tuple(entry))
    return extra


def expand_suite(suite: dict, ops=None, shapes=None, dtypes=None, layouts=None, modes=None,
                 quick: bool = False, dtype_slots=None) -> list:
    """The suite's cases in suite order, narrowed by the filters (None = everything).

    ``shapes``: suite shapes to keep; an entry the suite lacks for an op (``16384x5120``; group norm
    ``32x256x64x64/g32``) is added to that op where its rank fits, with the op's suite dtypes, layouts
    and modes. Entries that fit no selected op raise ValueError when nothing is left.
    ``dtype_slots``: positions in each op's suite dtype list to keep (0 = the op's first, headline dtype).
    Layouts apply to 4-D and 5-D inputs of batch/group/instance norm only: a (N, C) batch-norm shape is run
    once, as contiguous. Batch norm has train and eval modes; the other ops train (forward + backward)."""
    cases = []
    used = set()
    for op in OPS:
        if ops and op not in ops:
            continue
        spec = suite.get(op)
        if not spec:
            continue
        shapes_list = QUICK_SHAPES[op] if quick else spec["shapes"]
        shapes_list = list(shapes_list) + _extra_shapes(op, shapes_list, shapes)
        op_layouts = spec.get("layouts", ["contiguous"])
        op_modes = spec.get("modes", ["train"])
        # dtype is the outer loop: the suite's first (headline) dtype of every op comes first, so a run cut
        # short by its budget misses whole later dtypes rather than scattered shapes
        for slot, dt in enumerate(spec["dtypes"]):
            if dtype_slots is not None and slot not in dtype_slots:
                continue
            dtype, params = (dt, dt) if isinstance(dt, str) else (dt[0], dt[1])
            dtype, params = canon_dtype(dtype), canon_dtype(params)
            if not _dtype_matches(dtype, params, dtypes):
                continue
            for raw in shapes_list:
                raw = list(raw)
                groups = 0
                if op == "group_norm":
                    groups, raw = int(raw[-1]), raw[:-1]
                shape = tuple(int(d) for d in raw)
                for layout in op_layouts:
                    if layout != "contiguous" and (len(shape) < 4 or op in ("layer_norm", "rms_norm")):
                        continue
                    if layouts and layout not in layouts:
                        continue
                    for mode in op_modes:
                        if modes and mode not in modes:
                            continue
                        case = Case(op, shape, dtype, params, layout, mode, groups)
                        hit = _shape_matches(case, shapes)
                        if hit:
                            cases.append(case)
                            used.add(hit)
    unused = [w for w in shapes or [] if w not in used]
    if unused and not cases:
        raise ValueError(f"--shapes {' '.join(unused)}: no such input shape for {', '.join(ops or OPS)} "
                         "(e.g. 16384x5120 for layer/RMS norm, 256x64x56x56 for batch norm, "
                         "32x256x64x64/g32 for group norm with 32 groups)")
    return cases


@dataclass
class Inputs:
    """One input set of a case, in the case's dtypes and layout."""

    x: torch.Tensor
    dy: torch.Tensor
    weight: torch.Tensor | None
    bias: torch.Tensor | None
    running_mean: torch.Tensor | None = None
    running_var: torch.Tensor | None = None
    extra: dict = field(default_factory=dict)


def make_inputs(case: Case, device, seed: int, offset: float = 0.0) -> Inputs:
    """Fresh random inputs (never zeros). ``offset`` is added to x before rounding (randn + 1000)."""
    dev = torch.device(device)
    gen = torch.Generator(device=dev)
    gen.manual_seed(seed)
    dt, pt = DTYPES[case.dtype], DTYPES[case.params]
    if offset:
        x = (torch.randn(case.shape, generator=gen, device=dev, dtype=torch.float32) + offset).to(dt)
    else:
        x = torch.randn(case.shape, generator=gen, device=dev, dtype=dt)
    dy = torch.randn(case.shape, generator=gen, device=dev, dtype=dt)
    if case.layout != "contiguous":
        x = x.contiguous(memory_format=case.memory_format)
        dy = dy.contiguous(memory_format=case.memory_format)
    c = case.channels
    weight = (torch.randn(c, generator=gen, device=dev, dtype=torch.float32) * 0.5 + 1.0).to(pt)
    bias = (torch.randn(c, generator=gen, device=dev, dtype=torch.float32) * 0.5).to(pt)
    rm = rv = None
    if case.op == "rms_norm":
        bias = None
    if case.op == "batch_norm":
        rm = (torch.randn(c, generator=gen, device=dev, dtype=torch.float32) * 0.1).to(pt)
        rv = (torch.rand(c, generator=gen, device=dev, dtype=torch.float32) + 0.5).to(pt)
    return Inputs(x, dy, weight, bias, rm, rv)


def rotation_count(case: Case, l2_bytes: int | None, direction: str, cap: int = 8) -> int:
    """How many input sets to rotate through so that the working set is >= 4x L2 (1 when it already is)."""
    if not l2_bytes:
        return 1
    ws = (4 if direction == "bwd" else 2) * case.tensor_bytes
    return max(1, min(cap, math.ceil(4 * l2_bytes / max(ws, 1))))
