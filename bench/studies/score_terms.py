"""Which chunk-score terms find the needle: rank of the needle chunk under s_I, s_P, s_C and sums.

    python -m bench.studies.score_terms [--length 8192] [--chunk-size 256] [--cases 10]

Prefilling-dLLM scores every chunk with s = s_I + s_P (paper); this package also offers s_C
(``answer_confidence``) and s_C - s_P (``draft_contrast``). For seeded passkey cases (seeds
10**9+100.., depths 0, .25, .5, .75, 1 repeated) on the bundled tiny model, the context is
chunk-encoded once, every term is computed for every chunk, and the rank (0 = best) of the chunk
where the needle sentence starts (it holds "The pass key is" and, unless the cut falls inside it,
the key) is reported for each combination, with how often it lands in the top 4 and the top 2.
Writes ``score_terms.md`` with the command and machine line to ``runs/bench/``; ``--record``
rewrites the recorded one in ``bench/results/`` (``score_terms.md`` at 8192 tokens,
``score_terms_4k.md`` and so on at other lengths). This is what chose ``TINY_PREFILLING.score_terms``.
"""

from __future__ import annotations

import argparse
import os

import torch

from bench.outputs import RESULTS_DIR, RUNS_DIR
from bench.provenance import machine_line
from bench.tiny_defaults import TINY_PREFILLING
from dllm.eval.evaluation import case_inputs
from dllm.eval.tasks import make_case
from dllm.model.loader import load_model
from dllm.prefilling.chunks import encode_chunks
from dllm.prefilling.config import PrefillingConfig
from dllm.prefilling.scoring import draft_pseudo_labels, score_chunks

COMBOS = (
    ("self_info", "pseudo_label"),
    ("self_info",),
    ("pseudo_label",),
    ("answer_confidence",),
    ("self_info", "answer_confidence"),
    ("draft_contrast",),
)
SHORT = {"self_info": "s_I", "pseudo_label": "s_P", "answer_confidence": "s_C", "draft_contrast": "s_C - s_P"}


def needle_ranks(model, length: int, chunk_size: int, cases: int) -> dict[tuple, list[int]]:
    """Per term combination, the needle chunk's rank in each case (0 = highest score)."""
    cfg = PrefillingConfig(chunk_size=chunk_size)
    ranks = {c: [] for c in COMBOS}
    for i in range(cases):
        case = make_case("passkey", length, (i % 5) / 4, 10**9 + 100 + i, tokenizer=None)
        needle = case.needle_start // chunk_size  # the needle's first chunk; character offsets are tokens
        parts = case_inputs(model, case, "prefilling")["prompt"]
        with torch.no_grad():
            chunks, _ = encode_chunks(
                model, parts.context, chunk_size, bos_id=model.config.bos_token_id, pad_id=model.config.pad_token_id
            )
            labels, confirmed = draft_pseudo_labels(
                model, parts.prefix, parts.query, cfg.draft_tokens, cfg.draft_threshold
            )
            scores, _ = score_chunks(model, chunks, parts.query, labels, confirmed, terms=tuple(SHORT))
        terms = {t: getattr(scores, t) for t in SHORT}
        for combo in COMBOS:
            total = sum(terms[t] for t in combo)
            ranks[combo].append(int((total > total[needle]).sum()))
    return ranks


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--length", type=int, default=8192)
    p.add_argument("--chunk-size", type=int, default=256)
    p.add_argument("--cases", type=int, default=10)
    g = p.add_mutually_exclusive_group()
    g.add_argument("--out", default=None, help="Markdown file (default: runs/bench/score_terms.md, git-ignored)")
    g.add_argument("--record", action="store_true", help="rewrite the recorded file in bench/results/ instead")
    args = p.parse_args(argv)
    out = args.out or str(recorded_path(args.length) if args.record else RUNS_DIR / "bench" / "score_terms.md")
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    model = load_model(device="cpu")
    ranks = needle_ranks(model, args.length, args.chunk_size, args.cases)
    lines = [
        f"# Chunk-score terms on the bundled tiny model (passkey, {args.length} tokens, C={args.chunk_size})",
        "",
        f"Command: `python -m bench.studies.score_terms --length {args.length} --chunk-size {args.chunk_size} "
        f"--cases {args.cases}{' --record' if args.record else ''}`  ",
        machine_line("cpu"),
        "",
        "| terms | needle-chunk rank per case (0 = best) | in top 4 | in top 2 |",
        "|---|---|---:|---:|",
    ]
    for combo, r in ranks.items():
        name = " + ".join(SHORT[t] for t in combo)
        top4, top2 = sum(x < 4 for x in r), sum(x < 2 for x in r)
        lines.append(f"| {name} | {' '.join(map(str, r))} | {top4}/{len(r)} | {top2}/{len(r)} |")
    hits = {combo: sum(x < 4 for x in r) for combo, r in ranks.items()}
    best = max(hits, key=hits.get)
    lines += [
        "",
        f"Most often in the top 4 here: {' + '.join(SHORT[t] for t in best)} ({hits[best]}/{len(ranks[best])}). "
        f"The demo and benchmarks score chunks with {' + '.join(SHORT[t] for t in TINY_PREFILLING.score_terms)} "
        "(`bench.tiny_defaults.TINY_PREFILLING`; why: the comment there and `bench/results/README.md`).",
    ]
    table = "\n".join(lines)
    print(table)
    with open(out, "w") as f:
        f.write(table + "\n")
    return 0


def recorded_path(length: int):
    """The recorded file of a study at ``length`` tokens: ``score_terms.md`` at 8192, else ``score_terms_4k.md``..."""
    return RESULTS_DIR / ("score_terms.md" if length == 8192 else f"score_terms_{length // 1024}k.md")


if __name__ == "__main__":
    raise SystemExit(main())
