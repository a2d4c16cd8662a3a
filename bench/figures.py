"""Saving the studies' matplotlib figures the same way everywhere."""

from __future__ import annotations


def save_figure(fig, path, title: str | None = None, dpi: int = 120) -> None:
    """Give ``fig`` its overall ``title`` (if any), lay it out tightly, write it to ``path`` (the format
    from the suffix, e.g. PNG) at ``dpi`` dots per inch, and close it so a long run does not keep every
    figure in memory. Raises ``OSError`` if ``path`` cannot be written."""
    import matplotlib.pyplot as plt  # here: only plotting needs matplotlib

    if title is not None:
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
