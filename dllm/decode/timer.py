"""``PhaseTimer``: wall-clock seconds per named phase of one generation (prefill, scoring, decode, total).

:func:`dllm.generate` creates one timer per call and hands it to the policy builders (``prefill``,
``scoring``) and to the denoising loop (``decode``). On CPU a phase is timed with
``time.perf_counter``. On CUDA each entry records a pair of CUDA events on the current stream of the
timer's device (the model's, e.g. ``cuda:1``, whatever the current device is) and
nothing waits: the events are read when :attr:`PhaseTimer.seconds` is first asked for, with one
synchronisation for the whole generation. So timing adds no host-device sync to a denoising step
(a later CUDA-graph step may not synchronise inside its capture).
"""

from __future__ import annotations

import time
from contextlib import contextmanager

import torch


class PhaseTimer:
    """Seconds per named phase; phases may nest (``total`` holds the others) and repeat (summed).

    Args:
        device: where the timed work runs; CUDA devices (any index; ``cuda`` = the current one) are
            timed with CUDA events on that device's current stream.
    """

    def __init__(self, device: torch.device | str):
        self.device = torch.device(device)
        self._seconds: dict[str, float] = {}
        self._pending: list[tuple[str, torch.cuda.Event, torch.cuda.Event]] = []

    @contextmanager
    def phase(self, name: str):
        """Context manager adding the time spent inside it to phase ``name``."""
        if self.device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            stream = torch.cuda.current_stream(self.device)  # the device's stream, not the current device's
            start.record(stream)
            try:
                yield
            finally:
                end.record(stream)
                self._pending.append((name, start, end))
            return
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self._seconds[name] = self._seconds.get(name, 0.0) + time.perf_counter() - t0

    @property
    def seconds(self) -> dict[str, float]:
        """``{phase: seconds}`` so far (waits once for the recorded CUDA events, if any)."""
        if self._pending:
            self._pending[-1][2].synchronize()  # events complete in stream order: the last one suffices
            for name, start, end in self._pending:
                self._seconds[name] = self._seconds.get(name, 0.0) + start.elapsed_time(end) / 1000.0
            self._pending.clear()
        return dict(self._seconds)
