"""Training samples for multi-part answers: 2-4 numbered pass keys in separate chunks, all asked for in one answer.

The answer format of :mod:`dllm.eval.tasks.multipart` (its prefix, needle wordings, question and answer), on
training text only: each part's chunk is a crop of a training case's context (InfiniteBench filler, or the
training parts of the essays, pydoc and generated prose, :func:`bench.tiny.data._case` with
``split="train"``) with one numbered needle sentence put in at a word boundary, away from the case's own
pass key; 0-3 other chunks beside them are number-dense (:func:`bench.tiny.distractors._other_chunk`:
prose with dates and codes put in, reports, tables). The parts' chunks stay in order (the first key's
first), the other chunks anywhere, as selection keeps chunks in document order. The held-out registers of
the evaluation (*The Devil's Dictionary*) never appear.

Two layouts: ``chunked`` (``[BOS prefix] [BOS chunk]... query answer EOS*n``, segment-local attention, the
static-KV layout Prefilling-dLLM decodes from) and ``dense`` (``BOS prefix chunks query answer EOS*n`` in
one segment, what a dense reader of a crop sees). Answer-only masking.
"""

from __future__ import annotations

import random

from bench.tiny.data import BOS, EOS, Sample, _append, _case, append_chunks, encode
from bench.tiny.distractors import OTHER_CHUNKS, _other_chunk, _weighted, crop
from dllm.eval.tasks.multipart import NEEDLES, PREFIX, answer_text, needle_text, query_text

PARTS = (2, 4)
OTHERS = (0, 3)  # number-dense chunks beside the parts' chunks
CHUNK_CHARS = (160, 320)
MIN_CHUNK = 96


def _part_chunk(rng: random.Random, text: str, n: int, sentence: str) -> str:
    """About ``n`` characters of ``text`` with ``sentence`` put in at a word boundary (its own sentence)."""
    body = crop(rng, text, max(0, n - len(sentence) - 1))
    starts = [i + 1 for i in range(1, len(body)) if body[i] == " " and body[i - 1] in ".!?"]
    spots = starts if starts and rng.random() < 0.7 else [0] + [i + 1 for i, c in enumerate(body) if c == " "]
    at = rng.choice(spots)
    return body[:at] + sentence + " " + body[at:]


def multipart_sample(rng: random.Random, total: int, haystack: str = "filler", dense: bool = False) -> Sample:
    """``[BOS prefix] [BOS chunk]... query answer EOS*n`` (``dense``: one segment) of at most about ``total``
    tokens: 2-4 numbered pass keys each in a chunk of its own, 0-3 number-dense chunks beside them (module
    docstring); chunks shrink (down to :data:`MIN_CHUNK` characters), then other chunks go, when ``total``
    leaves no room, and a sample too short for 3-4 parts holds fewer."""
    n_parts = rng.randint(*PARTS)
    n_other = rng.randint(*OTHERS)
    n_eos = rng.randint(1, 8)
    fixed = 2 + len(PREFIX) + len(query_text(2)) + n_eos
    while n_parts > PARTS[0] and fixed + n_parts * (MIN_CHUNK + 2 * len(needle_text(3, "00000"))) > total:
        n_parts -= 1  # a short sample holds fewer parts
    keys: list[str] = []
    while len(keys) < n_parts:
        key = str(rng.randint(10000, 99999))
        if all(key not in k and k not in key for k in keys):
            keys.append(key)
    sentences = [needle_text(i, k, rng.choice(NEEDLES)) for i, k in enumerate(keys)]
    query, answer = query_text(n_parts), answer_text(keys)
    budget = total - (2 + len(PREFIX) + len(query) + len(answer) + n_eos) - 40 * n_parts
    n_other = max(0, min(n_other, budget // (MIN_CHUNK + 1) - n_parts))
    chunk = max(MIN_CHUNK, min(rng.randint(*CHUNK_CHARS), budget // (n_parts + n_other) - 1))
    case = _case(rng, "passkey", max(320, (n_parts + n_other + 2) * chunk), haystack=haystack)
    ctx, span = case.context, (case.needle_start - chunk, case.needle_end + chunk)
    free = ctx[: max(0, span[0])] + " " + ctx[span[1] :]  # the case's own pass key left out
    parts = [_part_chunk(rng, free, chunk, s) for s in sentences]
    others = [
        _other_chunk(rng, case, rng.randint(3 * chunk // 4, chunk), _weighted(rng, OTHER_CHUNKS), span)
        for _ in range(n_other)
    ]
    others = [t for t in others if not any(k in t for k in keys)]
    places = [(i, 0, p) for i, p in enumerate(parts)] + [(rng.uniform(-0.5, n_parts - 0.5), 1, t) for t in others]
    order = sorted(places)
    chunks = [t for *_, t in order]
    s = Sample([], [], [], "multipart_dense" if dense else "multipart")
    if dense:
        _append(s, [BOS], 0, "b")
        _append(s, encode(PREFIX + " ".join(chunks)), 0, "p")
    else:
        append_chunks(s, PREFIX, [encode(t) for t in chunks])
    _append(s, encode(query), 0, "q")
    _append(s, encode(answer) + [EOS] * n_eos, 0, "a")
    return s
