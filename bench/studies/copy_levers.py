"""How many chunks to keep beside the fact's: selection settings decoded side by side from one document cache.

    python -m bench.studies.copy_levers --lengths 4096 16384 65536 --cases 20 --out DIR

The copy evaluation (:mod:`bench.fidelity.copy_eval`) found that the bundled model reads a kept fact worse the
more chunks selection keeps beside it (they are the document's other number-dense chunks). This study tunes
that lever on cases *apart from* the evaluation's: the same ``devil`` haystack of held-out prose (the only
held-out haystack a dense crop still reads), pass keys and number strings alternating over 5 depths, seeds
from ``SEED_BASE + 5000`` (copy_eval draws from ``SEED_BASE``). Per case the document is encoded once
(:func:`dllm.encode_document`) and each setting of ``--settings`` selects and decodes from that cache:
``k<N>`` is ``top_k=N``, ``ak<M>`` is adaptive K with margin M (``PrefillingConfig(adaptive_k=M)``: the chunks
above the first drop of M robust spreads, at most ``top_k``, and when fewer than ``top_k`` the best chunk's better
neighbour if it ranks among the ``top_k`` best), ``ak<M>-solo`` the same without the neighbour step, ``ak<M>-any``
with the neighbour kept whatever its rank (the library's rule up to commit 5f118cc), ``ak<M>-top`` the
library's rule written out again (probes: the library has no such option, the study
patches :func:`dllm.prefilling.selection.kept_chunks` where the pipeline calls it), every other field the
checkpoint's.
Greedy, one token per step, the answer's tokens + 4; exact = the first integer of the output is the answer; kept =
a chunk the needle overlaps is selected.

Writes ``copy_levers.csv`` (one row per case and setting) and ``copy_levers.md`` (per length and setting:
needle chunk kept, exact where kept, exact in all, mean chunks kept) into the output folder.
"""

from __future__ import annotations

import dataclasses
import time
from collections import defaultdict
from contextlib import nullcontext
from unittest import mock

import torch

from bench.fidelity.copy_eval import DEPTHS, SEED_BASE, TASKS, make_copy_case, needle_chunks
from bench.outputs import output_dir, study_parser, write_results
from dllm import encode_document, encode_text, generate, load_model
from dllm.eval.evaluation import response_length
from dllm.eval.tasks import score
from dllm.model.loader import default_model_dir
from dllm.prefilling import PrefillingConfig, PromptParts, chunk_char_spans
from dllm.prefilling.selection import kept_count, rank_chunks, select_chunks

TUNE_SEED_BASE = SEED_BASE + 5000
"""Seeds of this study's cases: apart from copy_eval's (``SEED_BASE + k``, k below 5000)."""


SOLO, ANY, TOP = "-solo", "-any", "-top"
RULE_SUFFIXES = (SOLO, ANY, TOP)


def parse_setting(name: str, base: PrefillingConfig) -> PrefillingConfig:
    """``k<N>`` -> ``top_k=N``; ``ak<M>`` and ``ak<M>-solo|-any|-top`` -> ``adaptive_k=M`` (the checkpoint's
    ``top_k`` as the ceiling; the ``-solo``, ``-any`` and ``-top`` rules are :func:`without_neighbour`,
    :func:`neighbour_always` and :func:`neighbour_if_top`, applied by :func:`run_case`).

    Raises ``ValueError`` naming the forms for anything else."""
    try:
        if name.startswith("ak"):
            margin = name[2:]
            for suffix in RULE_SUFFIXES:
                margin = margin.removesuffix(suffix)
            return dataclasses.replace(base, adaptive_k=float(margin))
        if name.startswith("k"):
            return dataclasses.replace(base, top_k=int(name[1:]), adaptive_k=None)
    except ValueError:
        pass
    raise ValueError(
        f"setting {name!r}: expected k<N> (top_k=N) or ak<M>[-solo|-any|-top] (adaptive_k=M), e.g. k4 ak1.5"
    )


def without_neighbour(scores, k, adaptive_margin, chunk_ids=None, threshold=None) -> list:
    """:func:`dllm.prefilling.selection.kept_chunks` without its neighbour step: the adaptive count of the best
    chunks only (the ``-solo`` settings)."""
    return select_chunks(scores, kept_count(scores, k, adaptive_margin), chunk_ids, threshold)


def neighbour_always(scores, k, adaptive_margin, chunk_ids=None, threshold=None) -> list:
    """The adaptive count of the best chunks and, when below ``k``, the best chunk's better-scoring finite
    neighbour whatever its rank (ties: the earlier chunk; the ``-any`` settings, the library's rule before the
    ``-top`` one)."""
    kept = without_neighbour(scores, k, adaptive_margin, chunk_ids, threshold)
    if adaptive_margin is None or len(kept) >= k:
        return kept
    best, total = rank_chunks(scores)[0], int(scores.numel())
    near = [j for j in (best - 1, best + 1) if 0 <= j < total and bool(torch.isfinite(scores[j]))]
    if not near:
        return kept
    return sorted({*kept, max(near, key=lambda j: (float(scores[j]), -j))})


def neighbour_if_top(scores, k, adaptive_margin, chunk_ids=None, threshold=None) -> list:
    """:func:`neighbour_always` with the neighbour kept only when it ranks among the ``k`` best (the ``-top``
    settings, the library's rule since it was measured here): a fact straddling a boundary makes both its chunks
    score high, a plain neighbour does not."""
    kept = without_neighbour(scores, k, adaptive_margin, chunk_ids, threshold)
    full = neighbour_always(scores, k, adaptive_margin, chunk_ids, threshold)
    best = set(rank_chunks(scores)[:k])
    return full if set(full) - set(kept) <= best else kept


def run_case(model, case, settings: dict[str, PrefillingConfig], base: PrefillingConfig) -> list[dict]:
    """One case's rows, a row per setting, every setting decoded from one :class:`dllm.DocumentCache`."""
    g = response_length(case)
    doc = encode_document(model, encode_text(model, case.context), prefilling=base)
    spans = chunk_char_spans(model, case.context, base)
    fact = set(needle_chunks(spans, case.needle_start, case.needle_end))
    prompt = PromptParts(encode_text(model, case.prefix, bos=True), None, encode_text(model, case.query))
    rows = []
    for name, cfg in settings.items():
        t0 = time.perf_counter()
        rules = {SOLO: without_neighbour, ANY: neighbour_always, TOP: neighbour_if_top}
        rule = rules.get(name[name.rfind("-") :] if "-" in name else "")
        with mock.patch("dllm.prefilling.pipeline.kept_chunks", rule) if rule else nullcontext():
            res = generate(
                model, prompt=prompt, method="prefilling", prefilling=cfg, document=doc, gen_length=g, steps=g
            )
        kept = sorted(spans.index(tuple(s)) for s in res.stats.extra["selected_chunk_tokens"])
        rows.append({
            "length": case.length, "task": case.task, "depth": case.depth, "seed": case.seed, "setting": name,
            "gold": case.answer, "answer": res.text[0], "kept_chunks": " ".join(map(str, kept)),
            "needle_chunks": " ".join(map(str, sorted(fact))), "kept": bool(fact & set(kept)),
            "correct": bool(score(case.task, res.text[0], case)), "chunks_kept": len(kept),
            "seconds": round(time.perf_counter() - t0, 3),
        })  # fmt: skip
    return rows


def table(rows: list[dict], settings: list[str]) -> str:
    """Per length and setting: cases, needle chunk kept, exact where kept, exact in all, mean chunks kept."""
    cell = defaultdict(list)
    for r in rows:
        cell[(r["length"], r["setting"])].append(r)
    out = [
        "| length | setting | cases | needle chunk kept | exact where kept | exact, all cases | mean chunks kept |",
        "|---:|---|---:|---:|---:|---:|---:|",
    ]
    for length in sorted({r["length"] for r in rows}) + ["all"]:
        for s in settings:
            rs = [r for r in rows if r["setting"] == s and length in ("all", r["length"])]
            if not rs:
                continue
            kept = [r for r in rs if r["kept"]]
            right = sum(r["correct"] for r in kept)
            out.append(
                f"| {length} | {s} | {len(rs)} | {len(kept)} | {right}/{len(kept)} | "
                f"{sum(r['correct'] for r in rs)}/{len(rs)} | {sum(r['chunks_kept'] for r in rs) / len(rs):.2f} |"
            )
    return "\n".join(out)


def main(argv=None) -> int:
    p = study_parser(__doc__, "copy_levers", "copy_levers")
    p.add_argument("--model", default=None, help="checkpoint (default: the bundled tiny model)")
    p.add_argument("--lengths", type=int, nargs="+", default=[4096, 16384, 65536])
    p.add_argument("--cases", type=int, default=20, help="cases per length")
    p.add_argument(
        "--settings", nargs="+", default=["k4", "ak1", "ak1.5", "ak2", "ak3", "ak1-solo", "ak1.5-solo", "ak2-solo",
                                          "k2", "k1"],
    )  # fmt: skip
    p.add_argument("--threads", type=int, default=1, help="torch threads")
    args = p.parse_args(argv)
    if args.cases < 1:
        p.error("--cases must be at least 1")
    torch.set_num_threads(args.threads)
    model_dir = args.model or str(default_model_dir())
    base = PrefillingConfig.from_pretrained(model_dir)
    try:
        settings = {s: parse_setting(s, base) for s in args.settings}
    except ValueError as e:
        p.error(str(e))
    out = output_dir(args, "copy_levers", "copy_levers")
    model = load_model(model_dir)
    t0 = time.time()
    rows = []
    for length in args.lengths:
        for i in range(args.cases):
            case = make_copy_case("devil", TASKS[i % 2], length, DEPTHS[i % len(DEPTHS)], TUNE_SEED_BASE + i)
            rows += run_case(model, case, settings, base)
            print(f"[{time.time() - t0:.0f}s] {length} {case.task} d={case.depth} "
                  + " ".join(f"{r['setting']}:{int(r['kept'])}{int(r['correct'])}/{r['chunks_kept']}"
                             for r in rows[-len(settings):]), flush=True)  # fmt: skip
    cfg = ", ".join(f"{k}={getattr(base, k)!r}" for k in ("chunk_size", "top_k", "adaptive_k", "boundary_snap",
                                                         "candidates", "lexical_weight"))  # fmt: skip
    write_results(
        out, "copy_levers", rows, "bench.studies.copy_levers", argv, time.time() - t0,
        "Chunks kept beside the fact's: selection settings from one document cache (devil, tuning seeds)",
        [f"Checkpoint `{args.model or 'dllm/assets/tiny-dream'}`, its prefilling config ({cfg}); "
         f"{args.threads} torch thread(s).",
         table(rows, args.settings)],
    )  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
