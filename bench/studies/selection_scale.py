"""Selection at scale on the bundled tiny model: facts across chunk boundaries, near-duplicate chunks,
a cheap first stage.

    python -m bench.studies.selection_scale [--out DIR | --record] [--long-length 131072]
                                    [--depths 0.1 0.3 0.5 0.7 0.9] [--straddle-length 16384]
                                    [--offsets 2 6 12 16 20 24 32 40 48] [--snap 48] [--model DIR]

Part 1 (``straddle``): passkey documents whose needle starts ``k`` characters before a boundary of
the fixed C-token cut (tokens are characters for the bundled model), for every ``k`` of
``--offsets``, answered fresh with today's configuration (:data:`BASE`) and with chunk boundaries
snapped to sentence ends (``boundary_snap`` of ``--snap`` tokens, :data:`SNAP` by default); chunks
encoded and tokens encoded are reported (the encoding cost).

Part 2 (``long``): for each depth, a ``--long-length``-token passkey document is encoded once (fixed
chunks, and once more with snapped boundaries) and asked four questions with: today's configuration,
redundancy-aware selection (``redundancy_threshold``), the first stage (``candidates``) and all three
together. Before any of that, the first stage's rank of the needle chunk is measured for every
question (all layers, and each layer alone); the candidate count used is derived from it:
``max(2 K, 2 * (worst rank + 1))`` rounded up to a power of two. Seconds per question are measured
side by side (runs alternate) and reported as ratios to today's.

Writes ``selection_scale.csv`` and ``selection_scale.md`` to ``runs/bench/`` (git-ignored), to
``--out DIR``, or with ``--record`` to ``bench/results/``.
"""

from __future__ import annotations

import dataclasses
import sys
import time

import torch

from bench.outputs import output_dir, study_parser, write_results
from bench.speed.document_cache import CONFIG, QUESTIONS, SEED
from dllm.eval.evaluation import case_inputs
from dllm.eval.tasks import make_case, score
from dllm.generate import generate
from dllm.model.loader import load_model
from dllm.model.tokenization import encode_text
from dllm.prefilling import PromptParts, encode_document
from dllm.prefilling.selection import first_stage_scores

GEN, STEPS = 8, 8
SNAP_TOL = 48  # tokens a boundary may move back: longer than the pass-key sentences of the filler
REDUNDANCY = 0.8  # Jaccard of 8-grams: repeated filler chunks are ~1.0, a filler chunk holding a needle 0.6-0.72
# fixed chunks, every chunk scored: what the knobs are measured against
BASE = dataclasses.replace(CONFIG, boundary_snap=0, candidates=None, candidate_layer=None)
SNAP = dataclasses.replace(BASE, boundary_snap=SNAP_TOL)
# the straddling needles: the canonical one holds the number twice, the single one once
NEEDLES = {"canonical": "The pass key is {x}. Remember it. {x} is the pass key.", "single": "The pass key is {x}."}


def needle_chunks(starts: list, sizes: list, lo: int, hi: int) -> set:
    """Chunks overlapping the context token span ``lo..hi-1``."""
    return {j for j, (s, c) in enumerate(zip(starts, sizes)) if s < hi and lo < s + c}


def _ask(model, parts, cfg, document=None, query=None):
    t0 = time.perf_counter()
    p = PromptParts(
        parts.prefix, None if document is not None else parts.context, parts.query if query is None else query
    )
    res = generate(model, method="prefilling", prompt=p, document=document, prefilling=cfg, gen_length=GEN, steps=STEPS)
    return res, time.perf_counter() - t0


def straddle(model, length: int, offsets: list, needles: list | None = None, snap: int = SNAP_TOL) -> list:
    """Part 1: the needle starting ``k`` characters before a fixed-cut boundary, today vs snapped by ``snap`` tokens."""
    rows = []
    c = BASE.chunk_size
    snapped = dataclasses.replace(BASE, boundary_snap=snap)
    for i, (needle_kind, k) in enumerate((n, k) for n in (needles or NEEDLES) for k in offsets):
        case = make_case("passkey", length, 0.5, SEED + 100 + i, tokenizer=None)
        ctx, ns, ne = case.context, case.needle_start, case.needle_end
        if needle_kind == "single":  # one copy of the number: a cut number has no second copy to fall back on
            single = NEEDLES["single"].format(x=case.answer)
            ctx, ne = ctx[:ns] + single + ctx[ne:], ns + len(single)
        b = (ns // c + 1) * c  # the next boundary after the needle's start
        d = ns - (b - k)  # characters to drop from the front (negative: to add) so the needle starts at b - k
        ctx = ctx[d:] if d >= 0 else ctx[ne : ne - d] + ctx
        ns, ne = ns - d, ne - d
        case = dataclasses.replace(case, context=ctx[: case.length], needle_start=ns, needle_end=ne)
        parts = case_inputs(model, case, "prefilling")["prompt"]
        for name, cfg in (("today", BASE), ("snap", snapped)):
            res, sec = _ask(model, parts, cfg)
            doc_chunks = res.stats.extra["num_chunks"]
            kept = res.stats.extra["selected_chunks"]
            from dllm.prefilling.chunks import chunk_spans

            spans = chunk_spans(model, parts.context, cfg.chunk_size, cfg.boundary_snap)
            holders = [j for j, (s, n) in enumerate(spans) if s <= ns and ne <= s + n]
            rows.append(
                {
                    "part": "straddle",
                    "needle": needle_kind,
                    "config": name,
                    "offset": k,
                    "tokens": parts.context.numel(),
                    "chunks": doc_chunks,
                    "tokens_encoded": parts.context.numel() + doc_chunks,
                    "seconds": round(sec, 4),
                    "answer": res.text[0],
                    "correct": int(score("passkey", res.text[0], case)),
                    "needle_whole_in_a_chunk": int(bool(holders)),
                    "needle_kept": int(
                        bool(needle_chunks([s for s, _ in spans], [n for _, n in spans], ns, ne) & set(kept))
                    ),
                    "selected_chunks": " ".join(map(str, kept)),
                }
            )
        print(
            f"  straddle {needle_kind} k={k}: " + ", ".join(f"{r['config']} {r['answer']!r}" for r in rows[-2:]),
            flush=True,
        )
    return rows


def first_stage_ranks(model, doc, parts, queries, needle) -> list:
    """Per question: the needle chunk's best rank under the first stage (all layers, then each layer)."""
    out = []
    for q in queries:
        window = q if BASE.query_window is None else q[-BASE.query_window :]
        ranks = {}
        for layer in [None, *range(model.config.num_layers)]:
            t0 = time.perf_counter()
            s = first_stage_scores(model, doc.chunks, window, BASE.draft_tokens, layer)
            sec = time.perf_counter() - t0
            order = torch.argsort(s, descending=True).tolist()
            ranks["all" if layer is None else f"layer{layer}"] = min(order.index(j) for j in needle)
            if layer is None:
                ranks["seconds"] = sec
        out.append(ranks)
    return out


def long_documents(model, length: int, depths: list) -> tuple[list, int]:
    """Part 2: first-stage recall, then today / redundancy / first stage / all at each depth."""
    cases = []
    for depth in depths:
        case = make_case("passkey", length, depth, SEED + 1, tokenizer=None)
        parts = case_inputs(model, case, "prefilling")["prompt"]
        queries = [parts.query if q is None else encode_text(model, q) for q in QUESTIONS]
        cases.append((depth, case, parts, queries))
    rows, docs = [], {}
    worst = 0
    for depth, case, parts, queries in cases:
        t0 = time.perf_counter()
        doc = encode_document(model, parts.context, prefilling=BASE)
        enc = time.perf_counter() - t0
        docs[depth] = doc
        needle = needle_chunks(doc.chunks.starts, doc.chunks.sizes(), case.needle_start, case.needle_end)
        for qi, r in enumerate(first_stage_ranks(model, doc, parts, queries, needle)):
            worst = max(worst, r["all"])
            rows.append({"part": "first_stage", "depth": depth, "question": qi, "chunks": doc.num_chunks, **r})
        rows.append(
            {"part": "encode", "depth": depth, "config": "fixed", "chunks": doc.num_chunks, "seconds": round(enc, 3)}
        )
    n = 1
    while n < max(2 * BASE.top_k, 2 * (worst + 1)):
        n *= 2
    configs = {
        "today": BASE,
        "redundancy": dataclasses.replace(BASE, redundancy_threshold=REDUNDANCY),
        "first_stage": dataclasses.replace(BASE, candidates=n),
        "all": dataclasses.replace(SNAP, redundancy_threshold=REDUNDANCY, candidates=n),
    }
    # warm-up, untimed: one question per configuration on the first document
    depth0, _c0, parts0, q0 = cases[0]
    for name, cfg in configs.items():
        if name != "all":
            _ask(model, parts0, cfg, docs[depth0], q0[0])
    for depth, case, parts, queries in cases:
        doc = docs.pop(depth)
        t0 = time.perf_counter()
        snap_doc = encode_document(model, parts.context, prefilling=SNAP)
        enc = time.perf_counter() - t0
        rows.append(
            {
                "part": "encode",
                "depth": depth,
                "config": "snap",
                "chunks": snap_doc.num_chunks,
                "seconds": round(enc, 3),
            }
        )
        names = list(configs)
        for qi, q in enumerate(queries):
            order = names if qi % 2 == 0 else names[::-1]  # alternate, so no configuration always runs warmest
            for name in order:
                cfg = configs[name]
                d = snap_doc if cfg.boundary_snap else doc
                res, sec = _ask(model, parts, cfg, d, q)
                kept = res.stats.extra["selected_chunks"]
                needle = needle_chunks(d.chunks.starts, d.chunks.sizes(), case.needle_start, case.needle_end)
                rows.append(
                    {
                        "part": "long",
                        "depth": depth,
                        "question": qi,
                        "config": name,
                        "candidates": cfg.candidates or 0,
                        "seconds": round(sec, 4),
                        "answer": res.text[0],
                        "correct": int(score("passkey", res.text[0], case)),
                        "needle_kept": int(bool(needle & set(kept))),
                        "selected_chunks": " ".join(map(str, kept)),
                        "needle_chunks": " ".join(map(str, sorted(needle))),
                    }
                )
            print(
                f"  depth {depth} q{qi}: "
                + ", ".join(f"{r['config']} {r['answer']!r} {r['seconds']:.2f}s" for r in rows[-len(names) :]),
                flush=True,
            )
        del doc, snap_doc
    return rows, n


def summarize(rows: list, n_cand: int) -> str:
    lines = []
    st = [r for r in rows if r["part"] == "straddle"]
    if st:
        offs = sorted({r["offset"] for r in st})
        lines += [
            "### Pass keys straddling a chunk boundary (fresh runs)",
            "",
            "The needle starts k characters before a boundary of the fixed cut (C="
            f"{BASE.chunk_size}): canonical `{NEEDLES['canonical']}` (the number twice) and single "
            f"`{NEEDLES['single']}`. 'whole' = some chunk holds the whole needle; 'kept' = a kept chunk overlaps it.",
            "",
            "| needle | k | today: answer | today: whole / kept | snapped: answer | snapped: whole / kept |",
            "|---|---:|---|:---:|---|:---:|",
        ]
        kinds = [kind for kind in NEEDLES if any(r["needle"] == kind for r in st)]
        for kind in kinds:
            for k in offs:
                a = next(r for r in st if r["offset"] == k and r["config"] == "today" and r["needle"] == kind)
                b = next(r for r in st if r["offset"] == k and r["config"] == "snap" and r["needle"] == kind)
                cell = lambda r: f"{r['answer']!r} {'ok' if r['correct'] else 'wrong'}"  # noqa: E731
                lines.append(
                    f"| {kind} | {k} | {cell(a)} | {a['needle_whole_in_a_chunk']} / {a['needle_kept']} | {cell(b)} | "
                    f"{b['needle_whole_in_a_chunk']} / {b['needle_kept']} |"
                )
        for name in ("today", "snap"):
            rr = [r for r in st if r["config"] == name]
            lines.append("")
            by = ", ".join(
                f"{kind} {sum(r['correct'] for r in rr if r['needle'] == kind)}/{sum(r['needle'] == kind for r in rr)}"
                for kind in kinds
            )
            lines.append(
                f"{name}: {sum(r['correct'] for r in rr)}/{len(rr)} exact ({by}); chunks per document "
                f"{sum(r['chunks'] for r in rr) / len(rr):.1f}, tokens encoded (context + anchors) "
                f"{sum(r['tokens_encoded'] for r in rr) / len(rr):.0f} for {rr[0]['tokens']} context tokens."
            )
        lines.append("")
    fs = [r for r in rows if r["part"] == "first_stage"]
    if fs:
        keys = [k for k in fs[0] if k == "all" or k.startswith("layer")]
        lines += [
            "### First stage: rank of the needle chunk (0 = first) per question",
            "",
            f"{fs[0]['chunks']} chunks per document. Recall@n = share of the {len(fs)} questions whose needle chunk "
            "is among the first stage's n best.",
            "",
            "| first stage | worst rank | recall@4 | recall@8 | recall@16 | recall@32 | mean s |",
            "|---|---:|---:|---:|---:|---:|---:|",
        ]
        for k in keys:
            rk = [r[k] for r in fs]
            sec = f"{sum(r['seconds'] for r in fs) / len(fs):.3f}" if k == "all" else "-"
            rec = " | ".join(f"{100 * sum(x < n for x in rk) / len(rk):.0f}%" for n in (4, 8, 16, 32))
            lines.append(f"| {k} | {max(rk)} | {rec} | {sec} |")
        lines += [
            "",
            f"Candidate count used: {n_cand} (max(2K, 2 x (worst rank of 'all' + 1)), to a power of two).",
            "",
        ]
    enc = [r for r in rows if r["part"] == "encode"]
    if enc:
        for name in ("fixed", "snap"):
            e = [r for r in enc if r["config"] == name]
            if e:
                lines.append(
                    f"Encoding ({name} boundaries): {sum(r['chunks'] for r in e) / len(e):.1f} chunks per document, "
                    f"{sum(r['seconds'] for r in e) / len(e):.1f} s (loaded machine, indicative)."
                )
        lines.append("")
    lg = [r for r in rows if r["part"] == "long"]
    if lg:
        names = list(dict.fromkeys(r["config"] for r in lg))
        base = {(r["depth"], r["question"]): r["seconds"] for r in lg if r["config"] == "today"}
        lines += [
            f"### Long documents: {len({r['depth'] for r in lg})} depths x "
            f"{len({r['question'] for r in lg})} questions",
            "",
            "| configuration | exact | needle chunk kept | mean s / question "
            "| ratio to today (same question, same run) |",
            "|---|---:|---:|---:|---:|",
        ]
        for name in names:
            rr = [r for r in lg if r["config"] == name]
            ratio = sum(r["seconds"] / base[(r["depth"], r["question"])] for r in rr) / len(rr)
            lines.append(
                f"| {name} | {sum(r['correct'] for r in rr)}/{len(rr)} | "
                f"{sum(r['needle_kept'] for r in rr)}/{len(rr)} | "
                f"{sum(r['seconds'] for r in rr) / len(rr):.2f} | {ratio:.2f} |"
            )
        lines += [
            "",
            "| depth | question | " + " | ".join(names) + " | needle chunks (fixed cut) |",
            "|---:|---:|" + "---|" * len(names) + "---|",
        ]
        for depth in sorted({r["depth"] for r in lg}):
            for qi in sorted({r["question"] for r in lg}):
                at = {r["config"]: r for r in lg if r["depth"] == depth and r["question"] == qi}
                cells = [
                    f"{at[n]['answer']!r} {'ok' if at[n]['correct'] else 'wrong'} ({at[n]['selected_chunks']})"
                    for n in names
                ]
                lines.append(f"| {depth} | {qi} | " + " | ".join(cells) + f" | {at['today']['needle_chunks']} |")
        lines.append("")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = study_parser(__doc__, "bench")
    p.add_argument("--long-length", type=int, default=131072)
    p.add_argument("--depths", type=float, nargs="+", default=[0.1, 0.3, 0.5, 0.7, 0.9])
    p.add_argument("--straddle-length", type=int, default=16384)
    p.add_argument("--offsets", type=int, nargs="+", default=[2, 6, 12, 16, 20, 24, 32, 40, 48])
    p.add_argument("--needles", nargs="+", choices=sorted(NEEDLES), default=sorted(NEEDLES))
    p.add_argument(
        "--snap",
        type=int,
        default=SNAP_TOL,
        help=f"boundary_snap of the straddle part's snapped runs, 0 to C - 1 (default: {SNAP_TOL})",
    )
    p.add_argument("--skip-long", action="store_true")
    p.add_argument("--skip-straddle", action="store_true")
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args(argv)
    if not 0 <= args.snap < BASE.chunk_size:
        print(f"error: --snap must be in 0..{BASE.chunk_size - 1} (tokens, below C), got {args.snap}", file=sys.stderr)
        return 2
    out = str(output_dir(args, "bench"))
    torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    model = load_model(device="cpu")
    rows, n = [], 0
    if not args.skip_long:
        long_rows, n = long_documents(model, args.long_length, args.depths)
        rows += long_rows
    if not args.skip_straddle:
        rows += straddle(model, args.straddle_length, args.offsets, args.needles, args.snap)
    title = (
        "Selection at scale: boundaries snapped to sentences, redundancy-aware top-K, a first stage "
        "(bundled tiny model)"
    )
    paragraphs = [
        f"Today's configuration: {BASE}; {GEN} response tokens, {STEPS} steps. "
        f"New knobs: boundary_snap={SNAP_TOL} (straddle part: {args.snap}), "
        f"redundancy_threshold={REDUNDANCY}, candidates derived below. Timings on a loaded 2-core machine with "
        f"{args.threads} torch thread(s): indicative; the ratios are side by side.",
        summarize(rows, n),
    ]
    seconds = time.perf_counter() - t0
    write_results(out, "selection_scale", rows, "bench.studies.selection_scale", argv, seconds, title, paragraphs)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
