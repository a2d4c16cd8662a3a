"""Multi-part answers from long documents: re-selection across the answer's blocks, off and on, against a crop.

    python -m bench.fidelity.multipart_eval --model DIR --lengths 4096 16384 65536 --cases 24 --out DIR

Each case is :func:`dllm.eval.tasks.multipart.make_multipart`: 2, 3 or 4 numbered pass keys far apart in a
register document of *The Devil's Dictionary* (a source no training phase saw; dated title lines and
numbered sections as distractors), asked for in one answer ("The pass key number 1 is ... The pass key
number 2 is ..."), decoded greedily one token a step in blocks of 32 tokens, the answer length the gold answer's plus
at least 6 tokens, rounded up to a block (96, 128 and 160 tokens at 2, 3, 4 parts: 3-5 blocks; ``--gen-length``
sets a longer one, the rest EOS). Per case:

- ``off``: Prefilling-dLLM at the checkpoint's defaults, the question's selection serving the whole answer;
- ``on``: the same with ``reselect=1``: at every block start after the first the chunks are re-scored against
  the query plus the answer so far and the kept set replaced (:mod:`dllm.prefilling.reselect`);
- ``crop``: dense decoding of the prefix, a crop of the document holding every part
  (:func:`dllm.eval.tasks.multipart.crop_parts`: ``--crop`` characters, an equal window around each needle,
  in document order) and the query: the same question asked of a reader that is given every part.

Scored part by part (:func:`dllm.eval.tasks.multipart.part_scores`: the key named under its number), with
whether each part's chunk was kept (``off``: by the question's selection; ``on``: by any of the answer's
selections). Writes ``multipart_eval.csv`` (a row per case, appended as cases finish) and
``multipart_eval.md`` into ``--out``.

The bundled model answers one key per question; the reader of the recorded run is the answer-format
fine-tune of ``bench.tiny.curriculum``'s phase 13 (``--model``), not bundled.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from collections import defaultdict

import torch

from bench.outputs import save_text
from bench.provenance import machine_line, read_csv, write_csv
from dllm import encode_text, generate, load_model
from dllm.eval.tasks.multipart import MultipartCase, crop_parts, make_multipart, part_scores
from dllm.model.loader import default_model_dir
from dllm.prefilling import PrefillingConfig, PromptParts, chunk_char_spans

SEED_BASE = 1 << 31  # seeds no training run draws
BLOCK = 32
CROP = 1024
PARTS = (2, 3, 4)


def gen_length(case: MultipartCase, at_least: int = 0) -> int:
    """The response length: the gold answer's characters + 6 (EOS room), rounded up to a block; at least
    ``at_least`` (rounded up to a block too)."""
    return BLOCK * math.ceil(max(len(case.answer) + 6, at_least) / BLOCK)


def grid(length: int, n: int) -> list[tuple[int, int]]:
    """The first ``n`` (parts, seed) of ``length``: the part counts in turn, each with its next seed."""
    return [(PARTS[i % len(PARTS)], SEED_BASE + i // len(PARTS)) for i in range(n)]


def part_chunks(spans: list, case: MultipartCase) -> list[list[int]]:
    """Per part, the chunks (indices into ``spans``, character spans) its needle sentence overlaps."""
    return [[j for j, (a, b) in enumerate(spans) if a < e and b > s] for s, e in case.spans]


def _kept_parts(chunks: list[list[int]], kept: set) -> int:
    return sum(bool(set(c) & kept) for c in chunks)


def evaluate_case(model, case: MultipartCase, cfg: PrefillingConfig, crop_chars: int, at_least: int = 0) -> dict:
    """One case's row: the answers of ``off``, ``on`` and ``crop``, parts right and parts' chunks kept
    (``at_least``: the shortest response, :func:`gen_length`)."""
    g = gen_length(case, at_least)
    prompt = PromptParts(
        encode_text(model, case.prefix, bos=True), encode_text(model, case.context), encode_text(model, case.query)
    )
    chunks = part_chunks(chunk_char_spans(model, case.context, cfg), case)
    row = {"length": case.length, "parts": len(case.keys), "seed": case.seed, "gen_length": g,
           "depths": " ".join(f"{d:.2f}" for d in case.depths), "gold": case.answer,
           "part_chunks": " ".join("+".join(map(str, c)) for c in chunks)}  # fmt: skip
    for name, reselect in (("off", 0), ("on", 1)):
        t0 = time.perf_counter()
        res = generate(model, method="prefilling", prompt=prompt, prefilling=cfg, gen_length=g, steps=g,
                       block_length=BLOCK, reselect=reselect)  # fmt: skip
        extra = res.stats.extra
        kept = set(extra["selected_chunks"])
        history = [list(ks) for _, ks in extra.get("reselected_chunks", [])]
        ever = kept.union(*map(set, history)) if history else kept
        right = part_scores(res.text[0], case.keys)
        row |= {
            f"{name}_answer": res.text[0], f"{name}_right": sum(right), f"{name}_all": all(right),
            f"{name}_kept": " ".join(map(str, sorted(kept))), f"{name}_parts_kept": _kept_parts(chunks, ever),
            f"{name}_selections": " | ".join(" ".join(map(str, ks)) for ks in history),
            f"{name}_s": round(time.perf_counter() - t0, 2),
        }  # fmt: skip
    crop = crop_parts(case.context, case.spans, crop_chars)
    t0 = time.perf_counter()
    ids = encode_text(model, case.prefix + crop + case.query, bos=True)[None]
    text = generate(model, ids, method="dense", gen_length=g, steps=g, block_length=BLOCK).text[0]
    right = part_scores(text, case.keys)
    row |= {"crop_answer": text, "crop_right": sum(right), "crop_all": all(right), "crop_chars": len(crop),
            "crop_s": round(time.perf_counter() - t0, 2)}  # fmt: skip
    return row


# ----------------------------------------------------------------------------------------------- report
def _pct(k: float, n: int) -> str:
    return f"{100 * k / n:.0f}% ({k:g}/{n})" if n else "-"


def table(rows: list[dict], by: str) -> str:
    """Parts right, answers with every part right, and parts' chunks kept, per ``by`` (length or parts)."""
    groups = defaultdict(list)
    for r in rows:
        groups[int(r[by])].append(r)
    head = (
        f"| {'context tokens' if by == 'length' else 'parts'} | cases | parts | parts right: off / on / crop "
        "| every part right: off / on / crop | parts' chunks kept: off / on | s a case: off / on |"
    )
    out = [head, "|---:|---:|---:|---|---|---|---|"]
    for key in sorted(groups):
        rs = groups[key]
        parts = sum(int(r["parts"]) for r in rs)
        right = " / ".join(_pct(sum(int(r[f"{m}_right"]) for r in rs), parts) for m in ("off", "on", "crop"))
        every = " / ".join(_pct(sum(_true(r[f"{m}_all"]) for r in rs), len(rs)) for m in ("off", "on", "crop"))
        kept = " / ".join(_pct(sum(int(r[f"{m}_parts_kept"]) for r in rs), parts) for m in ("off", "on"))
        secs = " / ".join(f"{sum(float(r[f'{m}_s']) for r in rs) / len(rs):.2f}" for m in ("off", "on"))
        out.append(f"| {key} | {len(rs)} | {parts} | {right} | {every} | {kept} | {secs} |")
    return "\n".join(out)


def _true(v) -> bool:
    return v is True or str(v) == "True"


def report(rows: list[dict], cmd: str, machine: str, cfg_line: str, model_line: str, notes: str = "") -> str:
    """The Markdown page: what was run, then the tables by context length and by part count."""
    return (
        "# Multi-part answers: re-selection across the answer's blocks, off and on, against a crop\n\n"
        f"Command: `{cmd}`  \n{machine}\n\n{model_line} {cfg_line}\n\n{notes}"
        "Documents: registers of *The Devil's Dictionary* (held out of every training phase) with 2-4 numbered "
        "pass keys far apart; the answer names each key under its number, scored part by part. `off`: the "
        "question's selection serves the whole answer; `on`: `reselect=1`, the chunks re-scored at every block "
        f"start against the query and the answer so far; `crop`: dense decoding of a {CROP}-character crop "
        "holding every part (an equal window around each). Blocks of 32 tokens, one token a step, greedy.\n\n"
        f"By context length:\n\n{table(rows, 'length')}\n\nBy part count:\n\n{table(rows, 'parts')}\n"
    )


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None, help="checkpoint (default: the bundled tiny model)")
    p.add_argument("--out", default="runs/bench/multipart_eval", help="output folder")
    p.add_argument("--lengths", type=int, nargs="+", default=[4096, 16384, 65536])
    p.add_argument("--cases", type=int, default=24, help="cases per length (2, 3, 4 parts in turn)")
    p.add_argument("--crop", type=int, default=CROP, help="characters of the crop holding every part")
    p.add_argument("--threads", type=int, default=1, help="torch threads")
    p.add_argument("--gen-length", type=int, default=0, help="the shortest response in tokens (default: the answer's)")
    p.add_argument("--notes", default="", help="a paragraph put before the tables")
    p.add_argument("--report-from", default=None, metavar="CSV", help="write the Markdown from this CSV, stop")
    args = p.parse_args(argv)
    for name in ("cases", "crop", "threads"):
        if getattr(args, name) < 1:
            p.error(f"--{name} must be at least 1")
    if args.gen_length < 0:
        p.error("--gen-length must be 0 (the answer's) or more")
    cmd = "python -m bench.fidelity.multipart_eval " + " ".join(argv if argv is not None else sys.argv[1:])
    model_dir = args.model or default_model_dir()
    cfg = PrefillingConfig.from_pretrained(model_dir)
    cfg_line = (f"Prefilling at the checkpoint's defaults: C={cfg.chunk_size}, K={cfg.top_k}, adaptive K "
                f"{cfg.adaptive_k}, boundary snap {cfg.boundary_snap}, candidates {cfg.candidates}.")  # fmt: skip
    model_line = f"Model: `{args.model}`." if args.model else "Model: the bundled tiny model."
    notes = args.notes + "\n\n" if args.notes else ""
    os.makedirs(args.out, exist_ok=True)
    if args.report_from:
        rows, machine = read_csv(args.report_from)
        text = report(rows, rows[0]["command"] if rows else cmd, machine, cfg_line, model_line, notes)
    else:
        torch.manual_seed(0)
        torch.set_num_threads(args.threads)
        model = load_model(model_dir)
        path = os.path.join(args.out, "multipart_eval.csv")
        rows: list[dict] = []
        t0 = time.perf_counter()
        for ln in args.lengths:
            for n, seed in grid(ln, args.cases):
                case = make_multipart(ln, n, seed)
                r = evaluate_case(model, case, cfg, args.crop, args.gen_length) | {"command": cmd.strip()}
                rows.append(r)
                write_csv(path, rows, str(model.device))  # a stopped run keeps its finished cases
                print(f"[{time.perf_counter() - t0:.0f}s] {ln} parts={n} right off/on/crop "
                      f"{r['off_right']}/{r['on_right']}/{r['crop_right']} kept {r['off_parts_kept']}/"
                      f"{r['on_parts_kept']} on={r['on_answer']!r}", flush=True)  # fmt: skip
        text = report(rows, cmd, machine_line(str(model.device)), cfg_line, model_line, notes)
    save_text(args.out, "multipart_eval.md", text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
