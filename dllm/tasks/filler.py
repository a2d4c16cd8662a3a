"""Repeated "noise" filler and the shared builder of the digit-needle tasks
(passkey, number_string).

InfiniteBench's passkey and number_string tasks hide a number in a block of
five short sentences repeated many times ("The grass is green. The sky is
blue. The sun is yellow. Here we go. There and back again."); that is the
canonical filler here. The random phrasing draws from a larger pool of similar
short sentences, either i.i.d. or as a repeated random block, so a model trained
on it does not key on one template. No filler sentence contains a digit, so the
hidden number occurs only in the needle.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from .case import PHRASINGS, SPLITS, TaskCase
from .text import check_depth, check_length, count_tokens, fill_context, stable_seed, tokenizer_name

__all__ = [
    "CANONICAL_NOISE",
    "NOISE_POOL",
    "noise_units",
    "DigitTaskSpec",
    "make_digit_case",
    "check_phrasing",
    "check_split",
]

CANONICAL_NOISE: tuple[str, ...] = (
    "The grass is green.",
    "The sky is blue.",
    "The sun is yellow.",
    "Here we go.",
    "There and back again.",
)

NOISE_POOL: tuple[str, ...] = CANONICAL_NOISE + (
    "The river is wide.",
    "The night is quiet.",
    "The road is long.",
    "Birds sing in the morning.",
    "The wind is cold.",
    "The sea is calm today.",
    "Leaves fall in autumn.",
    "The stars are bright.",
    "The moon is pale.",
    "Rain falls on the roof.",
    "The hills are far away.",
    "Snow covers the field.",
    "The tea is warm.",
    "Clouds drift slowly by.",
    "The door is open.",
    "A dog barks in the distance.",
    "The clock ticks on the wall.",
    "The trees sway gently.",
    "The bread is fresh.",
    "Waves roll onto the shore.",
    "The lamp is on.",
    "The path winds through the woods.",
    "The garden is full of flowers.",
    "Time goes by.",
    "And so it goes.",
    "The cat sleeps by the fire.",
    "The water is cool and clear.",
    "Nothing happens here.",
    "The wall is painted white.",
    "We walk along the beach.",
)


def check_phrasing(phrasing: str) -> str:
    """Return ``phrasing``; raise ``ValueError`` unless it is "canonical" or "random"."""
    if phrasing not in PHRASINGS:
        raise ValueError(f"unknown phrasing {phrasing!r}; expected one of {PHRASINGS}")
    return phrasing


def check_split(split: str) -> str:
    """Return ``split``; raise ``ValueError`` unless it is "eval" or "train"."""
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; expected one of {SPLITS}")
    return split


def noise_units(rng: random.Random, phrasing: str = "canonical") -> Iterator[str]:
    """Endless iterator of filler sentences.

    Args:
        rng: source of randomness (used only for ``phrasing="random"``).
        phrasing: ``"canonical"``: the five InfiniteBench sentences in a cycle;
            ``"random"``: half of the seeds draw sentences i.i.d. from
            :data:`NOISE_POOL`, the other half repeat a random block of 3-7 of them.

    Raises:
        ValueError: unknown phrasing.
    """
    check_phrasing(phrasing)
    if phrasing == "canonical":
        return itertools.cycle(CANONICAL_NOISE)
    if rng.random() < 0.5:
        block = rng.sample(NOISE_POOL, rng.randint(3, 7))
        return itertools.cycle(block)
    pool = NOISE_POOL
    return (rng.choice(pool) for _ in itertools.count())


@dataclass(frozen=True)
class DigitTaskSpec:
    """Wording of a digit-needle task. Templates use ``{x}`` for the number.

    The first entry of ``needles``, ``prefixes`` and ``queries`` is the
    canonical (InfiniteBench) wording; the random phrasing picks any entry.
    Every query ends where the number starts.
    """

    task: str
    n_digits: int
    needles: tuple[str, ...]
    prefixes: tuple[str, ...]
    queries: tuple[str, ...]


def _draw_number(rng: random.Random, n_digits: int) -> str:
    return str(rng.randint(1, 9)) + "".join(str(rng.randint(0, 9)) for _ in range(n_digits - 1))


def make_digit_case(
    spec: DigitTaskSpec,
    length: int,
    depth: float,
    seed: int,
    *,
    tokenizer: Any = None,
    phrasing: str = "canonical",
    split: str = "eval",
) -> TaskCase:
    """Generate one digit-needle case (InfiniteBench passkey / number_string style).

    Args:
        spec: the task's wording and number of digits.
        length: context length in tokens (characters when tokenizer is None);
            the context is at most this long and within ~1% (or a few tokens) of it.
        depth: needle depth in [0, 1], the fraction of filler tokens before it.
        seed: integer seed; the case is a pure function of all arguments, and
            the number and wording do not depend on the tokenizer.
        tokenizer: None (character level) or a Hugging Face tokenizer.
        phrasing: "canonical" or "random".
        split: "eval" or "train" (validated; no effect on these tasks).

    Raises:
        ValueError: bad depth, length, phrasing or split, or length too short
            for the needle (the message gives the minimum).
    """
    depth = check_depth(depth)
    length = check_length(length)
    check_phrasing(phrasing)
    check_split(split)
    rng = random.Random(stable_seed(spec.task, int(seed), length, depth, phrasing, split))
    answer = _draw_number(rng, spec.n_digits)
    if phrasing == "canonical":
        needle_t, prefix, query = spec.needles[0], spec.prefixes[0], spec.queries[0]
    else:
        needle_t, prefix, query = (
            rng.choice(spec.needles),
            rng.choice(spec.prefixes),
            rng.choice(spec.queries),
        )
    needle = needle_t.format(x=answer)
    units = noise_units(random.Random(rng.getrandbits(64)), phrasing)
    filled = fill_context(units, needle, length, depth, tokenizer, task=spec.task)
    return TaskCase(
        task=spec.task,
        prefix=prefix,
        context=filled.context,
        query=query,
        answer=answer,
        length=length,
        depth=depth,
        seed=int(seed),
        needle_start=filled.needle_start,
        needle_end=filled.needle_end,
        context_tokens=filled.n_tokens,
        answer_tokens=count_tokens(answer, tokenizer),
        phrasing=phrasing,
        split=split,
        tokenizer=tokenizer_name(tokenizer),
    )
