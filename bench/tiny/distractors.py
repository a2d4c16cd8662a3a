"""Chunked answers among number-dense chunks: the layout that Prefilling-dLLM decodes from on documents full of
numbers.

``[BOS prefix] [BOS chunk]... query answer EOS*n`` with segment-local attention, as
:func:`bench.tiny.data.chunked_sample`, but with 2-5 chunks, the needle's chunk at a uniformly drawn place
among them and the other chunks full of numbers (dates, amounts, codes, numbered headings): what chunk
selection keeps beside the needle on such documents, where a model trained on random filler chunks beside
the needle copies the answer with digits changed. All text comes from training sources only:

- the needle's case is drawn with ``split="train"`` (:func:`bench.tiny.data._case`) in the haystack the phase
  draws (InfiniteBench filler, or the training parts of the essays, pydoc and generated prose);
- the number-dense text is :mod:`bench.tiny.synthetic`'s reports and tables (the ``reports`` / ``tables``
  training sources), generated afresh from the sample's rng, and the snippets of :func:`snippet` (built from
  :mod:`bench.tiny.synthetic`'s dates, amounts and codes), put into the case's own haystack.

Chunks (:data:`NEEDLE_CHUNKS`, :data:`OTHER_CHUNKS`): the needle's chunk is a crop of its case's context around
the whole needle (``plain``), the same with 1-3 snippets put beside the needle (``numbers``), or the needle
sentence inside report text (``report``); each other chunk is a crop of the case's context away from the
needle with 1-4 snippets put in (``prose``), of a report (``report``) or of a table (``table``). The answer
occurs in the sample only inside the needle (a draw that breaks this is drawn again), so it can only be
copied from there.
"""

from __future__ import annotations

import random
import re

from bench.tiny import synthetic
from bench.tiny.data import EOS, Sample, _append, _case, append_chunks, encode

NEEDLE_CHUNKS = {"plain": 0.4, "numbers": 0.3, "report": 0.3}
OTHER_CHUNKS = {"prose": 0.55, "report": 0.3, "table": 0.15}
CHUNKS = (2, 5)  # chunks per sample, the needle's included
CHUNK_CHARS = (160, 320)  # a sample's chunk length (Prefilling-dLLM's C=256 with boundaries snapped by 64)
MIN_CHUNK = 128  # the shortest chunk when a short sample leaves less room
HEADINGS = ("Summary", "Accounts", "Schedule", "Notes", "Findings", "Expenses", "Appendix", "Minutes", "Returns",
            "Stores", "Repairs", "Tenders")  # fmt: skip
_DIGITS = re.compile(r"\d+")
_STARTS = re.compile(r"(?<=[.!?:]\s)|(?<=\n)")


def snippet(rng: random.Random) -> str:
    """A short number-bearing piece of text: a numbered heading, a dated entry, a reference, an amount."""
    kind = rng.randrange(5)
    if kind == 0:
        return f"\n{rng.randint(1, 12)}. {rng.choice(HEADINGS)}\n"
    if kind == 1:
        return f"Entered {synthetic.date(rng)} under {synthetic.code(rng)}."
    if kind == 2:
        return f"(see {rng.randint(1, 12)}.{rng.randint(1, 9)}, {synthetic.date(rng)})"
    if kind == 3:
        return f"Total {synthetic.amount(rng)} as of {synthetic.date(rng)}."
    return f"Ref. {synthetic.code(rng)}, {synthetic.amount(rng)}."


def sprinkle(rng: random.Random, text: str, k: int) -> str:
    """``text`` with ``k`` snippets put in at word boundaries (after a space or newline; at the start when none)."""
    for _ in range(k):
        spots = [i + 1 for i, c in enumerate(text) if c in " \n"] or [0]
        at = rng.choice(spots)
        piece = snippet(rng)
        text = text[:at] + piece + ("" if piece.endswith("\n") else " ") + text[at:]
    return text


def number_text(rng: random.Random, n: int, kind: str) -> str:
    """At least ``n`` characters of fresh synthetic ``kind`` documents ("report" or "table"), blank-line joined."""
    make = synthetic.report if kind == "report" else synthetic.table
    text = make(rng)
    while len(text) < n:
        text += "\n\n" + make(rng)
    return text


def crop(rng: random.Random, text: str, n: int, at_start: float = 0.7) -> str:
    """``n`` characters of ``text`` (all of it when shorter); with probability ``at_start`` from a sentence or
    line start (as chunk boundaries snapped to sentence ends give), else from any offset."""
    if len(text) <= n:
        return text
    starts = [m.start() for m in _STARTS.finditer(text) if m.start() <= len(text) - n]
    if starts and rng.random() < at_start:
        a = rng.choice(starts)
    else:
        a = rng.randint(0, len(text) - n)
    return text[a : a + n]


def _needle_chunk(rng: random.Random, case, n: int, kind: str) -> tuple[str, str, str]:
    """The needle's chunk of about ``n`` characters as (text before the needle, needle, text after it)."""
    ctx, ns, ne = case.context, case.needle_start, case.needle_end
    needle = ctx[ns:ne]
    room = max(0, n - len(needle))
    if kind == "report":
        left_n = rng.randint(0, room)
        text = number_text(rng, 4 * n, "report")
        ends = [m.start() for m in _STARTS.finditer(text) if m.start() >= left_n] or [len(text)]
        end = rng.choice(ends)
        left = text[max(0, end - left_n) : end]
        right = crop(rng, number_text(rng, 2 * n, "report"), max(0, room - len(left) - 1), at_start=1.0)
        return left, needle, " " + right if right else ""
    a = rng.randint(max(0, ne - n), max(0, min(ns, len(ctx) - n)))
    left, right = ctx[a:ns], ctx[ne : a + n]
    if kind == "numbers":
        k = rng.randint(1, 3)
        k_left = rng.randint(0, k)
        left = sprinkle(rng, left, k_left)[-len(left) :] if left else ""
        right = sprinkle(rng, right, k - k_left)[: len(right)] if right else ""
    return left, needle, right


def _other_chunk(rng: random.Random, case, n: int, kind: str, avoid: tuple[int, int]) -> str:
    """Another chunk of ``n`` characters: ``prose`` (the case's context outside ``avoid`` with 1-4 snippets),
    ``report`` or ``table``."""
    if kind != "prose":
        return crop(rng, number_text(rng, 2 * n, kind), n)
    ctx = case.context
    lo, hi = avoid
    free = [(0, lo), (hi, len(ctx))]
    a, b = max(free, key=lambda span: span[1] - span[0]) if rng.random() < 0.5 else rng.choice(free)
    if b - a < n // 2:
        a, b = max(free, key=lambda span: span[1] - span[0])
    text = sprinkle(rng, crop(rng, ctx[a:b], n), rng.randint(1, 4))
    return crop(rng, text, n, at_start=0.0) if len(text) > n else text


def _weighted(rng: random.Random, weights: dict) -> str:
    return rng.choices(list(weights), weights=list(weights.values()))[0]


def _answer_elsewhere(answer: str, texts: list[str]) -> bool:
    return any(answer in run for t in texts for run in _DIGITS.findall(t))


def distractor_chunked_sample(rng: random.Random, total: int, task: str, haystack: str = "filler") -> Sample:
    """``[BOS prefix] [BOS chunk]... query answer EOS*n`` of about ``total`` tokens: 2-5 chunks of 160-320
    characters (shorter, down to :data:`MIN_CHUNK`, then fewer when ``total`` leaves no room), the needle's
    at a uniformly drawn place, the others number-dense (module
    docstring); ``task`` passkey or number_string, ``haystack`` as for ``make_case`` (training split)."""
    for _ in range(50):
        n_eos = rng.randint(1, 12)
        n_chunks = rng.randint(*CHUNKS)
        chunk = rng.randint(*CHUNK_CHARS)
        case = _case(rng, task, max(320, (n_chunks + 3) * chunk), haystack=haystack)
        needle_len = case.needle_end - case.needle_start
        budget = total - (2 + len(case.prefix) + len(case.query) + len(case.answer) + n_eos)
        # shorter chunks first (down to MIN_CHUNK), then fewer of them, when ``total`` leaves no room
        floor = max(needle_len + 16, MIN_CHUNK)
        n_chunks = max(CHUNKS[0], min(n_chunks, budget // (floor + 1)))
        chunk = max(floor, min(chunk, budget // n_chunks - 1))
        place = rng.randrange(n_chunks)
        left, needle, right = _needle_chunk(rng, case, chunk, _weighted(rng, NEEDLE_CHUNKS))
        span = (case.needle_start - chunk, case.needle_end + chunk)
        others = [
            _other_chunk(rng, case, rng.randint(3 * chunk // 4, chunk), _weighted(rng, OTHER_CHUNKS), span)
            for _ in range(n_chunks - 1)
        ]
        if not _answer_elsewhere(case.answer, [left, right, *others]):
            break
    else:  # pragma: no cover - an answer is a 5- or 10-digit draw: 50 clashes in a row do not happen
        raise RuntimeError(f"{task}: the answer kept occurring outside the needle")
    chunks = others[:place] + [left + needle + right] + others[place:]
    s = Sample([], [], [], "distractor_chunked")
    append_chunks(s, case.prefix, [encode(text) for text in chunks])
    _append(s, encode(case.query), 0, "q")
    _append(s, encode(case.answer) + [EOS] * n_eos, 0, "a")
    return s
