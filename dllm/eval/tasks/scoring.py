"""InfiniteBench-style answer checks of the generated retrieval tasks.

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

__all__ = ["first_integer", "first_integer_matches", "word_matches", "phrase_matches"]

_INT = re.compile(r"\d+")
_KV_PUNCT = re.compile(r"[\n:\"'.,?!{}]")


def first_integer(text: str) -> str:
    """The first run of ASCII digits in ``text`` ("" if none), as a string so
    leading zeros are kept."""
    m = _INT.search(text)
    return m.group(0) if m else ""


def first_integer_matches(prediction: str, answer: str) -> bool:
    """InfiniteBench passkey / number_string rule: the first integer in ``prediction`` equals ``answer``."""
    return first_integer(prediction) == str(answer).strip()


def word_matches(prediction: str, answer: str) -> bool:
    """InfiniteBench kv_retrieval rule: ``answer`` is one of the words of
    ``prediction`` once newlines, quotes and ``: . , ? ! { }`` are spaces.
    (A UUID keeps its hyphens, so a partial UUID does not match.)"""
    return str(answer).strip() in _KV_PUNCT.sub(" ", prediction).split()


def phrase_matches(prediction: str, answer: str) -> bool:
    """Needle QA rule: ``answer`` occurs in ``prediction`` as a case-insensitive
    substring, whitespace runs compared as single spaces."""
    gold = " ".join(str(answer).split()).lower()
    return bool(gold) and gold in " ".join(prediction.split()).lower()
