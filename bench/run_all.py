"""``make bench``: every benchmark this machine allows, in about 22 minutes on 2 CPU cores (1312 s, 2026-12-07).

On a CUDA machine the kernel microbenchmarks run compiled on the GPU; elsewhere their
CPU comparison of the torch paths runs (labelled CPU). Then the end-to-end studies on
the bundled tiny model: speed vs context length, the lost-in-the-middle heatmaps and
the chunk-size trade-off, each under its own time budget (cells that would overrun are
skipped and listed); each runs one untimed warm-up case first and reports it apart. Then the
document cache (questions from a cached 16K-token document vs fresh runs, a 128K-token
document; --scale below 1 shrinks both documents), the long-context study (4K to 128K tokens, 5 depths x 4
questions, in the filler and in the held-out essays), batching, the chunk-parallel encoding of a 256K-token
document by 1 vs 2 gloo processes beside its 1-8 H200 prediction (in a process of its own, which starts
its ranks; --scale below 1 shrinks the document), and the cost of a denoising step at 32 and 512 answer tokens
with and without the block cache. CSVs (with
provenance columns), Markdown tables, PNGs and ``SUMMARY.md`` (the tables with the command and
machine line) go to ``runs/bench/`` (git-ignored); ``--record`` (``make record``) rewrites the
recorded ones in ``bench/results/`` instead.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import torch

from bench.fidelity import long_context, lost_in_middle
from bench.outputs import output_dir, study_parser
from bench.provenance import machine_line
from bench.speed import answer_length, batching, distributed, document_cache, e2e_speed
from bench.studies import chunk_tradeoff

STUDIES = (
    "kernels",
    "e2e_speed",
    "lost_in_middle",
    "chunk_tradeoff",
    "document_cache",
    "long_context",
    "batching",
    "distributed",
    "answer_length",
)
LONG_CONTEXT_LENGTHS = (4096, 16384, 32768, 131072)


def main(argv=None) -> int:
    p = study_parser(__doc__, "bench")
    p.add_argument("--only", nargs="+", choices=STUDIES, default=list(STUDIES))
    p.add_argument("--scale", type=float, default=1.0, help="multiply every time budget (e.g. 0.2 for a smoke run)")
    args = p.parse_args(argv)
    out = str(output_dir(args, "bench"))
    torch.set_num_threads(2)
    os.makedirs(out, exist_ok=True)
    t0 = time.time()
    budgets = {"kernels": 150, "e2e_speed": 360, "lost_in_middle": 300, "chunk_tradeoff": 240}
    b = {k: max(10.0, v * args.scale) for k, v in budgets.items()}
    done = []
    if "kernels" in args.only:
        device = "cuda" if torch.cuda.is_available() else "cpu"
        cmd = [
            sys.executable,
            "-m",
            "bench.kernels.bench_kernels",
            "--out",
            out,
            "--device",
            device,
            "--budget-s",
            str(b["kernels"]),
        ]
        print("$", " ".join(cmd), flush=True)
        subprocess.run(cmd, check=False)
        done.append(f"bench_kernels_{'gpu' if device == 'cuda' else 'cpu'}.csv")
    if "e2e_speed" in args.only:
        e2e_speed.main(["--budget", str(b["e2e_speed"]), "--out", out])
        done.append("e2e_speed.md")
    if "lost_in_middle" in args.only:
        lost_in_middle.main(["--budget", str(b["lost_in_middle"]), "--out", out])
        done.append("lost_in_middle.md")
    if "chunk_tradeoff" in args.only:
        chunk_tradeoff.main(["--budget", str(b["chunk_tradeoff"]), "--out", out])
        done.append("chunk_tradeoff.md")
    if "document_cache" in args.only:
        shrink = min(1.0, args.scale)
        document_cache.main(
            ["--out", out, "--length", str(max(2048, int(16384 * shrink)))]
            + ["--long-length", str(max(4096, int(131072 * shrink)))]
        )
        done.append("document_cache.md")
    if "long_context" in args.only:
        shrink = min(1.0, args.scale)
        lengths = sorted({str(max(2048, int(n * shrink))) for n in LONG_CONTEXT_LENGTHS}, key=int)
        # the study writes fixed file names: filler beside the others, essays in the folder bench/results uses
        for haystack, sub in (("filler", ""), ("essays", "long_context_essays")):
            folder = os.path.join(out, sub)
            long_context.main(["--out", folder, "--haystack", haystack, "--lengths", *lengths, "--threads", "2"])
            done.append(os.path.join(sub, "long_context.md"))
    if "batching" in args.only:
        shrink = min(1.0, args.scale)
        lengths = [str(max(1024, int(n * shrink))) for n in batching.LENGTHS]
        batching.main(["--out", out, "--lengths", *lengths] + (["--rounds", "1"] if shrink < 1 else []))
        done.append("batching.md")
    if "distributed" in args.only:
        # a fresh process: its ranks are forked from it, one torch thread each, not from this 2-thread one
        shrink = min(1.0, args.scale)
        length = max(8192, int(distributed.LENGTH * shrink))
        cmd = [sys.executable, "-m", "bench.speed.distributed", "--out", out, "--length", str(length)]
        cmd += ["--rounds", "1"] if shrink < 1 else []
        print("$", " ".join(cmd), flush=True)
        subprocess.run(cmd, check=False, env={**os.environ, "OMP_NUM_THREADS": "1"})
        done.append("distributed.md")
    if "answer_length" in args.only:
        # 32 and 512 tokens (~1.5 min); the recorded study adds 1024 and 2048 (python -m bench.speed.answer_length)
        lengths = ["32", "512"] if args.scale >= 1 else ["32", "64"]
        resel = ["16384"] if args.scale >= 1 else ["4096"]
        answer_length.main(
            ["--out", out, "--lengths", *lengths, "--passkeys", "10" if args.scale >= 1 else "2"]
            + ["--reselect-lengths", *resel]
        )
        done.append("answer_length.md")
    lines = [
        "# Benchmark summary",
        "",
        f"Command: `{' '.join(['python -m bench.run_all', *(sys.argv[1:] if argv is None else argv)])}`",
        f"{machine_line()}; {time.time() - t0:.0f} s in all.",
        "",
    ]
    for name in done:
        path = os.path.join(out, name)
        if name.endswith(".md") and os.path.exists(path):
            lines += [f"## {name[:-3]}", "", open(path).read(), ""]
        else:
            lines += [f"## {name}", "", f"see `{name}` beside this file", ""]
    with open(os.path.join(out, "SUMMARY.md"), "w") as f:
        f.write("\n".join(lines))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
