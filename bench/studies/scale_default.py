"""Scale by default: the bundled defaults against scoring every chunk, side by side.

    python -m bench.studies.scale_default [--out DIR] [--cache-lengths 131072] [--depths 0.1 0.5 0.9] [--questions 2]
                                  [--every-questions 2] [--fresh-lengths 100000] [--fresh-depths 0.5]
                                  [--haystack filler|essays|pydoc|generated] [--threads 1]

Two configurations of the bundled tiny model: ``defaults`` (its ``prefilling_config.json``: the first stage
``candidates="auto"`` in layer 0, :func:`dllm.prefilling.config.auto_candidates`) and ``every`` (the same with
``candidates=None``: every chunk scored, the paper's selection).

- From a cache: for each ``--cache-lengths`` x ``--depths`` a passkey document is encoded once
  (:func:`dllm.encode_document`, timed) and asked ``--questions`` wordings of the question
  (:data:`bench.speed.document_cache.QUESTIONS`) with each configuration, one after the other (``every`` only for
  the first ``--every-questions``: at 1M tokens it costs a minute a question).
- Fresh: for each ``--fresh-lengths`` x ``--fresh-depths`` one question with the context in the prompt
  (chunked prefill + selection + decoding), each configuration; ``defaults`` encodes it in two passes
  (:func:`dllm.prefilling.chunks.encode_candidates`).

Every question is timed in wall seconds and in CPU seconds of this process (``time.process_time``: on a
shared machine the wall time grows with the other processes' load, the CPU time much less; at one torch
thread it is what the wall time would be alone), with the phases of :class:`dllm.GenerationStats`
(prefill = encoding, scoring = draft + first stage + predictive score + cache). Reported beside each: the
answer, exact or not, and whether a kept chunk holds the needle. A warm-up question (4K tokens, fresh, both
configurations) runs first, untimed. Writes ``scale_default.csv`` and ``scale_default.md`` to
``runs/bench/`` or ``--out DIR``.
"""

from __future__ import annotations

import dataclasses
import resource
import time

import torch

from bench.fidelity.long_context import _needle_chunks
from bench.outputs import output_dir, study_parser, write_results
from bench.speed.document_cache import QUESTIONS
from dllm.eval.evaluation import case_inputs
from dllm.eval.tasks import make_case, score
from dllm.eval.tasks.prose import HAYSTACKS
from dllm.generate import generate
from dllm.model.loader import default_model_dir, load_model
from dllm.model.tokenization import encode_text
from dllm.prefilling import PrefillingConfig, PromptParts, encode_document
from dllm.prefilling.chunks import chunk_spans

GEN, STEPS = 8, 8
SEED = 10**9 + 23  # bench.fidelity.long_context's: the same documents


def configs() -> dict:
    """``defaults``: the bundled checkpoint's prefilling_config.json; ``every``: the same scoring every chunk."""
    defaults = PrefillingConfig.from_pretrained(default_model_dir())
    return {"defaults": defaults, "every": dataclasses.replace(defaults, candidates=None, candidate_layer=None)}


def _ask(model, cfg, prompt, document=None) -> tuple:
    w0, c0 = time.perf_counter(), time.process_time()
    res = generate(model, method="prefilling", prompt=prompt, document=document, prefilling=cfg, gen_length=GEN,
                   steps=STEPS)  # fmt: skip
    return res, time.perf_counter() - w0, time.process_time() - c0


def _row(kind, name, case, res, wall, cpu, needle, length, depth, question, chunks, encode_s=None) -> dict:
    kept = res.stats.extra["selected_chunks"]
    sec = res.stats.seconds
    return {
        "kind": kind, "config": name, "length": length, "depth": depth, "question": question, "chunks": chunks,
        "candidates": len(res.stats.extra.get("candidate_chunks", [])) or "all",
        "wall_s": round(wall, 3), "cpu_s": round(cpu, 3),
        "prefill_s": round(sec.get("prefill", 0.0), 3), "scoring_s": round(sec.get("scoring", 0.0), 3),
        "decode_s": round(sec.get("decode", 0.0), 3), "encode_s": "" if encode_s is None else round(encode_s, 3),
        "answer": res.text[0], "gold": case.answer, "correct": int(score("passkey", res.text[0], case)),
        "needle_kept": int(bool(needle & set(kept))), "selected_chunks": " ".join(map(str, kept)),
        "peak_rss_gib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 3),
    }  # fmt: skip


def from_cache(model, cfgs, length, depth, haystack, questions, every_questions) -> list:
    case = make_case("passkey", length, depth, SEED, tokenizer=None, haystack=haystack)
    parts = case_inputs(model, case, "prefilling")["prompt"]
    w0 = time.perf_counter()
    doc = encode_document(model, parts.context, prefilling=cfgs["defaults"])  # the encoding both configs share
    enc = time.perf_counter() - w0
    needle = _needle_chunks(doc, case, parts, model)
    rows = []
    for qi, q in enumerate(QUESTIONS[:questions]):
        query = parts.query if q is None else encode_text(model, q)
        for name, cfg in cfgs.items():
            if name == "every" and qi >= every_questions:
                continue
            res, wall, cpu = _ask(model, cfg.for_chunks(doc.num_chunks), PromptParts(parts.prefix, None, query), doc)
            rows.append(_row("cache", name, case, res, wall, cpu, needle, len(doc), depth, qi, doc.num_chunks, enc))
            print(f"  cache {len(doc)} d{depth} q{qi} {name}: {res.text[0]!r} ({case.answer}) wall {wall:.2f} s "
                  f"cpu {cpu:.2f} s", flush=True)  # fmt: skip
    return rows


def fresh(model, cfgs, length, depth, haystack) -> list:
    case = make_case("passkey", length, depth, SEED, tokenizer=None, haystack=haystack)
    parts = case_inputs(model, case, "prefilling")["prompt"]
    spans = chunk_spans(model, parts.context, cfgs["defaults"].chunk_size, cfgs["defaults"].boundary_snap)
    needle = {j for j, (s, c) in enumerate(spans) if s < case.needle_end and case.needle_start < s + c}
    rows = []
    for name, cfg in cfgs.items():
        res, wall, cpu = _ask(model, cfg, parts)
        rows.append(_row("fresh", name, case, res, wall, cpu, needle, parts.context.numel(), depth, 0, len(spans)))
        print(f"  fresh {parts.context.numel()} d{depth} {name}: {res.text[0]!r} ({case.answer}) wall {wall:.2f} s "
              f"cpu {cpu:.2f} s {res.stats.seconds}", flush=True)  # fmt: skip
    return rows


def heldout(model, cfgs, length, seed) -> list:
    """The held-out register documents (:mod:`dllm.eval.tasks.reports`, branch s-eval: registers full of section
    numbers, dates, amounts and codes around an excerpt of a source no training phase saw): one document with
    a pass key, a number string and a word fact, encoded once, each question asked from the cache with each
    configuration (greedy, one token per step, the answer's tokens + 4)."""
    from dllm.eval.tasks.reports import make_report

    rep = make_report(length, [("passkey", 0.2), ("number_string", 0.5), ("word_fact", 0.8)], (1 << 31) + seed)
    ids = encode_text(model, rep.context)
    w0 = time.perf_counter()
    doc = encode_document(model, ids, prefilling=cfgs["defaults"])
    enc = time.perf_counter() - w0
    rows = []
    for qi, needle in enumerate(rep.needles):
        case = rep.case(qi)
        near = {j for j, (s, c) in enumerate(zip(doc.chunks.starts, doc.chunks.sizes())) if s < needle.end and
                needle.start < s + c}  # fmt: skip
        prompt = PromptParts(encode_text(model, case.prefix, bos=True), None, encode_text(model, case.query))
        g = case.answer_tokens + 4
        for name, cfg in cfgs.items():
            w0, c0 = time.perf_counter(), time.process_time()
            res = generate(model, method="prefilling", prompt=prompt, document=doc, prefilling=cfg.for_chunks(
                doc.num_chunks), gen_length=g, steps=g)  # fmt: skip
            row = _row("heldout", name, case, res, time.perf_counter() - w0, time.process_time() - c0, near,
                       len(doc), needle.depth, qi, doc.num_chunks, enc)  # fmt: skip
            row["correct"] = int(score(case.task, res.text[0], case))
            row["task"] = case.task
            rows.append(row)
            print(f"  heldout {len(doc)} {case.task} {name}: {res.text[0]!r} ({case.answer}) kept "
                  f"{row['needle_kept']}", flush=True)  # fmt: skip
    return rows


def summarize(rows: list) -> str:
    lines = [
        "| where | context tokens | chunks | config | candidates | questions | exact | needle kept | wall s / q | "
        "CPU s / q | prefill s | scoring s | decode s |",
        "|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    keys = []
    for r in rows:
        key = (r["kind"], r["length"], r["config"])
        if key not in keys:
            keys.append(key)
    for kind, length, name in keys:
        at = [r for r in rows if (r["kind"], r["length"], r["config"]) == (kind, length, name)]
        mean = lambda k, at=at: sum(r[k] for r in at) / len(at)  # noqa: E731
        cands = sorted({str(r["candidates"]) for r in at})
        lines.append(
            f"| {kind} | {length} | {at[0]['chunks']} | {name} | {'/'.join(cands)} | {len(at)} | "
            f"{sum(r['correct'] for r in at)}/{len(at)} | {sum(r['needle_kept'] for r in at)}/{len(at)} | "
            f"{mean('wall_s'):.2f} | {mean('cpu_s'):.2f} | {mean('prefill_s'):.2f} | {mean('scoring_s'):.2f} | "
            f"{mean('decode_s'):.2f} |"
        )
    lines += ["", "| where | context tokens | depth | question | config | answer | kept chunks | wall s | CPU s |",
              "|---|---:|---:|---:|---|---|---|---:|---:|"]  # fmt: skip
    for r in rows:
        ok = "ok" if r["correct"] else "wrong"
        lines.append(
            f"| {r['kind']} | {r['length']} | {r['depth']} | {r['question']} | {r['config']} | {r['answer']!r} {ok} | "
            f"{r['selected_chunks']} | {r['wall_s']:.2f} | {r['cpu_s']:.2f} |"
        )
    enc = sorted({(r["length"], r["encode_s"]) for r in rows if r["kind"] == "cache"})
    if enc:
        lines += [
            "",
            "Encoding once (wall s, defaults' chunking): " + "; ".join(f"{n} tokens {s:.1f} s" for n, s in enc),
        ]
    return "\n".join(lines)


def main(argv=None) -> int:
    p = study_parser(__doc__, "bench")
    p.add_argument("--cache-lengths", type=int, nargs="*", default=[131072])
    p.add_argument("--depths", type=float, nargs="+", default=[0.1, 0.5, 0.9])
    p.add_argument("--questions", type=int, default=2, help=f"wordings asked per document (1-{len(QUESTIONS)})")
    p.add_argument("--every-questions", type=int, default=2, help="of those, asked with every chunk scored too")
    p.add_argument("--fresh-lengths", type=int, nargs="*", default=[100000])
    p.add_argument("--fresh-depths", type=float, nargs="+", default=[0.5])
    p.add_argument("--haystack", choices=HAYSTACKS, default="filler")
    p.add_argument(
        "--heldout-lengths",
        type=int,
        nargs="*",
        default=[],
        help="held-out register documents of these lengths (needs dllm.eval.tasks.reports)",
    )
    p.add_argument("--heldout-seeds", type=int, nargs="+", default=[1, 2])
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args(argv)
    if not 1 <= args.questions <= len(QUESTIONS) or args.every_questions < 0:
        p.error(f"--questions must lie in 1..{len(QUESTIONS)} and --every-questions >= 0")
    if not all(0.0 <= d <= 1.0 for d in [*args.depths, *args.fresh_depths]):
        p.error("depths must lie in 0..1")
    if any(n < 1024 for n in [*args.cache_lengths, *args.fresh_lengths, *args.heldout_lengths]):
        p.error("lengths must be >= 1024 tokens")
    out = str(output_dir(args, "bench"))
    torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    model = load_model(None, device="cpu")
    cfgs = configs()
    fresh(model, cfgs, 4096, 0.5, args.haystack)  # warm-up, untimed
    rows = []
    for n in args.fresh_lengths:
        for d in args.fresh_depths:
            rows += fresh(model, cfgs, n, d, args.haystack)
    for n in args.cache_lengths:
        for d in args.depths:
            rows += from_cache(model, cfgs, n, d, args.haystack, args.questions, args.every_questions)
    for n in args.heldout_lengths:
        for seed in args.heldout_seeds:
            rows += heldout(model, cfgs, n, seed)
    title = "Scale by default: the bundled defaults (first stage auto) against scoring every chunk (bundled tiny model)"
    paragraphs = [
        f"Configurations: `defaults` = {cfgs['defaults']}; `every` = the same with candidates=None (every chunk "
        f"scored). Haystack {args.haystack}; {GEN} response tokens, {STEPS} steps; {args.threads} torch "
        "thread(s). Wall seconds on a shared 2-core machine loaded by other sessions; CPU seconds are this "
        "process's (at one thread, about the wall time of a quiet machine).",
        summarize(rows),
    ]
    seconds = time.perf_counter() - t0
    write_results(out, "scale_default", rows, "bench.studies.scale_default", argv, seconds, title, paragraphs)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
