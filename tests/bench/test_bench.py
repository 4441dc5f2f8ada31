"""Tests of the benchmark harness itself (CPU, --quick sizes)."""

import io
import json
import math
import os
import subprocess
import sys
import time

import pytest
import torch
import torch.nn.functional as F

from normkit.bench import cases as C
from normkit.bench import report
from normkit.bench.impls import AtenImpl, Impl, LigerImpl, NormkitImpl, functional_call
from normkit.bench.runner import Context, run_accuracy, run_case
from normkit.bench.timing import Progress, Timer

SRC = os.path.join(os.path.dirname(__file__), "..", "..", "src")

ROW_KEYS = {"op", "shape", "groups", "dtype", "params", "layout", "mode", "direction", "impl", "status", "note",
            "ms", "gbps", "sol", "bytes", "tensor_bytes", "peak_mem_bytes", "timer", "rotation", "errors", "tol",
            "first_call_s", "oracle", "calls_per_timing", "estimate_ms", "ms_rounds"}


def _ctx(copy_gbps=10.0):
    return Context(device="cpu", timer=Timer("cpu", warmup_ms=0.2, rep_ms=0.5), copy_gbps=copy_gbps, quick=True)


def _strict_json(path):
    def bad(c):
        raise ValueError(f"non-strict JSON constant {c}")

    with open(path) as f:
        return json.load(f, parse_constant=bad)


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    """The CI command itself, through ``python -m normkit``."""
    d = tmp_path_factory.mktemp("bench")
    out, js = d / "out", d / "bench.json"
    env = dict(os.environ, PYTHONPATH=os.path.abspath(SRC) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    p = subprocess.run([sys.executable, "-m", "normkit", "bench", "--quick", "--json", str(js), "--out", str(out)],
                       capture_output=True, text=True, env=env, timeout=300)
    return p, js, out


def test_quick_cli_runs(quick_run):
    p, js, out = quick_run
    assert p.returncode == 0, p.stderr[-3000:]
    assert "### batch_norm" in p.stdout and "### headline" in p.stdout
    assert "bench [" in p.stderr  # the progress bar


def test_quick_json_schema(quick_run):
    _, js, _ = quick_run
    d = _strict_json(js)
    for k in ("schema", "device", "gpu_name", "versions", "date", "git_sha", "copy_bandwidth_gbps", "rows",
              "timing", "implementations", "complete"):
        assert k in d, k
    assert d["schema"] == report.SCHEMA and d["complete"] is True
    assert d["versions"]["torch"] == torch.__version__
    assert d["copy_bandwidth_gbps"] > 0
    assert d["copy_bytes"] == 32 << 20  # what the CPU run copied (the suite's 1 GiB is a GPU's)
    rows = d["rows"]
    assert rows
    for r in rows:
        assert ROW_KEYS <= set(r), ROW_KEYS - set(r)
        assert r["status"] in ("ok", "WRONG", "n/a", "error", "skipped", "unchecked")
    ops = {r["op"] for r in rows}
    assert ops == set(C.OPS)
    # eager torch on CPU is correct on every row it supports, and is timed
    for r in rows:
        if r["impl"] == "aten":
            assert r["status"] == "ok", r
            assert r["ms"] > 0 and r["gbps"] > 0 and r["sol"] > 0
            assert r["calls_per_timing"] >= 1 and r["estimate_ms"] > 0
    # cuDNN-off eager exists for batch and instance norm only: the others say n/a, not missing
    na = [r for r in rows if r["impl"] == "aten-native" and r["op"] == "layer_norm"]
    assert na and all(r["status"] == "n/a" for r in na)
    # every case has the same implementations
    impls_per_case = {}
    for r in rows:
        impls_per_case.setdefault(report.case_key(r), set()).add(r["impl"])
    assert len({frozenset(v) for v in impls_per_case.values()}) == 1


def test_quick_outputs(quick_run):
    _, _, out = quick_run
    summary = (out / "summary.md").read_text()
    assert "## Headline" in summary and "copy bandwidth" in summary
    pytest.importorskip("matplotlib")
    for name in report.PLOT_FILES:
        f = out / name
        assert f.exists() and f.stat().st_size > 1000
        assert f.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_suite_expansion_and_filters():
    suite = C.load_suite()
    cases = C.expand_suite(suite)
    by_op = {op: [c for c in cases if c.op == op] for op in C.OPS}
    # batch norm: 7 4-D/5-D shapes x 2 layouts + 2 2-D shapes, x 4 dtypes x 2 modes
    assert len(by_op["batch_norm"]) == (7 * 2 + 2) * 4 * 2
    assert len(by_op["layer_norm"]) == 9 * 4 and len(by_op["rms_norm"]) == 9 * 3
    assert len(by_op["group_norm"]) == 5 * 2 * 2 and len(by_op["instance_norm"]) == 2 * 2 * 2
    gn = by_op["group_norm"][0]
    assert gn.shape == (32, 256, 64, 64) and gn.groups == 32
    sel = C.expand_suite(suite, ops=["batch_norm"], shapes=["256x64x56x56"], dtypes=["bf16:fp32"],
                         layouts=["channels_last"], modes=["train"])
    assert len(sel) == 1 and sel[0].memory_format == torch.channels_last and sel[0].directions == ("fwd", "bwd")
    assert len(C.expand_suite(suite, ops=["layer_norm"], dtypes=["bf16"])) == 18  # bf16 inputs, both param dtypes
    assert len(C.expand_suite(suite, ops=["layer_norm"], dtypes=["bf16:bf16"])) == 9
    assert len(C.expand_suite(suite, ops=["group_norm"], shapes=["32x256x64x64/g32"])) == 4


def test_shapes_outside_the_suite():
    # a --shapes entry the suite lacks runs with the op's suite dtypes / layouts / modes where its rank
    # fits; suite shapes keep their suite form; an entry that fits no selected op is an error, not 0 cases
    suite = C.load_suite()
    sel = C.expand_suite(suite, ops=["layer_norm", "rms_norm", "batch_norm"], shapes=["16384x5120", "32768x768"])
    ln = [c for c in sel if c.op == "layer_norm"]
    assert {c.shape for c in ln} == {(16384, 5120), (32768, 768)} and len(ln) == 2 * 4
    assert len([c for c in sel if c.op == "rms_norm"]) == 2 * 3
    bn = [c for c in sel if c.op == "batch_norm"]  # (N, C) is a batch-norm shape too: train and eval, 4 dtypes
    assert {c.shape for c in bn} == {(16384, 5120), (32768, 768)} and len(bn) == 2 * 4 * 2
    gn = C.expand_suite(suite, ops=["group_norm"], shapes=["8x64x32x32/g16", "8x64x32x32:8"])
    assert {(c.shape, c.groups) for c in gn} == {((8, 64, 32, 32), 16), ((8, 64, 32, 32), 8)}
    assert all(c.layout in ("contiguous", "channels_last") for c in gn) and len(gn) == 2 * 2 * 2
    for bad in (["7x"], ["8x64x32x32/g6"], ["1x2x3x4x5x6"]):
        ops = ["group_norm"] if "/g" in bad[0] else ["layer_norm"]
        with pytest.raises(ValueError, match="no such input shape"):
            C.expand_suite(suite, ops=ops, shapes=bad)


def test_byte_accounting():
    case = C.Case("batch_norm", (256, 64, 56, 56), "bfloat16", "float32", "contiguous", "train")
    n = 256 * 64 * 56 * 56
    assert C.min_bytes(case, "fwd") == 2 * n * 2      # read x, write y
    assert C.min_bytes(case, "bwd") == 3 * n * 2      # read x and dy, write dx
    case32 = C.Case("layer_norm", (8192, 8192), "float32", "float32")
    assert C.min_bytes(case32, "fwd") == 2 * 8192 * 8192 * 4
    # rows carry bytes / ms consistently: GB/s and the SOL fraction of the copy bandwidth
    small = C.Case("layer_norm", (64, 32), "float32", "float32")
    rows = run_case(small, [AtenImpl(True)], _ctx(copy_gbps=10.0))
    for r in rows:
        assert r["bytes"] == C.min_bytes(small, r["direction"])
        assert math.isclose(r["gbps"], r["bytes"] / (r["ms"] * 1e-3) / 1e9, rel_tol=1e-9)
        assert math.isclose(r["sol"], r["gbps"] / 10.0, rel_tol=1e-9)


class _WrongForward(Impl):
    """Eager layer norm with a 5% scale error: fast enough, wrong."""

    name = "wrong-fwd"

    def build(self, case):
        return lambda x, w, b, rm, rv: functional_call(F, case, x, w, b, rm, rv) * 1.05


def _layer_norm_grads(ctx, dy):
    """The true layer norm's gradients for the (x, w, b) a Function saved."""
    x, w, b = ctx.saved_tensors
    with torch.enable_grad():
        xx, ww, bb = (t.detach().requires_grad_() for t in (x, w, b))
        y = F.layer_norm(xx, (x.shape[-1],), ww, bb, C.EPS)
        return torch.autograd.grad(y, (xx, ww, bb), dy)


class _BadGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w, b):
        ctx.save_for_backward(x, w, b)
        return F.layer_norm(x, (x.shape[-1],), w, b, C.EPS)

    @staticmethod
    def backward(ctx, dy):
        gx, gw, gb = _layer_norm_grads(ctx, dy)
        return gx, gw * 0.5, gb  # wrong weight gradient


class _WrongGrad(Impl):
    name = "wrong-grad"
    ops = ("layer_norm",)

    def build(self, case):
        return lambda x, w, b, rm, rv: _BadGrad.apply(x, w, b)


class _Raises(Impl):
    name = "raises"

    def build(self, case):
        def fn(*a):
            raise RuntimeError("deliberate failure")
        return fn


class _LogsBuilds(AtenImpl):
    """Eager ATen that records when each of its builds (one per timing round) happens."""

    def __init__(self, name, log):
        super().__init__(True)
        self.name, self.log = name, log

    def build(self, case):
        self.log.append(self.name)
        return super().build(case)


def test_timing_rounds_alternate_order_and_keep_the_fastest():
    case = C.Case("layer_norm", (64, 32), "float32", "float32")
    log = []
    ctx = _ctx()
    ctx.rounds = 3
    rows = run_case(case, [_LogsBuilds("a", log), _LogsBuilds("b", log), _WrongForward()], ctx)
    assert log == ["a", "b", "b", "a", "a", "b"]  # round 1 checks and times; 2 reversed; 3 forward
    for r in rows:
        if r["impl"] in ("a", "b"):
            assert r["status"] == "ok" and len(r["ms_rounds"]) == 3
            assert r["ms"] == min(r["ms_rounds"]) > 0
            assert math.isclose(r["gbps"], r["bytes"] / (r["ms"] * 1e-3) / 1e9, rel_tol=1e-9)
        else:  # a wrong implementation is timed once, and stays marked
            assert r["status"] == "WRONG" and len(r["ms_rounds"]) == 1


class _ScaledForwardExactGrad(torch.autograd.Function):
    """y 5 % off, gradients those of the true layer norm: a WRONG forward, a correct backward."""

    @staticmethod
    def forward(ctx, x, w, b):
        ctx.save_for_backward(x, w, b)
        return F.layer_norm(x, (x.shape[-1],), w, b, C.EPS) * 1.05

    @staticmethod
    def backward(ctx, dy):
        return _layer_norm_grads(ctx, dy)


class _WrongForwardOnly(Impl):
    name = "wrong-fwd-only"
    ops = ("layer_norm",)

    def build(self, case):
        return lambda x, w, b, rm, rv: _ScaledForwardExactGrad.apply(x, w, b)


def test_correct_backward_behind_wrong_forward_gets_every_round():
    """Its backward counts in the speedups, so it is timed in as many rounds (keeping the fastest) as the
    rows it is compared with: with one round it would carry the first-round penalty alone."""
    case = C.Case("layer_norm", (64, 32), "float32", "float32")
    ctx = _ctx()
    ctx.rounds = 2
    rows = run_case(case, [AtenImpl(True), _WrongForwardOnly()], ctx)
    st = {(r["impl"], r["direction"]): r for r in rows}
    assert st["wrong-fwd-only", "fwd"]["status"] == "WRONG"
    assert st["wrong-fwd-only", "bwd"]["status"] == "ok"
    assert len(st["wrong-fwd-only", "bwd"]["ms_rounds"]) == len(st["aten", "bwd"]["ms_rounds"]) == 2
    assert st["wrong-fwd-only", "bwd"]["ms"] == min(st["wrong-fwd-only", "bwd"]["ms_rounds"])


class _WrongThenRaisingBackward(AtenImpl):
    """A backward that is WRONG in the first round and raises in the second."""
    def __init__(self):
        super().__init__(True)
        self.name, self.builds = "wrong-then-raising", 0

    def build(self, case):
        self.builds += 1
        raises = self.builds >= 2

        class Grad(torch.autograd.Function):
            @staticmethod
            def forward(ctx, y):
                return y.view_as(y)

            @staticmethod
            def backward(ctx, g):
                if raises:
                    raise RuntimeError("round-2 failure")
                return g * 1.5

        return lambda x, w, b, rm, rv: Grad.apply(F.layer_norm(x, x.shape[-1:], w, b, C.EPS))


def test_a_later_timing_round_failure_keeps_the_rows_status():
    # the second round's exception used to overwrite WRONG with "error", and the row left the WRONG counts
    case = C.Case("layer_norm", (64, 32), "float32", "float32")
    ctx = _ctx()
    ctx.rounds = 2
    rows = run_case(case, [AtenImpl(True), _WrongThenRaisingBackward()], ctx)
    bwd = next(r for r in rows if r["impl"] == "wrong-then-raising" and r["direction"] == "bwd")
    assert bwd["status"] == "WRONG" and "timing round 2: " in bwd["note"] and "round-2 failure" in bwd["note"]
    assert len(bwd["ms_rounds"]) == 1 and bwd["ms"] == bwd["ms_rounds"][0]


def test_cpu_summary_says_it_is_not_a_gpu_measurement(quick_run):
    p, js, out = quick_run
    summary = (out / "summary.md").read_text()
    head = summary.split("## Headline")[0]
    assert "Not a GPU measurement" in head
    assert "timed on CUDA" not in summary and "CUDA graph" not in summary
    assert "Not a GPU measurement" in p.stdout.split("### headline")[-1]   # the tail a remote run shows
    d = _strict_json(js)
    d["device"] = dict(d["device"], device="cuda", gpu_name="NVIDIA H200")
    assert "Not a GPU measurement" not in report.summary_markdown(d)
    assert "Not a GPU measurement" not in report.console_report(d)


def test_wrong_implementation_is_flagged():
    case = C.Case("layer_norm", (64, 32), "float32", "float32")
    rows = run_case(case, [AtenImpl(True), _WrongForward(), _WrongGrad(), _Raises()], _ctx())
    st = {(r["impl"], r["direction"]): r for r in rows}
    assert st["aten", "fwd"]["status"] == "ok" and st["aten", "bwd"]["status"] == "ok"
    assert st["wrong-fwd", "fwd"]["status"] == "WRONG"
    assert st["wrong-fwd", "fwd"]["ms"] > 0          # timed anyway, and marked
    assert "y err" in st["wrong-fwd", "fwd"]["note"]
    assert st["wrong-grad", "fwd"]["status"] == "ok"
    assert st["wrong-grad", "bwd"]["status"] == "WRONG" and "dw err" in st["wrong-grad", "bwd"]["note"]
    assert st["wrong-grad", "bwd"]["errors"]["dx"] < 1e-6
    assert st["raises", "fwd"]["status"] == "error" and "deliberate failure" in st["raises", "fwd"]["note"]
    table = report.op_tables(rows, "layer_norm")
    assert "**WRONG**" in table
    # a wrong row never counts towards a speedup
    assert report.speedup(st["aten", "fwd"], st["wrong-fwd", "fwd"]) is None


def test_headline_counts_normkit_and_peer_wrong_rows_apart():
    case = C.Case("layer_norm", (64, 32), "float32", "float32")
    rows = run_case(case, [NormkitImpl(), AtenImpl(True), _WrongForward()], _ctx())
    assert {r["impl"] for r in rows if r["status"] == "WRONG"} == {"wrong-fwd"}
    head = report.headline(rows).splitlines()
    cols = [c.strip() for c in head[0].strip("|").split("|")]
    fwd = next([c.strip() for c in line.strip("|").split("|")] for line in head[2:] if "| fwd |" in line)
    assert fwd[cols.index("normkit WRONG / error rows")] == "0"
    assert fwd[cols.index("peer WRONG rows")] == "wrong-fwd 1"
    assert fwd[cols.index("normkit timed")] == "1"
    assert fwd[cols.index("vs wrong-fwd (geomean, rows)")] == ""  # no correct row to compare with
    assert fwd[cols.index("vs aten (geomean, rows)")].endswith("x (1/1)")
    for r in rows:  # a normkit row that raised is a failure of the headline, not a row left out
        if r["impl"] == "normkit" and r["direction"] == "fwd":
            r["status"] = "error"
    head = report.headline(rows).splitlines()
    fwd = next([c.strip() for c in line.strip("|").split("|")] for line in head[2:] if "| fwd |" in line)
    assert fwd[cols.index("normkit WRONG / error rows")] == "1" and fwd[cols.index("normkit timed")] == "0"


def test_wrong_batch_norm_running_stats_flagged():
    class NoStats(Impl):
        name = "no-running-stats"
        ops = ("batch_norm",)

        def build(self, case):
            return lambda x, w, b, rm, rv: F.batch_norm(x, None, None, w, b, True, C.MOMENTUM, C.EPS)

    case = C.Case("batch_norm", (8, 4, 5, 5), "float32", "float32", "channels_last", "train")
    rows = run_case(case, [AtenImpl(True), NoStats()], _ctx())
    st = {(r["impl"], r["direction"]): r for r in rows}
    assert st["aten", "fwd"]["status"] == "ok", st["aten", "fwd"]
    assert st["no-running-stats", "fwd"]["status"] == "WRONG"
    assert "running_mean" in st["no-running-stats", "fwd"]["note"]


def test_peer_without_op_or_device_is_na():
    case = C.Case("batch_norm", (8, 4, 5, 5), "float32", "float32", "contiguous", "eval")
    rows = run_case(case, [LigerImpl(), AtenImpl(False)], _ctx())
    st = {(r["impl"], r["direction"]): r for r in rows}
    assert st["liger", "fwd"]["status"] == "n/a"
    assert st["aten-native", "fwd"]["status"] == "ok"
    assert [r["direction"] for r in rows if r["impl"] == "liger"] == ["fwd"]  # eval: forward only


def test_budget_skips_rows():
    ctx = _ctx()
    ctx.budget_s = 0.0
    rows = run_case(C.Case("rms_norm", (16, 8), "float32", "float32"), [AtenImpl(True)], ctx)
    assert rows and all(r["status"] == "skipped" for r in rows)


def test_accuracy_section():
    suite = C.load_suite()
    acc = run_accuracy(["rms_norm"], suite, [AtenImpl(True), _WrongForward()], _ctx())
    kinds = {r["input"] for r in acc}
    assert kinds == {"randn", "randn+1000"}
    assert all(r["status"] == "ok" for r in acc if r["impl"] == "aten")
    assert all(r["status"] == "WRONG" for r in acc if r["impl"] == "wrong-fwd")
    assert "rms_norm" in report.accuracy_table(acc)


def test_models_tiny_cpu():
    from normkit.bench import models as M

    rows = M.run_models(["tiny"], "cpu", steps=3, warmup=1)
    assert [r["setting"] for r in rows] == ["eager", "normkit"]
    e = rows[0]
    assert e["status"] == "ok", e
    assert e["step_ms"] > 0 and len(e["losses"]) == 3 and e["norm_ms"] > 0
    assert 0 < e["norm_share"] <= 1
    assert "tiny" in report.models_table(rows)
    with pytest.raises(ValueError):
        M.resolve(["no-such-model"])
    assert M.resolve(["resnet50"]) == ["resnet50", "resnet50-cl"]


class _CountingProgress(Progress):
    """The bench's progress bar, keeping its total and the units reported against it."""

    last = None

    def __init__(self, total, *a, **k):
        super().__init__(total, *a, **k)
        self.reported = 0
        _CountingProgress.last = self

    def update(self, n=1, label=""):
        self.reported += n
        super().update(n, label)


def test_models_are_resolved_once(tmp_path, monkeypatch):
    # `--models resnet50-nchw` resolved to the key `resnet50`, which run_models resolved again as the alias for
    # both layouts: the channels_last model ran too, past the progress bar's total
    from normkit.bench import cli
    from normkit.bench import models as M

    ran = []

    def fake_run_one(name, setting, device, steps, warmup, seed):
        ran.append((name, setting))
        return {"model": name, "setting": setting, "status": "ok", "step_ms": 1.0, "final_loss": 1.0}

    monkeypatch.setattr(M, "run_one", fake_run_one)
    monkeypatch.setattr(cli, "Progress", _CountingProgress)
    js = tmp_path / "b.json"
    assert cli.main(["--models", "resnet50-nchw", "--steps", "1", "--json", str(js), "--no-progress"]) == 0
    assert ran == [("resnet50", "eager"), ("resnet50", "normkit")]
    assert M.MODELS["resnet50"][2] == "contiguous"
    assert [r["model"] for r in _strict_json(js)["models"]] == ["resnet50", "resnet50"]
    bar = _CountingProgress.last
    assert bar.reported == bar.total == 1 + len(ran)  # the copy bandwidth, then one unit per model row


def test_norm_kernel_names():
    from normkit.bench.models import NORM_KERNEL

    for name in ("void at::native::batch_norm_collect_statistics_kernel<float>", "bn_fw_tr_1C11_kernel_NCHW",
                 "void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<float, float, false>",
                 "triton_red_fused__native_batch_norm_legit_functional_0", "_layer_norm_forward_kernel",
                 "void cudnn::bn_bw_1C11_singleread", "nhwcBatchNormFwd"):
        assert NORM_KERNEL.search(name), name
    for name in ("ampere_sgemm_128x64_nn", "void at::native::vectorized_elementwise_kernel<4, add>",
                 "triton_poi_fused_relu_0", "cutlass_80_tensorop_bf16_s16816gemm_relu_bf16"):
        assert not NORM_KERNEL.search(name), name


def test_progress_bar_non_tty():
    buf = io.StringIO()
    p = Progress(40, "bench", stream=buf)
    for _ in range(40):
        p.update(1, "x")
    p.close()
    lines = buf.getvalue().splitlines()
    assert 5 <= len(lines) <= 25 and "40/40" in lines[-1]


def test_cli_rejects_bad_arguments(capsys):
    from normkit.bench.cli import main

    assert main(["--quick", "--ops", "nope"]) == 2
    assert main(["--quick", "--peers", "nope"]) == 2
    assert main(["--quick", "--dry-run", "--ops", "rms_norm"]) == 0
    assert "rms_norm" in capsys.readouterr().out


def test_blank_ops_is_the_usage_error_check_gives(capsys):
    # `bench --ops ""` ran every op (`check --ops ""` was a usage error already)
    from normkit.bench.cli import main as bench
    from normkit.conformance.cli import main as check

    assert check(["--ops", ""]) == 2
    check_err = capsys.readouterr().err
    assert bench(["--quick", "--no-progress", "--ops", ""]) == 2
    bench_err = capsys.readouterr().err
    assert "--ops names no op family" in check_err and "--ops names no op family" in bench_err


def test_help_explains_every_option_and_lists_every_model_name():
    # --seed and --no-progress had no help; --models listed some of the names it takes
    from normkit.bench import models as M
    from normkit.bench.cli import build_parser

    options = {a.option_strings[-1]: a.help for a in build_parser()._actions}
    assert all(options.values()), [flag for flag, text in options.items() if not text]
    listed = options["--models"].replace(",", " ").replace("(", " ").split()
    assert set(M.MODELS) | set(M.ALIASES) <= set(listed)


@pytest.mark.parametrize("suite, msg", [
    ([1, 2], "a JSON object with an entry per op is expected, not a list"),
    ({"batch_norm": {"shapes": [[4, 3]]}}, "batch_norm: 'dtypes' must be a non-empty list"),
    ({"layer_norm": {"shapes": "abc", "dtypes": ["bf16"]}}, "layer_norm: 'shapes' must be a non-empty list"),
    ({"rms_norm": {"shapes": [[64, 0]], "dtypes": ["bf16"]}}, "rms_norm: shape [64, 0] is not a list of two or more"),
    ({"batch_norm": {"shapes": [[4, 3]], "dtypes": [["bf16", "fp32", "fp16"]]}}, "is neither a name nor an"),
    ({"batch_norm": {"shapes": [[4, 3]], "dtypes": ["bf17"]}}, "unknown dtype 'bf17'"),
    ({"batch_norm": {"shapes": [[4, 3, 2, 2]], "dtypes": ["bf16"], "layouts": ["weird"]}}, "unknown layouts ['weird']"),
    ({"batch_norm": {"shapes": [[4, 3]], "dtypes": ["bf16"], "modes": ["training"]}}, "unknown modes ['training']"),
])
def test_cli_rejects_a_malformed_suite_before_any_row(tmp_path, capsys, suite, msg):
    """A suite file of the wrong structure is a usage error up front (it was a traceback from the expansion)."""
    from normkit.bench.cli import main

    path = tmp_path / "suite.json"
    path.write_text(json.dumps(suite))
    assert main(["--quick", "--no-progress", "--suite", str(path), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "bench: cannot read suite: " in err and msg in err, err
    C.check_suite(C.load_suite())  # the packaged suite passes


def test_cli_output_paths_and_steps_are_checked_before_the_run(tmp_path, capsys):
    # a bad --out crashed after the run; a bad --json printed "wrote" and exited 0; --steps 0 gave error rows
    from normkit.bench.cli import main

    a_file = tmp_path / "file"
    a_file.write_text("x")
    assert main(["--quick", "--no-progress", "--out", str(a_file)]) == 2
    assert main(["--quick", "--no-progress", "--json", str(a_file / "r.json")]) == 2  # under a file
    assert main(["--quick", "--no-progress", "--json", str(tmp_path)]) == 2
    assert capsys.readouterr().err.count("cannot write there") == 3
    # a missing folder above --json is made, as --out's (session 37: a device call lost to one)
    assert main(["--quick", "--no-progress", "--dry-run", "--json", str(tmp_path / "no" / "r.json")]) == 0
    assert (tmp_path / "no").is_dir()
    with pytest.raises(SystemExit) as e:
        main(["--models", "tiny", "--steps", "0"])
    assert e.value.code == 2 and "--steps: must be at least 1" in capsys.readouterr().err


@pytest.mark.parametrize("argv, msg", [
    (["--layouts", "channel_last"], "unknown layout(s) ['channel_last']"),
    (["--modes", "training"], "unknown mode(s) ['training']"),
    (["--dtype-slots", "x"], "--dtype-slots takes integers"),
    (["--ops", "layer_norm", "--dtypes", "fp64"], "no suite case matches"),
    (["--ops", "layer_norm", "--layouts", "channels_last"], "no suite case matches"),
])
def test_cli_filters_selecting_nothing_are_usage_errors(argv, msg, capsys):
    # a misspelt or empty filter used to run nothing, print "0 rows" and exit 0 (or crash, for --dtype-slots)
    from normkit.bench.cli import main

    assert main(["--quick", "--no-progress"] + argv) == 2
    assert msg in capsys.readouterr().err


def test_normkit_impl_reports_missing_functional(monkeypatch):
    impl = NormkitImpl()
    impl._err = "ModuleNotFoundError: No module named 'normkit.functional'"
    rows = run_case(C.Case("layer_norm", (16, 8), "float32", "float32"), [impl], _ctx())
    assert all(r["status"] == "error" for r in rows)


def test_console_report_lists_the_errors_as_the_summary_does():
    # the console showed "error" cells without their reason; only summary.md had the "Errors" list
    impl = NormkitImpl()
    impl._err = "ModuleNotFoundError: No module named 'normkit.functional'"
    rows = run_case(C.Case("layer_norm", (16, 8), "float32", "float32"), [impl, AtenImpl(True)], _ctx())
    result = {"device": {"device": "cpu"}, "quick": True, "rows": rows}
    console, summary = report.console_report(result), report.summary_markdown(result)
    listed = [ln for ln in console.splitlines() if ln.startswith("- normkit layer_norm")]
    assert listed and all(impl._err in ln for ln in listed)
    assert console.index("### errors") < console.index("### headline")
    assert all(ln in summary.split("## Errors")[1] for ln in listed)
    assert not any(ln.startswith("- aten") for ln in console.splitlines())  # the rows that ran are no errors


@pytest.mark.parametrize("unavailable, reason", [("No module named 'liger_kernel'", "No module named 'liger_kernel'"),
                                                  (None, "it runs on CUDA only")])
def test_peers_rows_read_na_with_the_reason_on_every_device(unavailable, reason, monkeypatch, capsys):
    # on CPU `--peers liger flaggems` gave tables of n/a without a word why (the reason was printed on CUDA only)
    from normkit.bench import cli

    monkeypatch.setattr(LigerImpl, "unavailable", lambda self: unavailable)
    assert cli.main(["--quick", "--no-progress", "--ops", "rms_norm", "--dtypes", "fp32", "--peers", "liger"]) == 0
    captured = capsys.readouterr()
    assert f"bench: liger's rows read n/a: {reason}" in captured.err
    assert "| n/a |" in captured.out


def test_norm_share_attribution_cuda_logic():
    """The CUDA branch of the profiler accounting, on hand-made profiler events."""
    from types import SimpleNamespace as NS

    from torch.autograd import DeviceType

    from normkit.bench.models import _kernel_times

    clock = [0.0]

    def dev(name, us):  # device events back to back on the timeline
        start = clock[0]
        clock[0] += us
        return NS(name=name, device_type=DeviceType.CUDA, kernels=[], cpu_parent=None,
                  time_range=NS(elapsed_us=lambda us=us: us, start=start, end=start + us))

    def cpu(name, kernels, parent=None):
        return NS(name=name, device_type=DeviceType.CPU, cpu_parent=parent,
                  kernels=[NS(name=k, duration=d) for k, d in kernels])

    bwd = cpu("autograd::engine::evaluate_function: NativeBatchNormBackward0", [])
    events = [
        cpu("aten::cudnn_convolution", [("sm90_xmma_fprop", 50.0)]),
        cpu("aten::native_batch_norm", [("batch_norm_collect_statistics_kernel", 10.0),
                                        ("unrolled_elementwise_kernel_for_multi_outputs", 1.0)]),
        cpu("aten::native_batch_norm_backward", [("batch_norm_backward_kernel", 20.0)], parent=bwd),
        cpu("aten::add_", [("vectorized_elementwise_kernel", 5.0)], parent=bwd),  # under a norm node
        cpu("aten::mm", [("_fwd_rows_kernel", 4.0)]),  # a normkit kernel name, unusual parent
        bwd,
    ]
    for e in list(events):
        for k in e.kernels:
            events.append(dev(k.name, k.duration))
    events.append(dev("rms_norm_kernel_no_cpu_op", 2.0))  # a named kernel no CPU op claims
    # a record_function range kineto also puts on the GPU timeline: not kernel time
    annotation = dev("Optimizer.step#SGD.step", 30.0)
    annotation.is_user_annotation = True
    events.append(annotation)
    prof = NS(events=lambda: events)
    total, norm, by_name, top, busy, norm_busy, other = _kernel_times(prof, "cuda")
    assert math.isclose(busy, total) and math.isclose(norm_busy, by_name)  # nothing overlaps here
    assert math.isclose(total, 92e-3)
    assert math.isclose(norm, (10 + 1 + 20 + 5 + 4 + 2) * 1e-3)
    assert math.isclose(by_name, (10 + 20 + 4 + 2) * 1e-3)
    assert "sm90_xmma_fprop" not in top
    # the rest of the kernel time, by name: the conv, and the add only where no norm op launched it (none here)
    assert math.isclose(other["sm90_xmma_fprop"], 50e-3)
    assert math.isclose(other.get("vectorized_elementwise_kernel", 0.0), 0.0, abs_tol=1e-12)
    assert math.isclose(sum(other.values()), total - norm)


def test_union_of_kernel_intervals():
    """GPU busy time: overlapping kernels (programmatic dependent launch) count once, gaps not at all."""
    from normkit.bench.models import _union_us

    assert _union_us([]) == 0.0
    assert math.isclose(_union_us([(0, 10), (5, 12), (20, 25), (21, 22)]), 17.0)
    assert math.isclose(_union_us([(3, 4), (0, 10)]), 10.0)


# --- the run plan's machinery: budgets, scoped peers, interruption, peer adapters' CUDA-free parts ---------

class _Scoped(AtenImpl):
    """Eager ATen posing as a compiling peer."""

    scoped = True

    def __init__(self):
        super().__init__(True)
        self.name = "scoped"


def test_scoped_peer_gives_way_to_the_rows_still_to_come():
    import time

    ctx = _ctx()
    case = C.Case("layer_norm", (16, 8), "float32", "float32")
    ctx.deadline = time.time() + 30.0
    ctx.scoped_reserve_s = 60.0          # the rest of the slice needs more than is left
    rows = run_case(case, [AtenImpl(True), _Scoped()], ctx)
    st = {(r["impl"], r["direction"]): r for r in rows}
    assert st["aten", "fwd"]["status"] == "ok"
    assert st["scoped", "fwd"]["status"] == "skipped" and "budget" in st["scoped", "fwd"]["note"]
    ctx.scoped_reserve_s = 1.0
    rows = run_case(case, [_Scoped()], ctx)
    assert all(r["status"] == "ok" for r in rows)


def test_estimate_counts_dynamic_compile_graphs_once():
    from normkit.bench.impls import CompileImpl, make_impls
    from normkit.bench.runner import estimate_seconds

    suite = C.load_suite()
    cases = C.expand_suite(suite, ops=["layer_norm"], dtypes=["bf16:bf16"])
    static = estimate_seconds(cases, [CompileImpl(False)], scope="all")
    dynamic = estimate_seconds(cases, [CompileImpl(True)], scope="all")
    assert dynamic < static / 2
    # every peer, the whole suite: minutes, not hours; scoped peers last in the run order
    impls = make_impls(["aten", "aten-native", "liger", "compile", "flaggems"], compile_dynamic=True)
    assert [i.name for i in impls][-2:] == ["compile", "flaggems"]
    t = estimate_seconds(C.expand_suite(suite), impls, scope="all")
    assert 300 < t < 3000


def test_peer_adapters_cuda_free_parts():
    from normkit.bench.impls import FlagGemsImpl, fast_autotune

    fg = FlagGemsImpl()
    big = C.Case("group_norm", (4, 64, 32, 128, 128), "float32", "float32", "contiguous", "train", 8)
    ok = C.Case("group_norm", (32, 256, 64, 64), "bfloat16", "bfloat16", "contiguous", "train", 32)
    assert "Triton" in fg.supports(big, "cuda")
    assert fg.supports(ok, "cuda") is None
    assert fg.supports(ok, "cpu")  # CUDA only
    # blocks whose Triton compile alone would take minutes: skipped, per direction
    assert fg.skip(C.Case("rms_norm", (512, 262144), "bfloat16", "bfloat16"), "fwd") is None
    assert "262144" in fg.skip(C.Case("rms_norm", (512, 262144), "bfloat16", "bfloat16"), "bwd")
    assert fg.skip(C.Case("rms_norm", (4096, 16384), "bfloat16", "bfloat16"), "bwd") is None
    assert fg.skip(C.Case("rms_norm", (2048, 65536), "bfloat16", "bfloat16"), "bwd")
    assert fg.skip(C.Case("group_norm", (8, 128, 256, 256), "bfloat16", "bfloat16", groups=32), "fwd")
    assert fg.skip(ok, "fwd") is None and "weight/bias" in fg.skip(ok, "bwd")
    assert fg.skip(C.Case("group_norm", (64, 1280, 16, 16), "bfloat16", "bfloat16", groups=32), "bwd") is None
    # Liger's group norm copies a channels_last input (ensure_contiguous): it runs, the copy is timed
    cl = C.Case("group_norm", (32, 256, 64, 64), "bfloat16", "bfloat16", "channels_last", "train", 32)
    assert LigerImpl().supports(cl, "cuda") is None
    assert "65536" in LigerImpl().supports(C.Case("rms_norm", (512, 262144), "bfloat16", "bfloat16"), "cuda")
    # FlagGems' autotuning runs with a cheaper do_bench, restored afterwards
    tt = pytest.importorskip("triton.testing")
    before = tt.do_bench.__defaults__
    with fast_autotune(5, 20):
        assert tt.do_bench.__defaults__[:2] == (5, 20)
    assert tt.do_bench.__defaults__ == before


def test_skipped_backward_keeps_the_forward():
    class NoBwd(AtenImpl):
        def skip(self, case, direction):
            return "too slow to compile" if direction == "bwd" else None

    rows = run_case(C.Case("layer_norm", (16, 8), "float32", "float32"), [NoBwd(True)], _ctx())
    st = {r["direction"]: r for r in rows}
    assert st["fwd"]["status"] == "ok" and st["fwd"]["ms"] > 0
    assert st["bwd"]["status"] == "skipped" and st["bwd"]["note"] == "too slow to compile"


def test_interrupted_run_still_writes_its_outputs(tmp_path, monkeypatch, capsys):
    from normkit.bench import cli

    real = cli.run_case
    calls = []

    def run_case_then_stop(*a, **k):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real(*a, **k)

    monkeypatch.setattr(cli, "run_case", run_case_then_stop)
    js = tmp_path / "b.json"
    rc = cli.main(["--quick", "--ops", "rms_norm", "--json", str(js), "--out", str(tmp_path), "--no-progress",
                   "--save-every", "0"])
    assert rc == 0
    d = _strict_json(js)
    assert d["interrupted"] and d["complete"] is False
    assert len(d["rows"]) == 2 * 3 * 2   # two cases x (normkit, aten, aten-native) x (fwd, bwd) before it
    assert "interrupted" in (tmp_path / "summary.md").read_text()


def test_models_and_accuracy_run_before_the_suite_rows(tmp_path, capsys):
    from normkit.bench import cli

    js = tmp_path / "b.json"
    rc = cli.main(["--quick", "--ops", "rms_norm", "--perf", "--models", "tiny", "--steps", "2", "--accuracy",
                   "--budget", "1e-9", "--json", str(js), "--no-progress"])
    assert rc == 0
    d = _strict_json(js)
    # a budget spent at once: models and accuracy were reached first (they check the budget per model / row
    # too, so they read skipped), and the suite rows all read skipped
    assert d["models"] and d["accuracy"] and d["rows"]
    assert all(r["status"] == "skipped" for r in d["rows"])
    # ... and are counted as such: the run is not complete (it said "complete": true with every row skipped)
    n = len(d["rows"]) + len(d["accuracy"]) + len(d["models"])
    assert d["skipped_rows"] == {"all": n, "budget": n} and d["complete"] is False
    assert f"; {n} skipped, {n} of them for --budget" in capsys.readouterr().out


@pytest.mark.parametrize("budget", ["0", "-5", "nan"])
def test_a_budget_of_no_time_is_a_usage_error(budget, capsys):
    from normkit.bench import cli

    with pytest.raises(SystemExit) as e:
        cli.main(["--quick", "--budget", budget])
    assert e.value.code == 2 and "--budget" in capsys.readouterr().err


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_graph_calls_do_not_depend_on_host_time():
    """Two implementations of the same device work, one with ~2 ms of host time a call: the graph that times them
    has the same number of calls (sized from the device time of a one-rotation graph, not the eager estimate), and
    their per-call times agree."""
    timer = Timer("cuda", warmup_ms=2.0, rep_ms=20.0)
    xs = [torch.randn(1 << 20, device="cuda") for _ in range(4)]
    ys = [torch.empty_like(x) for x in xs]

    def fast(i):
        return lambda: torch.mul(xs[i], 2.0, out=ys[i])

    def slow(i):
        def f():
            time.sleep(0.002)  # host time only: nothing of it is captured
            torch.mul(xs[i], 2.0, out=ys[i])
        return f

    ms_fast, name = timer.time([fast(i) for i in range(4)])
    calls_fast = timer.last_calls
    ms_slow, _ = timer.time([slow(i) for i in range(4)])
    assert name == "cuda-graph"
    assert timer.last_calls == calls_fast > 4
    assert abs(ms_slow - ms_fast) / ms_fast < 0.2


@pytest.mark.skipif(torch.cuda.is_available(), reason="the note is for machines without a GPU")
def test_dry_run_says_it_plans_a_gpu_run_and_writes_no_json(capsys, tmp_path):
    from normkit.bench.cli import main

    path = tmp_path / "r.json"
    assert main(["--dry-run", "--ops", "rms_norm", "--json", str(path)]) == 0
    err = capsys.readouterr().err
    assert "the cases a CUDA run would time" in err and f"--dry-run writes no {path}" in err
    assert not path.exists()
