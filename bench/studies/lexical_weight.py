"""The lexical chunk-score term against the bundled defaults on the recorded bundled studies.

    python -m bench.studies.lexical_weight [--weights 0 1] [--adaptive-k 0 1.5] [--sets demo lost_in_middle] [--out DIR]

Prefilling only, every case decoded once per ``lexical_weight`` (0: the bundled defaults without the lexical term,
:data:`bench.tiny_defaults.TINY_PREFILLING`) and per ``adaptive_k`` margin (0: off, a fixed K), side by side in
one process: the pass keys of :mod:`bench.fidelity.demo`
(4K-32K tokens, 5 depths, seeds 0-4) and the passkey and needle cases of :mod:`bench.fidelity.lost_in_middle` (4K-16K,
11 depths, seeds 1000-1010). Reports exact answers and the share of cases whose needle chunk was kept
(:func:`bench.fidelity.selection_recall.needle_chunk_ids`) per set, task, length and weight, and the mean seconds per
case. Writes ``lexical_weight.csv`` and ``lexical_weight.md``.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections import defaultdict
from dataclasses import asdict, replace

import torch

from bench.fidelity.selection_recall import needle_chunk_ids
from bench.outputs import save_text
from bench.provenance import machine_line, write_csv
from bench.tiny_defaults import TINY_PREFILLING
from dllm.cli.args import non_negative_float
from dllm.eval.evaluation import run_case
from dllm.eval.tasks import make_case
from dllm.model.loader import load_model

SETS = {  # name -> (tasks, lengths, depths, first seed): the recorded studies' grids
    "demo": (("passkey",), (4096, 8192, 16384, 32768), (0.0, 0.25, 0.5, 0.75, 1.0), 0),
    "lost_in_middle": (("passkey", "needle"), (4096, 8192, 16384), tuple(i / 10 for i in range(11)), 1000),
}


# --adaptive-k: 0 (off: a fixed K) or a finite margin > 0, the CLI's own type
margin_or_off = non_negative_float


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--weights", type=float, nargs="+", default=[0.0, 1.0])
    p.add_argument("--adaptive-k", type=margin_or_off, nargs="+", default=[0.0], help="adaptive K margins (0: fixed K)")
    p.add_argument("--sets", nargs="+", choices=sorted(SETS), default=sorted(SETS))
    p.add_argument("--out", default="runs/lexical_weight")
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args(argv)
    cmd = "python -m bench.studies.lexical_weight " + " ".join(argv if argv is not None else sys.argv[1:])
    torch.set_num_threads(args.threads)
    model = load_model()
    cfgs = {  # (lexical_weight, adaptive margin) -> config
        (w, m): replace(TINY_PREFILLING, lexical_weight=w, adaptive_k=m or None)
        for w in args.weights
        for m in args.adaptive_k
    }
    warm = make_case("passkey", 4096, 0.5, 99, tokenizer=None)
    run_case(model, warm, "prefilling", prefilling=next(iter(cfgs.values())))
    rows = []
    for name in args.sets:
        tasks, lengths, depths, seed = SETS[name]
        for length in lengths:
            for task in tasks:
                for i, d in enumerate(depths):
                    case = make_case(task, length, d, seed + i, tokenizer=None)
                    needle = needle_chunk_ids(case, TINY_PREFILLING.chunk_size, TINY_PREFILLING.boundary_snap, model)
                    for (w, m), cfg in cfgs.items():
                        r = asdict(run_case(model, case, "prefilling", prefilling=cfg))
                        kept = {int(x) for x in r["selected_chunks"].split()}
                        rows.append({"set": name, "lexical_weight": w, "adaptive_k": m, **r,
                                     "needle_kept": bool(needle & kept)})  # fmt: skip
                mine = [r for r in rows if (r["set"], r["task"], r["length"]) == (name, task, length)]
                ok = {v: sum(r["correct"] for r in mine if (r["lexical_weight"], r["adaptive_k"]) == v) for v in cfgs}
                got = " ".join(f"w={w:g} m={m:g} {n}" for (w, m), n in ok.items())
                print(f"{name} {task} {length}: {got}", flush=True)
    os.makedirs(args.out, exist_ok=True)
    write_csv(os.path.join(args.out, "lexical_weight.csv"), rows, str(model.device))
    cells = defaultdict(list)
    for r in rows:
        cells[(r["set"], r["task"], r["length"], r["lexical_weight"], r["adaptive_k"])].append(r)
    lines = ["| set | task | context tokens | lexical_weight | adaptive_k | exact | needle chunk kept | mean K "
             "| s / case |", "|---|---|---:|---:|---:|---:|---:|---:|---:|"]  # fmt: skip

    def mean_k(rs):
        return sum(len(r["selected_chunks"].split()) for r in rs) / len(rs)

    for (name, task, length, w, m), rs in cells.items():
        n = len(rs)
        ok, kept = sum(r["correct"] for r in rs), sum(r["needle_kept"] for r in rs)
        sec = sum(r["seconds"] for r in rs) / n
        cell = f"| {name} | {task} | {length} | {w:g} | {m or 'off'} "
        lines.append(cell + f"| {ok}/{n} | {kept}/{n} | {mean_k(rs):.2f} | {sec:.2f} |")
    for w, m in cfgs:
        rs = [r for r in rows if (r["lexical_weight"], r["adaptive_k"]) == (w, m)]
        ok, kept = sum(r["correct"] for r in rs), sum(r["needle_kept"] for r in rs)
        lines.append(f"| all | - | - | {w:g} | {m or 'off'} | {ok}/{len(rs)} | {kept}/{len(rs)} | {mean_k(rs):.2f} | "
                     f"{sum(r['seconds'] for r in rs) / len(rs):.2f} |")  # fmt: skip
    text = (
        f"# lexical_weight on the bundled studies\n\nCommand: `{cmd.strip()}`  \n{machine_line(str(model.device))}\n\n"
    )
    text += "\n".join(lines) + "\n"
    save_text(args.out, "lexical_weight.md", text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
