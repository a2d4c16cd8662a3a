"""Plot helpers every study shares, so that their matplotlib figures look the same.

Every figure has a title saying what it shows, axes labelled with their units, context lengths
written as 4K / 64K (not 2^12), and a point that was not run (a time budget skipped it) drawn as a
grey x on the axis, never left out silently (:func:`mark_not_run`). The studies import this module;
:mod:`bench.figures` (which redraws recorded figures) imports the studies.
"""

from __future__ import annotations

import csv

NOT_RUN = "x: not run (the time budget skipped it)"


def save_figure(fig, path, title: str | None = None, dpi: int = 120, caption: str | None = None) -> None:
    """Give ``fig`` its overall ``title`` (if any) and a ``caption`` under the axes (if any), lay it out
    tightly, write it to ``path`` (the format from the suffix, e.g. PNG) at ``dpi`` dots per inch, and close
    it so a long run does not keep every figure in memory. Raises ``OSError`` if ``path`` cannot be written."""
    import matplotlib.pyplot as plt  # here: only plotting needs matplotlib

    if title is not None:
        fig.suptitle(title)
    if caption is not None:
        fig.text(0.5, 0.005, caption, ha="center", va="bottom", fontsize=8, wrap=True)
        fig.tight_layout(rect=(0, 0.03 * (caption.count("\n") + 1) + 0.02, 1, 1))
    else:
        fig.tight_layout()
    fig.savefig(path, dpi=dpi)
    plt.close(fig)


def tokens_label(n: int) -> str:
    """A token count as people write it: 300, 1K, 4K, 64K, 1M (binary K = 1024, M = 1024 * 1024)."""
    n = int(n)
    if n >= 1 << 20 and n % (1 << 20) == 0:
        return f"{n >> 20}M"
    if n >= 1024 and n % 1024 == 0:
        return f"{n >> 10}K"
    return str(n)


def token_axis(ax, values, label: str = "context length (tokens)", base: int = 2) -> None:
    """A log-scale x axis of token counts ``values`` with ticks 2K, 4K, ... (:func:`tokens_label`)."""
    from matplotlib.ticker import NullLocator

    values = sorted({int(v) for v in values})
    ax.set_xscale("log", base=base)
    ax.set_xticks(values, [tokens_label(v) for v in values])
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xlabel(label)


def mark_not_run(ax, xs, color="grey", label: str | None = None) -> None:
    """Grey (or ``color``) x markers on the bottom edge of ``ax`` at the x positions ``xs`` of points that
    were not run, so a skipped point is visible rather than missing."""
    if not xs:
        return
    ax.plot(
        list(xs), [0.02] * len(xs), ls="none", marker="x", ms=9, mew=2, color=color, label=label,
        transform=ax.get_xaxis_transform(), clip_on=False,
    )  # fmt: skip


def dodge(x: float, i: int, n: int, spread: float = 0.06) -> float:
    """``x`` moved sideways (multiplicatively, for a log axis) for the i-th of n overlapping series, so
    equal values stay visible side by side."""
    return x * (1 + spread * (i - (n - 1) / 2))


def read_csv_rows(path) -> list[dict]:
    """A recorded CSV's rows with numbers as int / float and ``True`` / ``False`` as bool (empty cells stay
    ``""``), the values the plotting functions were given when the benchmark ran."""

    def value(text: str):
        if text in ("True", "False"):
            return text == "True"
        for kind in (int, float):
            try:
                return kind(text)
            except ValueError:
                pass
        return text

    with open(path, newline="", encoding="utf-8") as f:
        return [{k: value(v) for k, v in row.items()} for row in csv.DictReader(f)]
