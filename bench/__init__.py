"""Benchmarks, studies and the training of the bundled tiny model (imports dllm, never the reverse).

The studies decode past the bundled model's trained positions on purpose (the dense baselines at 4K-128K, answers
of 1-2K tokens) and record it themselves (a ``past_window`` column, a note in their reports), so the library's
:class:`dllm.generate.PositionWindowWarning` is not repeated for every case they run."""

import warnings

from dllm.generate import PositionWindowWarning

warnings.filterwarnings("ignore", category=PositionWindowWarning)
