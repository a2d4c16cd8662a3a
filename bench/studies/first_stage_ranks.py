"""Where the first stage ranks the needle's chunk: the plain mean of the chunk maxima against their excess over the
document's median chunk (:func:`dllm.prefilling.selection.first_stage_excess`), in layers 0 and 1.

    python -m bench.studies.first_stage_ranks [--out DIR] [--sets demo essays:16384:0:4 pydoc:32768:0:2 ...]

A set is ``demo`` (the cases of ``make demo``: passkey, 4K-32K tokens, depths 0-1, seed = depth index) or
``HAYSTACK:LENGTH:SEED0:SEED1`` (passkey cases in that haystack, depths 0, 0.3, 0.6 and 1.0, seeds SEED0..SEED1-1).
Each case's context is cut as the bundled model's defaults cut it (C=256, boundaries snapped within 64); the keys
of layer L of every chunk come from :func:`dllm.prefilling.chunks.encode_candidates`'s first pass (layer 0: a
projection of the embeddings; layer 1: layer 0 in full). Per case: the rank (0 = first) of each chunk the needle
overlaps, and whether the chunks the bundled rule passes on (:func:`dllm.prefilling.config.auto_candidates` best
plus the neighbours of the K best, :func:`dllm.prefilling.selection.first_stage_candidates`) hold every needle
chunk. Only the ranking is measured (no decoding): cheap enough for many cases. Writes
``first_stage_ranks.csv`` and ``first_stage_ranks.md``.
"""

from __future__ import annotations

import os
import sys

import torch

from bench.outputs import output_dir, study_parser
from bench.provenance import machine_line, write_csv
from bench.tiny_defaults import TINY_PREFILLING as CFG
from dllm.eval.evaluation import case_inputs
from dllm.eval.tasks import make_case
from dllm.eval.tasks.prose import HAYSTACKS
from dllm.model.loader import load_model
from dllm.prefilling.chunks import chunk_spans, encode_candidates
from dllm.prefilling.config import auto_candidates, resolve_anchor_token_id
from dllm.prefilling.selection import first_stage_candidates, first_stage_excess, first_stage_maxima, rank_chunks

LAYERS = (0, 1)
RULES = {"mean": lambda x: x.mean(1), "excess": first_stage_excess}  # mean: the rule before the excess
DEMO = ((4096, 8192, 16384, 32768), (0.0, 0.25, 0.5, 0.75, 1.0))
DEPTHS = (0.0, 0.3, 0.6, 1.0)


def cases_of(spec: str) -> list:
    """The (name, case) pairs of one set (``demo`` or ``HAYSTACK:LENGTH:SEED0:SEED1``).

    Raises:
        ValueError: a malformed set.
    """
    if spec == "demo":
        return [
            (f"demo {n} d{d}", make_case("passkey", n, d, i, tokenizer=None))
            for n in DEMO[0]
            for i, d in enumerate(DEMO[1])
        ]
    parts = spec.split(":")
    if len(parts) != 4 or parts[0] not in HAYSTACKS or not all(p.isdigit() for p in parts[1:]):
        raise ValueError(f"a set is 'demo' or HAYSTACK:LENGTH:SEED0:SEED1 with HAYSTACK in {HAYSTACKS}, got {spec!r}")
    hay, n, s0, s1 = parts[0], int(parts[1]), int(parts[2]), int(parts[3])
    return [
        (f"{hay} {n} d{d} s{s}", make_case("passkey", n, d, s, tokenizer=None, haystack=hay))
        for s in range(s0, s1)
        for d in DEPTHS
    ]


def first_pass_keys(model, context, anchor: int, layer: int):
    """The :class:`~dllm.prefilling.chunks.ChunkCache` whose ``k[layer]`` alone is set, every chunk's keys of
    ``layer`` as :func:`encode_candidates`'s first pass computes them (one chunk is then encoded in full: the
    least it takes)."""
    got = []

    def pick(keys):
        got.append(keys)
        return [0]

    encode_candidates(model, context, CFG, anchor, layer, pick)
    return got[0]


def ranks_of_case(model, anchor: int, case) -> dict:
    """One case's needle chunks, chunk count, candidate count and, per ``L{layer}.{rule}``, the needle chunks'
    ranks and whether the candidates hold them all."""
    parts = case_inputs(model, case, "prefilling")["prompt"]
    spans = chunk_spans(model, parts.context, CFG.chunk_size, CFG.boundary_snap)
    needle = [j for j, (s, c) in enumerate(spans) if s < case.needle_end and case.needle_start < s + c]
    n = len(spans)
    k = min(CFG.top_k, n)
    n_cand = auto_candidates(n, k)
    out = {"chunks": n, "candidates": n_cand or "all", "needle": " ".join(map(str, needle))}
    for layer in LAYERS:
        maxima = first_stage_maxima(model, first_pass_keys(model, parts.context, anchor, layer), parts.query,
                                    CFG.draft_tokens, layer)  # fmt: skip
        for name, rule in RULES.items():
            scores = rule(maxima)
            order = rank_chunks(scores)
            ranks = [order.index(j) for j in needle]
            cands = set(range(n)) if n_cand is None else set(first_stage_candidates(scores, n_cand, k))
            out[f"L{layer}.{name}"] = " ".join(map(str, ranks))
            out[f"L{layer}.{name}.held"] = int(set(needle) <= cands)
    return out


def summary(rows: list) -> str:
    """Markdown: per set and (layer, rule), the worst best rank of a needle chunk, the cases whose best needle
    chunk ranks first, and the cases whose candidates hold every needle chunk (with the engaged count)."""
    lines = [
        "| set | cases (first stage engaged) | layer | rule | worst rank of the best needle chunk | ranked first | "
        "candidates hold every needle chunk |",
        "|---|---:|---:|---|---:|---:|---:|",
    ]
    for spec in dict.fromkeys(r["set"] for r in rows):
        sel = [r for r in rows if r["set"] == spec]
        eng = sum(r["candidates"] != "all" for r in sel)
        for layer in LAYERS:
            for name in RULES:
                best = [min(int(x) for x in r[f"L{layer}.{name}"].split()) for r in sel]
                held = sum(r[f"L{layer}.{name}.held"] for r in sel)
                lines.append(
                    f"| {spec} | {len(sel)} ({eng}) | {layer} | {name} | {max(best)} | {sum(b == 0 for b in best)} | "
                    f"{held}/{len(sel)} |"
                )
    return "\n".join(lines)


def main(argv=None) -> int:
    p = study_parser(__doc__, "bench")
    p.add_argument("--sets", nargs="+", default=["demo", "essays:16384:0:4", "pydoc:16384:0:4"])
    p.add_argument("--threads", type=int, default=1, help="torch threads")
    args = p.parse_args(argv)
    try:
        sets = {spec: cases_of(spec) for spec in args.sets}
    except ValueError as e:
        p.error(str(e))
    torch.set_num_threads(args.threads)
    model = load_model(None)
    anchor, _source = resolve_anchor_token_id(model.config, model.tokenizer, CFG)
    rows = []
    for spec, cases in sets.items():
        for name, case in cases:
            rows.append({"set": spec, "case": name, **ranks_of_case(model, anchor, case)})
            print(rows[-1], flush=True)
    out = output_dir(args, "bench", "")
    os.makedirs(out, exist_ok=True)
    write_csv(os.path.join(out, "first_stage_ranks.csv"), rows, str(model.device))
    command = " ".join(["python -m bench.studies.first_stage_ranks", *(sys.argv[1:] if argv is None else argv)])
    table = summary(rows)
    with open(os.path.join(out, "first_stage_ranks.md"), "w") as f:
        f.write(f"Command: `{command}`  \n{machine_line(str(model.device))}\n\n{table}\n")
    print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
