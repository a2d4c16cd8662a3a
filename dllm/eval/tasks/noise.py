"""InfiniteBench's filler: the five noise sentences of ``passkey`` and ``number_string`` repeated, or draws
from a larger pool of such sentences (from ``wording.json``); the haystack of the digit tasks and of
``word_fact`` with ``haystack="filler"``. No sentence holds a digit.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterator

from .case import WORDING

__all__ = ["CANONICAL_NOISE", "NOISE_POOL", "noise_units"]

CANONICAL_NOISE: tuple[str, ...] = tuple(WORDING["noise"]["canonical"])
NOISE_POOL: tuple[str, ...] = CANONICAL_NOISE + tuple(WORDING["noise"]["more"])


def noise_units(rng: random.Random, canonical: bool) -> Iterator[str]:
    """Endless filler sentences: the five InfiniteBench ones in a cycle
    (canonical), else, by a coin of ``rng``, a repeated random block of 3-7
    sentences of :data:`NOISE_POOL` or i.i.d. draws from it."""
    if canonical:
        return itertools.cycle(CANONICAL_NOISE)
    if rng.random() < 0.5:
        return itertools.cycle(rng.sample(NOISE_POOL, rng.randint(3, 7)))
    return (rng.choice(NOISE_POOL) for _ in itertools.count())
