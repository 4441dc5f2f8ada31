"""The command line: JSON schema, exit status, repro lines, --case/--ops filters, --impl MODULE."""

import json
import os
import sys
import types

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))

import delegate_backend  # noqa: E402

from normkit.conformance.cli import main  # noqa: E402

ORACLE = ["--oracle", "torch64_oracle"]


def test_json_schema_and_exit_status(tmp_path, capsys):
    path = tmp_path / "report.json"
    rc = main(["--impl", "torch", "--ops", "rms_norm,group_norm", "--json", str(path), "--quiet"] + ORACLE)
    assert rc == 0
    data = json.loads(path.read_text())
    assert isinstance(data["cases"], int) and isinstance(data["passed"], int) and isinstance(data["failed"], int)
    assert data["cases"] == data["passed"] + data["failed"] and data["failed"] == 0 and data["cases"] > 50
    assert data["results"]
    for r in data["results"]:
        assert set(r) == {"op", "case", "rule", "passed", "detail"}
        assert isinstance(r["passed"], bool) and isinstance(r["detail"], str)
    assert {r["case"].split("/")[0] for r in data["results"]} <= {
        "native_group_norm", "F.group_norm", "native_group_norm_backward", "_fused_rms_norm", "rms_norm",
        "F.rms_norm"}
    out = capsys.readouterr().out
    assert "rms_norm" in out and "group_norm" in out and "batch_norm " not in out


@pytest.fixture
def broken_backend(monkeypatch):
    """An --impl MODULE whose native_batch_norm returns a channels_last input's output contiguous."""
    mod = types.ModuleType("nk_test_broken_cl")
    for k, v in vars(delegate_backend).items():
        if not k.startswith("__"):
            setattr(mod, k, v)

    def native_batch_norm(*args):
        out, m, s = delegate_backend.native_batch_norm(*args)
        return out.contiguous(), m, s

    mod.native_batch_norm = native_batch_norm
    monkeypatch.setitem(sys.modules, "nk_test_broken_cl", mod)
    return mod.__name__


def test_failure_exit_status_and_repro(tmp_path, capsys, broken_backend):
    path = tmp_path / "r.json"
    rc = main(["--impl", "nk_test_broken_cl", "--ops", "batch_norm", "--case", "channels_last", "--quiet",
               "--json", str(path)] + ORACLE)
    assert rc == 1
    out = capsys.readouterr().out
    assert "FAIL native_batch_norm/" in out and "[meta]" in out
    repro = [ln.split("repro: ")[1] for ln in out.splitlines() if "repro: " in ln][0]
    assert repro.startswith("python -m normkit check --impl nk_test_broken_cl")
    data = json.loads(path.read_text())
    assert data["failed"] > 0 and any(not r["passed"] and r["rule"] == "meta" for r in data["results"])
    # the repro line reruns exactly that case, and it fails again
    argv = repro.split()[4:]
    rc = main([a.strip("'") for a in argv] + ["--quiet"] + ORACLE)
    assert rc == 1
    assert "0 of 1 cases passed, 1 FAILED" in capsys.readouterr().out


def test_failures_not_shown_are_counted_and_located(tmp_path, capsys, broken_backend):
    # --max-failures 0 printed an empty "failures:" header, then "... and 13 more failed rule(s); see --json"
    # whether or not --json was given
    argv = ["--impl", broken_backend, "--ops", "batch_norm", "--case", "channels_last", "--quiet"] + ORACLE
    assert main(argv + ["--max-failures", "0"]) == 1
    out = capsys.readouterr().out
    assert "failures:" not in out and "FAIL " not in out and "... and" not in out
    hidden = [ln for ln in out.splitlines() if "failed rule(s) not shown" in ln]
    assert len(hidden) == 1 and hidden[0].endswith("(--json FILE lists them all)")
    n = int(hidden[0].split()[0])
    path = tmp_path / "r.json"
    assert main(argv + ["--max-failures", "1", "--json", str(path)]) == 1
    out = capsys.readouterr().out
    assert "\nfailures:\nFAIL " in out and out.count("FAIL ") == 1
    assert f"... and {n - 1} more failed rule(s) not shown (all are in {path})" in out
    assert sum(not r["passed"] for r in json.loads(path.read_text())["results"]) == n


def test_progress_total_is_the_case_count(tmp_path, capsys):
    # the bar counted the torch-only error cases that normkit skips: 33 steps for 30 cases (848 for 845 in all)
    path = tmp_path / "r.json"
    assert main(["--ops", "batch_norm", "--case", "/err_", "--json", str(path)]) == 0
    last = capsys.readouterr().err.strip().splitlines()[-1]
    done, total = last.split("] ")[1].split()[0].split("/")
    cases = json.loads(path.read_text())["cases"]
    assert int(done) == int(total) == cases and cases > 0


def test_ctrl_c_reports_what_ran(tmp_path, capsys, monkeypatch):
    # Ctrl-C used to end check in a traceback, without the table or the JSON of the cases already checked
    from normkit.conformance.runner import Runner

    real_run_case = Runner.run_case
    calls = []

    def run_case_then_ctrl_c(self, case):
        calls.append(case.name)
        if len(calls) == 5:
            raise KeyboardInterrupt
        return real_run_case(self, case)

    monkeypatch.setattr(Runner, "run_case", run_case_then_ctrl_c)
    path = tmp_path / "r.json"
    assert main(["--impl", "torch", "--ops", "rms_norm", "--quiet", "--json", str(path)] + ORACLE) == 130
    out = capsys.readouterr().out
    assert "INTERRUPTED (Ctrl-C): 4 of " in out
    row = next(ln for ln in out.splitlines() if ln.startswith("rms_norm "))
    assert row.split()[1:4] == ["4", "4", "0"]  # cases, passed, failed
    assert out.rstrip().splitlines()[-1].startswith("4 of 4 cases passed; INTERRUPTED")
    data = json.loads(path.read_text())
    assert data["cases"] == 4 and data["meta"]["interrupted"] is True
    assert {r["case"] for r in data["results"]} == set(calls[:4])


def test_header_names_the_normkit_path_checked(tmp_path, capsys, monkeypatch):
    # check did not say whether it checked normkit's Triton kernels or its reference
    from normkit import kernels
    from normkit.conformance.cli import normkit_path

    argv = ["--ops", "rms_norm", "--case", "_fused_rms_norm/4x5x32_small_eps_default/fp32", "--exact", "--quiet"]
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    path = tmp_path / "r.json"
    assert main(argv + ["--json", str(path)]) == 0
    header = capsys.readouterr().out.splitlines()[1]
    assert header == "normkit path: " + normkit_path("cpu")
    assert json.loads(path.read_text())["meta"]["normkit_path"] == normkit_path("cpu")
    if kernels.available():
        assert normkit_path("cpu").startswith("reference (CPU; set TRITON_INTERPRET=1")
        monkeypatch.setenv("TRITON_INTERPRET", "1")
        assert normkit_path("cpu").startswith("Triton kernels (interpreter")
    # torch's own kernels are checked: no normkit path to name
    assert main(argv + ["--impl", "torch", "--json", str(path)] + ORACLE) == 0
    assert "normkit path" not in capsys.readouterr().out
    assert json.loads(path.read_text())["meta"]["normkit_path"] is None


def test_json_records_the_run_setting_and_the_table(tmp_path, capsys):
    # check's JSON lacked the date, versions, git sha and host that bench's has, and the per-family table
    import datetime
    import platform

    import torch

    import normkit

    path = tmp_path / "r.json"
    assert main(["--ops", "rms_norm,group_norm", "--no-errors", "--quiet", "--json", str(path)]) == 0
    out = capsys.readouterr().out
    data = json.loads(path.read_text())
    meta = data["meta"]
    assert datetime.datetime.fromisoformat(meta["date"]).tzinfo is not None
    assert meta["versions"]["normkit"] == normkit.__version__ and meta["versions"]["torch"] == torch.__version__
    assert meta["versions"]["python"] == platform.python_version() and "triton" in meta["versions"]
    assert meta["device"]["device"] == "cpu" and meta["device"]["host"] == platform.node()
    assert meta["gpu_name"] is None and "git_sha" in meta
    families = data["families"]
    assert set(families) == {"rms_norm", "group_norm"}
    assert sum(f["cases"] for f in families.values()) == data["cases"]
    for name, f in families.items():
        row = next(ln for ln in out.splitlines() if ln.startswith(name + " ")).split()
        assert [int(v) for v in row[1:4]] == [f["cases"], f["passed"], f["failed"]]
        assert float(row[4]) == pytest.approx(f["worst_err_over_tol"], rel=1e-2, abs=1e-3)
        assert row[5] == f["worst_case"].split()[0]


def test_worst_error_column_is_compact():
    # 51163817.328 was printed in full, 12 characters in a column 15 wide
    from normkit.conformance import report

    table = {fam: {"cases": 1, "passed": 0, "failed": 1, "worst_err_over_tol": worst, "worst_case": "c"}
             for fam, worst in (("batch_norm", 51163817.328), ("layer_norm", 0.4654), ("rms_norm", float("inf")))}
    cells = {ln.split()[0]: ln.split()[4] for ln in report.format_table(table).splitlines()[2:5]}
    assert cells == {"batch_norm": "5.12e+07", "layer_norm": "0.465", "rms_norm": "inf"}


def test_list_and_case_count(capsys):
    assert main(["--list", "--impl", "torch"]) == 0
    names = capsys.readouterr().out.split()
    assert len(names) >= 600 and len(set(names)) == len(names)


def test_ops_take_commas_and_spaces_as_bench_does(capsys):
    # `check --ops` took only "a,b" while `bench --ops` took "a,b" and "a b" alike
    listed = []
    for ops in (["rms_norm,group_norm"], ["rms_norm", "group_norm"], ["rms_norm,", " group_norm"]):
        assert main(["--list", "--ops"] + ops) == 0
        listed.append(capsys.readouterr().out)
    assert listed[0] == listed[1] == listed[2]
    names = listed[0].split()
    assert any("rms_norm" in n for n in names) and any("group_norm" in n for n in names)
    assert not any("batch_norm" in n or "layer_norm" in n for n in names)


def test_flags_that_would_be_ignored_are_usage_errors(capsys, tmp_path):
    """--exact without --case, and --list with --json, ran without a word about the flag that did nothing."""
    assert main(["--exact", "--ops", "rms_norm"]) == 2
    assert "give --case NAME" in capsys.readouterr().err
    assert main(["--list", "--json", str(tmp_path / "r.json")]) == 2
    assert "give one of them" in capsys.readouterr().err and not (tmp_path / "r.json").exists()


def test_bad_arguments():
    assert main(["--ops", "nope"]) == 2
    with pytest.raises(SystemExit):
        main(["--bogus"])


@pytest.mark.parametrize("argv, msg", [
    (["--ops", ""], "--ops names no op family"),            # used to run every family (minutes)
    (["--ops", " , "], "--ops names no op family"),
    (["--ops", "layer_norm", "--device", "tpu"], "--device tpu:"),   # used to be a traceback with status 1
    (["--ops", "rms_norm", "--device", "meta"], "--device meta:"),   # used to crash mid-run
    (["--ops", "rms_norm", "--device", "xla"], "--device xla: check runs on"),   # a known type without a backend
])
def test_bad_ops_and_device_are_usage_errors(argv, msg, capsys):
    assert main(argv + ["--quiet"]) == 2
    assert msg in capsys.readouterr().err


@pytest.mark.skipif(torch.cuda.device_count() > 1, reason="cuda:1 exists here")
def test_a_missing_cuda_device_is_named_as_given(capsys):
    # `--device cuda:1` said "--device cuda: no CUDA device available"
    assert main(["--ops", "rms_norm", "--device", "cuda:1", "--quiet"]) == 2
    assert capsys.readouterr().err.startswith("--device cuda:1: no ")


def test_unwritable_json_path_is_rejected_before_the_run(tmp_path, capsys):
    # used to run every case, then crash in write_json with a traceback and exit status 1 ("a case failed")
    a_file = tmp_path / "file"
    a_file.write_text("x")
    assert main(["--ops", "rms_norm", "--quiet", "--json", str(a_file / "such" / "r.json")]) == 2  # under a file
    assert main(["--ops", "rms_norm", "--quiet", "--json", str(tmp_path)]) == 2
    read_only = tmp_path / "ro"
    read_only.mkdir()
    read_only.chmod(0o500)
    try:
        probe = read_only / "probe"
        writable = True
        try:
            probe.write_text("")
            probe.unlink()
        except OSError:
            writable = False
        if not writable:  # (root writes anywhere: then only the two paths above are checked)
            assert main(["--ops", "rms_norm", "--quiet", "--json", str(read_only / "r.json")]) == 2
    finally:
        read_only.chmod(0o700)
    err = capsys.readouterr().err
    assert err.count("cannot write a file there") == 2 + (not writable)
    assert not list(tmp_path.glob("**/*.json"))  # the probe leaves nothing behind


def test_json_path_folders_are_made(tmp_path):
    # (session 37: a missing folder above --json was an error, unlike --out's)
    path = tmp_path / "no" / "such" / "r.json"
    assert main(["--ops", "rms_norm", "--quiet", "--device", "cpu", "--json", str(path)]) == 0
    assert json.loads(path.read_text())


def test_negative_max_failures_is_rejected(capsys):
    # -1 printed "... and 1 more failed rule(s)" for a run without failures
    with pytest.raises(SystemExit) as e:
        main(["--ops", "layer_norm", "--max-failures", "-1"])
    assert e.value.code == 2 and "must be >= 0" in capsys.readouterr().err


def test_nothing_checked_is_not_a_pass(capsys, monkeypatch):
    # a misspelt --case used to print "0 of 0 cases passed" with status 0; so did a backend with none of the
    # functions (an empty module), which a CI gate would have taken as conforming
    assert main(["--ops", "layer_norm", "--case", "no_such_case_name", "--quiet"] + ORACLE) == 2
    assert "no case matches --case" in capsys.readouterr().err
    monkeypatch.setitem(sys.modules, "nk_test_empty_backend", types.ModuleType("nk_test_empty_backend"))
    assert main(["--impl", "nk_test_empty_backend", "--ops", "rms_norm", "--quiet"] + ORACLE) == 1
    assert "no case ran" in capsys.readouterr().out
