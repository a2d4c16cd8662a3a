"""Time budget for benchmark grids: skip a method at a larger size when it would not finish.

After a method has run at some size, its cost at a larger size is predicted by its
cost law (seconds x (size / measured size) ** exponent: 2 for attention over the whole
prompt, 1 for Prefilling-dLLM's chunked prefill). A cell whose prediction exceeds the
time left is skipped, with the reason recorded for the results table.
"""

from __future__ import annotations

import time


class TimeBudget:
    """Wall-clock budget shared by the cells of one benchmark run."""

    def __init__(self, seconds: float):
        self.seconds = float(seconds)
        self.t0 = time.perf_counter()
        self.measured: dict[str, tuple[float, float]] = {}
        self.skipped: dict[tuple, str] = {}

    def left(self) -> float:
        return self.seconds - (time.perf_counter() - self.t0)

    def skip_reason(self, method: str, size: float, n_cases: int, exponent: float) -> str | None:
        """None if the cell fits, else a reason like "skipped: predicted 280 s > 120 s left"."""
        if method not in self.measured:
            return None if self.left() > 0 else "skipped: budget spent"
        s0, t0 = self.measured[method]
        predicted = t0 * (size / s0) ** exponent * n_cases
        if predicted > self.left():
            reason = f"skipped: predicted {predicted:.0f} s > {max(self.left(), 0):.0f} s left"
            self.skipped[(method, size)] = reason
            return reason
        return None

    def record(self, method: str, size: float, seconds_per_case: float) -> None:
        self.measured[method] = (size, seconds_per_case)
