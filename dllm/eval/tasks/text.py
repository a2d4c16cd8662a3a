"""Text helpers of the task generators: token counts, ASCII normalisation,
stable seeds, sentence splitting and argument checks."""

from __future__ import annotations

import hashlib
import operator
import re
import unicodedata
from typing import Any

__all__ = [
    "count_tokens",
    "tokenizer_name",
    "normalize_text",
    "stable_seed",
    "split_sentences",
    "check_depth",
    "check_length",
    "check_choice",
]


def count_tokens(text: str, tokenizer: Any = None) -> int:
    """Number of tokens in ``text``: characters when ``tokenizer`` is None (the
    bundled tiny model's vocabulary), else the length of a Hugging Face
    tokenizer's ``encode(text, add_special_tokens=False)`` (no BOS/EOS)."""
    if tokenizer is None:
        return len(text)
    if not text:
        return 0
    return len(tokenizer.encode(text, add_special_tokens=False))


def tokenizer_name(tokenizer: Any = None) -> str:
    """``"char"`` for None, else the tokenizer's ``name_or_path`` (or class name)."""
    if tokenizer is None:
        return "char"
    name = getattr(tokenizer, "name_or_path", None)
    return str(name) if name else type(tokenizer).__name__


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
    """Map ``text`` to printable ASCII plus newline (the tiny model's vocabulary).

    Curly quotes become straight quotes, en dashes and minus signs ``-``, em
    dashes ``--``, the ellipsis ``...``, non-breaking and thin spaces a space,
    tabs a space, ``\\r\\n``/``\\r`` a newline, Windows-1252 quote/dash bytes
    their ASCII forms; accented letters lose their accents (NFKD); every other
    character outside ``[\\x20-\\x7e\\n]`` is dropped.
    """
    text = text.replace("\r\n", "\n").translate(_ASCII_TABLE)
    if not text.isascii():
        text = "".join(c for c in unicodedata.normalize("NFKD", text) if not unicodedata.combining(c))
    return _NON_PRINTABLE.sub("", text)


def stable_seed(*parts: Any) -> int:
    """A 64-bit seed from plain values (str, int, float, None, tuples): the first
    8 bytes of SHA-256 of ``repr(parts)``, the same on every run and machine
    (unlike ``hash()``, which Python salts per process)."""
    digest = hashlib.sha256(repr(parts).encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big")


_SENTENCE_END = re.compile(r"(?<=[.!?])[\"')\]]*\s+(?=[\"'(\[]?[A-Z0-9])")


def split_sentences(text: str) -> list[str]:
    """Split running English text into non-empty sentences, in order.

    A boundary is whitespace after ``.``, ``!`` or ``?`` (optionally followed by
    closing quotes/brackets) and before a capital letter, digit or opening
    quote/bracket. Whitespace inside a sentence is collapsed to single spaces.
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
    try:
        n = -1 if isinstance(length, bool) else operator.index(length)
    except TypeError:
        n = -1
    if n < 1:
        raise ValueError(f"length must be a positive integer number of tokens, got {length!r}")
    return n


def check_choice(what: str, value: str, options: tuple[str, ...]) -> str:
    """Return ``value``; raise ``ValueError`` ("unknown {what} ...") unless it is one of ``options``."""
    if value not in options:
        raise ValueError(f"unknown {what} {value!r}; expected one of {options}")
    return value
