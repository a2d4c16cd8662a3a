"""Needle-chunk recall of Prefilling-dLLM's chunk selection, from a results CSV.

    python -m bench.fidelity.selection_recall [bench/results/demo/demo.csv] [--chunk-size 256] [--boundary-snap 64]

Exact-match accuracy mixes two stages: did the top-K selection keep the chunk holding the
needle, and did the model then copy the answer right. This separates them: for every
``prefilling`` row of a CSV written by :mod:`bench.fidelity.demo` or :mod:`bench.fidelity.lost_in_middle`, the
case is regenerated from its (task, length, depth, seed) and its needle's chunks (the bundled
model's tokenizer is character-level, so character offsets are token offsets: // C for fixed
chunks; with ``boundary_snap`` the snapped spans of :func:`dllm.prefilling.chunks.chunk_spans`) are
checked against the row's ``selected_chunks``. Prints a Markdown table per context length and writes it beside
the CSV as ``<name>_recall.md``.
"""

from __future__ import annotations

import argparse
import csv
import functools
import os
from collections import defaultdict

from dllm.eval.tasks import make_case


def needle_chunk_ids(case, chunk_size: int, boundary_snap: int = 0, model=None) -> set[int]:
    """Indices of the chunks a character-level case's needle overlaps (character offsets are tokens).

    ``boundary_snap`` 0: the fixed C-token cut, by arithmetic. Otherwise the chunks Prefilling-dLLM cuts
    with boundaries snapped to sentence ends (:func:`dllm.prefilling.chunks.chunk_spans` with ``model``'s
    sentence ends; default model: the bundled one)."""
    if boundary_snap == 0:
        return set(range(case.needle_start // chunk_size, (case.needle_end - 1) // chunk_size + 1))
    from dllm.model.tokenization import encode_text
    from dllm.prefilling.chunks import chunk_spans

    model = model or _bundled_model()
    spans = chunk_spans(model, encode_text(model, case.context), chunk_size, boundary_snap)
    return {j for j, (s, n) in enumerate(spans) if s < case.needle_end and case.needle_start < s + n}


@functools.cache
def _bundled_model():
    from dllm.model.loader import load_model

    return load_model(device="cpu")


def needle_chunks(row: dict, chunk_size: int, boundary_snap: int = 0) -> set[int]:
    """Chunk indices the results row's needle overlaps (the case is regenerated from the row)."""
    case = make_case(row["task"], int(row["length"]), float(row["depth"]), int(row["seed"]), tokenizer=None)
    return needle_chunk_ids(case, chunk_size, boundary_snap)


def recall_table(rows: list[dict], chunk_size: int, boundary_snap: int = 0) -> str:
    """Markdown: per (task, length) the share of cases whose needle chunk was kept, and exact-match accuracy."""
    cells = defaultdict(lambda: [0, 0, 0])  # kept, correct, n
    for r in rows:
        if r["method"] != "prefilling":
            continue
        kept = {int(c) for c in r["selected_chunks"].split()}
        cell = cells[(r["task"], int(r["length"]))]
        cell[0] += bool(needle_chunks(r, chunk_size, boundary_snap) & kept)
        cell[1] += r["correct"] == "True"
        cell[2] += 1
    lines = [
        "| task | context tokens | needle chunk kept | exact answer | cases |",
        "|---|---:|---:|---:|---:|",
    ]
    for (task, length), (kept, correct, n) in sorted(cells.items()):
        lines.append(f"| {task} | {length} | {100 * kept / n:.0f}% | {100 * correct / n:.0f}% | {n} |")
    total = [sum(c[i] for c in cells.values()) for i in range(3)]
    if total[2]:
        lines.append(f"| all | - | {100 * total[0] / total[2]:.0f}% | {100 * total[1] / total[2]:.0f}% | {total[2]} |")
    return "\n".join(lines)


def write_recall(csv_path: str, chunk_size: int, boundary_snap: int = 0) -> str:
    """Read a results CSV, write its recall table to ``<name>_recall.md`` beside it; returns the table.

    Raises:
        FileNotFoundError: no such CSV. KeyError: a row lacks the columns of :data:`dllm.eval.evaluation.CSV_FIELDS`.
    """
    with open(csv_path) as f:
        rows = list(csv.DictReader(f))
    table = recall_table(rows, chunk_size, boundary_snap)
    out = os.path.splitext(csv_path)[0] + "_recall.md"
    with open(out, "w") as f:
        name = os.path.basename(csv_path)
        snap = f", boundaries snapped to sentence ends within {boundary_snap}" if boundary_snap else ""
        f.write(f"# Needle-chunk recall of the prefilling rows of `{name}` (C={chunk_size}{snap})\n\n{table}\n")
    print(table)
    print(f"wrote {out}")
    return table


def main(argv=None) -> int:
    from bench.tiny_defaults import TINY_PREFILLING  # the demo's chunk size is the default

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("csv", nargs="?", default=os.path.join("bench", "results", "demo", "demo.csv"))
    p.add_argument("--chunk-size", type=int, default=TINY_PREFILLING.chunk_size)
    p.add_argument("--boundary-snap", type=int, default=TINY_PREFILLING.boundary_snap)
    args = p.parse_args(argv)
    write_recall(args.csv, args.chunk_size, args.boundary_snap)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
