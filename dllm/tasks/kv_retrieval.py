"""Key-value retrieval (InfiniteBench ``kv_retrieval``): a JSON object of
random UUID keys and values; the query names one key and the answer is its
value.

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

from .case import TaskCase
from .filler import check_phrasing, check_split
from .text import _PrefixCounter, check_depth, check_length, count_tokens, stable_seed, tokenizer_name

__all__ = ["KV_PREFIXES", "KV_QUERIES", "seeded_uuid", "make_kv_retrieval"]

KV_PREFIXES: tuple[str, ...] = (
    "Extract the value corresponding to the specified key in the JSON object below.\n\n",
    "The JSON object below maps keys to values. You will be asked for the value of one key.\n\n",
    "Read the following JSON data carefully.\n\n",
    "Here is a dictionary of identifiers. Find the value that belongs to the requested key.\n\n",
    "",
)
KV_QUERIES: tuple[str, ...] = (
    '\n\nKey: "{key}"\nThe value associated with the specified key is: ',
    '\n\nWhat is the value of the key "{key}"? The value is: ',
    '\n\nQuestion: Which value belongs to key "{key}"?\nAnswer: ',
    '\n\nLook up "{key}" in the JSON object above. Its value is ',
    '\n\nKey: "{key}"\nValue: ',
)
_OPEN, _SEP, _CLOSE = "{", ", ", "}"


def seeded_uuid(rng: random.Random) -> str:
    """A random version-4 UUID string (``xxxxxxxx-xxxx-4xxx-yxxx-xxxxxxxxxxxx``,
    36 characters, lowercase hex) drawn from ``rng``, so it is reproducible."""
    return str(uuid.UUID(int=rng.getrandbits(128), version=4))


def _pair(key: str, value: str) -> str:
    return f'"{key}": "{value}"'


def make_kv_retrieval(
    length: int,
    depth: float,
    seed: int,
    *,
    tokenizer: Any = None,
    phrasing: str = "canonical",
    split: str = "eval",
) -> TaskCase:
    """Generate a kv_retrieval case: a JSON object of UUID pairs; ask one key's value.

    Args:
        length: context (JSON text) length in tokens (characters when tokenizer
            is None). The object holds as many whole pairs as fit, so the context
            is at most ``length`` and within one pair (76 characters plus the
            ``", "`` separator; about 55 Qwen tokens) of it.
        depth: in [0, 1]; the asked pair is pair ``round(depth * (n_pairs - 1))``.
        seed: integer seed (same arguments -> identical case; the sequence of
            UUID pairs and the wording do not depend on the tokenizer).
        tokenizer: None (character level) or a Hugging Face tokenizer.
        phrasing: "canonical" (InfiniteBench wording) or "random" (paraphrased
            prefix and query).
        split: "eval" or "train" (validated; no effect on this task).

    Returns:
        A :class:`~dllm.tasks.case.TaskCase`; its answer is the asked value (a
        36-character UUID) and its needle is the ``"key": "value"`` pair.

    Raises:
        ValueError: depth outside [0, 1], bad length/phrasing/split, or a length
            too short for one pair in braces (the message gives the minimum).

    Source: InfiniteBench ``kv_retrieval`` (Zhang et al., 2024).
    """
    depth = check_depth(depth)
    length = check_length(length)
    check_phrasing(phrasing)
    check_split(split)
    rng = random.Random(stable_seed("kv_retrieval", int(seed), length, depth, phrasing, split))
    if phrasing == "canonical":
        prefix, query_t = KV_PREFIXES[0], KV_QUERIES[0]
    else:
        prefix, query_t = rng.choice(KV_PREFIXES), rng.choice(KV_QUERIES)
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
    needle_start = len(_OPEN) + sum(len(t) + len(_SEP) for t in texts[:idx])
    return TaskCase(
        task="kv_retrieval",
        prefix=prefix,
        context=context,
        query=query_t.format(key=key),
        answer=value,
        length=length,
        depth=depth,
        seed=int(seed),
        needle_start=needle_start,
        needle_end=needle_start + len(texts[idx]),
        context_tokens=n_tok,
        answer_tokens=count_tokens(value, tokenizer),
        phrasing=phrasing,
        split=split,
        tokenizer=tokenizer_name(tokenizer),
    )


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
        T = _PrefixCounter(text, tokenizer)
        fits = [i + 1 for i, e in enumerate(ends) if T(e) + close <= length]
        n = fits[-1] if fits else 1
        if n < est:
            return n
        est *= 2
