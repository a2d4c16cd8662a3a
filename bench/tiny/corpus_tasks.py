"""Training samples drawn from the packed corpus (``bench.tiny.corpus``): packed text and retrieval.

Retrieval: a crop of one source's documents with a needle sentence inserted at a line or word boundary
at a random depth, in one of :data:`LAYOUTS` (prompt layouts: question after or before the text,
Q/A, markdown headings, a continuation), optionally with decoys (the same kind of fact under another
name: "The backup code is 28421.") so that the answer is found by its name, not by being the only number.
Needle kinds (:data:`NEEDLES`): pass keys (5-9 digits), number strings (7-12 digits), codes (letters,
digits, dashes) and word facts (a word after its name). The samples use the ``bench.tiny.data.Sample``
convention (segment 0 live, k > 0 a static chunk that sees only itself; roles b/p/q/a).
"""

from __future__ import annotations

import random

from bench.tiny import synthetic
from bench.tiny.corpus import Corpus
from bench.tiny.data import BOS, EOS, Sample, _append, append_chunks, encode

_WORDS = {
    "city": ["Lisbon", "Nairobi", "Kyoto", "Dublin", "Denver", "Hanoi", "Zurich", "Lima", "Tunis", "Bergen", "Austin"],
    "animal": ["otter", "falcon", "badger", "walrus", "lemur", "heron", "bison", "gecko", "ferret", "jackal", "moose"],
    "color": ["crimson", "teal", "amber", "violet", "indigo", "ochre", "maroon", "olive", "scarlet", "cobalt"],
    "fruit": ["apricot", "mango", "quince", "papaya", "lychee", "guava", "fig", "plum", "kiwi", "lime"],
    "word": ["harbor", "lantern", "meadow", "granite", "whistle", "copper", "thistle", "canyon", "velvet", "orbit"],
}


def _digits(lo: int, hi: int):
    def make(rng: random.Random) -> str:
        n = rng.randint(lo, hi)
        return str(rng.randint(1, 9)) + "".join(rng.choice("0123456789") for _ in range(n - 1))

    return make


def _word(group: str):
    return lambda rng: rng.choice(_WORDS[group])


# kind -> (names the fact goes by, value maker)
NEEDLES = {
    "passkey": (["pass key", "access code", "PIN", "door code"], _digits(5, 9)),
    "number": (["account number", "serial number", "reference number", "tracking number"], _digits(7, 12)),
    "code": (["ticket code", "order code", "voucher code", "batch label"], synthetic.code),
    "word": ([f"secret {g}" for g in _WORDS] + ["project name"], None),
}
NEEDLE_WEIGHTS = {"passkey": 0.25, "number": 0.3, "code": 0.15, "word": 0.3}
STATEMENTS = [
    "The {name} is {value}.",
    "Remember: the {name} is {value}.",
    "{Name}: {value}.",
    "Note that the {name} is {value}.",
    "(The {name} is {value}.)",
    "For the record, the {name} is {value}.",
]
# (instruction prefix, query); both may name the fact; a layout with the question in the prefix is dense-only
LAYOUTS = [
    ("", "\n\nQuestion: What is the {name}?\nAnswer: "),
    ("Read the text and find the {name}.\n\n", "\n\nWhat is the {name}? The {name} is "),
    ("", "\n\nQ: {name}?\nA: "),
    ("### Document\n", "\n### Question\nWhat is the {name}?\n### Answer\n"),
    ("Somewhere below is the {name}. Remember it.\n", "\nThe {name} mentioned above is "),
    ("Question: what is the {name}?\nDocument:\n", "\nAnswer: "),
]
QUERY_FIRST = {5}


def _value(rng: random.Random, kind: str, name: str) -> str:
    if kind == "word":
        group = name.split()[-1] if name.startswith("secret") else "word"
        return _word(group)(rng)
    return NEEDLES[kind][1](rng)


def _statement(rng: random.Random, name: str, value: str) -> str:
    s = rng.choice(STATEMENTS).format(name=name, Name=name[0].upper() + name[1:], value=value)
    return s


_BREAKS = frozenset(encode(" \n"))


def _boundary(text: list[int], at: int) -> int:
    """The first offset at or after ``at`` that follows a space or newline (a word boundary), within 40
    characters; else ``at`` (a run without spaces, such as a long number or a table rule)."""
    for p in range(at, min(len(text), at + 40) + 1):
        if p == 0 or p == len(text) or text[p - 1] in _BREAKS:
            return p
    return at


class CorpusSamples:
    """Samples of :class:`~bench.tiny.corpus.Corpus` text: sources drawn uniformly (each source weighs the
    same however large), documents uniformly within a source."""

    def __init__(self, corpus: Corpus):
        self.corpus = corpus
        self.by_source = [d for d in (corpus.source_docs(n) for n in corpus.names) if len(d)]
        if not self.by_source:
            raise ValueError("the corpus holds no document")

    def text_ids(self, rng: random.Random, n: int) -> list[int]:
        """``n`` character ids of one source: a crop of a document, documents of that source joined by a
        blank line when one is too short."""
        docs = rng.choice(self.by_source)
        out: list[int] = []
        while len(out) < n:
            first, end, _ = docs[rng.randrange(len(docs))]
            take = min(n - len(out), int(end - first))
            start = rng.randint(int(first), int(end) - take)
            if out:
                out += encode("\n\n")
            out += self.corpus.tokens[start : start + take].tolist()
        return out[:n]

    def lm(self, rng: random.Random, total: int) -> Sample:
        """Packed crops (BOS between them), every token may be masked."""
        s = Sample([], [], [], "lm")
        while len(s.ids) < total - 1:
            n = min(total - len(s.ids) - 1, rng.randint(64, max(64, total)))
            _append(s, [BOS], 0, "b")
            _append(s, self.text_ids(rng, n), 0, "p")
        return s

    def _fact(self, rng: random.Random, ctx_len: int):
        """A context of ``ctx_len`` ids with a needle (and maybe decoys): (context ids, needle span, name, value)."""
        kind = rng.choices(list(NEEDLE_WEIGHTS), weights=list(NEEDLE_WEIGHTS.values()))[0]
        names = NEEDLES[kind][0]
        name = rng.choice(names)
        value = _value(rng, kind, name)
        needle = encode(_statement(rng, name, value) + " ")
        decoys = []
        if rng.random() < 0.6:
            others = [n for n in names if n != name]
            for _ in range(rng.randint(1, 3)):
                other = rng.choice(others)
                decoys.append(encode(_statement(rng, other, _value(rng, kind, other)) + " "))
        text = self.text_ids(rng, max(16, ctx_len - len(needle) - sum(map(len, decoys))))
        pieces = [(needle, True)] + [(d, False) for d in decoys]
        spots = sorted((_boundary(text, rng.randint(0, len(text))), i) for i in range(len(pieces)))
        out, span, prev = [], (0, 0), 0
        for at, i in spots:
            out += text[prev:at]
            ids, is_needle = pieces[i]
            if is_needle:
                span = (len(out), len(out) + len(ids))
            out += ids
            prev = at
        out += text[prev:]
        return out, span, name, value

    def dense(self, rng: random.Random, total: int) -> Sample:
        """``BOS prefix context query answer EOS*n`` with full attention."""
        layout = rng.randrange(len(LAYOUTS))
        n_eos = rng.randint(1, 6)
        ctx, span, name, value = self._fact(rng, total - 80)
        prefix, query = (x.format(name=name) for x in LAYOUTS[layout])
        fixed = 1 + len(prefix) + len(query) + len(value) + n_eos
        ctx = ctx[: max(16, total - fixed)]
        if span[1] > len(ctx):  # the cut removed the needle: draw again (rare: a needle near the end)
            return self.dense(rng, total)
        s = Sample([], [], [], "dense")
        _append(s, [BOS], 0, "b")
        _append(s, encode(prefix) + ctx, 0, "p")
        _append(s, encode(query), 0, "q")
        _append(s, encode(value) + [EOS] * n_eos, 0, "a")
        return s

    def chunked(self, rng: random.Random, total: int, needle: bool = True, answer: bool = True) -> Sample:
        """``[BOS prefix] [BOS chunk]... query [answer]``: static chunks that see only themselves, the kept
        ones in document order; ``needle=False`` keeps only needle-free chunks (then no answer)."""
        layout = rng.choice([i for i in range(len(LAYOUTS)) if i not in QUERY_FIRST])
        chunk_len = rng.choice([64, 96, 128, 192, 256])
        n_eos = rng.randint(1, 6)
        probe_name = "reference number"  # the longest name: sizes the query and prefix budget
        prefix_len, query_len = (len(x.format(name=probe_name)) for x in LAYOUTS[layout])
        budget = total - (3 + prefix_len + query_len + 12 + n_eos)
        keep = max(1, min(rng.randint(1, 6), budget // (chunk_len + 1)))
        ctx, (a, b), name, value = self._fact(rng, (keep + rng.randint(1, 6)) * chunk_len)
        cuts = list(range(0, len(ctx), chunk_len))
        hit = {i for i, c in enumerate(cuts) if c < b and c + chunk_len > a}
        others = [i for i in range(len(cuts)) if i not in hit]
        if needle:
            kept = sorted(hit | set(rng.sample(others, max(0, min(keep - len(hit), len(others))))))
        else:
            kept = sorted(rng.sample(others, min(keep, len(others))))
        prefix, query = (x.format(name=name) for x in LAYOUTS[layout])
        s = Sample([], [], [], "chunked" if needle else "no_needle")
        append_chunks(s, prefix, [ctx[cuts[i] : cuts[i] + chunk_len] for i in kept])
        _append(s, encode(query), 0, "q")
        if answer and needle:
            _append(s, encode(value) + [EOS] * n_eos, 0, "a")
        return s
