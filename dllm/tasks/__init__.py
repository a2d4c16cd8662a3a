"""Seeded long-context retrieval tasks and their scorers.

Tasks (InfiniteBench and Needle-in-a-Haystack style), each generated for a
context length in tokens of a given tokenizer (characters by default) and a
needle depth in [0, 1]:

- ``passkey``: a 5-digit key in repeated noise sentences (InfiniteBench);
- ``number_string``: a 10-digit number in the same noise (InfiniteBench);
- ``kv_retrieval``: a JSON object of UUID pairs, ask one key's value (InfiniteBench);
- ``needle``: a one-sentence fact in Paul Graham essays (gkamradt's NIAH).

Example::

    from dllm.tasks import make_case, score
    case = make_case("passkey", 4096, 0.5, seed=0)
    ok = score("passkey", model_output, case)

LongBench data (local JSONL) and metrics live in :mod:`dllm.tasks.longbench`.
"""

from __future__ import annotations

import numbers
from collections.abc import Callable, Iterable
from typing import Any

from .case import PHRASINGS, SPLITS, TaskCase
from .kv_retrieval import make_kv_retrieval
from .needle import make_needle
from .number_string import make_number_string
from .passkey import make_passkey
from .scoring import SCORERS, score
from .text import count_tokens, normalize_text

__all__ = [
    "TaskCase",
    "TASKS",
    "PHRASINGS",
    "SPLITS",
    "SCORERS",
    "make_case",
    "make_cases",
    "score",
    "count_tokens",
    "normalize_text",
]

TASKS: dict[str, Callable[..., TaskCase]] = {
    "passkey": make_passkey,
    "number_string": make_number_string,
    "kv_retrieval": make_kv_retrieval,
    "needle": make_needle,
}


def make_case(
    task: str,
    length: int,
    depth: float,
    seed: int,
    *,
    tokenizer: Any = None,
    phrasing: str = "canonical",
    split: str = "eval",
) -> TaskCase:
    """Generate one case of ``task``.

    A case is a pure function of its arguments (the seed is hashed with
    SHA-256 together with the task, length, depth, phrasing and split, so it is
    stable across Python runs).

    Args:
        task: one of :data:`TASKS` ("passkey", "number_string", "kv_retrieval", "needle").
        length: context length in tokens of ``tokenizer`` (characters when it is
            None). The context (the text between prefix and query) never
            exceeds it and is within ~1% or a few tokens of it (kv_retrieval:
            within one key-value pair).
        depth: needle depth, 0.0 (start of the context) to 1.0 (end).
        seed: integer seed.
        tokenizer: None for character level (the bundled tiny model), or a
            Hugging Face tokenizer (tokens counted without special tokens).
        phrasing: "canonical" (InfiniteBench/NIAH wording, for evaluation) or
            "random" (paraphrased needle, prefix, query and filler, for training).
        split: "eval" (default) or "train"; selects the held-out or training
            essays for the needle task, validated but unused by the others.

    Returns:
        A :class:`TaskCase`; the model continues ``case.prompt`` with ``case.answer``.

    Raises:
        ValueError: unknown task, phrasing or split; depth outside [0, 1];
            length not a positive integer or too short for the needle (the
            message gives the minimum).
    """
    try:
        gen = TASKS[task]
    except (KeyError, TypeError):
        raise ValueError(f"unknown task {task!r}; expected one of {sorted(TASKS)}") from None
    return gen(length, depth, seed, tokenizer=tokenizer, phrasing=phrasing, split=split)


def make_cases(
    task: str,
    lengths: int | Iterable[int],
    depths: float | Iterable[float],
    n: int,
    seed: int = 0,
    *,
    tokenizer: Any = None,
    phrasing: str = "canonical",
    split: str = "eval",
) -> list[TaskCase]:
    """Generate ``n`` cases for every (length, depth) cell of a sweep.

    Args:
        task: task name (see :func:`make_case`).
        lengths: one context length or several, in tokens (characters when
            tokenizer is None).
        depths: one depth or several, each in [0, 1].
        n: cases per cell (>= 1); the i-th case of a cell uses seed ``seed + i``.
        seed: base seed.
        tokenizer, phrasing, split: as for :func:`make_case`.

    Returns:
        A list ordered by length, then depth, then i (``len(lengths) *
        len(depths) * n`` cases).

    Raises:
        ValueError: n < 1, an empty list of lengths or depths, or any error of
            :func:`make_case`.
    """
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"n must be an integer >= 1 (cases per cell), got {n!r}")
    length_list = [lengths] if isinstance(lengths, numbers.Integral) else list(lengths)
    depth_list = [depths] if isinstance(depths, numbers.Real) else list(depths)
    if not length_list or not depth_list:
        raise ValueError("make_cases needs at least one length and one depth")
    return [
        make_case(task, length, depth, seed + i, tokenizer=tokenizer, phrasing=phrasing, split=split)
        for length in length_list
        for depth in depth_list
        for i in range(n)
    ]
