"""`python -m normkit info`."""

import json
import os
import subprocess
import sys

import pytest
import torch

import normkit
from normkit import aten, info


def test_info_prints_versions_devices_kernels(capsys):
    assert info.main([]) == 0
    out = capsys.readouterr().out
    assert f"normkit {normkit.__version__}" in out
    assert f"torch   {torch.__version__}" in out
    assert "python  " in out and "triton  " in out
    assert "kernels:" in out and "batch_norm" in out and "layer_norm" in out and "rms_norm" in out
    assert "triton interpreter (TRITON_INTERPRET=1): " in out
    assert "enable(): inactive" in out
    from normkit import kernels

    if kernels.available():  # where and whether kernels after a call's first launch early
        assert "programmatic dependent launch: " in out


def test_info_reports_enable_state_and_json(capsys):
    normkit.enable(_dispatch_key="CPU")
    try:
        assert info.main(["--json"]) == 0
        data = json.loads(capsys.readouterr().out)
    finally:
        normkit.disable()
    assert data["enable"]["active"] is True and "native_batch_norm" in data["enable"]["ops"]
    assert data["torch"] == torch.__version__
    assert set(data["kernels"]) >= {"batch_norm", "layer_norm", "rms_norm"}
    assert set(data["pdl"]) == {"devices", "knobs"}
    assert len(data["pdl"]["devices"]) == len(data["cuda"]["devices"])
    assert not aten.is_enabled()


def test_info_through_the_cli():
    src = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src")
    env = dict(os.environ, PYTHONPATH=src + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, "-m", "normkit", "info"], capture_output=True, text=True, env=env,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "normkit " in proc.stdout and "devices:" in proc.stdout


def test_info_reports_the_host_launch_switches():
    """Each host-path switch the README names shows in `info`: direct launches and launch plans too (it used to
    print group norm's plans as on with NORMKIT_LAUNCH_PLANS=0)."""
    src = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src")
    for env_on, expect in ((("1", "1"), ["direct launches: on", "launch plans: on", "fast routes under enable(): on"]),
                           (("0", "0"), ["direct launches: off (NORMKIT_DIRECT_LAUNCH=0)",
                                         "launch plans: off (NORMKIT_LAUNCH_PLANS=0)"])):
        env = dict(os.environ, PYTHONPATH=src + os.pathsep + os.environ.get("PYTHONPATH", ""),
                   NORMKIT_DIRECT_LAUNCH=env_on[0], NORMKIT_LAUNCH_PLANS=env_on[1], NORMKIT_FAST_ROUTES="1")
        proc = subprocess.run([sys.executable, "-m", "normkit", "info"], capture_output=True, text=True, env=env,
                              timeout=300)
        assert proc.returncode == 0, proc.stderr
        line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("host launch path: "))
        for text in expect:
            assert text in line, line
        assert ("group norm's: on" in line) == (env_on[1] == "1")


def test_top_level_usage_goes_to_stderr_when_no_command_is_given(capsys):
    from normkit.cli import main

    assert main([]) == 2
    out = capsys.readouterr()
    assert "usage: python -m normkit" in out.err and not out.out
    assert main(["--help"]) == 0
    assert "usage: python -m normkit" in capsys.readouterr().out
    assert main(["bogus"]) == 2
    assert "unknown command 'bogus'" in capsys.readouterr().err


def test_version_flag(capsys):
    # `python -m normkit --version` was "unknown command '--version'"
    from normkit.cli import main

    for flag in ("--version", "-V"):
        assert main([flag]) == 0
        assert capsys.readouterr().out == f"normkit {normkit.__version__}\n"


@pytest.mark.parametrize("command", [["info"], ["check", "--list"]])
def test_a_reader_that_leaves_early_gets_no_traceback(command):
    # `python -m normkit check --list | head -2` ended in BrokenPipeError tracebacks
    src = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src")
    env = dict(os.environ, PYTHONPATH=src + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.Popen([sys.executable, "-m", "normkit"] + command, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)
    proc.stdout.close()  # the reader is gone before the first line: every write meets a closed pipe
    err = proc.communicate(timeout=300)[1]
    assert proc.returncode == 1 and "Traceback" not in err and "BrokenPipeError" not in err, err
