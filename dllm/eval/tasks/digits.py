"""Digit needles in repeated noise (InfiniteBench ``passkey`` and ``number_string``).

InfiniteBench hides a number in five short sentences repeated many times
("The grass is green. The sky is blue. The sun is yellow. Here we go. There and
back again."): the canonical filler here. The random phrasing draws from a
larger pool of such sentences, i.i.d. or as a repeated random block, so a model
trained on it does not key on one template. No filler sentence holds a digit,
so the number occurs only in the needle; its first digit is never 0.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

from .case import Wording, pick
from .haystack import FilledContext, fill_context
from .noise import CANONICAL_NOISE, NOISE_POOL, noise_units

__all__ = ["CANONICAL_NOISE", "NOISE_POOL", "noise_units", "DigitTask", "PASSKEY", "NUMBER_STRING", "make_digits"]


@dataclass(frozen=True)
class DigitTask:
    """A digit-needle task: its name, number of digits and wording (``{x}`` is the number)."""

    task: str
    n_digits: int
    wording: Wording


PASSKEY = DigitTask("passkey", 5, Wording.of("passkey"))
NUMBER_STRING = DigitTask("number_string", 10, Wording.of("number_string"))


def make_digits(
    spec: DigitTask,
    rng: random.Random,
    length: int,
    depth: float,
    tokenizer: Any,
    canonical: bool,
    split: str,
    haystack: str = "filler",
) -> tuple[str, FilledContext, str, str]:
    """The passkey / number_string generator (the protocol of :data:`dllm.eval.tasks.TASKS`); ``haystack``
    other than "filler" takes the words of a natural-prose haystack (:mod:`dllm.eval.tasks.prose`) in place
    of the noise sentences, drawn from the same rng."""
    answer = str(rng.randint(1, 9)) + "".join(str(rng.randint(0, 9)) for _ in range(spec.n_digits - 1))
    w = spec.wording
    needle, prefix, query = (pick(rng, options, canonical) for options in (w.needles, w.prefixes, w.queries))
    units_rng = random.Random(rng.getrandbits(64))
    if haystack == "filler":
        units = noise_units(units_rng, canonical)
    else:
        from .prose import prose_units

        units = prose_units(haystack, split, units_rng)
    return prefix, fill_context(units, needle.format(x=answer), length, depth, tokenizer, task=spec.task), query, answer
