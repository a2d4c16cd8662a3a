"""Accuracy of a checkpoint in natural prose: exact answers and needle chunk kept.

    python -m bench.tiny.prose_eval [--model DIR] [--out bench/results/tiny_prose_eval]

For every held-out haystack (``split="eval"``: the 9 evaluation essays, every fifth pydoc topic;
see :mod:`dllm.eval.tasks.prose`), task (passkey, number_string, word_fact), context length, needle
depth and seed (``phrasing="random"``: each seed draws its own needle, query and prefix
wording), one case is decoded by Prefilling-dLLM with the checkpoint's prefilling defaults
(``prefilling_config.json``) and, at ``--dense-length``, by dense decoding inside the window.
Greedy, one token per step, the answer's tokens + 4. "Needle chunk kept": a chunk the needle
overlaps (the bundled tokenizer is character-level, so the needle's character offsets are token
offsets) is among the selected ones; the chunks' token spans are recomputed by
:func:`dllm.prefilling.chunks.chunk_spans`, so chunks snapped to sentence ends (``boundary_snap``)
are read right. Writes ``prose_eval.csv`` (with provenance) and ``prose_eval.md``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections import defaultdict
from dataclasses import asdict, replace

from bench.outputs import save_text
from bench.provenance import machine_line, write_csv
from dllm.eval.evaluation import run_case
from dllm.eval.tasks import make_case
from dllm.model.loader import default_model_dir, load_model
from dllm.model.tokenization import encode_text
from dllm.prefilling import PrefillingConfig
from dllm.prefilling.chunks import chunk_spans

SEED_BASE = 1 << 31  # seeds no training run draws (train.py draws below 2**30)


def eval_cases(haystacks, tasks, lengths, depths, seeds, first_seed: int = 0):
    """The grid's cases, ordered by haystack, task, length, depth, seed: seeds ``SEED_BASE + first_seed`` to
    ``SEED_BASE + first_seed + seeds - 1`` (the recorded evaluation: ``first_seed=0``, 3 seeds; tuning cases
    apart from it start at 3 or later)."""
    return [
        (h, make_case(t, ln, d, SEED_BASE + first_seed + s, phrasing="random", split="eval", haystack=h))
        for h in haystacks for t in tasks for ln in lengths for d in depths for s in range(seeds)
    ]  # fmt: skip


def needle_kept(case, selected: str, spans: list) -> bool:
    """True when one of the selected chunk indices (a space-separated string) overlaps the needle.

    ``spans``: ``(start, size)`` in context tokens of every chunk (the bundled tokenizer is
    character-level, so they compare with the case's character offsets of the needle)."""
    kept = {int(c) for c in selected.split()}
    return any(spans[j][0] < case.needle_end and spans[j][0] + spans[j][1] > case.needle_start for j in kept)


def case_spans(model, case, cfg: PrefillingConfig) -> list:
    """The ``(start, size)`` chunk spans Prefilling-dLLM cuts ``case``'s context into under ``cfg``."""
    ids = encode_text(model, case.context)
    return chunk_spans(model, ids, cfg.chunk_size, cfg.boundary_snap)


def table(rows: list[dict], by: tuple[str, ...]) -> str:
    """Markdown: per ``by`` cell, exact answers and (prefilling rows) needle chunk kept, in % and counts."""
    cells = defaultdict(lambda: [0, 0, 0])
    for r in rows:
        c = cells[tuple(r[k] for k in by)]
        c[0] += r["correct"]
        c[1] += bool(r["kept"])
        c[2] += 1
    head = "| " + " | ".join(by) + " | exact answer | needle chunk kept | cases |"
    lines = [head, "|" + "---|" * len(by) + "---:|---:|---:|"]
    for key, (ok, kept, n) in sorted(cells.items(), key=lambda kv: tuple(str(x).zfill(8) for x in kv[0])):
        kept_text = f"{100 * kept / n:.0f}% ({kept}/{n})" if key[by.index("method")] == "prefilling" else "-"
        lines.append("| " + " | ".join(map(str, key)) + f" | {100 * ok / n:.0f}% ({ok}/{n}) | {kept_text} | {n} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None, help="checkpoint (default: the bundled tiny model)")
    p.add_argument("--out", default="bench/results/tiny_prose_eval", help="output folder")
    p.add_argument("--haystacks", nargs="+", default=["essays", "pydoc"])
    p.add_argument("--tasks", nargs="+", default=["passkey", "number_string", "word_fact"])
    p.add_argument("--lengths", type=int, nargs="+", default=[4096, 16384, 32768])
    p.add_argument("--depths", type=float, nargs="+", default=[0.0, 0.25, 0.5, 0.75, 1.0])
    p.add_argument("--seeds", type=int, default=3, help="cases (random wordings) per cell")
    p.add_argument(
        "--first-seed", type=int, default=0,
        help="seed offset from 2**31 (default 0, the recorded evaluation; >= 3 for tuning cases apart from it)",
    )  # fmt: skip
    p.add_argument("--dense-length", type=int, default=1024, help="dense decoding at this length (0: none)")
    p.add_argument(
        "--boundary-snap", type=int, default=None, help="PrefillingConfig.boundary_snap (default: the checkpoint's)"
    )
    args = p.parse_args(argv)
    model_dir = args.model or default_model_dir()
    model = load_model(model_dir)
    cfg = PrefillingConfig.from_pretrained(model_dir)
    if args.boundary_snap is not None:
        cfg = replace(cfg, boundary_snap=args.boundary_snap)
    grid = []  # the cheapest first, so a stopped run has whole cells
    if args.dense_length:
        dense = eval_cases(args.haystacks, args.tasks, [args.dense_length], args.depths, args.seeds, args.first_seed)
        grid += [("dense", h, c) for h, c in dense]
    for ln in args.lengths:
        cases = eval_cases(args.haystacks, args.tasks, [ln], args.depths, args.seeds, args.first_seed)
        grid += [("prefilling", h, c) for h, c in cases]
    rows: list[dict] = []
    t0 = time.perf_counter()
    for i, (method, hay, case) in enumerate(grid):
        g = case.answer_tokens + 4
        kw = {"prefilling": cfg} if method == "prefilling" else {}
        r = asdict(run_case(model, case, method, gen_length=g, steps=g, **kw))
        kept = needle_kept(case, r["selected_chunks"], case_spans(model, case, cfg)) if kw else ""
        r |= {"haystack": hay, "kept": kept}
        rows.append(r)
        print(
            f"{i + 1}/{len(grid)} {time.perf_counter() - t0:.0f}s {method} {hay} {case.task} {case.length} "
            f"{case.depth} ok={r['correct']} kept={r['kept']} {r['answer']!r} gold={case.answer!r}",
            flush=True,
        )
    os.makedirs(args.out, exist_ok=True)
    write_csv(os.path.join(args.out, "prose_eval.csv"), rows, str(model.device))
    by_len = table(rows, ("haystack", "task", "method", "length"))
    by_depth = table([r for r in rows if r["method"] == "prefilling"], ("haystack", "method", "length", "depth"))
    cmd = "python -m bench.tiny.prose_eval " + " ".join(argv if argv is not None else sys.argv[1:])
    text = (
        f"# {os.path.relpath(model_dir) if not os.path.relpath(model_dir).startswith('..') else model_dir}: "
        f"natural prose, held-out split\n\nCommand: `{cmd.strip()}`  \n"
        f"{machine_line(str(model.device))}\n\nPrefilling: C={cfg.chunk_size}, K={cfg.top_k} "
        f"(adaptive_k {cfg.adaptive_k}, candidates {cfg.candidates!r}, lexical_weight {cfg.lexical_weight:g}), "
        f"score terms {', '.join(cfg.score_terms)}, boundary snap {cfg.boundary_snap}; "
        f"seeds from 2**31 + {args.first_seed}, "
        f'`phrasing="random"`.\n\n'
        f"{by_len}\n\nPer depth (prefilling, all tasks):\n\n{by_depth}\n"
    )
    save_text(args.out, "prose_eval.md", text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
