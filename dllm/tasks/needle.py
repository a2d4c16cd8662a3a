"""Needle-in-a-Haystack QA: a one-sentence fact hidden in real English essays
(gkamradt's test; the haystack is :mod:`dllm.tasks.essays`).

Essays are concatenated (in file-name order, from a seeded essay, cycling when
more text is needed) and cut to the requested token length; the fact goes at
the sentence boundary nearest the requested depth. Facts are drawn per seed
from a few kinds (secret soup ingredient, pet's name, home city, ...) with
short answers (1-3 words). Every answer in the pools is checked at load time
not to occur (case-insensitive substring) anywhere in the 49 essays, so the
answer occurs in the context only inside the needle.
"""

from __future__ import annotations

import functools
import random
from dataclasses import dataclass
from typing import Any

from .case import pick
from .essays import essay_sentences, essay_units, load_essays
from .haystack import FilledContext, fill_context

__all__ = ["FactKind", "FACT_KINDS", "NAMES", "NEEDLE_PREFIXES", "make_needle"]


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
    rng: random.Random, length: int, depth: float, tokenizer: Any, canonical: bool, split: str
) -> tuple[str, FilledContext, str, str]:
    """The needle generator (the protocol of :data:`dllm.tasks.TASKS`)."""
    kind_idx = rng.randrange(len(FACT_KINDS))
    kind = FACT_KINDS[kind_idx]
    answer = rng.choice(_answer_pools()[kind_idx])
    name = rng.choice(NAMES)
    start = rng.randrange(len(essay_sentences(split)))
    needle, query = pick(rng, kind.needles, canonical), pick(rng, kind.queries, canonical)
    prefix, query_sep = pick(rng, NEEDLE_PREFIXES, canonical), pick(rng, _QUERY_SEP, canonical)
    needle = needle.format(name=name, a=answer)
    needle = needle[0].upper() + needle[1:]
    filled = fill_context(essay_units(split, start), needle, length, depth, tokenizer, task="needle")
    return prefix, filled, query_sep + query.format(name=name, a=answer), answer
