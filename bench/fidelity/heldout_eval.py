"""Selection in documents full of competing numbers, on sources no training phase saw.

    python -m bench.fidelity.heldout_eval [--lengths 4096 16384 65536 131072] [--out bench/results/heldout_eval]

The documents are registers of :mod:`dllm.eval.tasks.reports`: numbered sections "1." to "8.", dates,
amounts, 5-digit docket and access codes, 10-digit account numbers, and the prose of an excerpt of *The
Devil's Dictionary* (a whole source held out of every training phase; the register generator is new too).
Needles: a pass key, a 10-digit number string and a one-word fact, each between two register sentences
(distractors near it) and with distractors all over the rest (away from it), at 5 depths.

Up to ``--multi-from`` characters every document holds one needle (task x depth x seed); from there on a
document holds all three (at rotated depths, >= 20% of the document apart) and is encoded once for its
three questions (a :class:`~dllm.DocumentCache`). Every question is scored once (all score terms, token
scores); each *policy* (which score, which K, which token budget B) then keeps its chunks from those scores
and decodes greedily, one token per step, the answer's characters + 4, over the kept chunks. The crop
baseline is dense decoding of ``prefix + a 1024-character crop centred on the needle + query`` (the bundled
tokenizer is character-level: 1024 characters are 1024 tokens, inside the model's 1536-token window).

Beside the probes, the library's own paths: its lexical term (:mod:`dllm.prefilling.lexical`) alone, fused
with the predictive score over every chunk (z-scored sums at three weights, reciprocal-rank fusion), and
``score_and_select`` with ``lexical_weight`` 0 and 1 (the first stage as configured).

Reported per policy: exact answers (InfiniteBench rules), needle chunk kept (a kept chunk overlaps the
needle sentence), mean kept context tokens (after top-B), and per-length/task tables. Writes
``heldout_eval.csv`` (provenance rows) and ``heldout_eval.md``.
"""

from __future__ import annotations

import argparse
import csv
import os
import re
import sys
import time
from collections import defaultdict
from dataclasses import dataclass, replace

import torch

from bench.outputs import save_text
from bench.provenance import machine_line, write_csv
from dllm import encode_document, generate, load_model
from dllm.decode.denoise import denoise
from dllm.decode.policies import PrefillingPolicy
from dllm.decode.unmasking import UnmaskingConfig
from dllm.eval.tasks import score
from dllm.eval.tasks.reports import NEEDLE_TASKS, crop_around, make_report
from dllm.generate import default_alg
from dllm.model.kv_cache import StaticKVCache
from dllm.model.loader import default_model_dir
from dllm.model.tokenization import decode_text, encode_text
from dllm.prefilling import PrefillingConfig, PromptParts
from dllm.prefilling.lexical import fuse_scores
from dllm.prefilling.pipeline import Selection, build_cache, check_parts, prefill, score_and_select
from dllm.prefilling.scoring import ChunkScores
from dllm.prefilling.selection import adaptive_top_k, first_stage_scores, ngram_set, rank_chunks, select_chunks

DEPTHS = (0.1, 0.3, 0.5, 0.7, 0.9)
SEED_BASE = 1 << 31  # seeds no training run draws
CROP = 1024
DIGIT_RUN = re.compile(r"\d+")
LEXICAL_N = 4  # characters per n-gram of the lexical probe (a short word or a word's stem)
ALL_TERMS = ("self_info", "pseudo_label", "answer_confidence")


@dataclass(frozen=True)
class Policy:
    """How one variant keeps chunks: its score (``terms``: :class:`ChunkScores` attributes summed, or
    ``("first_stage",)``, ``("lexical",)``, ``("oracle",)``), K rule and token budget."""

    name: str
    terms: tuple = ("draft_contrast",)
    k: int = 4
    adaptive: tuple | None = None  # (floor, ceiling, margin): :func:`adaptive_top_k`
    budget: int | None = None
    redundancy: float | None = None
    library: dict | None = None  # PrefillingConfig overrides: kept chunks chosen by the library's score_and_select


def lexical_overlap(query: torch.Tensor, chunks, n: int = LEXICAL_N) -> torch.Tensor:
    """``[N]`` share of the query's token ``n``-grams that occur in each chunk (a probe here, not a library
    score term: the lexical half of hybrid retrieval, e.g. BM25's term match, at character level)."""
    q = ngram_set(query, n)
    return torch.tensor([len(q & ngram_set(chunks.context_ids(j), n)) / len(q) for j in range(chunks.num_chunks)])


def policies(default_terms: tuple, margins: list) -> list:
    """The compared variants: fixed K of the default score, adaptive K, and the levers (score, top-B,
    redundancy), plus the oracle (the needle's chunk alone: what reading costs once selection is perfect)."""
    fs, lex = ("first_stage",), ("lexical",)
    out = [Policy(f"K={k}", default_terms, k) for k in (1, 2, 4, 8)]
    out += [Policy(f"adaptive m={m:g}", default_terms, 8, (1, 8, m)) for m in margins]
    out += [
        Policy("K=4 s_I+s_P (paper)", ("self_info", "pseudo_label"), 4),
        Policy("K=4 s_C", ("answer_confidence",), 4),
        Policy("K=4 B=64", default_terms, 4, budget=64),
        Policy("K=4 redundancy 0.5", default_terms, 4, redundancy=0.5),
    ]
    out += [Policy(f"first stage K={k}", fs, k) for k in (1, 2, 4, 8)]
    out += [Policy(f"first stage adaptive m={m:g}", fs, 8, (1, 8, m)) for m in margins]
    out += [Policy(f"lexical K={k}", lex, k) for k in (1, 4)]
    out += [Policy(f"lexical adaptive m={m:g}", lex, 8, (1, 8, m)) for m in margins]
    out += [Policy("lexical K=1 B=64", lex, 1, budget=64)]
    # the library's lexical term (dllm.prefilling.lexical: idf-weighted) and its fusion with the predictive
    # score, every chunk scored (the fusions compared: z-scored sums, reciprocal-rank fusion)
    out += [Policy(f"library lexical K={k}", ("lexical_idf",), k) for k in (1, 4)]
    out += [Policy("every chunk K=4", ("predictive_full",), 4)]
    out += [Policy(f"fused z w={w:g} K=4", (f"fused_z_{w:g}",), 4) for w in FUSION_WEIGHTS]
    out += [Policy("fused rrf K=4", ("fused_rrf",), 4)]
    # the library's own path (score_and_select, first stage as configured): the defaults, then lexical_weight
    out += [Policy("library lexical_weight=0", ("library",), 4, library={"lexical_weight": 0.0})]
    out += [Policy(f"library lexical_weight={w:g}", ("library",), 4, library={"lexical_weight": w}) for w in (1.0,)]
    out += [
        Policy(
            "library lexical_weight=1 adaptive m=1", ("library",), 8, library={"lexical_weight": 1.0, "adaptive_k": 1.0}
        )
    ]
    out += [Policy("oracle: needle chunk", ("oracle",), 1)]
    return out


FUSION_WEIGHTS = (0.5, 1.0, 2.0)
RRF_K = 60  # reciprocal-rank fusion's constant (Cormack, Clarke and Buettcher, SIGIR 2009)


def rrf(*scores: torch.Tensor) -> torch.Tensor:
    """Reciprocal-rank fusion of ``[N]`` scores: ``sum_s 1 / (RRF_K + rank_s)`` (rank 1 = best)."""
    out = torch.zeros(scores[0].numel(), dtype=torch.float64)
    for s in scores:
        for r, j in enumerate(rank_chunks(s)):
            out[j] += 1.0 / (RRF_K + r + 1)
    return out


def reports(lengths, seeds: int, multi_from: int, seed_offset: int = 0):
    """(length, report) pairs: single-needle reports below ``multi_from``, three-needle ones from it;
    ``seed_offset`` moves every document seed (0: the recorded evaluation's documents)."""
    out = []
    for ln in lengths:
        if ln < multi_from:
            for task in NEEDLE_TASKS:
                for d in DEPTHS:
                    for s in range(seeds):
                        out.append(make_report(ln, [(task, d)], SEED_BASE + seed_offset + s))
        else:
            for r in range(3):
                needles = [(t, DEPTHS[(r + 2 * i) % len(DEPTHS)]) for i, t in enumerate(NEEDLE_TASKS)]
                out.append(make_report(ln, needles, SEED_BASE + seed_offset + r))
    return out


def decode_kept(model, parts, pre, sel_scores, labels, kept, cfg, gen_length: int) -> str:
    """Greedy decoding (one token per step) over the kept chunks: build the static cache and run the loop."""
    sel = Selection(kept, sel_scores, labels, 0)
    row = build_cache(model, parts, pre, sel, cfg, gen_length)
    cache = StaticKVCache.from_rows([row.segments])
    policy = PrefillingPolicy(model, parts.query[None], row.query_start, cache, gen_length, 0)
    resp = torch.full((1, gen_length), model.mask_token_id, dtype=torch.long, device=model.device)
    denoise(
        policy, resp, mask_id=model.mask_token_id, block_length=gen_length, steps_per_block=gen_length,
        cfg=UnmaskingConfig(alg=default_alg(model)),
    )  # fmt: skip
    return decode_text(model, resp)[0]


def run(model, cfg: PrefillingConfig, docs, pols, dense: bool, log=print) -> list[dict]:
    """Every question of ``docs`` under every policy (and the crop baseline): one row each."""
    rows = []
    t0 = time.perf_counter()
    # the predictive terms alone (lexical_weight 0: the lexical policies below add it themselves)
    score_cfg = replace(cfg, top_k=1, score_terms=ALL_TERMS, token_budget=64, lexical_weight=0.0)
    for doc_i, rep in enumerate(docs):
        ids = encode_text(model, rep.context)
        t_enc = time.perf_counter()
        doc = encode_document(model, ids, prefilling=cfg)
        t_enc = time.perf_counter() - t_enc
        spans = list(zip(doc.chunks.starts, doc.chunks.sizes()))
        for qi, needle in enumerate(rep.needles):
            case = rep.case(qi)
            g = case.answer_tokens + 4
            base = {"length": rep.length, "task": needle.task, "depth": needle.depth, "seed": rep.seed,
                    "doc": doc_i, "chunks": len(spans), "encode_s": round(t_enc, 2)}  # fmt: skip
            if dense:
                crop, _off = crop_around(rep.context, needle.start, needle.end, CROP)
                ids_d = encode_text(model, case.prefix + crop + case.query, bos=True)[None]
                text = generate(model, ids_d, method="dense", gen_length=g, steps=g).text[0]
                rows.append(base | {"policy": f"dense {CROP}-char crop", "correct": score(case.task, text, case),
                                    "kept": True, "kept_tokens": len(crop), "k": 1, "answer": text})  # fmt: skip
            parts = PromptParts(encode_text(model, case.prefix, bos=True), None, encode_text(model, case.query))
            parts = check_parts(model, parts, doc)
            t1 = time.perf_counter()
            pre = prefill(model, parts, score_cfg, document=doc)
            sel = score_and_select(model, parts, pre.chunks, score_cfg)
            t_score = time.perf_counter() - t1
            sc = sel.scores
            needle_chunks = {j for j, (s, n) in enumerate(spans) if s < needle.end and s + n > needle.start}
            extra = {
                "first_stage": first_stage_scores(model, doc.chunks, parts.query, cfg.draft_tokens, None),
                "lexical": lexical_overlap(parts.query, doc.chunks),
                "oracle": torch.tensor([float(j in needle_chunks) for j in range(len(spans))]),
            }
            library = {}  # policy name -> the library's Selection
            if any(p.terms[0] not in extra and not hasattr(sc, p.terms[0]) for p in pols):
                # every chunk scored with the lexical term: the predictive score alone and the lexical term
                full_cfg = replace(cfg, candidates=None, candidate_layer=None, lexical_weight=1.0)
                full = score_and_select(model, parts, prefill(model, parts, full_cfg, document=doc).chunks, full_cfg)
                pred = sum(getattr(full.scores, t) for t in cfg.score_terms)
                extra["predictive_full"], extra["lexical_idf"] = pred, full.scores.lexical
                for w in FUSION_WEIGHTS:
                    extra[f"fused_z_{w:g}"] = fuse_scores(pred, full.scores.lexical, w)
                extra["fused_rrf"] = rrf(pred, full.scores.lexical)
            for pol in pols:
                if pol.library is not None:
                    lcfg = replace(cfg, **pol.library)
                    library[pol.name] = score_and_select(
                        model, parts, prefill(model, parts, lcfg, document=doc).chunks, lcfg
                    )
            decoded: dict = {}  # (kept chunks, B) -> answer: equal kept sets decode to the same tokens
            for pol in pols:
                if pol.library is not None:
                    total = library[pol.name].scores.total
                elif pol.terms[0] in extra:
                    total = extra[pol.terms[0]]
                else:
                    total = sum(getattr(sc, t) for t in pol.terms)
                n = total.numel()
                if pol.library is not None:
                    k = len(library[pol.name].kept)
                elif pol.adaptive is not None:
                    k = adaptive_top_k(total, *pol.adaptive)
                elif pol.terms == ("oracle",):
                    k = len(needle_chunks)
                else:
                    k = min(pol.k, n)
                kept = select_chunks(total, k, doc.chunks.context_ids, pol.redundancy)
                if pol.library is not None:
                    kept = library[pol.name].kept
                pcfg = replace(cfg, top_k=k, token_budget=pol.budget)
                scores = ChunkScores(sc.self_info, sc.pseudo_label, sc.answer_confidence, total, sc.token_scores)
                t2 = time.perf_counter()
                hit = bool(needle_chunks & set(kept))
                key = (tuple(kept), pol.budget)
                if not hit:
                    text = ""  # the answer is in no kept chunk (it occurs only in the needle): not decoded, wrong
                elif key not in decoded:
                    decoded[key] = decode_kept(model, parts, pre, scores, sel.pseudo_labels, kept, pcfg, g)
                text = decoded.get(key, text)
                kept_tokens = sum(spans[j][1] if pol.budget is None else min(pol.budget, spans[j][1]) for j in kept)
                rank = sorted(range(n), key=lambda j: -float(total[j]))
                rows.append(base | {
                    "policy": pol.name, "correct": hit and score(case.task, text, case), "kept": hit,
                    "kept_tokens": kept_tokens, "k": k, "answer": text,
                    "needle_rank": min(rank.index(j) for j in needle_chunks) + 1,
                    "score_s": round(t_score, 2), "decode_s": round(time.perf_counter() - t2, 3),
                })  # fmt: skip
            by = {r["policy"]: r for r in rows[-len(pols) - dense :]}
            log(
                f"[{time.perf_counter() - t0:.0f}s] {rep.length} {needle.task} d={needle.depth} gold={case.answer!r} "
                f"rank={by['K=4']['needle_rank']}/{len(spans)} "
                + " ".join(f"{p}:{int(r['correct'])}{'k' if r['kept'] else ''}" for p, r in by.items())
            )
    return rows


READING_VARIANTS = (  # (distractor share, near distractors): the evaluation's documents, then fewer numbers
    (0.45, True), (0.1, True), (0.1, False), (0.0, False),
)  # fmt: skip


def reading_probe(model, length: int = 4096, log=print) -> list[dict]:
    """Dense decoding of the 1K crop around the needle as the registers' numbers thin out: what the model
    reads once selection is out of the picture (pass keys and number strings, 5 depths)."""
    rows = []
    for share, near in READING_VARIANTS:
        for task in ("passkey", "number_string"):
            for d in DEPTHS:
                rep = make_report(length, [(task, d)], SEED_BASE, distractor_share=share, near_distractors=near)
                needle, case = rep.needles[0], rep.case(0)
                crop, off = crop_around(rep.context, needle.start, needle.end, CROP)
                g = case.answer_tokens + 4
                ids = encode_text(model, case.prefix + crop + case.query, bos=True)[None]
                text = generate(model, ids, method="dense", gen_length=g, steps=g).text[0]
                outside = crop[:off] + " " + crop[off + needle.end - needle.start :]  # the needle's digits left out
                digits = len(DIGIT_RUN.findall(outside))
                rows.append({"distractor_share": share, "near_distractors": near, "task": task, "depth": d,
                             "answer": text, "gold": case.answer, "correct": score(task, text, case),
                             "other_numbers_in_crop": digits})  # fmt: skip
                log(f"share={share} near={near} {task} d={d} {text!r} gold={case.answer!r} numbers={digits}")
    return rows


def summary(rows: list[dict], by: tuple) -> str:
    """Markdown: exact answers, needle chunk kept and mean kept tokens per ``by`` cell."""
    cells = defaultdict(list)
    for r in rows:
        cells[tuple(r[k] for k in by)].append(r)
    lines = ["| " + " | ".join(by) + " | exact | needle chunk kept | mean kept tokens | mean K |",
             "|" + "---|" * len(by) + "---:|---:|---:|---:|"]  # fmt: skip
    for key in cells:
        rs = cells[key]
        n = len(rs)
        ok, kept = sum(r["correct"] for r in rs), sum(bool(r["kept"]) for r in rs)
        tok = sum(r["kept_tokens"] for r in rs) / n
        k = sum(r["k"] for r in rs) / n
        lines.append("| " + " | ".join(str(x) for x in key) + f" | {100 * ok / n:.0f}% ({ok}/{n}) | "
                     f"{100 * kept / n:.0f}% ({kept}/{n}) | {tok:.0f} | {k:.2f} |")  # fmt: skip
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None, help="checkpoint (default: the bundled tiny model)")
    p.add_argument("--out", default="bench/results/heldout_eval", help="output folder")
    p.add_argument("--lengths", type=int, nargs="+", default=[4096, 16384, 65536, 131072])
    p.add_argument("--seeds", type=int, default=2, help="single-needle documents per (task, depth) cell")
    p.add_argument("--multi-from", type=int, default=65536, help="three-needle documents from this length on")
    p.add_argument("--margins", type=float, nargs="+", default=[2.0, 4.0, 8.0], help="adaptive K margins tried")
    p.add_argument("--no-dense", action="store_true", help="skip the dense crop baseline")
    p.add_argument("--threads", type=int, default=1, help="torch threads (1: fastest on a shared 2-core box)")
    p.add_argument(
        "--report-from",
        nargs="+",
        default=None,
        metavar="CSV",
        help="write the Markdown from these CSVs of earlier runs (e.g. lengths run in parallel) and stop",
    )
    p.add_argument(
        "--reading-probe",
        action="store_true",
        help="only the dense-crop reading probe (4K, 4 densities of numbers) -> reading_probe.md",
    )
    args = p.parse_args(argv)
    cmd = "python -m bench.fidelity.heldout_eval " + " ".join(argv if argv is not None else sys.argv[1:])
    if args.report_from:
        return write_report(args.report_from, args.out, cmd)
    torch.manual_seed(0)
    torch.set_num_threads(args.threads)
    model_dir = args.model or default_model_dir()
    model = load_model(model_dir)
    cfg = PrefillingConfig.from_pretrained(model_dir)
    if args.reading_probe:
        rows = reading_probe(model)
        os.makedirs(args.out, exist_ok=True)
        write_csv(os.path.join(args.out, "reading_probe.csv"), rows, str(model.device))
        cells = defaultdict(list)
        for r in rows:
            cells[(r["distractor_share"], r["near_distractors"], r["task"])].append(r)
        lines = ["| register sentences | distractors next to the needle | task | exact, dense 1K crop | mean other "
                 "numbers in the crop |", "|---:|---|---|---:|---:|"]  # fmt: skip
        for (share, near, task), rs in cells.items():
            ok = sum(r["correct"] for r in rs)
            nums = sum(r["other_numbers_in_crop"] for r in rs) / len(rs)
            lines.append(f"| {share:.0%} | {'yes' if near else 'no'} | {task} | {ok}/{len(rs)} | {nums:.1f} |")
        with open(os.path.join(args.out, "reading_probe.md"), "w") as f:
            f.write(f"# Reading probe\n\nCommand: `{cmd.strip()}`  \n{machine_line(str(model.device))}\n\n"
                    + "\n".join(lines) + "\n")  # fmt: skip
        print("\n".join(lines))
        return 0
    pols = policies(cfg.score_terms, args.margins)
    docs = reports(args.lengths, args.seeds, args.multi_from)
    rows = run(model, cfg, docs, pols, not args.no_dense)
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "heldout_eval.csv")
    write_csv(path, rows, str(model.device))
    return write_report([path], args.out, cmd)


def write_report(csvs: list, out: str, cmd: str) -> int:
    """``heldout_eval.md`` in ``out`` from the rows of ``csvs`` (their machine lines quoted)."""
    rows, machines = [], []
    for path in csvs:
        with open(path, newline="") as f:
            for i, r in enumerate(csv.DictReader(f)):
                r["correct"] = r["correct"] == "True"
                r["kept"] = r["kept"] == "True"
                r["kept_tokens"], r["k"] = int(r["kept_tokens"]), int(r["k"])
                rows.append(r)
                if i == 0:  # the first row's provenance: where and when this file's run started
                    machines.append(
                        f"Machine: {r['device_kind']} {r['device_name']}; torch {r['torch']}, triton {r['triton']}; "
                        f"commit {r['commit']}; {r['date_utc']} ({os.path.basename(os.path.dirname(path))})"
                    )
    n_q = len({(r["length"], r["doc"], r["task"]) for r in rows})
    text = (
        f"# Held-out documents with distractor numbers\n\nCommand: `{cmd.strip()}`  \n"
        + "  \n".join(machines)
        + f"\n\n{n_q} questions. Policies that keep no chunk of the needle are not decoded (the answer occurs only "
        "in the needle): wrong.\n\n"
        f"## All lengths\n\n{summary(rows, ('policy',))}\n\n"
        f"## Per length\n\n{summary(rows, ('length', 'policy'))}\n\n"
        f"## Per task\n\n{summary(rows, ('task', 'policy'))}\n"
    )
    save_text(out, "heldout_eval.md", text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
