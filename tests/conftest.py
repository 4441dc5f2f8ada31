import os

import torch

# Without a GPU, normkit's Triton kernels run on CPU tensors through Triton's interpreter. Triton reads
# TRITON_INTERPRET when a kernel is decorated, so it is set here, before any test imports normkit's
# kernels: every test then sees the same mode, whatever order pytest collects the files in.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

# tests/test_randomized.py draws its cases from this base seed: fresh per session unless given, and printed in
# the session header, so that a run cut short (a timeout before pytest prints its failures) can be replayed
os.environ.setdefault("NORMKIT_RANDOM_SEED", str(int.from_bytes(os.urandom(4), "little")))


def pytest_sessionstart(session):
    # written at the start even under -q (which hides pytest's header), so a run cut short still names its seed
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_line(f"NORMKIT_RANDOM_SEED={os.environ['NORMKIT_RANDOM_SEED']} (tests/test_randomized.py)")


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)
