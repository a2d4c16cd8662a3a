"""Long-context study: passkey documents from 4K to 128K tokens (and beyond), 5 needle depths, from a cache.

    python -m bench.fidelity.long_context [--out DIR | --record] [--lengths 4096 ... 131072]
                                 [--depths 0.1 0.3 0.5 0.7 0.9] [--haystack filler|essays|pydoc|generated]
                                 [--model DIR] [--config today|scale] [--questions 4] [--threads 1]

For every length and depth a passkey case is generated in the ``--haystack`` (the task's own filler
by default, or a natural-prose haystack of :mod:`dllm.eval.tasks.prose`), its context is encoded once as a
:class:`dllm.DocumentCache` (timed: encode seconds) and asked ``--questions`` wordings of the question
from the cache (timed: seconds per question; the four of :data:`bench.speed.document_cache.QUESTIONS`, the
canonical one first). Reported per cell: whether a kept
chunk holds the needle, whether the answer is exact, encode seconds, seconds per question, and the peak
resident memory of the process.

``--config today`` is the bundled model's tuned configuration (:data:`bench.fidelity.demo.TINY_PREFILLING`,
32 chunks per forward); ``--config scale`` adds the selection knobs (:data:`SCALE`: boundaries snapped to
sentence ends, redundancy-aware top-K, the first stage with 32 candidates; bench/results/selection_scale.md
measures each). ``--model`` takes any checkpoint directory (with its tokenizer: lengths are then in its
tokens), so the study can be rerun on natural prose with a model that reads it.

Writes ``long_context.csv``, ``long_context.md`` and ``long_context.png`` (answer accuracy and seconds
per question against context length, labelled axes) to ``runs/bench/``, ``--out DIR``, or with
``--record`` to ``bench/results/``.
"""

from __future__ import annotations

import dataclasses
import os
import resource
import time

import torch

from bench.fidelity.demo import TINY_PREFILLING
from bench.outputs import output_dir, study_parser, write_results
from bench.plotting import save_figure
from bench.speed.document_cache import QUESTIONS
from dllm.eval.evaluation import case_inputs
from dllm.eval.tasks import make_case, score
from dllm.eval.tasks.prose import HAYSTACKS
from dllm.generate import generate
from dllm.model.loader import load_model
from dllm.model.tokenization import encode_text
from dllm.prefilling import PromptParts, encode_document

GEN, STEPS = 8, 8
SEED = 10**9 + 23
TODAY = dataclasses.replace(TINY_PREFILLING, prefill_batch=32)
SCALE = dataclasses.replace(TODAY, boundary_snap=48, redundancy_threshold=0.8, candidates=32, candidate_layer=None)
CONFIGS = {"today": TODAY, "scale": SCALE}


def _peak_rss_gib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # Linux reports KiB


def _needle_chunks(doc, case, parts, model) -> set:
    """Chunks of the document overlapping the needle's token span (character offsets at character level;
    with a tokenizer, the span is located by encoding the context before and through the needle)."""
    if model.tokenizer is None or getattr(model.config, "vocab_size", 0) <= 256:
        lo, hi = case.needle_start, case.needle_end
    else:
        from dllm.model.tokenization import encode_text

        lo = encode_text(model, case.context[: case.needle_start]).numel()
        hi = encode_text(model, case.context[: case.needle_end]).numel()
    return {j for j, (s, c) in enumerate(zip(doc.chunks.starts, doc.chunks.sizes())) if s < hi and lo < s + c}


def run_cell(model, cfg, length: int, depth: float, haystack: str, questions: int = 1) -> list[dict]:
    """One document of ``length`` tokens (needle at ``depth``) encoded once and asked the first ``questions``
    wordings of :data:`QUESTIONS` from its cache: one row per question."""
    tok = None if model.config.vocab_size <= 256 else model.tokenizer
    case = make_case("passkey", length, depth, SEED, tokenizer=tok, haystack=haystack)
    parts = case_inputs(model, case, "prefilling")["prompt"]
    t0 = time.perf_counter()
    doc = encode_document(model, parts.context, prefilling=cfg)
    enc = time.perf_counter() - t0
    needle = _needle_chunks(doc, case, parts, model)
    rows = []
    for qi, q in enumerate(QUESTIONS[:questions]):
        query = parts.query if q is None else encode_text(model, q)
        t0 = time.perf_counter()
        res = generate(
            model,
            method="prefilling",
            prompt=PromptParts(parts.prefix, None, query),
            document=doc,
            prefilling=cfg.for_chunks(doc.num_chunks),
            gen_length=GEN,
            steps=STEPS,
        )
        ask = time.perf_counter() - t0
        kept = res.stats.extra["selected_chunks"]
        rows.append({
            "length": length,
            "tokens": len(doc),
            "depth": depth,
            "question": qi,
            "haystack": haystack,
            "chunks": doc.num_chunks,
            "encode_s": round(enc, 3),
            "question_s": round(ask, 4),
            "answer": res.text[0],
            "gold": case.answer,
            "correct": int(score("passkey", res.text[0], case)),
            "needle_kept": int(bool(needle & set(kept))),
            "selected_chunks": " ".join(map(str, kept)),
            "peak_rss_gib": round(_peak_rss_gib(), 3),
        })  # fmt: skip
    return rows


def summarize(rows: list) -> str:
    lengths = sorted({r["length"] for r in rows})
    lines = [
        "| context tokens | chunks | needle chunk kept | exact answers | encode s | s / question | peak RSS GiB |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for n in lengths:
        at = [r for r in rows if r["length"] == n]
        mean = lambda k, at=at: sum(r[k] for r in at) / len(at)  # noqa: E731
        lines.append(
            f"| {n} | {at[0]['chunks']} | {sum(r['needle_kept'] for r in at)}/{len(at)} | "
            f"{sum(r['correct'] for r in at)}/{len(at)} | {mean('encode_s'):.2f} | {mean('question_s'):.2f} | "
            f"{max(r['peak_rss_gib'] for r in at):.2f} |"
        )
    lines += ["", "| context tokens | " + " | ".join(f"depth {d}" for d in sorted({r["depth"] for r in rows})) + " |"]
    lines.append("|---:|" + "---|" * len({r["depth"] for r in rows}))
    for n in lengths:
        cells = []
        for d in sorted({r["depth"] for r in rows}):
            at = sorted((r for r in rows if r["length"] == n and r["depth"] == d), key=lambda r: r["question"])
            answers = " ".join(f"{r['answer']!r}" + ("" if r["correct"] else " wrong") for r in at)
            cells.append(f"{sum(r['correct'] for r in at)}/{len(at)}: {answers} (kept {at[0]['selected_chunks']})")
        lines.append(f"| {n} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(rows: list, path: str, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lengths = sorted({r["length"] for r in rows})
    acc = [
        100 * sum(r["correct"] for r in rows if r["length"] == n) / sum(r["length"] == n for r in rows) for n in lengths
    ]
    kept = [
        100 * sum(r["needle_kept"] for r in rows if r["length"] == n) / sum(r["length"] == n for r in rows)
        for n in lengths
    ]
    sec = [
        sum(r["question_s"] for r in rows if r["length"] == n) / sum(r["length"] == n for r in rows) for n in lengths
    ]
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    a.plot(lengths, acc, "o-", label="exact answer")
    a.plot(lengths, kept, "s--", label="needle chunk kept")
    a.set_xscale("log", base=2)
    a.set_xlabel("context length (tokens)")
    a.set_ylabel("share of the questions (%)")
    a.set_ylim(-5, 105)
    a.legend()
    b.plot(lengths, sec, "o-")
    b.set_xscale("log", base=2)
    b.set_xlabel("context length (tokens)")
    b.set_ylabel("seconds per question from the cache")
    save_figure(fig, path, title)


def main(argv=None) -> int:
    p = study_parser(__doc__, "bench")
    p.add_argument("--lengths", type=int, nargs="+", default=[4096, 8192, 16384, 32768, 65536, 131072])
    p.add_argument("--depths", type=float, nargs="+", default=[0.1, 0.3, 0.5, 0.7, 0.9])
    p.add_argument("--haystack", choices=HAYSTACKS, default="filler")
    p.add_argument("--model", default=None, help="checkpoint directory (default: the bundled tiny model)")
    p.add_argument("--config", choices=sorted(CONFIGS), default="scale")
    p.add_argument(
        "--questions", type=int, default=len(QUESTIONS), help=f"wordings asked per document (1-{len(QUESTIONS)})"
    )
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args(argv)
    if not 1 <= args.questions <= len(QUESTIONS):
        p.error(f"--questions must lie in 1..{len(QUESTIONS)}, got {args.questions}")
    if not all(0.0 <= d <= 1.0 for d in args.depths):
        p.error(f"--depths must lie in 0..1, got {args.depths}")
    if any(n < 1 for n in args.lengths):
        p.error(f"--lengths must be positive, got {args.lengths}")
    out = str(output_dir(args, "bench"))
    torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    model = load_model(args.model, device="cpu")
    cfg = CONFIGS[args.config]
    run_cell(model, cfg, min(args.lengths), 0.5, args.haystack)  # warm-up, untimed
    rows = []
    for n in args.lengths:
        for d in args.depths:
            cell = run_cell(model, cfg, n, d, args.haystack, args.questions)
            rows += cell
            print(
                f"  {n} tokens depth {d}: {[r['answer'] for r in cell]} {sum(r['correct'] for r in cell)}/{len(cell)}"
                f", encode {cell[0]['encode_s']:.1f} s, question {cell[0]['question_s']:.2f} s",
                flush=True,
            )
    os.makedirs(out, exist_ok=True)
    plot_title = f"Passkey from a document cache, {args.haystack} haystack, config {args.config}"
    plot(rows, os.path.join(out, "long_context.png"), plot_title)
    title = "Long-context study: passkey from a document cache, 4K to 128K tokens (bundled tiny model unless --model)"
    paragraphs = [
        f"Model: {args.model or 'bundled tiny-dream'}; haystack: {args.haystack}; configuration `{args.config}`: "
        f"{cfg}; {GEN} response tokens, {STEPS} steps; {args.questions} question(s) per document (wordings of "
        f"bench.speed.document_cache.QUESTIONS, the canonical one first; depth cells: exact answers, the answers, "
        f"the first question's kept chunks); "
        f"{args.threads} torch thread(s) on a shared, loaded 2-core machine: seconds are indicative.",
        summarize(rows),
        "![accuracy and seconds per question against context length](long_context.png)",
    ]
    seconds = time.perf_counter() - t0
    write_results(out, "long_context", rows, "bench.fidelity.long_context", argv, seconds, title, paragraphs)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
