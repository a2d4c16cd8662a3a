"""Digit needles in repeated noise (InfiniteBench ``passkey`` and ``number_string``).

InfiniteBench hides a number in five short sentences repeated many times
("The grass is green. The sky is blue. The sun is yellow. Here we go. There and
back again."): the canonical filler here. The random phrasing draws from a
larger pool of such sentences, i.i.d. or as a repeated random block, so a model
trained on it does not key on one template. No filler sentence holds a digit,
so the number occurs only in the needle; its first digit is never 0.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from .case import Wording, pick
from .haystack import FilledContext, fill_context

__all__ = ["CANONICAL_NOISE", "NOISE_POOL", "noise_units", "DigitTask", "PASSKEY", "NUMBER_STRING", "make_digits"]

CANONICAL_NOISE: tuple[str, ...] = (
    "The grass is green.",
    "The sky is blue.",
    "The sun is yellow.",
    "Here we go.",
    "There and back again.",
)

NOISE_POOL: tuple[str, ...] = CANONICAL_NOISE + (
    "The river is wide.", "The night is quiet.", "The road is long.", "Birds sing in the morning.",
    "The wind is cold.", "The sea is calm today.", "Leaves fall in autumn.", "The stars are bright.",
    "The moon is pale.", "Rain falls on the roof.", "The hills are far away.", "Snow covers the field.",
    "The tea is warm.", "Clouds drift slowly by.", "The door is open.", "A dog barks in the distance.",
    "The clock ticks on the wall.", "The trees sway gently.", "The bread is fresh.", "Waves roll onto the shore.",
    "The lamp is on.", "The path winds through the woods.", "The garden is full of flowers.", "Time goes by.",
    "And so it goes.", "The cat sleeps by the fire.", "The water is cool and clear.", "Nothing happens here.",
    "The wall is painted white.", "We walk along the beach.",
)  # fmt: skip


def noise_units(rng: random.Random, canonical: bool) -> Iterator[str]:
    """Endless filler sentences: the five InfiniteBench ones in a cycle
    (canonical), else, by a coin of ``rng``, a repeated random block of 3-7
    sentences of :data:`NOISE_POOL` or i.i.d. draws from it."""
    if canonical:
        return itertools.cycle(CANONICAL_NOISE)
    if rng.random() < 0.5:
        return itertools.cycle(rng.sample(NOISE_POOL, rng.randint(3, 7)))
    return (rng.choice(NOISE_POOL) for _ in itertools.count())


@dataclass(frozen=True)
class DigitTask:
    """A digit-needle task: its name, number of digits and wording (``{x}`` is the number)."""

    task: str
    n_digits: int
    wording: Wording


_INFINITEBENCH_PREFIX = (
    "There is an important info hidden inside a lot of irrelevant text. Find it and memorize it. "
    "I will quiz you about the important information there.\n\n"
)
_BELOW = "Below is a long, mostly irrelevant text with one important piece of information in it.\n\n"

PASSKEY = DigitTask("passkey", 5, Wording(
    needles=(
        "The pass key is {x}. Remember it. {x} is the pass key.",
        "The pass key is {x}.",
        "Remember this pass key: {x}.",
        "Important: the pass key is {x}. Keep it in mind.",
        "The secret pass key is {x}. Do not forget it.",
        "Note that the pass key is {x}. {x} is the pass key.",
    ),
    prefixes=(
        _INFINITEBENCH_PREFIX,
        "A pass key is hidden somewhere in the text below. Find it and remember it.\n\n",
        "Read the following text carefully. Somewhere in it there is a pass key that you will be asked about.\n\n",
        _BELOW,
        "",
    ),
    queries=(
        "\n\nWhat is the pass key? The pass key is ",
        "\n\nWhat was the pass key hidden in the text? The pass key is ",
        "\n\nQuestion: What is the pass key?\nAnswer: The pass key is ",
        "\n\nRecall the pass key from the text above. The pass key is ",
        "\n\nWhat is the pass key? Answer: ",
        "\n\nThe pass key mentioned above is ",
    ),
))  # fmt: skip

NUMBER_STRING = DigitTask("number_string", 10, Wording(
    needles=(
        "The sequence of digits is {x}. Remember it. {x} is the sequence of digits.",
        "The sequence of digits is {x}.",
        "Remember this sequence of digits: {x}.",
        "Important: the sequence of digits is {x}. Keep it in mind.",
        "The secret number is {x}. Do not forget it.",
        "Note that the sequence of digits is {x}. {x} is the sequence of digits.",
    ),
    prefixes=(
        _INFINITEBENCH_PREFIX,
        "A long number is hidden somewhere in the text below. Find it and remember it.\n\n",
        "Read the following text carefully. Somewhere in it there is a sequence of digits that you "
        "will be asked about.\n\n",
        _BELOW,
        "",
    ),
    queries=(
        "\n\nWhat is the sequence of digits? The sequence of digits is ",
        "\n\nWhat was the number hidden in the text? The number is ",
        "\n\nQuestion: What is the sequence of digits?\nAnswer: The sequence of digits is ",
        "\n\nRecall the sequence of digits from the text above. The sequence of digits is ",
        "\n\nWhat is the hidden number? Answer: ",
        "\n\nThe sequence of digits mentioned above is ",
    ),
))  # fmt: skip


def make_digits(
    spec: DigitTask, rng: random.Random, length: int, depth: float, tokenizer: Any, canonical: bool, split: str
) -> tuple[str, FilledContext, str, str]:
    """The passkey / number_string generator (the protocol of :data:`dllm.tasks.TASKS`)."""
    answer = str(rng.randint(1, 9)) + "".join(str(rng.randint(0, 9)) for _ in range(spec.n_digits - 1))
    w = spec.wording
    needle, prefix, query = (pick(rng, options, canonical) for options in (w.needles, w.prefixes, w.queries))
    units = noise_units(random.Random(rng.getrandbits(64)), canonical)
    return prefix, fill_context(units, needle.format(x=answer), length, depth, tokenizer, task=spec.task), query, answer
