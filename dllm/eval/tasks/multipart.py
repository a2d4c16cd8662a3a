"""Multi-part answers: two to four numbered pass keys far apart in one document, asked for in one answer.

A question about a long document often wants several facts that sit in different places ("list the keys",
"a field from each section"). Here the document holds ``n`` pass keys (2-4), each with its number ("The pass
key number 2 is 40917."), at depths spread over the document (one in each ``n``-th of it, drawn inside the
middle 70% of that share: far apart). The question asks for all of them in order and the answer names each
one in the needle's own wording::

    What are the pass keys number 1 to 3? The pass key number 1 is 31785. The pass key number 2 is 40917. The
    pass key number 3 is 66052.

so an answer is 32 characters a part (64-128 tokens of a character-level tokenizer at 2-4 parts): it runs
over several 32-token blocks, and the part a block writes is named in the answer before its digits, which is
what a selection re-scored against the answer so far (:mod:`dllm.prefilling.reselect`) can follow. The part's
number sits right before its digits ("2 is "): a first wording with ordinal words ("The second pass key is
...", the word ten characters before the digits) was learned as a format and never read by the bundled
model's architecture (``bench/results/multipart_eval/``).

The documents are :mod:`dllm.eval.tasks.reports`' registers (*The Devil's Dictionary*, held out of every
training phase of the bundled model, in numbered sections with dated title lines); ``distractor_share``
adds register sentences with dates, amounts and codes. Every key occurs in the document only inside its
needle. :func:`part_scores` reads an answer part by part (each number's key must be the right one).

The wording is this module's own (:data:`NEEDLES`, :data:`PREFIX`, :func:`query_text`, :func:`answer_text`);
``bench.tiny.multipart`` trains the answer format on training text with the same wording.
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence
from dataclasses import dataclass

from .reports import _Numbers, compose, crop_around
from .text import check_length, stable_seed

__all__ = [
    "PARTS",
    "NEEDLES",
    "PREFIX",
    "MultipartCase",
    "needle_text",
    "query_text",
    "answer_text",
    "make_multipart",
    "part_scores",
    "crop_parts",
]

PARTS = (2, 3, 4)
NEEDLES = (
    "The pass key number {i} is {x}.",
    "The pass key number {i} is {x}. Remember it.",
    "Remember that the pass key number {i} is {x}.",
)
PREFIX = "Several numbered pass keys are hidden in the text below. Find them and remember them.\n\n"
_PART = re.compile(r"\bpass key number (\d+) is (\d+)", re.IGNORECASE)


def _check_parts(n: int) -> int:
    if isinstance(n, bool) or not isinstance(n, int) or n not in PARTS:
        raise ValueError(f"a multi-part question has 2 to 4 parts, got {n!r}")
    return n


def needle_text(i: int, key: str, template: str = NEEDLES[0]) -> str:
    """The needle sentence of part ``i`` (0-based: number ``i + 1``) with ``key``, in ``template`` (one of
    :data:`NEEDLES`)."""
    return template.format(i=i + 1, x=key)


def query_text(n: int) -> str:
    """The question asked after the context, for ``n`` parts (2-4). Raises ValueError otherwise."""
    return f"\n\nWhat are the pass keys number 1 to {_check_parts(n)}? "


def answer_text(keys: Sequence[str]) -> str:
    """The gold answer: ``"The pass key number 1 is K1. The pass key number 2 is K2. ..."`` (2-4 keys)."""
    _check_parts(len(keys))
    return " ".join(f"The pass key number {i + 1} is {k}." for i, k in enumerate(keys))


@dataclass(frozen=True)
class MultipartCase:
    """One multi-part question about one document.

    Fields:
        prefix, context, query: the prompt pieces (instruction, document, question).
        answer: the gold answer (:func:`answer_text`); keys: the pass keys, first to last (5 digits each).
        spans: each needle sentence's ``(start, end)`` characters in ``context``, first to last.
        length: the asked document length (characters); seed: the case's seed; depths: the asked depths.
    """

    prefix: str
    context: str
    query: str
    answer: str
    keys: tuple[str, ...]
    spans: tuple[tuple[int, int], ...]
    length: int
    seed: int
    depths: tuple[float, ...]


def make_multipart(length: int, n_parts: int, seed: int, *, distractor_share: float = 0.0) -> MultipartCase:
    """A register document of at most ``length`` characters with ``n_parts`` numbered pass keys far apart.

    Args:
        length: the document's maximum length in characters (>= 512 plus the needles).
        n_parts: 2, 3 or 4 keys; key ``i`` goes at a depth drawn in ``[(i + 0.15) / n, (i + 0.85) / n]``.
        seed: any int (the document is a pure function of the arguments).
        distractor_share: the share of register sentences (dates, amounts, codes) among a section's sentences,
            in [0, 1]; 0 leaves the dictionary's prose with the registers' title lines and section numbers.

    Returns:
        :class:`MultipartCase`; ``context[s:e]`` is each needle sentence and each key occurs in the context
        only there.

    Raises:
        ValueError: ``n_parts`` outside 2-4, a share outside [0, 1], or a length too short.
    """
    length = check_length(length)
    n = _check_parts(n_parts)
    if not 0 <= distractor_share <= 1:
        raise ValueError(f"distractor_share must be in [0, 1], got {distractor_share!r}")
    rng = random.Random(stable_seed("multipart", int(seed), length, n, float(distractor_share)))
    keys: list[str] = []
    while len(keys) < n:
        key = str(rng.randint(10000, 99999))
        if all(key not in k and k not in key for k in keys):
            keys.append(key)
    depths = tuple(round((i + rng.uniform(0.15, 0.85)) / n, 4) for i in range(n))
    sentences = [needle_text(i, k, rng.choice(NEEDLES)) for i, k in enumerate(keys)]
    num = _Numbers(rng, keys)
    context, spans = compose(rng, num, [(" ", s, "") for s in sentences], depths, length, distractor_share)
    for k, (s, e) in zip(keys, spans):
        rest = context[:s] + " " + context[e:]
        if re.search(rf"(?<!\d){k}(?!\d)|\d{k}|{k}\d", rest):  # a key drawn again by the filler: redraw
            return make_multipart(length, n, seed + 1_000_003, distractor_share=distractor_share)
    return MultipartCase(PREFIX, context, query_text(n), answer_text(keys), tuple(keys), tuple(spans), length,
                         int(seed), depths)  # fmt: skip


def part_scores(prediction: str, keys: Sequence[str]) -> list[bool]:
    """Per part, whether ``prediction`` names the right key for its number ("The pass key number 2 is K2"; the
    first mention of each number counts, so a part cannot be right by listing every key). Order, extra text
    and case do not matter; a key under the wrong number is wrong."""
    said: dict[str, str] = {}
    for number, digits in _PART.findall(prediction):
        said.setdefault(number, digits)
    return [said.get(str(i + 1)) == k for i, k in enumerate(keys)]


def crop_parts(context: str, spans: Sequence[tuple[int, int]], width: int) -> str:
    """The document cut to ``width`` characters that hold every part: a window of ``width // len(spans)``
    characters around each needle sentence (whole words, :func:`~dllm.eval.tasks.reports.crop_around`),
    in document order, joined by a space. What a reader limited to ``width`` characters of the document
    would be given to answer every part.

    Raises:
        ValueError: a window too narrow for a needle sentence.
    """
    share = width // max(1, len(spans))
    return " ".join(crop_around(context, s, e, share)[0] for s, e in sorted(spans))
