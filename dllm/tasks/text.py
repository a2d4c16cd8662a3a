"""Text utilities shared by the task generators.

- token counting, either character-level (``tokenizer=None``: one character is
  one token, the vocabulary of the bundled tiny model) or with any Hugging Face
  tokenizer (counted without special tokens);
- ASCII normalisation (:func:`normalize_text`);
- a stable seed from any tuple of plain values (:func:`stable_seed`);
- sentence splitting (:func:`split_sentences`);
- :func:`fill_context`: build a haystack of filler units to an exact token
  budget and insert a needle at a unit boundary at the requested depth.

The "repeat filler to a token length, put the needle at a depth" recipe is the
one used by InfiniteBench (passkey, number_string) and by gkamradt's
Needle-in-a-Haystack test; the code here is written from that description.
"""

from __future__ import annotations

import bisect
import hashlib
import math
import operator
import re
import unicodedata
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

__all__ = [
    "count_tokens",
    "tokenizer_name",
    "normalize_text",
    "stable_seed",
    "split_sentences",
    "check_depth",
    "check_length",
    "FilledContext",
    "fill_context",
]


# --------------------------------------------------------------------------- tokens


def count_tokens(text: str, tokenizer: Any = None) -> int:
    """Number of tokens in ``text``.

    Args:
        text: the text to count.
        tokenizer: ``None`` for character level (1 character = 1 token, the
            bundled tiny model's vocabulary), or a Hugging Face tokenizer (any
            object with ``encode(text, add_special_tokens=False)``); special
            tokens (BOS/EOS) are not counted.

    Returns:
        The token count (tokens of ``tokenizer``, or characters when it is None).
    """
    if tokenizer is None:
        return len(text)
    if not text:
        return 0
    return len(tokenizer.encode(text, add_special_tokens=False))


def tokenizer_name(tokenizer: Any = None) -> str:
    """A short name for ``tokenizer``: ``"char"`` for None, else its ``name_or_path``
    (or class name). Recorded on each :class:`~dllm.tasks.case.TaskCase`."""
    if tokenizer is None:
        return "char"
    name = getattr(tokenizer, "name_or_path", None)
    return str(name) if name else type(tokenizer).__name__


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
    whitespace-led word is tokenised on its own (with a cache, since filler
    repeats) and its tokens are placed at the word's start."""
    starts: list[int] = []
    cache: dict[str, int] = {}
    for m in re.finditer(r"\s*\S+|\s+$", text):
        piece = m.group(0)
        n = cache.get(piece)
        if n is None:
            n = cache[piece] = count_tokens(piece, tokenizer)
        starts.extend([m.start()] * n)
    return starts


class _PrefixCounter:
    """``T(p)``: the number of tokens of ``text[:p]``, for many ``p`` on one text.

    Character level: ``p``. Fast tokenizer: the text is tokenised once with
    offsets and ``T(p)`` is the number of tokens that start before ``p``
    (exact at word boundaries for BPE tokenizers whose pre-tokeniser splits
    before a space, as Qwen2's does). Tokenizer without offsets: words are
    tokenised one by one (:func:`_piece_starts`), an estimate. Either way the
    caller counts the final context again."""

    def __init__(self, text: str, tokenizer: Any):
        self.text = text
        self.tokenizer = tokenizer
        self.starts: list[int] | None = None
        if tokenizer is not None:
            self.starts = _token_starts(text, tokenizer)
            if self.starts is None:
                self.starts = _piece_starts(text, tokenizer)

    def __call__(self, p: int) -> int:
        if self.starts is None:
            return p
        return bisect.bisect_left(self.starts, p)

    def total(self) -> int:
        return len(self.text) if self.starts is None else len(self.starts)


# --------------------------------------------------------------------------- text


_ASCII_MAP = {
    # quotes and primes
    "\u2018": "'", "\u2019": "'", "\u201a": "'", "\u201b": "'", "\u2032": "'", "\u00b4": "'",
    "\u201c": '"', "\u201d": '"', "\u201e": '"', "\u201f": '"', "\u2033": '"',
    "\u00ab": '"', "\u00bb": '"',
    # dashes, hyphens, minus
    "\u2010": "-", "\u2011": "-", "\u2012": "-", "\u2013": "-", "\u2212": "-",
    "\u2014": "--", "\u2015": "--",
    # ellipsis, bullets
    "\u2026": "...", "\u2022": "*", "\u00b7": "*",
    # spaces
    "\u00a0": " ", "\u2002": " ", "\u2003": " ", "\u2009": " ", "\u200a": " ", "\u202f": " ",
    "\u200b": "", "\ufeff": "", "\t": " ", "\r": "\n",
    # Windows-1252 bytes that some files carry as C1 control characters
    "\x85": "...", "\x91": "'", "\x92": "'", "\x93": '"', "\x94": '"', "\x96": "-", "\x97": "--",
}  # fmt: skip
_ASCII_TABLE = str.maketrans(_ASCII_MAP)
_NON_PRINTABLE = re.compile(r"[^\x20-\x7e\n]")


def normalize_text(text: str) -> str:
    """Map ``text`` to printable ASCII plus newline.

    Curly quotes become straight quotes, en dashes and minus signs ``-``, em
    dashes ``--``, the ellipsis ``...``, non-breaking and thin spaces a space,
    tabs a space, ``\\r\\n``/``\\r`` a newline, Windows-1252 quote/dash bytes
    their ASCII forms; accented letters lose their accents (NFKD); every other
    character outside ``[\\x20-\\x7e\\n]`` is dropped.

    Args:
        text: any Unicode string.

    Returns:
        A string whose characters are all printable ASCII or ``\\n`` (the
        vocabulary of the bundled tiny character-level model).
    """
    text = text.replace("\r\n", "\n").translate(_ASCII_TABLE)
    if not text.isascii():
        text = "".join(c for c in unicodedata.normalize("NFKD", text) if not unicodedata.combining(c))
    return _NON_PRINTABLE.sub("", text)


def stable_seed(*parts: Any) -> int:
    """A 64-bit integer seed from plain values (str, int, float, None, tuples).

    Unlike ``hash()``, which is salted per Python process, this is the same on
    every run and machine: it hashes ``repr(parts)`` with SHA-256.
    """
    digest = hashlib.sha256(repr(parts).encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big")


_SENTENCE_END = re.compile(r"(?<=[.!?])[\"')\]]*\s+(?=[\"'(\[]?[A-Z0-9])")


def split_sentences(text: str) -> list[str]:
    """Split running English text into sentences.

    A boundary is whitespace after ``.``, ``!`` or ``?`` (optionally followed by
    closing quotes/brackets) and before a capital letter, digit or opening
    quote/bracket. Whitespace inside a sentence is collapsed to single spaces.

    Args:
        text: ASCII-normalised text.

    Returns:
        Non-empty sentences, in order, without surrounding whitespace.
    """
    text = " ".join(text.split())
    out: list[str] = []
    pos = 0
    for m in _SENTENCE_END.finditer(text):
        end = m.start() + len(m.group(0).rstrip())
        out.append(text[pos:end])
        pos = m.end()
    out.append(text[pos:])
    return [s for s in out if s]


# --------------------------------------------------------------------------- checks


def check_depth(depth: float) -> float:
    """Return ``depth`` as a float; raise ``ValueError`` unless 0.0 <= depth <= 1.0."""
    try:
        d = float(depth)
    except (TypeError, ValueError):
        raise ValueError(f"depth must be a number in [0, 1], got {depth!r}") from None
    if not (0.0 <= d <= 1.0):  # also rejects NaN
        raise ValueError(f"depth must be in [0, 1] (fraction of the context before the needle), got {depth!r}")
    return d


def check_length(length: int) -> int:
    """Return ``length`` as an int; raise ``ValueError`` unless it is a positive integer."""
    if isinstance(length, bool):
        raise ValueError(f"length must be a positive integer number of tokens, got {length!r}")
    try:
        n = operator.index(length)
    except TypeError:
        raise ValueError(f"length must be a positive integer number of tokens, got {length!r}") from None
    if n < 1:
        raise ValueError(f"length must be a positive integer number of tokens, got {length!r}")
    return n


# --------------------------------------------------------------------------- haystack


@dataclass(frozen=True)
class FilledContext:
    """Result of :func:`fill_context`: the context, the needle's character span in
    it, and the context's token count (tokens of the tokenizer used)."""

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


def _slack(length: int) -> int:
    """How far under ``length`` a context may stop at a whole filler unit before
    the generator cuts the next unit at a word boundary: 1% or 3 tokens."""
    return max(3, length // 100)


def fill_context(
    units: Iterable[str],
    needle: str,
    length: int,
    depth: float,
    tokenizer: Any = None,
    *,
    sep: str = " ",
    task: str = "task",
) -> FilledContext:
    """Build a context of at most ``length`` tokens: filler units with ``needle``
    inserted at the unit boundary nearest to ``depth``.

    The filler ("haystack") is ``sep.join`` of units taken in order from
    ``units`` (typically an endless seeded iterator of sentences). It is cut to
    ``length`` minus the needle's tokens: at the end of a whole unit when that
    leaves at most ``max(3, length // 100)`` tokens unused, else inside the
    next unit at a word boundary (so the context may end mid-sentence, as in
    gkamradt's Needle-in-a-Haystack, which truncates the haystack). The needle
    then goes at the boundary between whole units whose filler-token offset is
    nearest to ``depth`` times the filler's token count, so
    ``tokens(context[:needle_start]) / (tokens(context) - tokens(needle))`` is
    within half a unit of ``depth``. With a tokenizer, the whole filler is
    tokenised once (offset mapping) instead of once per trial, and the final
    context is counted again and shortened if token merges at the joins made it
    exceed ``length``.

    Args:
        units: filler units (sentences, JSON pairs...), each without the separator.
        needle: the text to hide; it must not contain ``sep`` at its ends.
        length: maximum context length in tokens (characters when tokenizer is None).
        depth: 0.0 (needle first) to 1.0 (needle after the last whole unit).
        tokenizer: None (character level) or a Hugging Face tokenizer.
        sep: separator between units and around the needle.
        task: task name, for error messages.

    Returns:
        :class:`FilledContext` with ``context[needle_start:needle_end] == needle``.

    Raises:
        ValueError: depth outside [0, 1]; length not a positive integer; length
            too short to hold the needle plus one filler word (the message gives
            the minimum).
    """
    depth = check_depth(depth)
    length = check_length(length)
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
    counter: _PrefixCounter | None = None
    ratio = 0.0  # characters per token, estimated
    for _ in range(12):
        counter, ratio = _cover_budget(src, budget, tokenizer, counter, ratio)
        built = _assemble(src, counter, needle, budget, depth, sep, _slack(length))
        if built is None:
            raise ValueError(f"{task}: length {length} is too short: the context needs at least {minimum} tokens")
        context, ns = built
        n = len(context) if tokenizer is None else count_tokens(context, tokenizer)
        if n <= length:
            return FilledContext(context, ns, ns + len(needle), n)
        budget -= n - length
    raise RuntimeError(f"{task}: could not fit the context into {length} tokens")  # pragma: no cover


def _cover_budget(
    src: _Units, budget: int, tokenizer: Any, counter: _PrefixCounter | None, ratio: float
) -> tuple[_PrefixCounter, float]:
    """Draw filler until it holds more than ``budget`` tokens (or the units run
    out) and return a prefix counter over it."""
    if tokenizer is None:
        src.extend_to(budget + 1)
        if counter is None or counter.text is not src.text:
            counter = _PrefixCounter(src.text, None)
        return counter, 1.0
    if counter is not None and len(counter.text) == src.n_chars and (counter.total() > budget or src.exhausted):
        return counter, ratio
    if ratio <= 0.0:
        src.extend_to(2000)
        sample = src.text
        ratio = len(sample) / max(1, count_tokens(sample, tokenizer))
    while True:
        src.extend_to(math.ceil((budget + 16) * ratio * 1.05) + 64)
        counter = _PrefixCounter(src.text, tokenizer)
        total = counter.total()
        if total > budget or src.exhausted:
            return counter, ratio
        ratio *= max(1.25, (budget + 16) / max(1, total))


def _assemble(
    src: _Units, T: _PrefixCounter, needle: str, budget: int, depth: float, sep: str, slack: int
) -> tuple[str, int] | None:
    """Cut the filler to ``budget`` tokens, insert the needle; return (context,
    needle_start) or None when not even one filler word fits."""
    text = T.text
    ends = src.ends
    t_ends = [T(e) for e in ends] if T.tokenizer is not None else ends
    k = bisect.bisect_right(t_ends, budget)  # whole units that fit
    c_unit = ends[k - 1] if k else 0
    c = c_unit
    if k < len(ends) and (k == 0 or budget - t_ends[k - 1] > slack):
        # cut the next unit at the last word boundary that still fits
        unit_start = ends[k] - len(src.parts[k])
        for m in reversed(list(re.finditer(r"\s+", src.parts[k]))):
            p = unit_start + m.start()
            if p > unit_start and T(p) <= budget:
                c = p
                break
    if c == 0:
        return None
    # insertion points: before each whole unit and after the last one
    positions = [0] + ends[:k]
    t_positions = [0] + t_ends[:k]
    if k == 0:  # only part of one unit fits: allow start or end
        positions.append(c)
        t_positions.append(T(c))
    target = depth * T(c)
    j = bisect.bisect_left(t_positions, target)
    if j == len(t_positions) or (j > 0 and target - t_positions[j - 1] <= t_positions[j] - target):
        j -= 1
    pos = positions[j]
    if pos == 0:
        return needle + sep + text[:c], 0
    return text[:pos] + sep + needle + text[pos:c], pos + len(sep)
