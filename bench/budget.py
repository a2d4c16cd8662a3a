"""Time budget for benchmark grids: skip a method at a larger size when it would not finish.

After a method has run at some size, its cost at a larger size is predicted by its
cost law (seconds x (size / measured size) ** exponent: 2 for attention over the whole
prompt, 1 for Prefilling-dLLM's chunked prefill). A cell whose prediction exceeds the
time left is skipped, with the reason recorded for the results table.

A benchmark with a cost model of its own (e.g. :func:`bench.speed.e2e_dream_shape.predict_cell_s`) uses
:meth:`TimeBudget.calibrate` / :meth:`TimeBudget.predict` instead: the model's seconds for a cell,
scaled by measured / modelled seconds of the method's last measured cell, then
:meth:`TimeBudget.skip_if_over`.
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
        self.scale: dict[str, float] = {}  # method -> measured / modelled seconds of its last cell

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

    def calibrate(self, method: str, measured_s: float, model_s: float) -> None:
        """Remember how a method's measured seconds compare with its cost model (``model_s`` > 0)."""
        if model_s > 0:
            self.scale[method] = measured_s / model_s

    def predict(self, method: str, model_s: float) -> float:
        """Seconds of a cell whose cost model says ``model_s``: scaled by the method's last
        :meth:`calibrate` (unscaled before its first measurement)."""
        return model_s * self.scale.get(method, 1.0)

    def skip_if_over(self, key: tuple, predicted_s: float) -> str | None:
        """None if ``predicted_s`` fits in the time left, else the reason (also kept in ``skipped[key]``)."""
        left = self.left()
        if predicted_s <= left:
            return None
        reason = "skipped: budget spent" if left <= 0 else f"skipped: predicted {predicted_s:.1f} s > {left:.1f} s left"
        self.skipped[key] = reason
        return reason
