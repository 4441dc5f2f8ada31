"""`python -m normkit bench`: side-by-side benchmarks of normkit against its peers.

Modules
-------
``cases``    the suite (packaged ``suite.json``), its expansion into cases, byte accounting, inputs
``oracle``   float64 answers from ``normkit.reference`` (torch float64 as a labelled fallback)
``impls``    the implementations: normkit, ATen eager (cuDNN on / off), torch.compile, Liger, FlagGems
``timing``   CUDA-graph / CUDA-event / CPU-wall timers with input rotation, the progress bar
``runner``   one row = (case, direction, implementation): check, peak memory, time; copy bandwidth;
             ``--accuracy``
``models``   ``--models``: whole training steps with and without ``normkit.enable()``
``report``   tables, ``summary.md``, JSON, PNG plots
``cli``      ``main(argv) -> int``

Every row is independent: an exception in one implementation is recorded in its row and the run goes on.
"""

from normkit.bench.cases import Case, expand_suite, load_suite, min_bytes  # noqa: F401
