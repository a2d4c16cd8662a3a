"""The haystack: filler units cut to a token budget with a needle at a depth.

The recipe (repeat filler to a token length, put the needle at a depth) is the
one of InfiniteBench (passkey, number_string) and gkamradt's
Needle-in-a-Haystack test; the code is written from that description.
"""

from __future__ import annotations

import bisect
import math
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from .text import count_tokens

__all__ = ["PrefixTokens", "FilledContext", "fill_context"]


def _token_starts(text: str, tokenizer: Any) -> list[int] | None:
    """Character offset where each token of ``text`` starts (fast tokenizers), or
    None when the tokenizer cannot report offsets."""
    if not getattr(tokenizer, "is_fast", False):
        return None
    try:
        enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    except (NotImplementedError, TypeError, ValueError):
        return None
    return [int(s) for s, _ in enc["offset_mapping"]]


def _piece_starts(text: str, tokenizer: Any) -> list[int]:
    """Approximate token starts for tokenizers without offsets: each
    whitespace-led word is tokenised on its own (cached: filler repeats) and its
    tokens are placed at the word's start."""
    starts: list[int] = []
    cache: dict[str, int] = {}
    for m in re.finditer(r"\s*\S+|\s+$", text):
        piece = m.group(0)
        n = cache.get(piece)
        if n is None:
            n = cache[piece] = count_tokens(piece, tokenizer)
        starts.extend([m.start()] * n)
    return starts


class PrefixTokens:
    """``tokens_before(p)``: the number of tokens of ``text[:p]``, for many ``p`` on one text.

    Character level: ``p``. Fast tokenizer: the text is tokenised once with
    offsets and the count is the number of tokens that start before ``p``
    (exact at word boundaries for BPE tokenizers whose pre-tokeniser splits
    before a space, as Qwen2's does). Tokenizer without offsets: words are
    tokenised one by one, an estimate. Either way the caller counts the final
    context again."""

    def __init__(self, text: str, tokenizer: Any):
        self.text = text
        self.tokenizer = tokenizer
        self.starts: list[int] | None = None
        if tokenizer is not None:
            self.starts = _token_starts(text, tokenizer)
            if self.starts is None:
                self.starts = _piece_starts(text, tokenizer)

    def __call__(self, p: int) -> int:
        return p if self.starts is None else bisect.bisect_left(self.starts, p)

    def total(self) -> int:
        return len(self.text) if self.starts is None else len(self.starts)


@dataclass(frozen=True)
class FilledContext:
    """A context, the needle's character span in it, and its token count."""

    context: str
    needle_start: int
    needle_end: int
    n_tokens: int


class _Units:
    """Filler units drawn lazily from an iterator and joined by ``sep``."""

    def __init__(self, units: Iterable[str], sep: str):
        self._it: Iterator[str] = iter(units)
        self.sep = sep
        self.parts: list[str] = []
        self.ends: list[int] = []  # character offset where unit i ends in the joined text
        self.n_chars = 0
        self.exhausted = False
        self._text = ""
        self._text_n = 0

    def extend_to(self, n_chars: int) -> None:
        while self.n_chars < n_chars and not self.exhausted:
            u = next(self._it, None)
            if u is None:
                self.exhausted = True
                break
            if not u:
                continue
            if self.parts:
                self.n_chars += len(self.sep)
            self.n_chars += len(u)
            self.parts.append(u)
            self.ends.append(self.n_chars)

    def first(self) -> str:
        self.extend_to(1)
        if not self.parts:
            raise ValueError("the filler source yielded no text")
        return self.parts[0]

    @property
    def text(self) -> str:
        if self._text_n != len(self.parts):
            self._text = self.sep.join(self.parts)
            self._text_n = len(self.parts)
        return self._text


def fill_context(
    units: Iterable[str], needle: str, length: int, depth: float, tokenizer: Any = None, *, sep: str = " ", task: str
) -> FilledContext:
    """Build a context of at most ``length`` tokens: filler units with ``needle``
    inserted at the unit boundary nearest to ``depth``.

    The filler is ``sep.join`` of units taken in order from ``units`` (an
    endless seeded iterator of sentences). It is cut to ``length`` minus the
    needle's tokens: at the end of a whole unit when that leaves at most
    ``max(3, length // 100)`` tokens unused, else inside the next unit at a word
    boundary (so the context may end mid-sentence, as in gkamradt's test, which
    truncates the haystack). The needle goes at the boundary between whole units
    whose filler-token offset is nearest to ``depth`` times the filler's token
    count. With a tokenizer the filler is tokenised once (offset mapping), and
    the final context is counted again and shortened if token merges at the
    joins made it exceed ``length``.

    Args:
        units: filler units (sentences...), each without the separator.
        needle: the text to hide, without ``sep`` at its ends.
        length: maximum context length in tokens (characters when tokenizer is
            None), a checked positive int.
        depth: a checked float, 0.0 (needle first) to 1.0 (after the last whole unit).
        tokenizer: None (character level) or a Hugging Face tokenizer.
        sep: separator between units and around the needle.
        task: task name, for error messages.

    Returns:
        :class:`FilledContext` with ``context[needle_start:needle_end] == needle``.

    Raises:
        ValueError: length too short for the needle plus one filler word (the
            message gives the minimum).
    """
    needle_cost = count_tokens(sep + needle, tokenizer)
    src = _Units(units, sep)
    first_word = (src.first().split() or [src.first()])[0]
    minimum = needle_cost + count_tokens(first_word, tokenizer)
    if length < minimum:
        raise ValueError(
            f"{task}: length {length} is too short: the needle alone takes {needle_cost} tokens; "
            f"the context needs at least {minimum} tokens (needle + one filler word)"
        )
    budget = length - needle_cost
    slack = max(3, length // 100)  # tokens a context may stop short at a whole unit
    tokens_before: PrefixTokens | None = None
    ratio = 0.0  # characters per token, estimated
    for _ in range(12):
        tokens_before, ratio = _cover_budget(src, budget, tokenizer, tokens_before, ratio)
        built = _assemble(src, tokens_before, needle, budget, depth, sep, slack)
        if built is None:
            raise ValueError(f"{task}: length {length} is too short: the context needs at least {minimum} tokens")
        context, start = built
        n = len(context) if tokenizer is None else count_tokens(context, tokenizer)
        if n <= length:
            return FilledContext(context, start, start + len(needle), n)
        budget -= n - length
    raise RuntimeError(f"{task}: could not fit the context into {length} tokens")  # pragma: no cover


def _cover_budget(
    src: _Units, budget: int, tokenizer: Any, tokens_before: PrefixTokens | None, ratio: float
) -> tuple[PrefixTokens, float]:
    """Draw filler until it holds more than ``budget`` tokens (or the units run
    out); return a prefix counter over it and the characters-per-token estimate."""
    if tokenizer is None:
        src.extend_to(budget + 1)
        if tokens_before is None or tokens_before.text is not src.text:
            tokens_before = PrefixTokens(src.text, None)
        return tokens_before, 1.0
    if (
        tokens_before is not None
        and len(tokens_before.text) == src.n_chars
        and (tokens_before.total() > budget or src.exhausted)
    ):
        return tokens_before, ratio
    if ratio <= 0.0:
        src.extend_to(2000)
        sample = src.text
        ratio = len(sample) / max(1, count_tokens(sample, tokenizer))
    while True:
        src.extend_to(math.ceil((budget + 16) * ratio * 1.05) + 64)
        tokens_before = PrefixTokens(src.text, tokenizer)
        total = tokens_before.total()
        if total > budget or src.exhausted:
            return tokens_before, ratio
        ratio *= max(1.25, (budget + 16) / max(1, total))


def _assemble(
    src: _Units, tokens_before: PrefixTokens, needle: str, budget: int, depth: float, sep: str, slack: int
) -> tuple[str, int] | None:
    """Cut the filler to ``budget`` tokens, insert the needle; return (context,
    needle_start) or None when not even one filler word fits."""
    text = tokens_before.text
    ends = src.ends
    t_ends = [tokens_before(e) for e in ends] if tokens_before.tokenizer is not None else ends
    k = bisect.bisect_right(t_ends, budget)  # whole units that fit
    cut = ends[k - 1] if k else 0
    if k < len(ends) and (k == 0 or budget - t_ends[k - 1] > slack):
        # cut the next unit at the last word boundary that still fits
        unit_start = ends[k] - len(src.parts[k])
        for m in reversed(list(re.finditer(r"\s+", src.parts[k]))):
            p = unit_start + m.start()
            if p > unit_start and tokens_before(p) <= budget:
                cut = p
                break
    if cut == 0:
        return None
    # insertion points: before each whole unit and after the last one
    positions = [0] + ends[:k]
    t_positions = [0] + t_ends[:k]
    if k == 0:  # only part of one unit fits: allow start or end
        positions.append(cut)
        t_positions.append(tokens_before(cut))
    target = depth * tokens_before(cut)
    j = bisect.bisect_left(t_positions, target)
    if j == len(t_positions) or (j > 0 and target - t_positions[j - 1] <= t_positions[j] - target):
        j -= 1
    pos = positions[j]
    if pos == 0:
        return needle + sep + text[:cut], 0
    return text[:pos] + sep + needle + text[pos:cut], pos + len(sep)
