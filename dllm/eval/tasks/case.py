"""What the task generators share: the case record, the wording, the options."""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path

__all__ = ["TaskCase", "WORDING", "Wording", "pick", "PHRASINGS", "SPLITS"]

PHRASINGS = ("canonical", "random")
SPLITS = ("eval", "train")
WORDING: dict = json.loads((Path(__file__).parent / "wording.json").read_text(encoding="utf-8"))
"""Every task's templates and word pools, from ``dllm/eval/tasks/wording.json``."""


@dataclass(frozen=True)
class PromptCase:
    """The first fields of every evaluation case, :class:`TaskCase` and LongBench's alike (see there), and
    the :attr:`prompt` they make."""

    task: str
    prefix: str
    context: str
    query: str
    answer: str

    @property
    def prompt(self) -> str:
        """``prefix + context + query``: the text the model continues with the answer."""
        return self.prefix + self.context + self.query


@dataclass(frozen=True)
class TaskCase(PromptCase):
    """One seeded long-context retrieval case.

    The model sees :attr:`prompt` (``prefix + context + query``) and should
    continue it with :attr:`answer`: the query ends right where the answer
    starts (e.g. ``"... The pass key is "``).

    Fields:
        task: task name (a key of :data:`dllm.eval.tasks.TASKS`).
        prefix: instruction text before the context.
        context: the long text (filler, JSON or essays) holding the needle.
        query: question after the context; the answer follows it directly.
        answer: gold answer string (5 digits, 10 digits, a UUID, or 1-3 words).
        length: requested context length, in tokens of the tokenizer used
            (characters for the character-level default); the context never exceeds it.
        depth: requested needle depth, 0.0 (start) to 1.0 (end): the fraction of
            the filler tokens that precede the needle.
        seed: the integer seed the case was generated from.
        needle_start, needle_end: character span of the needle in ``context``.
        context_tokens: actual token count of ``context`` (<= ``length``).
        answer_tokens: token count of ``answer``; use it (plus a little slack for
            trailing punctuation/EOS) to choose the generation length.
        phrasing: ``"canonical"`` (InfiniteBench/NIAH wording) or ``"random"``.
        split: ``"eval"`` or ``"train"`` (only the needle task's essays differ).
        tokenizer: ``"char"`` or the tokenizer's ``name_or_path``.
    """

    length: int
    depth: float
    seed: int
    needle_start: int
    needle_end: int
    context_tokens: int = 0
    answer_tokens: int = 0
    phrasing: str = "canonical"
    split: str = "eval"
    tokenizer: str = "char"

    @property
    def needle(self) -> str:
        """The inserted needle text, ``context[needle_start:needle_end]``."""
        return self.context[self.needle_start : self.needle_end]


@dataclass(frozen=True)
class Wording:
    """A task's templates (an entry of :data:`WORDING`). The first entry of each
    is the canonical (InfiniteBench / NIAH) wording; the random phrasing picks
    any entry. Every query ends where the answer starts."""

    needles: tuple[str, ...]
    prefixes: tuple[str, ...]
    queries: tuple[str, ...]

    @classmethod
    def of(cls, task: str) -> Wording:
        return cls(*(tuple(WORDING[task][k]) for k in ("needles", "prefixes", "queries")))


def pick(rng: random.Random, options: tuple[str, ...], canonical: bool) -> str:
    """The canonical (first) option, or a random one (one ``rng.choice`` draw)."""
    return options[0] if canonical else rng.choice(options)
