"""Document caches on the bundled tiny model: many questions over one document, and a 128K-token document.

    python -m bench.speed.document_cache [--out DIR | --record] [--length 16384] [--long-length 131072]
                                   [--long-depths 0.1 0.3 0.5 0.7 0.9] [--skip-long]

Part 1 (``questions``): a passkey document of ``--length`` tokens is asked four questions (four
wordings of "what is the pass key?"), each once fresh (chunked prefill + scoring + decoding, the
paper's method) and once from a :class:`dllm.DocumentCache` encoded beforehand (scoring +
decoding only). Both runs of a question use the same configuration, so their tokens must be
equal (checked and reported); the table gives seconds per question side by side, their ratio,
and the one-off encoding time (with the break-even number of questions).

Part 2 (``long``): for each needle depth of ``--long-depths`` (one document each, so the answer
is not one lucky position), a passkey document of ``--long-length`` tokens is encoded once, saved,
loaded back (read into memory) and asked the same four questions: encoding, saving and loading
seconds, cache bytes in memory and on disk, seconds per question, the answers (with the kept
chunks and the chunks the needle lies in), and the peak resident memory of the process.

Warm-ups run first, untimed and reported apart (with the model's load time): an encoding of a
short document, then one fresh and one cached run of the first question on the measured
document. Writes ``document_cache.csv`` (provenance columns on every row) and
``document_cache.md`` (machine line) to ``runs/bench/`` (git-ignored), to ``--out DIR``, or with
``--record`` to ``bench/results/``.
"""

from __future__ import annotations

import dataclasses
import os
import resource
import tempfile
import time

import torch

from bench.fidelity.demo import TINY_PREFILLING
from bench.fidelity.selection_recall import needle_chunk_ids
from bench.outputs import output_dir, study_parser, write_results
from bench.warmup import WARMUP_SEED
from dllm.eval.evaluation import case_inputs
from dllm.eval.tasks import make_case, score
from dllm.generate import generate
from dllm.model.loader import load_model
from dllm.model.tokenization import encode_text
from dllm.prefilling import DocumentCache, PromptParts, encode_document

# Four wordings of one question (the first is the task's canonical query).
QUESTIONS = (
    None,  # the case's own query
    "\n\nWhat was the pass key hidden in the text? The pass key is ",
    "\n\nQuestion: What is the pass key?\nAnswer: The pass key is ",
    "\n\nRecall the pass key from the text above. The pass key is ",
)
GEN, STEPS = 8, 8
# The demo's configuration; chunks encoded and scored 32 at a time so that a 128K-token document's
# activations stay small (the K/V of all chunks are kept either way).
CONFIG = dataclasses.replace(TINY_PREFILLING, prefill_batch=32)
SEED = 10**9 + 17


def _peak_rss_gib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # Linux reports KiB


def _ask(model, prefix, context, query, document=None):
    t0 = time.perf_counter()
    res = generate(
        model,
        method="prefilling",
        prompt=PromptParts(prefix, context, query),
        document=document,
        prefilling=CONFIG,
        gen_length=GEN,
        steps=STEPS,
    )
    return res, time.perf_counter() - t0


def _phases(res) -> dict:
    return {f"{k}_s": round(v, 4) for k, v in res.stats.seconds.items()}


def _selection(res, case) -> dict:
    """The kept chunks and whether one of them holds the needle (the answer is copyable at all)."""
    kept = res.stats.extra["selected_chunks"]
    needle = needle_chunk_ids(case, CONFIG.chunk_size, CONFIG.boundary_snap)
    return {
        "selected_chunks": " ".join(map(str, kept)),
        "needle_chunks": " ".join(map(str, sorted(needle))),
        "needle_kept": int(bool(needle & set(kept))),
    }


def questions(model, length: int) -> list[dict]:
    """Part 1: four questions over one document, fresh vs from the document cache."""
    case = make_case("passkey", length, 0.5, SEED, tokenizer=None)
    parts = case_inputs(model, case, "prefilling")["prompt"]
    queries = [parts.query if q is None else encode_text(model, q) for q in QUESTIONS]
    t0 = time.perf_counter()
    doc = encode_document(model, parts.context, prefilling=CONFIG)
    encode_s = time.perf_counter() - t0
    # warm-up at the measured shapes (first calls pick and build kernels per shape), reported apart
    warm_s = _ask(model, parts.prefix, parts.context, queries[0])[1]
    warm_s += _ask(model, parts.prefix, None, queries[0], document=doc)[1]
    rows = [
        {"part": "questions", "tokens": len(doc), "run": "encode", "seconds": round(encode_s, 4)},
        {"part": "questions", "tokens": len(doc), "run": "warm-up", "seconds": round(warm_s, 4)},
    ]
    for i, query in enumerate(queries):
        # alternate which run goes first, so neither always meets the warmer caches
        if i % 2 == 0:
            fresh, fresh_s = _ask(model, parts.prefix, parts.context, query)
            cached, cached_s = _ask(model, parts.prefix, None, query, document=doc)
        else:
            cached, cached_s = _ask(model, parts.prefix, None, query, document=doc)
            fresh, fresh_s = _ask(model, parts.prefix, parts.context, query)
        for run, res, sec in (("fresh", fresh, fresh_s), ("cached", cached, cached_s)):
            rows.append(
                {
                    "part": "questions",
                    "tokens": len(doc),
                    "run": run,
                    "question": i,
                    "seconds": round(sec, 4),
                    **_phases(res),
                    "nfe": res.stats.nfe,
                    "answer": res.text[0],
                    "correct": int(score("passkey", res.text[0], case)),
                    **_selection(res, case),
                    "equal_tokens": int(torch.equal(fresh.tokens, cached.tokens)),
                }
            )
        print(f"  question {i}: fresh {fresh_s:.2f} s, cached {cached_s:.2f} s", flush=True)
    return rows


def long_document(model, length: int, depth: float = 0.5) -> list[dict]:
    """Part 2: encode, save and load a ``length``-token document (needle at ``depth``), then ask it the
    four questions."""
    case = make_case("passkey", length, depth, SEED + 1, tokenizer=None)
    parts = case_inputs(model, case, "prefilling")["prompt"]
    queries = [parts.query if q is None else encode_text(model, q) for q in QUESTIONS]
    t0 = time.perf_counter()
    doc = encode_document(model, parts.context, prefilling=CONFIG)
    encode_s = time.perf_counter() - t0
    shared = {"part": "long", "depth": depth, "tokens": len(doc), "cache_bytes_memory": doc.nbytes}
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "doc.cache")
        t0 = time.perf_counter()
        doc.save(path)
        save_s = time.perf_counter() - t0
        shared["cache_bytes_disk"] = os.path.getsize(path)
        del doc
        t0 = time.perf_counter()
        loaded = DocumentCache.load(path, model)
        load_s = time.perf_counter() - t0
        rows.append({**shared, "run": "encode", "seconds": round(encode_s, 4), "save_s": round(save_s, 4)})
        rows[-1]["load_s"] = round(load_s, 4)
        for i, query in enumerate(queries):
            res, ask_s = _ask(model, parts.prefix, None, query, document=loaded)
            rows.append(
                {
                    **shared,
                    "run": "cached",
                    "question": i,
                    "seconds": round(ask_s, 4),
                    **_phases(res),
                    "nfe": res.stats.nfe,
                    "answer": res.text[0],
                    "correct": int(score("passkey", res.text[0], case)),
                    **_selection(res, case),
                    "peak_rss_gib": round(_peak_rss_gib(), 3),
                }
            )
            print(f"  {length} tokens, depth {depth}, question {i}: {ask_s:.1f} s, answer {res.text[0]!r}", flush=True)
        del loaded
    return rows


def summarize(rows: list[dict]) -> str:
    """Markdown tables of both parts."""
    lines = []
    q = [r for r in rows if r["part"] == "questions"]
    if q:
        enc = next(r for r in q if r["run"] == "encode")
        fresh = {r["question"]: r for r in q if r["run"] == "fresh"}
        cached = {r["question"]: r for r in q if r["run"] == "cached"}
        lines += [
            f"### {enc['tokens']}-token passkey document, {len(fresh)} questions",
            "",
            "| question | fresh s | from cache s | cache / fresh | equal tokens | fresh answer | cached answer | "
            "needle chunk kept |",
            "|---:|---:|---:|---:|:---:|---|---|:---:|",
        ]
        for i in sorted(fresh):
            f, c = fresh[i], cached[i]
            lines.append(
                f"| {i} | {f['seconds']:.2f} | {c['seconds']:.2f} | {c['seconds'] / f['seconds']:.2f} | "
                f"{'yes' if c['equal_tokens'] else 'NO'} | {f['answer']!r} {'ok' if f['correct'] else 'wrong'} | "
                f"{c['answer']!r} {'ok' if c['correct'] else 'wrong'} | {'yes' if c['needle_kept'] else 'no'} |"
            )
        f_mean = sum(r["seconds"] for r in fresh.values()) / len(fresh)
        c_mean = sum(r["seconds"] for r in cached.values()) / len(cached)
        saved = f_mean - c_mean
        lines += [
            "",
            f"Encoding the document once: {enc['seconds']:.2f} s. Mean per question: fresh {f_mean:.2f} s, "
            f"from the cache {c_mean:.2f} s ({c_mean / f_mean:.2f}x)"
            + (f"; the cache pays for itself after {enc['seconds'] / saved:.1f} questions." if saved > 0 else "."),
            "",
        ]
    long_rows = [r for r in rows if r["part"] == "long"]
    depths = sorted({r["depth"] for r in long_rows})
    for depth in depths:
        at = [r for r in long_rows if r["depth"] == depth]
        enc = next(r for r in at if r["run"] == "encode")
        asked = [r for r in at if r["run"] == "cached"]
        lines += [
            f"### {enc['tokens']}-token passkey document, needle at depth {depth}",
            "",
            f"Encoded in {enc['seconds']:.1f} s, saved in {enc['save_s']:.2f} s, loaded (read into memory) in "
            f"{enc['load_s']:.3f} s; the cache holds {enc['cache_bytes_memory'] / 2**20:.0f} MiB in memory and "
            f"{enc['cache_bytes_disk'] / 2**20:.0f} MiB on disk. Peak resident memory of the process so far: "
            f"{max(r['peak_rss_gib'] for r in asked):.2f} GiB.",
            "",
            "| question | from cache s | answer | kept chunks (needle chunks) |",
            "|---:|---:|---|---|",
        ]
        for r in asked:
            lines.append(
                f"| {r['question']} | {r['seconds']:.2f} | {r['answer']!r} {'ok' if r['correct'] else 'wrong'} | "
                f"{r['selected_chunks']} ({r['needle_chunks']}) |"
            )
        lines.append("")
    if depths:
        asked = [r for r in long_rows if r["run"] == "cached"]
        lines += [
            f"Long documents: {sum(r['correct'] for r in asked)} of {len(asked)} questions answered over "
            f"{len(depths)} needle depths; peak resident memory {max(r['peak_rss_gib'] for r in asked):.2f} GiB.",
            "",
        ]
    return "\n".join(lines)


def main(argv=None) -> int:
    p = study_parser(__doc__, "bench")
    p.add_argument("--length", type=int, default=16384, help="tokens of the document asked four questions")
    p.add_argument("--long-length", type=int, default=131072, help="tokens of the long document")
    p.add_argument(
        "--long-depths",
        type=float,
        nargs="+",
        default=[0.1, 0.3, 0.5, 0.7, 0.9],
        help="needle depths (0..1) of the long documents, one document each",
    )
    p.add_argument("--skip-long", action="store_true", help="run part 1 only")
    args = p.parse_args(argv)
    if not all(0.0 <= d <= 1.0 for d in args.long_depths):
        p.error(f"--long-depths must lie in 0..1, got {args.long_depths}")
    out = str(output_dir(args, "bench"))
    torch.set_num_threads(2)
    t0 = time.perf_counter()
    model = load_model(device="cpu")
    load_s = time.perf_counter() - t0
    warm = make_case("passkey", 1024, 0.5, WARMUP_SEED, tokenizer=None)
    warm_parts = case_inputs(model, warm, "prefilling")["prompt"]
    t1 = time.perf_counter()
    encode_document(model, warm_parts.context, prefilling=CONFIG)  # warm-up of the encoder
    enc_warm_s = time.perf_counter() - t1
    rows = questions(model, args.length)
    if not args.skip_long:
        for depth in args.long_depths:
            rows += long_document(model, args.long_length, depth)
    q_warm = next(r["seconds"] for r in rows if r["run"] == "warm-up")
    startup = (
        f"Start-up, not in the tables: model load {load_s:.2f} s; untimed warm-ups: an encoding of 1024 tokens "
        f"{enc_warm_s:.2f} s, then one fresh and one cached run of question 0 on the measured document {q_warm:.2f} s."
    )
    title = "Document cache: questions from a cached document vs fresh runs (bundled tiny model)"
    paragraphs = [f"Configuration: {CONFIG}; {GEN} response tokens, {STEPS} steps.", startup, summarize(rows)]
    seconds = time.perf_counter() - t0
    write_results(out, "document_cache", rows, "bench.speed.document_cache", argv, seconds, title, paragraphs)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
