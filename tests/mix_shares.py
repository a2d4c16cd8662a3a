"""The shares of a curriculum phase's mix as drawn, for the tests that compare them with the shares a phase states."""

import random
from collections import Counter

from bench.tiny.curriculum import draw_sample


def drawn_shares(phase, total: int, n: int = 400, seed: int = 5) -> Counter:
    """The share of each ``(mode, kind)`` over ``n`` samples of ``phase`` at about ``total`` tokens, drawn from
    ``random.Random(seed)`` (0 for a pair never drawn). Over 400 draws three standard deviations of a share are
    at most 0.075."""
    rng = random.Random(seed)
    counts = Counter()
    for _ in range(n):
        s, mode = draw_sample(rng, None, total, phase)
        counts[(mode, s.kind)] += 1
    return Counter({key: c / n for key, c in counts.items()})
