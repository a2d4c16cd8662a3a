"""Key-value retrieval (InfiniteBench ``kv_retrieval``): a JSON object of
UUID keys and values; the query names one key and the answer is its value.

The UUIDs are version-4-shaped strings drawn from the case's seeded
``random.Random`` (never ``uuid.uuid4()``), so a case is reproducible. The
"needle" is the asked ``"key": "value"`` pair; ``depth`` chooses which pair of
the object it is (pair index ``round(depth * (n_pairs - 1))``). The object holds
as many whole pairs as fit in ``length`` tokens, so the context is within one
pair of ``length``.
"""

from __future__ import annotations

import random
import uuid
from typing import Any

from .case import WORDING, pick
from .haystack import FilledContext, PrefixTokens
from .text import count_tokens

__all__ = ["KV_PREFIXES", "KV_QUERIES", "seeded_uuid", "make_kv_retrieval"]

KV_PREFIXES: tuple[str, ...] = tuple(WORDING["kv_retrieval"]["prefixes"])
KV_QUERIES: tuple[str, ...] = tuple(WORDING["kv_retrieval"]["queries"])  # {key}: the asked key
_OPEN, _SEP, _CLOSE = "{", ", ", "}"


def seeded_uuid(rng: random.Random) -> str:
    """A random version-4 UUID string (``xxxxxxxx-xxxx-4xxx-yxxx-xxxxxxxxxxxx``,
    36 characters, lowercase hex) drawn from ``rng``, so it is reproducible."""
    return str(uuid.UUID(int=rng.getrandbits(128), version=4))


def _pair(key: str, value: str) -> str:
    return f'"{key}": "{value}"'


def make_kv_retrieval(
    rng: random.Random, length: int, depth: float, tokenizer: Any, canonical: bool, split: str
) -> tuple[str, FilledContext, str, str]:
    """The kv_retrieval generator (the protocol of :data:`dllm.eval.tasks.TASKS`)."""
    prefix, query = pick(rng, KV_PREFIXES, canonical), pick(rng, KV_QUERIES, canonical)
    pair_rng = random.Random(rng.getrandbits(64))
    seen: set[str] = set()
    pairs: list[tuple[str, str]] = []

    def add_pairs(n: int) -> None:
        while len(pairs) < n:
            k, v = seeded_uuid(pair_rng), seeded_uuid(pair_rng)
            if k in seen or v in seen or k == v:  # practically never; keeps values unique
                continue
            seen.update((k, v))
            pairs.append((k, v))

    add_pairs(1)
    min_len = count_tokens(_OPEN + _pair(*pairs[0]) + _CLOSE, tokenizer)
    if length < min_len:
        raise ValueError(
            f"kv_retrieval: length {length} is too short: one key-value pair in braces takes "
            f"{min_len} tokens; the context needs at least {min_len} tokens"
        )

    n = _fit_pairs(pairs, add_pairs, length, tokenizer)
    while True:
        texts = [_pair(k, v) for k, v in pairs[:n]]
        context = _OPEN + _SEP.join(texts) + _CLOSE
        n_tok = len(context) if tokenizer is None else count_tokens(context, tokenizer)
        if n_tok <= length or n == 1:
            break
        n -= 1
    idx = round(depth * (n - 1))
    key, value = pairs[idx]
    start = len(_OPEN) + sum(len(t) + len(_SEP) for t in texts[:idx])
    return prefix, FilledContext(context, start, start + len(texts[idx]), n_tok), query.format(key=key), value


def _fit_pairs(pairs: list[tuple[str, str]], add_pairs, length: int, tokenizer: Any) -> int:
    """How many whole pairs fit in ``length`` tokens (before the final check)."""
    pair_chars = len(_pair(*pairs[0])) + len(_SEP)  # every pair has the same character length
    if tokenizer is None:
        n = max(1, (length - len(_OPEN) - len(_CLOSE) + len(_SEP)) // pair_chars)
        add_pairs(n)
        return n
    close = count_tokens(_CLOSE, tokenizer)
    add_pairs(8)
    per_pair = count_tokens(_SEP.join(_pair(k, v) for k, v in pairs[:8]), tokenizer) / 8
    est = int(length / per_pair * 1.1) + 8
    while True:
        add_pairs(est)
        texts = [_pair(k, v) for k, v in pairs[:est]]
        text = _OPEN + _SEP.join(texts)
        ends, pos = [], len(_OPEN)
        for t in texts:
            pos += len(t)
            ends.append(pos)
            pos += len(_SEP)
        tokens_before = PrefixTokens(text, tokenizer)
        fits = [i + 1 for i, e in enumerate(ends) if tokens_before(e) + close <= length]
        n = fits[-1] if fits else 1
        if n < est:
            return n
        est *= 2
