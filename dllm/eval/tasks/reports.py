"""Held-out documents full of competing numbers: registers with numbered sections, dates, amounts and codes.

A new user's documents are not the filler a model was trained on: headings "1." to "8.", dates, money amounts,
docket numbers and access codes compete with the needle for the selector's attention. This module
generates such documents from two sources that no training phase of the bundled model saw, and that the
corpus of ``bench/tiny`` holds out as whole sources (not a split of a trained source):

- the prose: an excerpt of Ambrose Bierce's *The Devil's Dictionary* (1911, public domain), vendored as
  ``devils_dictionary.txt`` beside this file (48 KB; its header says how it was cut);
- the numbers and the layout: this generator (registers of a fictional municipal trust), written for this
  evaluation with its own vocabulary; ``bench/tiny/synthetic.py``'s reports (trained by the GPU recipe) share
  no template with it.

A document is a run of registers. Each register has a title line and eight numbered sections ("1. Receipts"
... "8. Remarks"); a section holds sentences of the dictionary and register sentences with distractors
(dates in five formats, amounts, 5-digit docket and access codes, 10-digit account numbers, place and colour
words). Needles (:data:`NEEDLE_TASKS`: pass key, 10-digit number string, one-word fact, in the wordings of
``wording.json``) go at sentence boundaries at given depths, each between two register sentences drawn for it
(distractors *near* the needle); the rest of the document carries distractors everywhere (*away* from it).
Every answer occurs in the document only inside its needle (a clashing draw is redrawn), so an exact answer
can only come from the needle.

The documents are pure functions of ``(length, needles, seed)`` (seeded by SHA-256, stable across runs) and
read nothing outside the package.
"""

from __future__ import annotations

import functools
import random
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from .case import WORDING, TaskCase
from .text import check_choice, check_depth, check_length, split_sentences, stable_seed

__all__ = ["NEEDLE_TASKS", "SECTIONS", "Needle", "Report", "dictionary_sentences", "make_report", "crop_around"]

NEEDLE_TASKS = ("passkey", "number_string", "word_fact")
SECTIONS = ("Receipts", "Disbursements", "Dockets", "Works", "Correspondence", "Inspections", "Arrears", "Remarks")
"""The eight section headings of a register, numbered "1." to "8."."""
_TRUSTS = ("Harbour Trust", "Lamplighters' Guild", "Orchard Board", "Canal Company", "Ferry Commission",
           "Almshouse Fund", "Tramway Syndicate", "Granary Board")  # fmt: skip
_PLACES = ("Marlow", "Dunmore", "Ashby", "Kelso", "Whitby", "Tarbert", "Ludlow", "Brixham", "Alnwick", "Penrith",
           "Rye", "Thirsk", "Wells", "Hexham", "Bala", "Ripon")  # fmt: skip
_COLOURS = ("grey", "brown", "slate", "russet", "buff", "tan", "dun", "sable")  # none is a word_fact answer
_BEASTS = ("mule", "ox", "cob", "ram", "goose", "terrier")  # none is a word_fact answer
DISTRACTOR_SHARE = 0.45
"""The default share of register sentences (those with numbers) among a section's sentences."""
_MONTHS = ("January", "February", "March", "April", "May", "June", "July", "August", "September", "October",
           "November", "December")  # fmt: skip


_HEADWORD = re.compile(r"^[A-Z][A-Z' -]*,\s*(?:[a-z]+\.\s*)+$|^(?:Dr|Rev|Mr|Mrs|St)\.$")


@functools.cache
def dictionary_sentences() -> tuple[str, ...]:
    """The sentences of the vendored *Devil's Dictionary* excerpt (no digit in any), in file order."""
    path = Path(__file__).with_name("devils_dictionary.txt")
    out: list[str] = []
    for line in path.read_text(encoding="ascii").splitlines():
        if line and not line.startswith("#"):
            parts = split_sentences(line)
            # the headword ("ABASEMENT, n.") reads as a sentence of its own: keep it with its definition
            while len(parts) > 1 and _HEADWORD.match(parts[0]):
                parts[:2] = [parts[0] + " " + parts[1]]
            out.extend(parts)
    return tuple(out)


class _Numbers:
    """Seeded distractor values that never contain (nor are contained in) a forbidden answer."""

    def __init__(self, rng: random.Random, forbidden: Sequence[str]):
        self.rng = rng
        self.forbidden = [f for f in forbidden if f]

    def _ok(self, s: str) -> bool:
        return not any(f in s or s in f for f in self.forbidden if f.isdigit() == s.isdigit())

    def digits(self, n: int) -> str:
        while True:
            s = str(self.rng.randint(10 ** (n - 1), 10**n - 1))
            if self._ok(s):
                return s

    def date(self) -> str:
        r = self.rng
        y, m, d = r.randint(1880, 1935), r.randint(1, 12), r.randint(1, 28)
        return r.choice(
            (f"{y}-{m:02d}-{d:02d}", f"{d} {_MONTHS[m - 1]} {y}", f"{_MONTHS[m - 1]} {d}, {y}", f"{d}/{m}/{y}",
             f"{_MONTHS[m - 1]} {d}")
        )  # fmt: skip

    def amount(self) -> str:
        r = self.rng
        return r.choice(
            (f"${r.randint(2, 999)},{r.randint(0, 999):03d}", f"{r.randint(2, 97)} per cent",
             f"{r.randint(3, 9999)} bushels", f"${r.randint(1, 999)}.{r.randint(0, 99):02d}",
             f"{r.randint(2, 640)} tons")
        )  # fmt: skip


def _register_sentence(num: _Numbers) -> str:
    """One register sentence with one or two distractors (a date, an amount, a code, a place or colour word)."""
    r = num.rng
    place, colour, beast = r.choice(_PLACES), r.choice(_COLOURS), r.choice(_BEASTS)
    return r.choice(
        (
            f"Docket {num.digits(5)} was entered on {num.date()} for {num.amount()}.",
            f"The access code of the {place} store is {num.digits(5)}.",
            f"Account {num.digits(10)} was settled at {place} on {num.date()}.",
            f"A levy of {num.amount()} fell due on {num.date()}.",
            f"The ledger of {place} shows {num.amount()} against docket {num.digits(5)}.",
            f"Clerk {num.digits(4)} signed the {colour} folio on {num.date()}.",
            f"The {beast} hired at {place} cost {num.amount()}.",
            f"Reference {num.digits(10)} covers the works at {place}.",
            f"Item {r.randint(2, 99)}.{r.randint(1, 9)} was deferred until {num.date()}.",
            f"The {colour} gate at {place} was repaired for {num.amount()}.",
        )
    )


def _register(rng: random.Random, num: _Numbers, sentences: tuple[str, ...], volume: int, share: float) -> list[str]:
    """One register as units: each unit carries its own leading separator (a heading starts a paragraph);
    a sentence is a register sentence with probability ``share``, else the dictionary's."""
    units = [f"\n\nRegister of the {rng.choice(_TRUSTS)}, volume {volume}, closed {num.date()}."]
    for i, head in enumerate(SECTIONS, 1):
        units.append(f"\n\n{i}. {head}\n")
        for k in range(rng.randint(3, 7)):
            s = rng.choice(sentences) if rng.random() < 1 - share else _register_sentence(num)
            units.append(s if k == 0 else " " + s)
    return units


@dataclass(frozen=True)
class Needle:
    """One question of a :class:`Report`: its task, gold answer, prompt pieces and the needle's span.

    Fields:
        task: one of :data:`NEEDLE_TASKS`. answer: the gold answer (5 digits, 10 digits or one word).
        prefix, query: the instruction before the context and the question after it (``wording.json``).
        depth: the asked depth, the share of the filler characters before the needle group.
        start, end: the needle sentence's character span in the report's ``context``.
    """

    task: str
    answer: str
    prefix: str
    query: str
    depth: float
    start: int
    end: int


@dataclass(frozen=True)
class Report:
    """A generated document and its needles (one question each)."""

    context: str
    needles: tuple[Needle, ...]
    length: int
    seed: int

    def case(self, i: int) -> TaskCase:
        """Question ``i`` as a :class:`~dllm.eval.tasks.TaskCase` (character-level token counts)."""
        n = self.needles[i]
        return TaskCase(
            task=n.task, prefix=n.prefix, context=self.context, query=n.query, answer=n.answer,
            length=self.length, depth=n.depth, seed=self.seed, needle_start=n.start, needle_end=n.end,
            context_tokens=len(self.context), answer_tokens=len(n.answer), phrasing="random", split="eval",
        )  # fmt: skip


def _draw_needle(rng: random.Random, task: str) -> tuple[str, str, str, str]:
    """(answer, needle sentence, prefix, query) of ``task`` in a random wording of ``wording.json``."""
    if task == "word_fact":
        wf = WORDING["word_fact"]
        kind = rng.choice(wf["kinds"])
        answer = rng.choice(kind["answers"])
        return (
            answer,
            rng.choice(kind["needles"]).format(a=answer),
            rng.choice(wf["prefixes"]),
            rng.choice(kind["queries"]),
        )
    w = WORDING[task]
    n = 5 if task == "passkey" else 10
    answer = str(rng.randint(1, 9)) + "".join(str(rng.randint(0, 9)) for _ in range(n - 1))
    return answer, rng.choice(w["needles"]).format(x=answer), rng.choice(w["prefixes"]), rng.choice(w["queries"])


def _occurrences(text: str, answer: str) -> int:
    if answer.isdigit():
        return len(re.findall(rf"(?<!\d){answer}(?!\d)", text)) + len(re.findall(rf"\d{answer}|{answer}\d", text))
    return len(re.findall(rf"(?i)\b{re.escape(answer)}\b", text))


def compose(
    rng: random.Random,
    num: _Numbers,
    groups: Sequence[tuple[str, str, str]],
    depths: Sequence[float],
    length: int,
    distractor_share: float,
) -> tuple[str, list[tuple[int, int]]]:
    """A register document of at most ``length`` characters with each ``(before, sentence, after)`` group put at
    the sentence boundary nearest its depth (a share of the filler's characters), as :func:`make_report`
    builds it; ``num`` draws the distractors (it forbids the answers).

    Returns:
        ``(context, spans)``: the document and each group's sentence span, in the order of ``groups``.

    Raises:
        ValueError: a length too short for the groups plus 512 characters of filler.
    """
    cost = sum(len(a) + len(b) + len(c) for a, b, c in groups)
    budget = length - cost
    if budget < 512:
        raise ValueError(f"length {length} is too short: the needles take {cost} characters, the filler needs 512")
    sentences = dictionary_sentences()
    units: list[str] = []
    size, volume = 0, 1
    while size < budget:
        for u in _register(rng, num, sentences, volume, distractor_share):
            units.append(u)
            size += len(u)
        volume += 1
    # cut: whole units while they fit, then the next one at a word boundary
    filler, kept = [], 0
    for u in units:
        if kept + len(u) <= budget:
            filler.append(u)
            kept += len(u)
            continue
        room = budget - kept
        cut = u[:room]
        sp = cut.rfind(" ")
        if sp > 0:
            filler.append(cut[:sp])
        break
    filler[0] = filler[0].lstrip("\n")
    # insertion points: before a unit that continues a paragraph (it starts with a space), and the end
    starts, pos = [], 0
    for i, u in enumerate(filler):
        if u.startswith(" "):
            starts.append((pos, i))
        pos += len(u)
    total = pos
    starts.append((total, len(filler)))  # after the last unit: depth 1 ends the document
    inserts: dict[int, int] = {}  # unit index -> needle index
    for g, d in sorted(enumerate(depths), key=lambda gd: gd[1]):
        free = [(abs(p - d * total), i) for p, i in starts if i not in inserts]
        inserts[min(free)[1]] = g
    pieces, spans, pos = [], [None] * len(groups), 0
    for i, u in enumerate(filler + [""]):
        if i in inserts:
            g = inserts[i]
            before, sentence, after = groups[g]
            spans[g] = (pos + len(before), pos + len(before) + len(sentence))
            piece = before + sentence + after
            pieces.append(piece)
            pos += len(piece)
        pieces.append(u)
        pos += len(u)
    context = "".join(pieces)
    return context, spans


def make_report(
    length: int,
    needles: Sequence[tuple[str, float]],
    seed: int,
    *,
    distractor_share: float = DISTRACTOR_SHARE,
    near_distractors: bool = True,
) -> Report:
    """A register document of at most ``length`` characters with one needle per ``(task, depth)``.

    Each needle group is ``near-distractor needle near-distractor`` (two register sentences drawn for it) at
    the sentence boundary inside a section nearest to ``depth`` times the filler's characters. The document
    is cut at a word boundary so that it holds at most ``length`` characters (the bundled tokenizer is
    character-level: characters are tokens).

    Args:
        length: the document's maximum length in characters (>= 512 and room for the needles).
        needles: ``(task, depth)`` pairs, task in :data:`NEEDLE_TASKS`, depth in [0, 1]; at most one per task
            (an answer is unique in the document, so two questions never share one).
        seed: any int.
        distractor_share: the share of a section's sentences that are register sentences (numbers), in
            [0, 1]; the rest are the dictionary's. Headings and title lines (section numbers, a date) stay.
        near_distractors: False leaves out the two register sentences around each needle (the same
            document otherwise: the same draws are made): a probe of what they cost.

    Returns:
        :class:`Report`; ``context[n.start:n.end]`` is each needle's sentence, and each answer occurs in
        the context only inside its needle (as "{x} is the pass key" wordings repeat it: only there).

    Raises:
        ValueError: an unknown task, a task given twice, a depth outside [0, 1], no needle, a share outside
            [0, 1], or a length too short for the needles plus 512 characters of filler.
    """
    length = check_length(length)
    if not 0 <= distractor_share <= 1:
        raise ValueError(f"distractor_share must be in [0, 1], got {distractor_share!r}")
    if not needles:
        raise ValueError("make_report needs at least one (task, depth) needle")
    tasks = [check_choice("task", t, NEEDLE_TASKS) for t, _ in needles]
    if len(set(tasks)) != len(tasks):
        raise ValueError(f"each task may hold one needle of a report, got {tasks}")
    depths = [check_depth(d) for _, d in needles]
    rng = random.Random(stable_seed("reports", int(seed), length, tuple(zip(tasks, depths))))
    drawn = [_draw_needle(rng, t) for t in tasks]
    num = _Numbers(rng, [a for a, *_ in drawn])
    near = _register_sentence  # the distractors drawn for each needle, one before and one after it
    groups = [(" " + near(num) + " ", sentence, " " + near(num)) for _a, sentence, *_ in drawn]
    if not near_distractors:  # drawn all the same, so the rest of the document is the same
        groups = [(" ", sentence, "") for _b, sentence, _a in groups]
    context, spans = compose(rng, num, groups, depths, length, distractor_share)
    out = []
    for (task, depth), (answer, sentence, prefix, query), (s, e) in zip(zip(tasks, depths), drawn, spans):
        assert context[s:e] == sentence
        if _occurrences(context[:s] + " " + context[e:], answer):
            # the dictionary holds this word (a colour or animal): draw the document again
            kw = {"distractor_share": distractor_share, "near_distractors": near_distractors}
            return make_report(length, needles, seed + 1_000_003, **kw)
        out.append(Needle(task, answer, prefix, query, depth, s, e))
    return Report(context, tuple(out), length, int(seed))


def crop_around(context: str, start: int, end: int, width: int = 1024) -> tuple[str, int]:
    """A window of at most ``width`` characters of ``context`` that holds ``context[start:end]``, the span
    centred where the document allows, both ends moved inward to a space (whole words).

    Returns:
        ``(crop, offset)``: the crop and the span's start in it (``crop[offset:offset + end - start]`` is
        the span).

    Raises:
        ValueError: an empty or reversed span, one outside ``context``, or ``width`` below the span + 2.
    """
    if not 0 <= start < end <= len(context):
        raise ValueError(f"span [{start}, {end}) is not a non-empty span of a {len(context)}-character context")
    if width < end - start + 2:
        raise ValueError(f"width {width} cannot hold a {end - start}-character span")
    lo = max(0, start - (width - (end - start)) // 2)
    hi = min(len(context), lo + width)
    lo = max(0, hi - width)
    if lo > 0:
        sp = context.find(" ", lo, start)
        lo = sp + 1 if sp >= 0 else start
    if hi < len(context):
        sp = context.rfind(" ", end, hi)
        hi = sp if sp >= 0 else end
    return context[lo:hi], start - lo
