"""Programmatic dependent launch changes when kernels start, never what they compute: shared by the
batch, layer and group norm kernel tests (CUDA only)."""

import torch


def assert_pdl_same_bits(monkeypatch, run, table: dict, key: str, on, off=0) -> None:
    """``run()`` (returning tensors) gives the same bits with ``table[key]`` at ``off`` and at ``on``,
    twice, and when replayed from a captured CUDA graph."""
    monkeypatch.setitem(table, key, off)
    want = run()
    monkeypatch.setitem(table, key, on)
    for _ in range(2):
        for a, c in zip(want, run()):
            assert torch.equal(a, c)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static = run()
    graph.replay()
    torch.cuda.synchronize()
    for a, c in zip(want, static):
        assert torch.equal(a, c)
