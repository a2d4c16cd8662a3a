"""InfiniteBench-style scoring of the generated retrieval tasks.

Rules (as InfiniteBench defines them for these tasks):

- passkey, number_string: the first run of digits in the prediction must equal
  the gold number exactly ("The pass key is 71432." is right; "7143" and
  "71433" are wrong; so is "71,432", whose first integer is 71).
- kv_retrieval: the gold value must be one of the prediction's words after
  newlines, quotes, and the punctuation ``: . , ? ! { }`` are turned into spaces.
- needle: the gold answer must occur in the prediction, ignoring case and
  runs of whitespace (the usual Needle-in-a-Haystack exact-phrase check).
"""

from __future__ import annotations

import re
from collections.abc import Callable

from .case import TaskCase

__all__ = [
    "first_integer",
    "score_passkey",
    "score_number_string",
    "score_kv_retrieval",
    "score_needle",
    "SCORERS",
    "score",
]

_INT = re.compile(r"\d+")
_KV_PUNCT = re.compile(r"[\n:\"'.,?!{}]")


def first_integer(text: str) -> str:
    """The first run of ASCII digits in ``text`` ("" if none), as a string so
    leading zeros are kept."""
    m = _INT.search(text)
    return m.group(0) if m else ""


def score_passkey(prediction: str, answer: str) -> bool:
    """InfiniteBench passkey rule: the first integer in ``prediction`` equals ``answer``."""
    return first_integer(prediction) == str(answer).strip()


def score_number_string(prediction: str, answer: str) -> bool:
    """InfiniteBench number_string rule: the first integer in ``prediction`` equals ``answer``."""
    return first_integer(prediction) == str(answer).strip()


def score_kv_retrieval(prediction: str, answer: str) -> bool:
    """InfiniteBench kv_retrieval rule: ``answer`` is one of the words of
    ``prediction`` once newlines, quotes and ``: . , ? ! { }`` are spaces.
    (A UUID keeps its hyphens, so a partial UUID does not match.)"""
    return str(answer).strip() in _KV_PUNCT.sub(" ", prediction).split()


def score_needle(prediction: str, answer: str) -> bool:
    """Needle QA rule: ``answer`` occurs in ``prediction`` as a case-insensitive
    substring, whitespace runs compared as single spaces."""
    gold = " ".join(str(answer).split()).lower()
    return bool(gold) and gold in " ".join(prediction.split()).lower()


SCORERS: dict[str, Callable[[str, str], bool]] = {
    "passkey": score_passkey,
    "number_string": score_number_string,
    "kv_retrieval": score_kv_retrieval,
    "needle": score_needle,
}


def score(task: str, prediction: str, case_or_answer: TaskCase | str) -> bool:
    """Score one prediction.

    Args:
        task: "passkey", "number_string", "kv_retrieval" or "needle".
        prediction: the model's generated text after the query.
        case_or_answer: the :class:`~dllm.tasks.case.TaskCase` (its ``answer``
            is used) or the gold answer string.

    Returns:
        True when the prediction is right under the task's InfiniteBench rule.

    Raises:
        ValueError: unknown task.
    """
    try:
        scorer = SCORERS[task]
    except KeyError:
        raise ValueError(f"unknown task {task!r}; expected one of {sorted(SCORERS)}") from None
    answer = case_or_answer.answer if isinstance(case_or_answer, TaskCase) else case_or_answer
    return scorer(prediction, answer)
