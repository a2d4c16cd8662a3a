"""Benchmarks, studies and the training of the bundled tiny model (imports dllm, never the reverse).

Rooms: ``bench.kernels`` (the kernels against FlexAttention and SDPA, GPU readiness), ``bench.speed`` (end-to-end
time), ``bench.fidelity`` (answer quality), ``bench.studies`` (the studies that chose the defaults) and
``bench.tiny`` (the bundled model's training); shared infrastructure at the top. ``bench/README.md`` lists them.

The studies decode past the bundled model's trained positions on purpose (the dense baselines at 4K-128K, answers
of 1-2K tokens) and record it themselves (a ``past_window`` column, a note in their reports), so the library's
:class:`dllm.generate.PositionWindowWarning` is not repeated for every case they run."""

import warnings

from dllm.generate import PositionWindowWarning

warnings.filterwarnings("ignore", category=PositionWindowWarning)
