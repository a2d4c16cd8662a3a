"""Natural-prose haystacks and the word-valued fact task.

Haystacks (``make_case(..., haystack=...)``), each split into a training and a held-out part:

- ``essays``: the Paul Graham essays of :mod:`dllm.eval.tasks.essays` (40 train / 9 eval essays);
- ``pydoc``: the English reference prose that CPython ships (``pydoc_data.topics``, the text of
  ``help()`` topics), whitespace collapsed; EVAL is every fifth topic in sorted key order
  (positions 4, 9, ...: :func:`pydoc_topic_names`), TRAIN the others;
- ``generated``: sentences of 4-18 words drawn from the vocabulary of the two TRAIN parts above
  (a varied vocabulary without the grammar of real prose), the same generator in both splits.

The filler is a stream of words (the units of :func:`~dllm.eval.tasks.haystack.fill_context`), so a
needle goes at the word boundary nearest its depth, mid-sentence as often as not. Words holding a
digit are dropped from every prose haystack, so a digit answer occurs only in its needle.

``word_fact``: "The secret city is Lisbon." / "What is the secret city? The secret city is ":
a one-word answer after a fixed phrase (three fact kinds, several wordings each, from
``wording.json``); an answer that occurs in the drawn haystack (case-insensitive) is drawn again.
"""

from __future__ import annotations

import functools
import itertools
import random
import re
from collections.abc import Iterator
from typing import Any

from .case import SPLITS, WORDING, pick
from .essays import load_essays
from .haystack import FilledContext, fill_context
from .text import check_choice, normalize_text

__all__ = ["HAYSTACKS", "PROSE_HAYSTACKS", "pydoc_topic_names", "prose_docs", "prose_units", "make_word_fact"]

HAYSTACKS = ("filler", "essays", "pydoc", "generated")
"""``make_case``'s haystack choices; "filler" is each task's own (InfiniteBench noise, essays, JSON)."""
PROSE_HAYSTACKS = HAYSTACKS[1:]
_DIGIT = re.compile(r"\d")


@functools.cache
def pydoc_topic_names(split: str = "eval") -> tuple[str, ...]:
    """Keys of ``pydoc_data.topics.topics`` in ``split`` (sorted; "eval": positions 4, 9, 14, ...).
    Raises ``ValueError`` for an unknown split."""
    check_choice("split", split, SPLITS)
    from pydoc_data.topics import topics

    names = sorted(topics)
    return tuple(n for i, n in enumerate(names) if (i % 5 == 4) == (split == "eval"))


def _words(text: str) -> tuple[str, ...]:
    return tuple(w for w in text.split() if not _DIGIT.search(w))


@functools.cache
def prose_docs(haystack: str, split: str) -> tuple[tuple[str, ...], ...]:
    """The documents of a real-prose haystack ("essays" or "pydoc") of ``split`` as word tuples
    (ASCII-normalised, digit-holding words dropped). Cached."""
    check_choice("split", split, SPLITS)
    if haystack == "essays":
        return tuple(_words(text) for _, text in load_essays(split))
    if haystack == "pydoc":
        from pydoc_data.topics import topics

        return tuple(_words(normalize_text(topics[n])) for n in pydoc_topic_names(split))
    raise ValueError(f"no documents for haystack {haystack!r}; expected 'essays' or 'pydoc'")


@functools.cache
def _vocabulary() -> tuple[str, ...]:
    """Lower-case alphabetic words (2-14 letters) of the TRAIN essays and TRAIN pydoc topics, sorted."""
    words = set()
    for h in ("essays", "pydoc"):
        for doc in prose_docs(h, "train"):
            for w in doc:
                w = w.strip(".,;:!?\"'()[]*`").lower()
                if w.isalpha() and 2 <= len(w) <= 14:
                    words.add(w)
    return tuple(sorted(words))


def _generated(rng: random.Random) -> Iterator[str]:
    vocab = _vocabulary()
    while True:
        n = rng.randint(4, 18)
        words = [rng.choice(vocab) for _ in range(n)]
        words[0] = words[0].capitalize()
        if n > 8 and rng.random() < 0.4:
            k = rng.randint(2, n - 3)
            words[k] += ","
        words[-1] += rng.choice(".....?!")
        yield from words


def prose_units(haystack: str, split: str, rng: random.Random) -> Iterator[str]:
    """Endless words of ``haystack`` ("essays", "pydoc", "generated") in ``split``: documents in
    order from a random one at a random word, cycling (generated: a fresh seeded stream)."""
    if haystack == "generated":
        return _generated(rng)
    docs = prose_docs(haystack, split)
    first = rng.randrange(len(docs))
    skip = rng.randrange(len(docs[first]))
    order = [docs[(first + i) % len(docs)] for i in range(len(docs))]
    return itertools.islice(itertools.chain.from_iterable(itertools.cycle(order)), skip, None)


def filler_units(haystack: str, split: str, rng: random.Random, canonical: bool) -> Iterator[str]:
    """The units of a digit or word-fact haystack: InfiniteBench noise ("filler") or prose words."""
    if haystack == "filler":
        from .noise import noise_units

        return noise_units(rng, canonical)
    return prose_units(haystack, split, rng)


_WF = WORDING["word_fact"]


def make_word_fact(
    rng: random.Random, length: int, depth: float, tokenizer: Any, canonical: bool, split: str, haystack: str = "filler"
) -> tuple[str, FilledContext, str, str]:
    """The word_fact generator (the protocol of :data:`dllm.eval.tasks.TASKS` plus ``haystack``)."""
    kind = _WF["kinds"][0] if canonical else rng.choice(_WF["kinds"])
    needle_t, query = pick(rng, tuple(kind["needles"]), canonical), pick(rng, tuple(kind["queries"]), canonical)
    prefix = pick(rng, tuple(_WF["prefixes"]), canonical)
    units_seed = rng.getrandbits(64)
    answers = list(kind["answers"])
    rng.shuffle(answers)
    for answer in answers:
        filled = fill_context(
            filler_units(haystack, split, random.Random(units_seed), canonical),
            needle_t.format(a=answer), length, depth, tokenizer, task="word_fact",
        )  # fmt: skip
        rest = (filled.context[: filled.needle_start] + " " + filled.context[filled.needle_end :]).lower()
        if answer.lower() not in rest:
            return prefix, filled, query, answer
    raise RuntimeError(f"word_fact: every {kind['kind']} answer occurs in the haystack")  # pragma: no cover
