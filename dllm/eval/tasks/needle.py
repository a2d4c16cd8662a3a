"""Needle-in-a-Haystack QA: a one-sentence fact hidden in real English essays
(gkamradt's test; the haystack is :mod:`dllm.eval.tasks.essays`).

Essays are concatenated (in file-name order, from a seeded essay, cycling when
more text is needed) and cut to the requested token length; the fact goes at
the sentence boundary nearest the requested depth. Facts are drawn per seed
from a few kinds (secret soup ingredient, pet's name, home city, ...) with
short answers (1-3 words). Every answer in the pools is checked at load time
not to occur (case-insensitive substring) anywhere in the 49 essays, so the
answer occurs in the context only inside the needle.
"""

from __future__ import annotations

import functools
import random
from dataclasses import dataclass
from typing import Any

from .case import WORDING, pick
from .essays import essay_sentences, essay_units, load_essays
from .haystack import FilledContext, fill_context

__all__ = ["FactKind", "FACT_KINDS", "NAMES", "NEEDLE_PREFIXES", "make_needle"]


@dataclass(frozen=True)
class FactKind:
    """One family of facts. Templates use ``{name}`` and ``{a}`` (the answer);
    query templates end where the answer starts. The first needle and first
    query are the canonical wording; random phrasing picks any."""

    kind: str
    needles: tuple[str, ...]
    queries: tuple[str, ...]
    answers: tuple[str, ...]


_W = WORDING["needle"]
NAMES: tuple[str, ...] = tuple(_W["names"])
FACT_KINDS: tuple[FactKind, ...] = tuple(
    FactKind(f["kind"], tuple(f["needles"]), tuple(f["queries"]), tuple(f["answers"])) for f in _W["facts"]
)
NEEDLE_PREFIXES: tuple[str, ...] = tuple(_W["prefixes"])
_QUERY_SEP: tuple[str, ...] = tuple(_W["query_separators"])  # between the context and the query


@functools.cache
def _answer_pools() -> tuple[tuple[str, ...], ...]:
    """Answers of each fact kind that occur nowhere in the 49 essays
    (case-insensitive substring)."""
    corpus = " ".join(t for split in ("eval", "train") for _, t in load_essays(split)).lower()
    pools = tuple(tuple(a for a in k.answers if a.lower() not in corpus) for k in FACT_KINDS)
    for kind, pool in zip(FACT_KINDS, pools, strict=True):
        if not pool:  # pragma: no cover - the lists above are chosen to avoid this
            raise RuntimeError(f"needle: every answer of fact kind {kind.kind!r} occurs in the essays")
    return pools


def make_needle(
    rng: random.Random, length: int, depth: float, tokenizer: Any, canonical: bool, split: str
) -> tuple[str, FilledContext, str, str]:
    """The needle generator (the protocol of :data:`dllm.eval.tasks.TASKS`)."""
    kind_idx = rng.randrange(len(FACT_KINDS))
    kind = FACT_KINDS[kind_idx]
    answer = rng.choice(_answer_pools()[kind_idx])
    name = rng.choice(NAMES)
    start = rng.randrange(len(essay_sentences(split)))
    needle, query = pick(rng, kind.needles, canonical), pick(rng, kind.queries, canonical)
    prefix, query_sep = pick(rng, NEEDLE_PREFIXES, canonical), pick(rng, _QUERY_SEP, canonical)
    needle = needle.format(name=name, a=answer)
    needle = needle[0].upper() + needle[1:]
    filled = fill_context(essay_units(split, start), needle, length, depth, tokenizer, task="needle")
    return prefix, filled, query_sep + query.format(name=name, a=answer), answer
