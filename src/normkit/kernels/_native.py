"""The native plan replay: ``_replay.cpp`` compiled on first use, loaded when ready.

A launch plan's Python replay (``_plan._Plan.replay``) costs 50-110 µs of host time a call inside a model
on the H200 machine (benchmarks/NOTES-host-overhead.md, session 24): allocations, the pointer and scalar
holes, and Triton's C launcher parsing ~30 Python arguments per launch. ``_replay.cpp`` does the same work
in one C++ call: ``at::empty_strided`` for the outputs, one packed parameter buffer per launch, and
``cuLaunchKernelEx`` with the attributes Triton's launcher would set.

It is compiled by the C++ compiler (``$CXX``, else ``c++``) against the installed torch's headers and
Triton's ``cuda.h``, once per (source, torch version and path, Python, compiler) into ``$NORMKIT_CACHE_DIR`` (default
``~/.cache/normkit``): ~20 s on two cores. ``start()`` (called by the first CUDA plan) runs the compiler in
a background thread, so a process never waits for it: plans replay in Python until the module has loaded,
and natively from the next call on. Without a compiler, headers or libcuda the Python replay stays;
``status()`` says why. Off with ``NORMKIT_NATIVE_REPLAY=0``; ``wait()`` blocks until the build ends
(benchmarks).

A build writes to a temporary file and renames it into place, so two processes may build at once and an
interrupted build leaves no half-written module.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import subprocess
import sysconfig
import tempfile
import threading

_SOURCE = os.path.join(os.path.dirname(__file__), "_replay.cpp")
_LIBCUDA = "libcuda.so.1"

_lock = threading.Lock()
_thread = None
_module = None
_status = "not started"
_on = os.environ.get("NORMKIT_NATIVE_REPLAY", "1") != "0"


def module():
    """The loaded extension, or None (not built yet, building, failed or off)."""
    return _module


def status() -> str:
    """'loaded (path)', 'building', 'not started', 'off' or why it is unavailable."""
    return "off" if not _on else _status


def set_native(on: bool) -> None:
    """Use the native replay (once loaded) or the Python one, from the next replay on (benchmarks switch)."""
    global _on
    _on = bool(on)


def start(libcuda: str = _LIBCUDA) -> None:
    """Build (or find) and load the extension in a background thread; returns at once."""
    global _thread, _status
    if not _on or _thread is not None:
        return
    with _lock:
        if _thread is not None:
            return
        _status = "building"
        _thread = threading.Thread(target=_build_and_load, args=(libcuda,), name="normkit-native-replay",
                                   daemon=True)
        _thread.start()


def wait(timeout: float | None = None) -> bool:
    """Wait for a started build to end; whether the module is loaded."""
    t = _thread
    if t is not None:
        t.join(timeout)
    return _module is not None


def _build_and_load(libcuda: str) -> None:
    global _module, _status
    try:
        path = build()
        mod = load(path, libcuda)
    except Exception as e:  # no compiler, headers or driver: the Python replay stays
        _status = f"unavailable: {type(e).__name__}: {str(e).strip()[-600:]}"
        return
    _module = mod
    _status = f"loaded ({path})"


def cache_dir() -> str:
    d = os.environ.get("NORMKIT_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "normkit")
    try:
        os.makedirs(d, exist_ok=True)
        if os.access(d, os.W_OK):
            return d
    except OSError:
        pass
    d = os.path.join(tempfile.gettempdir(), "normkit-cache")
    os.makedirs(d, exist_ok=True)
    return d


def _compile_command(source: str, target: str, std: str) -> list:
    import torch
    import torch.utils.cpp_extension as ext
    import triton

    cuda_include = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "include")
    includes = ext.include_paths() + [sysconfig.get_paths()["include"], cuda_include]
    libs = ext.library_paths()
    abi = int(getattr(torch._C, "_GLIBCXX_USE_CXX11_ABI", True))
    return ([os.environ.get("CXX", "c++"), "-O2", f"-std={std}", "-shared", "-fPIC", "-w",
             f"-D_GLIBCXX_USE_CXX11_ABI={abi}"] + [f"-I{p}" for p in includes] + [source, "-o", target]
            + [f"-L{p}" for p in libs] + [f"-Wl,-rpath,{p}" for p in libs]
            + ["-lc10", "-ltorch", "-ltorch_cpu", "-ltorch_python"])


def build(source: str = _SOURCE) -> str:
    """Path of the compiled extension for this torch / Python / compiler, compiling it if not cached."""
    import torch

    with open(source, "rb") as f:
        src = f.read()
    cxx = os.environ.get("CXX", "c++")
    # (torch's path too: two environments with one torch version may hold different builds of it)
    meta = f"|{torch.__version__}|{torch.__file__}|{sysconfig.get_config_var('SOABI')}|{cxx}"
    tag = hashlib.sha256(src + meta.encode())
    target = os.path.join(cache_dir(), f"normkit_replay_{tag.hexdigest()[:16]}.so")
    if os.path.exists(target):
        return target
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=os.path.dirname(target))
    os.close(fd)
    try:
        err = ""
        for std in ("c++20", "c++17"):  # (torch 2.13's headers want C++20; older compilers lack it)
            r = subprocess.run(_compile_command(source, tmp, std), capture_output=True, text=True)
            if r.returncode == 0:
                os.replace(tmp, target)
                return target
            err = r.stderr
        raise RuntimeError(f"compiling {os.path.basename(source)} failed: {err[-2000:]}")
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def load(path: str, libcuda: str = _LIBCUDA):
    """Import the compiled extension at ``path`` and point it at the CUDA driver ``libcuda``."""
    import torch  # noqa: F401  (its libraries first: the extension links against them)

    spec = importlib.util.spec_from_file_location("_normkit_replay", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    mod.init(libcuda)
    return mod
