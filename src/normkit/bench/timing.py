"""Timers and the progress bar.

CUDA: the calls (rotating among the input sets) are captured into one CUDA graph and the graph's replays
are timed with CUDA events; the per-call time is the median replay time over the calls in the graph. This
removes Python, dispatcher, autograd-engine and torch.compile guard overhead for every implementation
alike, and with the rotation the working set is >= 4x L2, so L2 does not flatter small shapes. Where
capture fails (host synchronisation inside an implementation, an op that refuses capture) the same calls
are timed eagerly between CUDA events (batched, median) and the row says ``timer: cuda-events``.
CPU (--quick, CI): ``time.perf_counter`` around batches of calls, median.
"""

from __future__ import annotations

import math
import statistics
import sys
import time

import torch


class Timer:
    def __init__(self, device: str, warmup_ms: float = 10.0, rep_ms: float = 40.0, graphs: bool = True,
                 graph_target_ms: float = 1.0, max_graph_calls: int = 64):
        self.device = device
        self.warmup_ms = warmup_ms
        self.rep_ms = rep_ms
        self.graphs = graphs and device == "cuda"
        self.graph_target_ms = graph_target_ms
        self.max_graph_calls = max_graph_calls
        self.stream = torch.cuda.Stream() if device == "cuda" else None
        # of the last time(): the eager per-call estimate that sized it, and the calls per timed
        # batch (graph replay or event pair), recorded in each bench row for diagnosis
        self.last_estimate_ms = None
        self.last_calls = None

    # -- helpers ---------------------------------------------------------------------------------------
    def sync(self):
        if self.device == "cuda":
            torch.cuda.synchronize()

    def stream_ctx(self):
        if self.stream is None:
            import contextlib

            return contextlib.nullcontext()
        return torch.cuda.stream(self.stream)

    def _estimate_ms(self, fns) -> float:
        """Per-call time from a short eager loop (also the warm-up)."""
        k = len(fns)
        if self.device == "cuda":
            with self.stream_ctx():
                s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                s.record()
                for f in fns:
                    f()
                e.record()
                e.synchronize()
                est = max(s.elapsed_time(e) / k, 1e-3)
                n = int(min(max(self.warmup_ms / est, 1), 1000))
                for i in range(n):
                    fns[i % k]()
                self.sync()
            return est
        t0 = time.perf_counter()
        for f in fns:
            f()
        est = max((time.perf_counter() - t0) * 1e3 / k, 1e-4)
        n = int(min(max(self.warmup_ms / est, 1), 1000))
        for i in range(n):
            fns[i % k]()
        return est

    # -- public ----------------------------------------------------------------------------------------
    def time(self, fns, graph: bool = True) -> tuple:
        """(median ms per call, timer name). ``fns``: one zero-argument callable per input set.

        ``graph=False`` times eagerly even where graphs are on: a captured ``copy_`` becomes a memcpy
        node run by the copy engines, about 1.5x slower on an H200 than the copy kernel eager launches.
        """
        est = self.last_estimate_ms = self._estimate_ms(fns)
        if self.device != "cuda":
            return self._time_cpu(fns, est), "cpu-wall"
        if self.graphs and graph:
            try:
                return self._time_graph(fns), "cuda-graph"
            except Exception as e:  # capture refused: time eagerly, say so
                self.sync()
                self.last_graph_error = f"{type(e).__name__}: {e}"[:200]
        return self._time_events(fns, est), "cuda-events"

    def _time_cpu(self, fns, est):
        k = len(fns)
        batch = max(k, int(math.ceil(0.5 / est / k)) * k) if est < 0.5 else k
        reps = int(min(max(self.rep_ms / (est * batch), 3), 200))
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            for i in range(batch):
                fns[i % k]()
            times.append((time.perf_counter() - t0) * 1e3 / batch)
        self.last_calls = batch
        return statistics.median(times)

    def _time_events(self, fns, est):
        k = len(fns)
        batch = max(k, int(math.ceil(self.graph_target_ms / est / k)) * k)
        batch = min(batch, max(k, self.max_graph_calls))
        reps = int(min(max(self.rep_ms / (est * batch), 5), 500))
        evs = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
        with self.stream_ctx():
            for s, e in evs:
                s.record()
                for i in range(batch):
                    fns[i % k]()
                e.record()
        self.sync()
        self.last_calls = batch
        return statistics.median(s.elapsed_time(e) / batch for s, e in evs)

    def _capture(self, fns, calls):
        """A CUDA graph of ``calls`` calls rotating among ``fns``, replayed once (its first replay uploads it)."""
        k = len(fns)
        self.sync()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, stream=self.stream):
            for i in range(calls):
                fns[i % k]()
        with self.stream_ctx():
            g.replay()
        self.sync()
        return g

    def _replays_ms(self, g, reps):
        """Each of ``reps`` back-to-back replays of ``g`` timed with CUDA events (ms)."""
        evs = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
        with self.stream_ctx():
            for s, e in evs:
                s.record()
                g.replay()
                e.record()
        self.sync()
        return [s.elapsed_time(e) for s, e in evs]

    def _time_graph(self, fns):
        """The graph is sized from the device time of a one-rotation graph, not from the eager estimate: that
        one includes each implementation's host time, which gave implementations of the same kernels different
        call counts (128 of 192 cases in session 33) and so a different share of the replay's launch cost."""
        k = len(fns)
        probe = self._capture(fns, k)
        per_call = max(min(self._replays_ms(probe, 3)) / k, 1e-3)
        calls = max(k, int(math.ceil(self.graph_target_ms / per_call / k)) * k)
        calls = min(calls, max(k, (self.max_graph_calls // k) * k))
        g = probe if calls == k else self._capture(fns, calls)
        del probe
        reps = int(min(max(self.rep_ms / (per_call * calls), 5), 500))
        ms = statistics.median(t / calls for t in self._replays_ms(g, reps))
        self.last_calls = calls
        del g
        return ms


class Progress:
    """A small progress bar on stderr: redrawn in place on a terminal, a line every ~5% otherwise."""

    def __init__(self, total: int, title: str = "", stream=None, enabled: bool = True):
        self.total = max(int(total), 1)
        self.done = 0
        self.title = title
        self.stream = stream or sys.stderr
        self.enabled = enabled
        self.tty = hasattr(self.stream, "isatty") and self.stream.isatty()
        self.t0 = time.time()
        self._last_pct = -100.0

    def _eta(self) -> str:
        el = time.time() - self.t0
        if not self.done:
            return "--:--"
        rest = el / self.done * (self.total - self.done)
        return f"{int(rest // 60)}:{int(rest % 60):02d}"

    def update(self, n: int = 1, label: str = ""):
        self.done = min(self.done + n, self.total)
        if not self.enabled:
            return
        frac = self.done / self.total
        width = 28
        bar = "#" * int(frac * width) + "." * (width - int(frac * width))
        el = time.time() - self.t0
        line = (f"{self.title} [{bar}] {self.done}/{self.total} {frac * 100:5.1f}% "
                f"{int(el // 60)}:{int(el % 60):02d} eta {self._eta()} {label}")
        if self.tty:
            self.stream.write("\r" + line[:150].ljust(150))
            self.stream.flush()
        elif frac * 100 - self._last_pct >= 5 or self.done == self.total:
            self._last_pct = frac * 100
            self.stream.write(line[:200] + "\n")
            self.stream.flush()

    def close(self):
        if self.enabled and self.tty:
            self.stream.write("\n")
            self.stream.flush()
