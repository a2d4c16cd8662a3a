"""Training samples for the tiny dLLM: retrieval tasks in three layouts plus packed essay text.

Every sample is a list of character-level token ids plus, per token, a segment id
and a "may be masked" flag:

- ``dense``: ``BOS prefix context query answer EOS*n`` with full bidirectional
  attention (what dense / prefix_cache decoding sees).
- ``chunked``: ``[BOS prefix] [BOS chunk_1] ... [BOS chunk_k] query answer EOS*n``
  where each bracketed segment attends only to itself and the query/answer rows
  attend to everything: exactly what Prefilling-dLLM's independent chunk caches
  give at inference (continuous positions). Chunks are cut at arbitrary character
  offsets; the kept ones are the needle chunk(s) plus random distractors in order.
- ``no_needle``: needle-free chunks + a query (no answer); only query tokens are
  learned, so the model's confidence in the query reflects whether the chunks are
  relevant (what the self-information score s_I reads).
- ``lm``: packed essay crops with a BOS between documents, whole-sequence masking.

Masking (the caller): ``answer`` (SFT form: only the response is masked),
``all`` (every non-BOS token may be masked), ``query``.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from bench.tiny.tokenizer import CHARS, SPECIALS
from dllm.eval.tasks import make_case
from dllm.eval.tasks.essays import load_essays  # train split only

PAD, BOS, EOS, MASK = 0, 1, 2, 3
assert list(SPECIALS) == ["pad", "bos", "eos", "mask"]
CHAR_ID = {c: i + len(SPECIALS) for i, c in enumerate(CHARS)}
SPACE = CHAR_ID[" "]


def encode(text: str) -> list[int]:
    """Character ids (unknown characters become a space: the task text is ASCII-normalised)."""
    return [CHAR_ID.get(c, SPACE) for c in text]


@dataclass
class Sample:
    ids: list  # token ids
    segment: list  # 0 = live row (sees all keys); k > 0 = static segment k (sees only itself)
    role: list  # per token: "b" bos, "p" prompt/context, "q" query, "a" answer/eos
    kind: str


def _append(s: Sample, ids, seg, role):
    s.ids.extend(ids)
    s.segment.extend([seg] * len(ids))
    s.role.extend([role] * len(ids))


def append_chunks(s: Sample, prefix: str, chunks) -> None:
    """Append ``[BOS prefix] [BOS chunk]...`` to ``s``, each bracketed part a segment of its own (1, 2, ...: it
    attends only to itself, the independent chunk caches of Prefilling-dLLM); ``chunks`` are token id lists."""
    seg = 1
    if prefix:
        _append(s, [BOS], seg, "b")
        _append(s, encode(prefix), seg, "p")
        seg += 1
    for ids in chunks:
        _append(s, [BOS], seg, "b")
        _append(s, ids, seg, "p")
        seg += 1


def _case(rng: random.Random, task: str, ctx_len: int, phrasing: str = "random", haystack: str = "filler"):
    """A training case (``split="train"``: the evaluation essays and pydoc topics never appear)."""
    seed_depth = rng.random(), rng.randrange(1 << 30)
    return make_case(task, ctx_len, *seed_depth, phrasing=phrasing, split="train", haystack=haystack)


def _min_len(task: str) -> int:
    return {"kv_retrieval": 250, "needle": 300}.get(task, 160)


def _case_at_least(rng: random.Random, task: str, ctx_len: int, phrasing: str, haystack: str = "filler"):
    """A case whose context is ``ctx_len`` tokens, or the shortest length the needle allows."""
    for n in (ctx_len, 100, 160, 250, 320):
        if n < ctx_len:
            continue
        try:
            return _case(rng, task, n, phrasing, haystack)
        except ValueError:  # too short for this needle template
            continue
    return _case(rng, task, max(ctx_len, 400), phrasing, haystack)


def dense_sample(
    rng: random.Random,
    total: int,
    task: str,
    phrasing: str = "random",
    prefix: bool = True,
    max_eos: int = 12,
    haystack: str = "filler",
) -> Sample:
    """BOS + prompt + answer + EOS*n (1 <= n <= max_eos), about ``total`` tokens long (``prefix=False`` drops
    the instructions; ``haystack``: as for ``make_case``)."""
    n_eos = rng.randint(1, max_eos)
    case = _case(rng, task, 512, phrasing, haystack)  # probe the fixed parts' size
    fixed = 1 + (len(case.prefix) if prefix else 0) + len(case.query) + len(case.answer) + n_eos
    case = _case_at_least(rng, task, max(64, total - fixed), phrasing, haystack)
    s = Sample([], [], [], "dense")
    _append(s, [BOS], 0, "b")
    _append(s, encode((case.prefix if prefix else "") + case.context), 0, "p")
    _append(s, encode(case.query), 0, "q")
    _append(s, encode(case.answer) + [EOS] * n_eos, 0, "a")
    return s


def chunked_sample(
    rng: random.Random,
    total: int,
    task: str,
    drop_needle: bool = False,
    answer: bool | None = None,
    haystack: str = "filler",
) -> Sample:
    """[BOS prefix] [BOS chunk]... query answer: segment-local attention for the static parts.

    ``answer`` (default: not ``drop_needle``) appends the answer; without it the sample ends at the
    query, which is what the scoring pass of s_I sees (chunk + query, no answer)."""
    if answer is None:
        answer = not drop_needle
    chunk_len = rng.choice([64, 96, 128, 192, 256, 384])
    n_eos = rng.randint(1, 12)
    probe = _case(rng, task, 512, haystack=haystack)
    budget = total - (2 + len(probe.prefix) + len(probe.query) + len(probe.answer) + n_eos)
    keep = max(1, min(rng.randint(1, 6), budget // (chunk_len + 1)))
    n_chunks = keep + rng.randint(0, 6)
    case = _case(rng, task, max(_min_len(task), n_chunks * chunk_len), haystack=haystack)
    ctx = encode(case.context)
    cuts = list(range(0, len(ctx), chunk_len))
    needle_chunks = {i for i, c in enumerate(cuts) if c < case.needle_end and c + chunk_len > case.needle_start}
    others = [i for i in range(len(cuts)) if i not in needle_chunks]
    if drop_needle:
        if not others:
            return dense_sample(rng, total, task, haystack=haystack)
        kept = sorted(rng.sample(others, min(keep, len(others))))
    else:
        kept = sorted(needle_chunks | set(rng.sample(others, max(0, min(keep - len(needle_chunks), len(others))))))
    s = Sample([], [], [], "no_needle" if drop_needle else "chunked")
    append_chunks(s, case.prefix, [ctx[cuts[i] : cuts[i] + chunk_len] for i in kept])
    _append(s, encode(case.query), 0, "q")
    if answer:
        _append(s, encode(case.answer) + [EOS] * n_eos, 0, "a")
    return s


COPY_POOL = "abcdefghijklmnopqrstuvwxyz0123456789     "
DIGIT_POOL = "0123456789"
HEX_POOL = "0123456789abcdef-"  # the characters of kv_retrieval's UUID keys and values


def copy_sample(rng: random.Random, total: int, pool: str = COPY_POOL) -> Sample:
    """``BOS x <two newlines> x EOS`` for a random string x drawn from ``pool`` (default letters, digits and
    spaces); the second copy is the answer. Every answer token is a lookup of its twin in the first copy,
    so this gives the copy (induction) circuit of the retrieval tasks a dense training signal. A
    digits-only pool makes every character ambiguous on its own, so only the order (position in the
    string, or the preceding characters) tells which digit comes next: the skill the passkey and
    number_string answers lack (they hold the right digits in the wrong order)."""
    n = max(8, (total - 4) // 2)
    x = encode("".join(rng.choice(pool) for _ in range(n)))
    s = Sample([], [], [], "copy")
    _append(s, [BOS], 0, "b")
    _append(s, x, 0, "p")
    _append(s, encode("\n\n"), 0, "q")
    _append(s, x + [EOS], 0, "a")
    return s


class EssayStream:
    """Random crops of the training essays, packed with a BOS between documents."""

    def __init__(self):
        self.docs = [encode(text) for _name, text in load_essays("train")]

    def sample(self, rng: random.Random, total: int) -> Sample:
        s = Sample([], [], [], "lm")
        while len(s.ids) < total:
            doc = rng.choice(self.docs)
            n = min(total - len(s.ids) - 1, rng.randint(64, max(64, total)))
            if n <= 0:
                break
            start = rng.randrange(0, max(1, len(doc) - n))
            _append(s, [BOS], 0, "b")
            _append(s, doc[start : start + n], 0, "p")
        return s
