"""Where the answer is lost once its chunk is kept: selection, the reading of disjoint pieces, or their order.

    python -m bench.fidelity.copy_eval --lengths 4096 16384 65536 131072 --cases 40 --out bench/results

Held-out text of whole sources no training phase saw (:data:`bench.tiny.sources.HELD_OUT_SOURCES`), with
distractor numbers and dates, three haystacks from readable to number-dense:

- ``devil``: the vendored *Devil's Dictionary* excerpt in the register layout of
  :func:`dllm.eval.tasks.reports.make_report` with no register sentences (``distractor_share=0``, none next
  to the needle): its distractors are the registers' title lines ("volume 3, closed 12 May 1911"), section
  numbers "1." to "8." (sources ``devil`` and ``registers``);
- ``devil-registers``: ``make_report``'s defaults, the documents of ``bench.fidelity.heldout_eval``: 45% of the
  sentences are register sentences (dates, amounts, 5-digit codes, 10-digit account numbers), one on each
  side of the needle;
- ``debian-changelog``: this machine's ``/usr/share/doc/*/changelog.Debian.gz`` (versions, dates, bug
  numbers), read line by line from a seeded changelog and line, the needle a line of its own
  (:func:`dllm.eval.tasks.haystack.fill_context`); an answer that occurs anywhere else in the document, alone
  or inside a longer run of digits, is drawn again.

Every answer occurs in its document only inside the needle. The grid gives ``devil`` half the cases (the
haystack where a dense crop still reads the answer: there the steps after selection can be told apart)
and the other two a quarter each.

Tasks: pass keys (5 digits) and number strings (10 digits) in the random wordings of ``wording.json``, at 5
depths; seeds from 2**31 (no training run draws them). Per case, greedy decoding one token per step, the
answer's tokens + 4 (:func:`dllm.eval.evaluation.response_length`), exact match by the InfiniteBench rule
(:func:`dllm.eval.tasks.score`: the first integer of the output is the answer):

- (a) kept: a chunk the needle sentence overlaps is among the kept ones (``stats.extra["selected_chunk_tokens"]``
  against :func:`dllm.prefilling.chunk_char_spans`; the tokenizer is character-level);
- (b) Prefilling-dLLM at the checkpoint's defaults (``prefilling_config.json``);
- (c) dense decoding of prefix + exactly the kept chunks' context tokens in document order + query;
- (d) the same with the needle's chunk moved last (nearest the query); when it already is last, (c)'s answer;
- (e) dense decoding of prefix + the 1024 characters of the document centred on the needle (the whole document
  when shorter) + query;
- (f) dense decoding of prefix + the needle's chunk alone + query (what the chunk says without the others);
- (g) dense decoding of prefix + the needle's chunk and as many other chunks as were kept beside it, drawn
  (seeded by the case) among the chunks not kept, in document order + query: disjoint pieces that selection
  did not choose.

(c), (d), (f) and (g) are decoded only when the needle's chunk was kept (else the answer is in none of them:
wrong, not decoded). Each row also counts the numbers (runs of digits) beside the needle: in the other kept
chunks, in (g)'s random chunks and in the crop (the needle left out). Each wrong answer is classed:
``distractor`` (its first integer is a number of the document other than the answer), ``near`` (as many
digits as the answer, at most 2 of them wrong), ``other``.

``--columns`` picks the dense columns to decode ((b) always runs): ``--columns e`` measures prefilling against
the crop alone (the comparison the README's copy table makes), at about a third of the time per case; the
others' cells then say "not run" (empty in the CSV, never counted as wrong). ``copy_eval.md`` pairs (b) and (e)
on the kept cases: their gap with a 90% interval and a sign test.

Writes ``copy_eval.csv`` (one row per case, provenance columns first; rows appended as cases finish) and
``copy_eval.md`` into ``--out``.
"""

from __future__ import annotations

import argparse
import functools
import math
import os
import random
import re
import sys
import time
from collections import defaultdict
from dataclasses import dataclass

import torch

from bench.outputs import save_text
from bench.provenance import machine_line, read_csv, write_csv
from dllm import encode_text, generate, load_model
from dllm.eval.evaluation import case_inputs, response_length
from dllm.eval.tasks import TaskCase, score
from dllm.eval.tasks.case import pick
from dllm.eval.tasks.digits import NUMBER_STRING, PASSKEY
from dllm.eval.tasks.haystack import fill_context
from dllm.eval.tasks.reports import make_report
from dllm.eval.tasks.scoring import first_integer
from dllm.eval.tasks.text import stable_seed
from dllm.model.loader import default_model_dir
from dllm.prefilling import PrefillingConfig, chunk_char_spans

HAYSTACK_SOURCES = {
    "devil": ("devil", "registers"),
    "devil-registers": ("devil", "registers"),
    "debian-changelog": ("debian-changelog",),
}
"""Each haystack's whole sources, by their names in :data:`bench.tiny.sources.SOURCES` (all held out)."""
HAYSTACKS = tuple(HAYSTACK_SOURCES)
TASKS = ("passkey", "number_string")
DEPTHS = (0.1, 0.3, 0.5, 0.7, 0.9)
SEED_BASE = 1 << 31  # seeds no training run draws
CROP = 1024
COLUMNS = ("b", "c", "d", "e", "f", "g")
DENSE_COLUMNS = COLUMNS[1:]  # (b) always runs; ``--columns`` picks among these
TITLES = {
    "a": "(a) needle chunk kept",
    "b": "(b) prefilling",
    "c": "(c) dense, kept chunks in order",
    "d": "(d) dense, needle chunk last",
    "e": f"(e) dense, {CROP}-char crop",
    "f": "(f) dense, needle chunk alone",
    "g": "(g) dense, needle chunk + random unkept chunks",
}
HAYSTACK_NOTES = {
    "devil": "dictionary prose in the register layout, no register sentences: title-line dates and volume "
    "numbers, section numbers",
    "devil-registers": "45% register sentences (dates, amounts, codes, account numbers), one each side of the needle",
    "debian-changelog": "changelog lines (versions, dates, bug numbers), the needle a line of its own",
}
_DIGIT_SPEC = {"passkey": PASSKEY, "number_string": NUMBER_STRING}
_DIGITS = re.compile(r"\d+")


# ----------------------------------------------------------------------------------------------- cases
@functools.cache
def changelogs() -> tuple[str, ...]:
    """The texts of the ``debian-changelog`` source (:func:`bench.tiny.sources.documents`), in its order.

    Raises ``FileNotFoundError`` when this machine has none."""
    from bench.tiny.sources import documents

    docs = tuple(text for _ident, text in documents("debian-changelog"))
    if not docs:
        raise FileNotFoundError("no /usr/share/doc/*/changelog.Debian.gz on this machine")
    return docs


def changelog_lines(rng: random.Random):
    """Endless lines of the changelogs from a seeded changelog and line on, cycling in source order; a line
    followed by blank lines carries them (``"\\n".join`` of the units is the text, blank lines kept)."""
    docs = changelogs()
    first = rng.randrange(len(docs))
    k = 0
    while True:
        lines = re.split(r"\n(?=[^\n])", docs[(first + k) % len(docs)])
        start = rng.randrange(len(lines)) if k == 0 else 0
        yield from lines[start:]
        k += 1


def occurs_elsewhere(context: str, start: int, end: int, answer: str) -> bool:
    """True when ``answer`` is part of a run of digits of ``context`` outside ``[start, end)``."""
    rest = context[:start] + "\n" + context[end:]
    return any(answer in run for run in _DIGITS.findall(rest))


def changelog_case(task: str, length: int, depth: float, seed: int) -> TaskCase:
    """A digit needle (``task``: passkey or number_string, a random wording) on a line of its own at ``depth``
    in ``length`` characters of changelogs; its answer occurs nowhere else in the document."""
    spec = _DIGIT_SPEC[task]
    rng = random.Random(stable_seed("copy_eval", "debian-changelog", task, length, depth, seed))
    needle_t, prefix, query = (pick(rng, opts, False) for opts in (spec.wording.needles, spec.wording.prefixes,
                                                                    spec.wording.queries))  # fmt: skip
    units_seed = rng.getrandbits(64)
    for _ in range(100):
        answer = str(rng.randint(1, 9)) + "".join(str(rng.randint(0, 9)) for _ in range(spec.n_digits - 1))
        filled = fill_context(
            changelog_lines(random.Random(units_seed)), needle_t.format(x=answer), length, depth, sep="\n", task=task
        )
        if not occurs_elsewhere(filled.context, filled.needle_start, filled.needle_end, answer):
            break
    else:  # pragma: no cover
        raise RuntimeError(f"{task}: every drawn answer occurs in the changelogs")
    return TaskCase(
        task=task, prefix=prefix, context=filled.context, query=query, answer=answer, length=length, depth=depth,
        seed=seed, needle_start=filled.needle_start, needle_end=filled.needle_end, context_tokens=filled.n_tokens,
        answer_tokens=len(answer), phrasing="random", split="eval",
    )  # fmt: skip


def make_copy_case(haystack: str, task: str, length: int, depth: float, seed: int) -> TaskCase:
    """One case: ``task`` (passkey or number_string) in ``haystack`` (:data:`HAYSTACKS`)."""
    if haystack == "devil":
        return make_report(length, [(task, depth)], seed, distractor_share=0.0, near_distractors=False).case(0)
    if haystack == "devil-registers":
        return make_report(length, [(task, depth)], seed).case(0)
    if haystack == "debian-changelog":
        return changelog_case(task, length, depth, seed)
    raise ValueError(f"unknown haystack {haystack!r}; expected one of {HAYSTACKS}")


GRID_SLOTS = ("devil", "devil-registers", "devil", "debian-changelog")
"""The haystacks of one round of the grid: ``devil`` twice (each with its own seed), the others once."""


def grid(length: int, n: int, slots=GRID_SLOTS, first_seed: int = 0) -> list[tuple[str, str, float, int]]:
    """The first ``n`` (haystack, task, depth, seed) of ``length``. Case ``i`` of a round of
    ``2 x len(slots) x 5`` takes slot ``i % len(slots)`` and depth ``i % 5`` (every pair once in each half
    round), the task alternating between the slots and flipped in the second half: a run cut short still
    covers every haystack, task and depth. A repeated (haystack, task, depth) takes the next seed
    (``SEED_BASE + first_seed + k`` for its k-th case; ``first_seed`` 0 is the recorded evaluation, tuning cases
    apart from it take 1000 or more)."""
    k = len(slots) * len(DEPTHS)
    seen: dict = defaultdict(int)
    out = []
    for i in range(n):
        j = i % (2 * k)
        cell = (slots[j % len(slots)], TASKS[((j % len(slots)) // 2 + j // k) % 2], DEPTHS[j % len(DEPTHS)])
        out.append((*cell, SEED_BASE + first_seed + seen[cell]))
        seen[cell] += 1
    return out


# ----------------------------------------------------------------------------------------------- pieces
def needle_chunks(spans: list, start: int, end: int) -> list[int]:
    """Indices of the chunks (``spans``: ``(start, end)`` characters, chunk order) that overlap ``[start, end)``."""
    return [j for j, (a, b) in enumerate(spans) if a < end and b > start]


def ordered_spans(kept: list, fact: list, fact_last: bool) -> list:
    """The kept chunks' spans in document order; ``fact_last``: those in ``fact`` moved to the end (their
    order kept)."""
    spans = sorted(tuple(s) for s in kept)
    if not fact_last:
        return spans
    fact = {tuple(s) for s in fact}
    return [s for s in spans if s not in fact] + [s for s in spans if s in fact]


def pieces_ids(model, case: TaskCase, context_ids: torch.Tensor, spans: list) -> torch.Tensor:
    """``[1, L]``: BOS + prefix, the context tokens of ``spans`` (``(start, end)``) in that order, the query."""
    parts = [encode_text(model, case.prefix, bos=True)]
    parts += [context_ids[a:b] for a, b in spans]
    parts.append(encode_text(model, case.query))
    return torch.cat(parts)[None]


def centred_crop(context: str, start: int, end: int, width: int = CROP) -> tuple[str, int]:
    """The ``width`` characters of ``context`` centred on ``[start, end)`` (moved inside the document at its
    ends; the whole document when shorter), and the crop's offset in ``context``."""
    if len(context) <= width:
        return context, 0
    lo = min(max(0, (start + end) // 2 - width // 2), len(context) - width)
    return context[lo : lo + width], lo


def answer_kind(prediction: str, case: TaskCase) -> str:
    """``right``, ``distractor`` (the first integer is another number of the document), ``near`` (the
    answer's digit count, at most 2 digits wrong), ``other`` (incl. no integer)."""
    got = first_integer(prediction)
    if got == case.answer:
        return "right"
    if got and got in set(_DIGITS.findall(case.context)):
        return "distractor"
    if len(got) == len(case.answer) and sum(x != y for x, y in zip(got, case.answer)) <= 2:
        return "near"
    return "other"


@dataclass
class Prompts:
    """What one case decodes: (b)'s prompt parts, the kept chunks, and the dense prompts of (c)-(f)."""

    chunk_spans: list  # (start, end) characters = tokens of every chunk
    kept: list  # kept chunk indices (document order)
    kept_spans: list  # their [start, end) token spans (stats.extra["selected_chunk_tokens"])
    fact: list  # chunks the needle overlaps
    dense: dict  # column -> [1, L] ids (c, d, f when a needle chunk is kept; e always)
    crop: str
    others: list  # (g)'s chunks besides the needle's: drawn among the chunks neither kept nor the needle's


def numbers_in(text: str) -> int:
    """How many runs of digits ``text`` holds (the distractor numbers a reader sees)."""
    return len(_DIGITS.findall(text))


def dense_prompts(model, case: TaskCase, extra: dict, cfg: PrefillingConfig) -> Prompts:
    """The prompts of (c)-(g) from a prefilling run's ``stats.extra`` on ``case``; (g)'s other chunks are drawn
    with a seed of the case (as many as the kept chunks besides the needle's, or all there are)."""
    spans = chunk_char_spans(model, case.context, cfg)
    kept_spans = [tuple(s) for s in extra["selected_chunk_tokens"]]
    kept = [spans.index(s) for s in sorted(kept_spans)]
    fact = needle_chunks(spans, case.needle_start, case.needle_end)
    ctx = encode_text(model, case.context)
    crop, _ = centred_crop(case.context, case.needle_start, case.needle_end)
    dense = {"e": encode_text(model, case.prefix + crop + case.query, bos=True)[None]}
    kept_fact = [spans[j] for j in fact if j in kept]
    if kept_fact:
        dense["c"] = pieces_ids(model, case, ctx, ordered_spans(kept_spans, kept_fact, False))
        dense["d"] = pieces_ids(model, case, ctx, ordered_spans(kept_spans, kept_fact, True))
        dense["f"] = pieces_ids(model, case, ctx, ordered_spans(kept_fact, [], False))
    rest = [j for j in range(len(spans)) if j not in kept and j not in fact]
    rng = random.Random(stable_seed("copy_eval-g", case.context[:64], case.answer, case.needle_start))
    others = sorted(rng.sample(rest, min(len(rest), len(kept) - len(kept_fact))))
    if kept_fact:
        dense["g"] = pieces_ids(model, case, ctx, ordered_spans(kept_fact + [spans[j] for j in others], [], False))
    return Prompts(spans, kept, kept_spans, fact, dense, crop, others)


def _text(case: TaskCase, span: tuple) -> str:
    return case.context[span[0] : span[1]]


def evaluate_case(model, case: TaskCase, cfg: PrefillingConfig, haystack: str, columns=DENSE_COLUMNS) -> dict:
    """One case's row: (a)-(g) answers, exact match and answer kind. ``columns``: the dense columns to decode
    (a subset of :data:`DENSE_COLUMNS`); the others get an empty answer and ``None`` for exact and kind (not
    run, unlike ``False``: run and wrong)."""
    g = response_length(case)
    t0 = time.perf_counter()
    res = generate(model, **case_inputs(model, case, "prefilling"), method="prefilling", prefilling=cfg,
                   gen_length=g, steps=g)  # fmt: skip
    t_pre = time.perf_counter() - t0
    p = dense_prompts(model, case, res.stats.extra, cfg)
    kept = bool(set(p.fact) & set(p.kept))
    fact_pos = [i + 1 for i, j in enumerate(p.kept) if j in p.fact]
    row = {
        "length": case.length, "haystack": haystack, "task": case.task, "depth": case.depth, "seed": case.seed,
        "gold": case.answer, "chunks": len(p.chunk_spans), "needle_chunks": " ".join(map(str, p.fact)),
        "kept_chunks": " ".join(map(str, p.kept)), "kept": kept,
        "needle_position": " ".join(map(str, fact_pos)),  # 1 = first kept chunk in document order
        "needle_last": kept and fact_pos[-1] == len(p.kept), "crop_chars": len(p.crop),
        "random_chunks": " ".join(map(str, p.others)),
        # distractor numbers beside the needle: in the kept chunks, the unkept ones of (g), the crop (needle out)
        "numbers_kept": sum(numbers_in(_text(case, p.chunk_spans[j])) for j in p.kept if j not in p.fact),
        "numbers_random": sum(numbers_in(_text(case, p.chunk_spans[j])) for j in p.others),
        "numbers_crop": numbers_in(p.crop.replace(case.needle, " ")),
        "b_answer": res.text[0],
    }  # fmt: skip
    t1 = time.perf_counter()
    for col in DENSE_COLUMNS:
        if col not in columns:
            row[f"{col}_answer"] = ""
        elif col not in p.dense:
            row[f"{col}_answer"] = ""  # the needle is in none of the pieces: wrong, not decoded
        elif col == "d" and row["needle_last"] and "c" in columns:
            row["d_answer"] = row["c_answer"]  # the same prompt
        else:
            row[f"{col}_answer"] = generate(model, p.dense[col], method="dense", gen_length=g, steps=g).text[0]
        if col in ("c", "d", "f", "g"):
            row[f"{col}_tokens"] = p.dense[col].shape[1] if col in p.dense else ""
    for col in COLUMNS:
        if col != "b" and col not in columns:
            row[f"{col}_correct"] = row[f"{col}_kind"] = None
            continue
        row[f"{col}_correct"] = bool(row[f"{col}_answer"]) and score(case.task, row[f"{col}_answer"], case)
        row[f"{col}_kind"] = answer_kind(row[f"{col}_answer"], case) if row[f"{col}_answer"] else ""
    row |= {"prefill_s": round(t_pre, 2), "dense_s": round(time.perf_counter() - t1, 2)}
    return row


# ----------------------------------------------------------------------------------------------- report
def _pct(k: int, n: int) -> str:
    return f"{100 * k / n:.0f}% ({k}/{n})" if n else "-"


def _rate(rows: list[dict], col: str) -> str:
    """``col``'s exact answers over ``rows`` as ``_pct``; "not run" where ``--columns`` left it out."""
    if not ran(rows, col):
        return "not run"
    return _pct(sum(r[f"{col}_correct"] for r in rows), len(rows))


def ran(rows: list[dict], col: str) -> bool:
    """Whether column ``col`` was decoded in every row (``--columns``)."""
    return all(r[f"{col}_correct"] is not None for r in rows)


def tables(rows: list[dict], by: tuple = ("length",)) -> str:
    """Markdown: counts of each column over all cases, then the rates where the needle chunk was kept."""
    cells = defaultdict(list)
    for r in rows:
        cells[tuple(r[k] for k in by)].append(r)
    keys = sorted(cells, key=lambda k: tuple(int(x) if str(x).isdigit() else str(x) for x in k))
    head = "| " + " | ".join(by) + " | cases | " + " | ".join(TITLES[c] for c in ("a",) + COLUMNS) + " |"
    lines = ["All cases (exact answers):", "", head, "|" + "---|" * len(by) + "---:|" * (2 + len(COLUMNS))]
    for k in keys:
        rs = cells[k]
        n = len(rs)
        vals = [_pct(sum(r["kept"] for r in rs), n)] + [_rate(rs, c) for c in COLUMNS]
        lines.append("| " + " | ".join(map(str, k)) + f" | {n} | " + " | ".join(vals) + " |")
    lines += ["", "Where the needle chunk was kept:", ""]
    lines += ["| " + " | ".join(by) + " | kept | " + " | ".join(TITLES[c] for c in COLUMNS) + " |",
              "|" + "---|" * len(by) + "---:|" * (1 + len(COLUMNS))]  # fmt: skip
    for k in keys:
        rs = [r for r in cells[k] if r["kept"]]
        vals = [_rate(rs, c) for c in COLUMNS]
        lines.append("| " + " | ".join(map(str, k)) + f" | {len(rs)} | " + " | ".join(vals) + " |")
    return "\n".join(lines)


def position_table(rows: list[dict]) -> str:
    """Markdown: kept cases by where the needle chunk sat among the kept ones (document order), (b)-(d)."""
    cells = defaultdict(list)
    for r in rows:
        if r["kept"]:
            cells[r["needle_position"].split()[-1]].append(r)
    lines = ["| needle chunk's place among the kept (1 = first) | cases | " + " | ".join(TITLES[c] for c in "bcd")
             + " |", "|---|---:|---:|---:|---:|"]  # fmt: skip
    for k in sorted(cells):
        rs = cells[k]
        lines.append(f"| {k} | {len(rs)} | " + " | ".join(_rate(rs, c) for c in "bcd") + " |")
    return "\n".join(lines)


NUMBER_BANDS = ((0, 3), (4, 7), (8, 10**9))


def numbers_table(rows: list[dict]) -> str:
    """Markdown: kept cases by how many numbers the pieces beside the needle's chunk hold: (c) and (d) by the
    kept chunks', (g) by the random chunks', (e) by the crop's (the needle left out)."""
    kept = [r for r in rows if r["kept"]]
    band = {f"{a}-{b}" if b < 10**9 else f"{a}+": (a, b) for a, b in NUMBER_BANDS}
    lines = ["| numbers beside the needle | (c) kept chunks | (d) same, needle last | (g) random unkept chunks | "
             "(e) 1024-char crop |", "|---|---:|---:|---:|---:|"]  # fmt: skip
    for name, (a, b) in band.items():
        cell = []
        for c, key in (("c", "numbers_kept"), ("d", "numbers_kept"), ("g", "numbers_random"), ("e", "numbers_crop")):
            rs = [r for r in kept if a <= int(r[key]) <= b]
            cell.append(_rate(rs, c))
        lines.append(f"| {name} | " + " | ".join(cell) + " |")
    mean = {k: sum(int(r[k]) for r in kept) / max(1, len(kept)) for k in ("numbers_kept", "numbers_random",
                                                                          "numbers_crop")}  # fmt: skip
    lines += ["", f"Mean numbers beside the needle (kept cases): kept chunks {mean['numbers_kept']:.1f}, random "
              f"unkept chunks {mean['numbers_random']:.1f}, crop {mean['numbers_crop']:.1f}."]  # fmt: skip
    return "\n".join(lines)


def kinds_table(rows: list[dict]) -> str:
    """Markdown: what the wrong answers were, per column (kept cases)."""
    kept = [r for r in rows if r["kept"]]
    lines = ["| column | wrong | another number of the document | the answer, 1-2 digits off | other |",
             "|---|---:|---:|---:|---:|"]  # fmt: skip
    for c in [c for c in COLUMNS if ran(kept, c)]:
        wrong = [r for r in kept if not r[f"{c}_correct"]]
        n = {k: sum(r[f"{c}_kind"] == k for r in wrong) for k in ("distractor", "near", "other")}
        lines.append(f"| {TITLES[c]} | {len(wrong)} | {n['distractor']} | {n['near']} | {n['other']} |")
    return "\n".join(lines)


def read_rows(path: str) -> tuple[list[dict], str]:
    """The rows of a ``copy_eval.csv`` (booleans parsed) and its first row's machine line.

    Raises:
        OSError: it cannot be read (missing, a folder).
        ValueError: it is not a ``copy_eval.csv`` (a column missing), naming the column.
    """
    try:
        rows, machine = read_csv(path)
    except KeyError as e:
        raise ValueError(f"{path} is not a copy_eval.csv: no column {e}") from None
    need = ("length", "haystack", "kept", "needle_last", "kept_chunks") + tuple(f"{c}_correct" for c in COLUMNS)
    missing = [k for k in need if rows and k not in rows[0]]
    if missing:
        raise ValueError(f"{path} is not a copy_eval.csv: no column {missing[0]!r}")
    for r in rows:
        for k in ("kept", "needle_last"):
            r[k] = r[k] == "True"
        for k in (f"{c}_correct" for c in COLUMNS):
            r[k] = None if r[k] == "" else r[k] == "True"  # empty: the column was not run
    return rows, machine


def compare_table(runs: dict[str, list[dict]], haystack: str | None = None) -> str:
    """Markdown: settings side by side (``runs``: name -> rows of one ``copy_eval.csv`` each, the same cases), per
    length and over all: needle chunk kept, (b) and (e) exact where kept and their gap in points, (b) exact over
    all cases, mean chunks kept. ``haystack``: only its cases."""
    lines = ["| length | setting | cases | needle chunk kept | (b) prefilling, kept | (e) 1K crop, kept | (b) - (e), "
             "points | (b) prefilling, all cases | mean chunks kept |",
             "|---:|---|---:|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
    lengths = sorted({int(r["length"]) for rows in runs.values() for r in rows})
    for length in [*lengths, "all"]:
        for name, rows in runs.items():
            rs = [r for r in rows if length in ("all", int(r["length"])) and haystack in (None, r["haystack"])]
            kept = [r for r in rs if r["kept"]]
            b, e = (sum(r[f"{c}_correct"] for r in kept) for c in "be")
            gap = f"{100 * (b - e) / len(kept):+.0f}" if kept else "-"
            chunks = sum(len(r["kept_chunks"].split()) for r in rs) / max(1, len(rs))
            lines.append(f"| {length} | {name} | {len(rs)} | {len(kept)} | {_pct(b, len(kept))} | "
                         f"{_pct(e, len(kept))} | {gap} | {_pct(sum(r['b_correct'] for r in rs), len(rs))} | "
                         f"{chunks:.1f} |")  # fmt: skip
    return "\n".join(lines)


def sign_test_p(wins: int, losses: int) -> float:
    """Two-sided exact sign test (binomial, p = 1/2) of ``wins`` against ``losses`` discordant pairs: McNemar's
    exact test of two readers on the same cases (McNemar 1947)."""
    n, k = wins + losses, min(wins, losses)
    return min(1.0, 2 * sum(math.comb(n, i) for i in range(k + 1)) / 2**n) if n else 1.0


def paired_table(rows: list[dict]) -> str:
    """Markdown: (b) prefilling against (e) the 1K crop on the same kept cases, per length and over all: both
    rates, the gap in points with its 90% interval (normal approximation over the per-case differences
    -1/0/+1), the discordant cases each way and their two-sided sign test."""
    lines = ["| length | kept | (b) prefilling | (e) 1K crop | (b) - (e), points | 90% interval | (b) right, (e) "
             "wrong | (e) right, (b) wrong | sign test p |", "|---:" * 9 + "|"]  # fmt: skip
    lengths = sorted({int(r["length"]) for r in rows})
    for length in [*lengths, "all"]:
        kept = [r for r in rows if r["kept"] and length in ("all", int(r["length"]))]
        d = [int(r["b_correct"]) - int(r["e_correct"]) for r in kept]
        n = len(d)
        if not n:
            continue
        mean = sum(d) / n
        half = 1.645 * math.sqrt(sum((x - mean) ** 2 for x in d) / max(1, n - 1) / n)
        wins, losses = d.count(1), d.count(-1)
        lo, hi = max(-1.0, mean - half), min(1.0, mean + half)  # a difference of rates lies in [-100, 100]
        p = sign_test_p(wins, losses)
        lines.append(f"| {length} | {n} | {_rate(kept, 'b')} | {_rate(kept, 'e')} | {100 * mean:+.1f} | "
                     f"{100 * lo:+.1f} to {100 * hi:+.1f} | {wins} | {losses} | "
                     f"{'< 0.01' if p < 0.005 else f'{p:.2f}'} |")  # fmt: skip
    return "\n".join(lines)


def report(rows: list[dict], cmd: str, machine: str, cfg_line: str, notes: str = "") -> str:
    """``copy_eval.md``'s text."""
    devil = [r for r in rows if r["haystack"] == "devil"]
    haystacks = "\n".join(f"- {h}: {HAYSTACK_NOTES[h]} (sources {' + '.join(s)})" for h, s in HAYSTACK_SOURCES.items())
    return (
        f"# Where the answer is lost once its chunk is kept\n\nCommand: `{cmd.strip()}`  \n{machine}\n\n"
        f"{cfg_line}\n\nHaystacks (whole held-out sources of `bench.tiny.sources`):\n\n{haystacks}\n\n"
        f"Tasks {', '.join(TASKS)}; depths {', '.join(map(str, DEPTHS))}. Greedy, one token per step, the "
        "answer's characters + 4; exact = the first integer of the output is the answer. (c), (d), (f) and (g) "
        "are decoded only when the needle chunk was kept (else wrong). (d) = (c) when the needle chunk is already "
        "last. (g): the needle chunk and as many chunks as were kept beside it, drawn (seeded) among the chunks "
        "not kept, in document order.\n\n"
        f"{notes}"
        f"## Per length\n\n{tables(rows)}\n\n"
        + (f"## Prefilling against the crop, paired (kept cases)\n\n{paired_table(rows)}\n\n" if ran(rows, "e") else "")
        + f"## Per length and haystack\n\n{tables(rows, ('length', 'haystack'))}\n\n"
        f"## Per task\n\n{tables(rows, ('task',))}\n\n"
        f"## By the needle chunk's place among the kept chunks (kept cases, all lengths)\n\n{position_table(rows)}\n\n"
        f"## devil: by the numbers beside the needle (kept cases, all lengths)\n\n{numbers_table(devil)}\n\n"
        "Numbers: runs of digits in the pieces other than the needle's chunk (for (e): the crop, the needle left "
        "out).\n\n"
        f"## What the wrong answers were (kept cases, all lengths)\n\n{kinds_table(rows)}\n"
    )


def length_count_arg(text: str) -> tuple[int, int]:
    """``--cases-for``'s ``LENGTH=N`` as ``(LENGTH, N)``. Raises ``argparse.ArgumentTypeError`` (a usage
    error) for anything else."""
    length, _, n = text.partition("=")
    if not (length.isdigit() and n.isdigit() and int(length) > 0):
        raise argparse.ArgumentTypeError(f"expected LENGTH=N (two whole numbers, e.g. 16384=100), got {text!r}")
    return int(length), int(n)


def adaptive_k_arg(text: str) -> float | str:
    """``--adaptive-k``'s value: a margin (float) or ``"off"`` (a fixed K over a checkpoint that turns it on).
    Raises ``ValueError`` (argparse's usage error) for anything else."""
    return "off" if text.strip().lower() == "off" else float(text)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None, help="checkpoint (default: the bundled tiny model)")
    p.add_argument("--out", default="bench/results", help="output folder (copy_eval.csv, copy_eval.md)")
    p.add_argument("--lengths", type=int, nargs="+", default=[4096, 16384, 65536, 131072])
    p.add_argument("--cases", type=int, default=40, help="cases per length")
    p.add_argument(
        "--first-seed",
        type=int,
        default=0,
        help="seed offset (default 0: the recorded evaluation; 1000 or more: tuning cases apart from it)",
    )
    p.add_argument("--cases-for", nargs="*", type=length_count_arg, default=[], metavar="LENGTH=N",
                   help="another case count per length")  # fmt: skip
    p.add_argument("--haystacks", nargs="+", default=list(GRID_SLOTS), choices=HAYSTACKS,
                   help="one round of the grid's haystacks (one may repeat: more cases of it)")  # fmt: skip
    p.add_argument("--threads", type=int, default=1, help="torch threads (1 on a shared 2-core machine)")
    p.add_argument(
        "--report-from",
        default=None,
        metavar="CSV",
        help="write the Markdown from this CSV (its run's command), stop",
    )
    p.add_argument("--notes", default="", help="a paragraph put before the tables (what the run says)")
    p.add_argument("--compare", nargs="+", default=None, metavar="NAME=CSV",
                   help="print these runs (copy_eval.csv files of the same cases) side by side, stop")  # fmt: skip
    p.add_argument("--top-k", type=int, default=None, help="K over the checkpoint's (a lever to measure)")
    p.add_argument("--adaptive-k", type=adaptive_k_arg, default=None, help="adaptive K's margin, or off (a fixed K)")
    p.add_argument("--chunk-size", type=int, default=None, help="C over the checkpoint's (a lever to measure)")
    p.add_argument("--columns", nargs="+", default=list(DENSE_COLUMNS), choices=DENSE_COLUMNS,
                   help="the dense columns to decode ((b) always runs; e.g. 'e' alone: prefilling against the crop, "
                   "in a fraction of the time)")  # fmt: skip
    args = p.parse_args(argv)
    if args.compare:
        runs = {}
        for item in args.compare:
            name, sep, path = item.rpartition("=")
            if not sep or not name or not path:
                p.error(f"--compare {item!r}: expected NAME=CSV")
            try:
                runs[name] = read_rows(path)[0]
            except (OSError, ValueError) as e:
                p.error(f"--compare {path}: {e}")
            if not ran(runs[name], "e"):
                p.error(f"--compare {path}: column (e) was not run there")
        print(f"All haystacks:\n\n{compare_table(runs)}\n\ndevil:\n\n{compare_table(runs, 'devil')}")
        return 0
    cmd = "python -m bench.fidelity.copy_eval " + " ".join(argv if argv is not None else sys.argv[1:])
    model_dir = args.model or default_model_dir()
    if args.chunk_size is not None and args.chunk_size < 1:
        p.error("--chunk-size must be at least 1")
    pairs = (("top_k", args.top_k), ("adaptive_k", args.adaptive_k), ("chunk_size", args.chunk_size))
    levers = {k: v for k, v in pairs if v is not None}
    levers = {k: None if v == "off" else v for k, v in levers.items()}
    cfg = PrefillingConfig.from_pretrained(model_dir, **levers)
    where = "the checkpoint's defaults" + (f" with {levers}" if levers else "")
    cfg_line = (f"Prefilling at {where}: C={cfg.chunk_size}, K={cfg.top_k}, adaptive K {cfg.adaptive_k}, score terms "
                f"{', '.join(cfg.score_terms)}, boundary snap {cfg.boundary_snap}, candidates {cfg.candidates}, "
                f"lexical weight {cfg.lexical_weight}.")  # fmt: skip
    notes = args.notes + "\n\n" if args.notes else ""
    if args.report_from:
        try:
            rows, machine = read_rows(args.report_from)
        except (OSError, ValueError) as e:
            p.error(f"--report-from {args.report_from}: {e}")
        text = report(rows, rows[0]["command"] if rows else cmd, machine, cfg_line, notes)
    else:
        counts = dict(args.cases_for)
        torch.manual_seed(0)
        torch.set_num_threads(args.threads)
        model = load_model(model_dir)
        os.makedirs(args.out, exist_ok=True)
        path = os.path.join(args.out, "copy_eval.csv")
        rows: list[dict] = []
        t0 = time.perf_counter()
        for ln in args.lengths:
            for h, t, d, s in grid(ln, counts.get(ln, args.cases), tuple(args.haystacks), args.first_seed):
                case = make_copy_case(h, t, ln, d, s)
                r = evaluate_case(model, case, cfg, h, tuple(args.columns)) | {"command": cmd.strip()}
                rows.append(r)
                write_csv(path, rows, str(model.device))  # a stopped run keeps its finished cases
                print(f"[{time.perf_counter() - t0:.0f}s] {ln} {h} {t} d={d} gold={r['gold']} kept={int(r['kept'])} "
                      + " ".join(f"{c}:{int(r[f'{c}_correct'])}={r[f'{c}_answer']!r}" for c in COLUMNS
                                 if r[f"{c}_correct"] is not None),
                      flush=True)  # fmt: skip
        text = report(rows, cmd, machine_line(str(model.device)), cfg_line, notes)
    save_text(args.out, "copy_eval.md", text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
