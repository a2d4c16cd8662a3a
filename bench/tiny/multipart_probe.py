"""Does a reader copy numbered keys on the layout it trained on? Phase 13's own samples, decoded.

    python -m bench.tiny.multipart_probe --model DIR [--cases 8] [--out DIR]

Draws ``--cases`` samples of :func:`bench.tiny.multipart.multipart_sample` on training filler (seeds from
:data:`SEED_BASE`, which no training run draws; about 1100 tokens each, 2-4 numbered pass keys), gives the
model everything before the answer and decodes the answer greedily, one token a step, in blocks of 32 tokens
(the answer's length plus 6, rounded up to a block, as :mod:`bench.fidelity.multipart_eval`). The samples are the
one-segment layout (what a dense reader of a crop sees, 15% of phase 13's data), decoded densely: no selection
stands between the reader and the keys. Scored part by part (:func:`dllm.eval.tasks.multipart.part_scores`).

It separates the two ways the held-out evaluation can fail: a reader that copies keys here but not there
meets text it never read; one that copies none here never learned the lookup. Writes
``multipart_probe.csv`` and ``multipart_probe.md`` into ``--out``.
"""

from __future__ import annotations

import argparse
import math
import os
import random
import re
import time

import torch

from bench.outputs import RUNS_DIR, write_report
from bench.provenance import write_csv
from bench.tiny.data import EOS
from bench.tiny.multipart import multipart_sample
from dllm import decode_text, generate, load_model
from dllm.eval.tasks.multipart import part_scores

SEED_BASE = 900_000  # seeds no training run draws (as bench.tiny.skill_probe)
BLOCK = 32
TOKENS = 1100


def probe_case(model, seed: int) -> dict:
    """One sample's row: its gold answer, the decoded answer and the parts right. The sample is
    ``multipart_sample(random.Random(seed), TOKENS, dense=True)``; its ids before the answer are the prompt."""
    s = multipart_sample(random.Random(seed), TOKENS, dense=True)
    a0 = s.role.index("a")
    gold = decode_text(model, torch.tensor([t for t in s.ids[a0:] if t != EOS]))
    keys = re.findall(r"is (\d{5})\.", gold)
    g = BLOCK * math.ceil((len(gold) + 6) / BLOCK)
    res = generate(model, torch.tensor(s.ids[:a0])[None], method="dense", gen_length=g, steps=g, block_length=BLOCK)
    right = part_scores(res.text[0], keys)
    return {"seed": seed, "parts": len(keys), "gold": gold, "answer": res.text[0], "right": sum(right),
            "all": all(right)}  # fmt: skip


def report(rows: list[dict], model_line: str) -> list[str]:
    """The page's paragraphs after its command and machine lines: what was decoded, the parts right, a row a
    sample."""
    parts, right = sum(r["parts"] for r in rows), sum(r["right"] for r in rows)
    every = sum(r["all"] for r in rows)
    table = ["| seed | parts | right | gold | answer |", "|---:|---:|---:|---|---|"]
    for r in rows:
        ans = r["answer"].replace("|", "\\|").replace("\n", "\\n")[: len(r["gold"]) + 8]
        table.append(f"| {r['seed']} | {r['parts']} | {r['right']} | {r['gold']} | {ans} |")
    return [
        model_line + " One-segment samples of `bench.tiny.multipart` on training filler, dense decoding, "
        "greedy, one token a step, blocks of 32 tokens.",
        f"Parts right: **{right}/{parts}**; every part right: {every}/{len(rows)}.",
        "\n".join(table),
    ]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None, help="checkpoint folder (default: the bundled tiny model)")
    ap.add_argument("--cases", type=int, default=8)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default=str(RUNS_DIR / "multipart_probe"))
    args = ap.parse_args(argv)
    if args.cases < 1:
        ap.error("--cases must be at least 1")
    torch.manual_seed(0)
    torch.set_num_threads(args.threads)
    model = load_model(args.model)
    t0 = time.perf_counter()
    rows = [probe_case(model, SEED_BASE + i) for i in range(args.cases)]
    write_csv(os.path.join(args.out, "multipart_probe.csv"), rows, str(model.device))
    model_line = f"Model: `{args.model}`." if args.model else "Model: the bundled tiny model."
    write_report(os.path.join(args.out, "multipart_probe.md"), "Multi-part answers on the reader's own training layout",
                 "bench.tiny.multipart_probe", argv, str(model.device), time.perf_counter() - t0,
                 report(rows, model_line))  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
