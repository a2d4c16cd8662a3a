"""Adaptive K against fixed K on the held-out registers, rules tuned on other documents.

    python -m bench.studies.adaptive_k collect --seed-offset 100 --out DIR_TUNE      # documents for tuning
    python -m bench.studies.adaptive_k collect --seed-offset 0 --out DIR_TEST        # heldout_eval's 48 questions
    python -m bench.studies.adaptive_k rules --tune DIR_TUNE/scores.jsonl --test DIR_TEST/scores.jsonl --out DIR

``collect`` scores every question of :mod:`bench.fidelity.heldout_eval`'s documents (registers full of codes, dates and
amounts; a pass key, a number string and a word fact; 4K-128K) once with the library's own path
(``score_and_select`` with the bundled defaults, the first stage and the lexical term included) at a ceiling
``top_k`` (8 by default: the first stage then passes on ``max(8 K, sqrt N)`` candidates), and writes each
question's fused chunk scores, chunk sizes and the needle's chunks as one JSON line. ``--seed-offset`` moves
every document seed (0: the 48 questions of ``heldout_eval.md``).

``rules`` then applies each K rule to the stored scores, no model needed: fixed K = 1 ... ceiling, and the
adaptive rule of :func:`dllm.prefilling.selection.kept_chunks` (``drop``: cut at the first drop of at least
m robust spreads between consecutive scores, plus the best chunk's better neighbour) and :func:`band_k` (``band``:
keep every chunk within m robust spreads of the best), at several margins, floor 1, ceilings 4 and 8. A rule is
chosen on ``--tune`` (the best needle-kept count, then the fewest kept tokens, among the rules at least as
accurate as the tuning set's best fixed K) and reported on ``--test``. Measured: needle chunk kept (a kept
chunk overlaps the needle) and mean kept context tokens; exact answers are those of ``heldout_eval.md`` (the
bundled model reads none of these needles exactly at any K, the 1K dense crop included).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from dataclasses import replace

import torch

from bench.fidelity.heldout_eval import decode_kept, reports
from bench.outputs import save_text
from bench.provenance import machine_line
from dllm import encode_document, load_model
from dllm.cli.args import positive_int
from dllm.eval.tasks import score
from dllm.model.loader import default_model_dir
from dllm.model.tokenization import encode_text
from dllm.prefilling import PrefillingConfig, PromptParts
from dllm.prefilling.pipeline import check_parts, prefill, score_and_select
from dllm.prefilling.selection import kept_chunks, rank_chunks, robust_spread

MARGINS = (0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
CEILINGS = (4, 8)


def parse_rule(spec: str) -> tuple:
    """``fixed:K``, ``drop:M:CEIL`` or ``band:M:CEIL`` -> a rule tuple of :func:`kept_by`."""
    kind, *nums = spec.split(":")
    if kind == "fixed" and len(nums) == 1:
        return ("fixed", int(nums[0]))
    if kind in ("drop", "band") and len(nums) == 2:
        return (kind, float(nums[0]), int(nums[1]))
    raise argparse.ArgumentTypeError(f"a rule is fixed:K, drop:M:CEIL or band:M:CEIL, got {spec!r}")


def parse_override(spec: str) -> tuple:
    """``FIELD=JSON`` -> ``(field, value)`` for :class:`PrefillingConfig` (checked when the config is built)."""
    field, sep, value = spec.partition("=")
    try:
        if not sep:
            raise ValueError("no '='")
        return field, json.loads(value)
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"an override is FIELD=JSON (e.g. draft_tokens=8), got {spec!r}: {e}") from e


def collect(model, cfg: PrefillingConfig, docs, decode_rules=(), log=print) -> list[dict]:
    """One row per question: the library's fused chunk scores (``None`` = left out by the first stage), and
    for each of ``decode_rules`` the greedy answer over the chunks it keeps (exact by InfiniteBench's rules;
    a rule that keeps no chunk of the needle is not decoded and is wrong: the answer occurs only there)."""
    rows, t0 = [], time.perf_counter()
    for doc_i, rep in enumerate(docs):
        doc = encode_document(model, encode_text(model, rep.context), prefilling=cfg)
        spans = list(zip(doc.chunks.starts, doc.chunks.sizes()))
        for qi, needle in enumerate(rep.needles):
            case = rep.case(qi)
            parts = PromptParts(encode_text(model, case.prefix, bos=True), None, encode_text(model, case.query))
            parts = check_parts(model, parts, doc)
            pre = prefill(model, parts, cfg, document=doc)
            sel = score_and_select(model, parts, pre.chunks, cfg)
            total = [float(x) if math.isfinite(float(x)) else None for x in sel.scores.total]
            needle_chunks = [j for j, (s, n) in enumerate(spans) if s < needle.end and s + n > needle.start]
            decoded, g = {}, case.answer_tokens + 4
            for rule in decode_rules:
                kept = kept_by(rule, sel.scores.total.double())
                text = ""
                if set(kept) & set(needle_chunks):
                    pcfg = replace(cfg, top_k=len(kept))
                    text = decode_kept(model, parts, pre, sel.scores, sel.pseudo_labels, kept, pcfg, g)
                decoded[rule_name(rule)] = {"answer": text, "correct": bool(text) and score(case.task, text, case)}
            rows.append({
                "length": rep.length, "task": needle.task, "depth": needle.depth, "seed": rep.seed, "doc": doc_i,
                "sizes": [n for _s, n in spans], "needle_chunks": needle_chunks, "scores": total,
                "decoded": decoded, "ceiling": cfg.top_k,
            })  # fmt: skip
            rank = rank_chunks(sel.scores.total)
            best = min(rank.index(j) for j in needle_chunks) + 1
            log(f"[{time.perf_counter() - t0:.0f}s] {rep.length} {needle.task} d={needle.depth} needle rank {best}")
    return rows


def band_k(scores: torch.Tensor, floor: int, ceiling: int, margin: float) -> int:
    """K = the chunks within ``margin`` robust spreads (:func:`robust_spread` of the finite scores, as
    :func:`adaptive_top_k`) of the best one, between ``floor`` and ``ceiling``."""
    s = scores[torch.isfinite(scores)].double()
    if s.numel() == 0:
        return 1
    k = int((s >= s.max() - margin * robust_spread(s)).sum())
    return max(min(floor, s.numel()), min(k, ceiling, s.numel()))


def kept_by(rule: tuple, scores: torch.Tensor) -> list:
    """The chunks ``rule`` keeps of ``scores [N]`` (-inf: not scored): ``("fixed", k)``, ``("drop", m, ceil)``
    or ``("band", m, ceil)``, floor 1."""
    n_finite = int(torch.isfinite(scores).sum())
    if rule[0] == "fixed":
        k = min(rule[1], n_finite)
    elif rule[0] == "drop":  # the library's rule, the best chunk's neighbour included
        return kept_chunks(scores, min(rule[2], n_finite), rule[1])
    else:
        k = band_k(scores, 1, rule[2], rule[1])
    return rank_chunks(scores)[:k]


def rule_name(rule: tuple) -> str:
    return f"fixed K={rule[1]}" if rule[0] == "fixed" else f"{rule[0]} m={rule[1]:g} K<={rule[2]}"


def evaluate(rows: list, rules: list) -> dict:
    """rule -> (needle kept count, mean kept tokens, mean K, exact answers or None where not decoded)."""
    out = {}
    scores = [torch.tensor([float("-inf") if x is None else x for x in r["scores"]], dtype=torch.float64) for r in rows]
    for rule in rules:
        hits, tokens, ks = 0, 0, 0
        answers = [r.get("decoded", {}).get(rule_name(rule)) for r in rows]
        exact = sum(a["correct"] for a in answers) if all(answers) else None
        for r, s in zip(rows, scores):
            kept = kept_by(rule, s)
            hits += bool(set(kept) & set(r["needle_chunks"]))
            tokens += sum(r["sizes"][j] for j in kept)
            ks += len(kept)
        out[rule] = (hits, tokens / len(rows), ks / len(rows), exact)
    return out


def all_rules(ceiling: int) -> list:
    rules = [("fixed", k) for k in range(1, ceiling + 1)]
    for kind in ("drop", "band"):
        rules += [(kind, m, c) for c in CEILINGS if c <= ceiling for m in MARGINS]
    return rules


def choose(res: dict) -> tuple:
    """The best fixed K (most kept, then fewest tokens) and the adaptive rule chosen: at least as many
    needles kept as that K, then the fewest tokens (ties: the larger margin, the smaller ceiling)."""
    fixed = [r for r in res if r[0] == "fixed"]
    best_fixed = min(fixed, key=lambda r: (-res[r][0], res[r][1]))
    ok = [r for r in res if r[0] != "fixed" and res[r][0] >= res[best_fixed][0]]
    chosen = min(ok, key=lambda r: (-res[r][0], res[r][1], -r[1], r[2])) if ok else None
    return best_fixed, chosen


def table(res: dict, n: int, marks: dict) -> str:
    lines = ["| rule | needle chunk kept | mean kept tokens | mean K | exact |", "|---|---:|---:|---:|---:|"]
    for rule, (hits, tokens, k, exact) in res.items():
        tag = "".join(f" **({m})**" for m, r in marks.items() if r == rule)
        ex = "not decoded" if exact is None else f"{exact}/{n}"
        lines.append(f"| {rule_name(rule)}{tag} | {hits}/{n} ({hits / n:.0%}) | {tokens:.0f} | {k:.2f} | {ex} |")
    return "\n".join(lines)


def load_rows(path: str) -> list:
    """The rows of a ``collect`` JSONL file, each checked: ``scores`` (numbers, ``None`` for a chunk left
    out, at least one number), ``sizes`` of the same length, ``needle_chunks`` indices into them.

    Raises:
        OSError: the file cannot be read.
        ValueError: a line that is not JSON or not such a row (its line number said).
    """
    rows = []
    with open(path) as f:
        for i, line in enumerate(f, 1):
            if not line.strip():
                continue
            r = json.loads(line)
            ok = isinstance(r, dict) and all(isinstance(r.get(k), list) for k in ("scores", "sizes", "needle_chunks"))
            ok = ok and len(r["scores"]) == len(r["sizes"]) and any(x is not None for x in r["scores"])
            ok = ok and all(x is None or (isinstance(x, (int, float)) and math.isfinite(x)) for x in r["scores"])
            ok = ok and all(isinstance(j, int) and 0 <= j < len(r["scores"]) for j in r["needle_chunks"])
            if not ok:
                raise ValueError(f"{path}:{i}: not a scored question of `collect` (scores, sizes, needle_chunks)")
            rows.append(r)
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m bench.studies.adaptive_k",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = p.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("collect", help="score the questions once, write scores.jsonl")
    c.add_argument("--out", required=True)
    c.add_argument("--lengths", type=int, nargs="+", default=[4096, 16384, 65536, 131072])
    c.add_argument("--seeds", type=int, default=1, help="single-needle documents per (task, depth) cell")
    c.add_argument("--seed-offset", type=int, default=0, help="added to every document seed (0: heldout_eval's)")
    c.add_argument("--ceiling", type=positive_int, default=8, help="top_k of the scoring config (the rules' largest K)")
    c.add_argument("--threads", type=int, default=1)
    c.add_argument(
        "--set",
        type=parse_override,
        nargs="*",
        default=[],
        metavar="FIELD=JSON",
        help="PrefillingConfig overrides of the bundled defaults, e.g. draft_tokens=8 (a lever's effect on selection)",
    )
    c.add_argument(
        "--decode",
        type=parse_rule,
        nargs="*",
        default=[],
        metavar="RULE",
        help="rules whose kept chunks are decoded (fixed:K, drop:M:CEIL, band:M:CEIL)",
    )
    r = sub.add_parser("rules", help="apply the K rules to stored scores, choose on --tune, report on --test")
    r.add_argument("--tune", required=True, metavar="JSONL")
    r.add_argument("--test", required=True, metavar="JSONL")
    r.add_argument("--ceiling", type=positive_int, default=8, help="the largest K tried (at most the collect's)")
    r.add_argument("--out", required=True)
    args = p.parse_args(argv)
    cmd = "python -m bench.studies.adaptive_k " + " ".join(argv if argv is not None else sys.argv[1:])
    if args.cmd == "collect":
        torch.manual_seed(0)
        torch.set_num_threads(args.threads)
        model_dir = default_model_dir()
        overrides = dict(args.set)
        if {"top_k", "adaptive_k"} & set(overrides):
            p.error("--set cannot change top_k or adaptive_k: --ceiling is the scoring top_k, the rules choose K")
        try:
            cfg = replace(PrefillingConfig.from_pretrained(model_dir), **overrides, top_k=args.ceiling, adaptive_k=None)
        except (TypeError, ValueError) as e:  # an unknown field or a value the config refuses
            p.error(f"--set: {e}")
        model = load_model(model_dir)
        docs = reports(args.lengths, args.seeds, 65536, seed_offset=args.seed_offset)
        rows = collect(model, cfg, docs, args.decode)
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "scores.jsonl"), "w") as f:
            for row in rows:
                f.write(json.dumps(row) + "\n")
        with open(os.path.join(args.out, "README.md"), "w") as f:
            f.write(f"Command: `{cmd}`  \n{machine_line(str(model.device))}\n\nScoring config: {cfg}\n")
        return 0
    try:
        tune, test = load_rows(args.tune), load_rows(args.test)
    except (OSError, ValueError) as e:  # a missing file or a line that is not JSON
        p.error(f"cannot read the stored scores: {e}")
    if not tune or not test:
        p.error("--tune and --test need at least one scored question each")
    collected = min((r["ceiling"] for r in tune + test if "ceiling" in r), default=None)  # older files: unknown
    if collected is not None and args.ceiling > collected:
        p.error(f"--ceiling {args.ceiling} exceeds the top_k {collected} the scores were collected at")
    rules = all_rules(args.ceiling)
    res_tune, res_test = evaluate(tune, rules), evaluate(test, rules)
    best_fixed, chosen = choose(res_tune)
    best_fixed_test, _ = choose(res_test)
    marks = {"best fixed K on tuning": best_fixed, "chosen on tuning": chosen}
    text = (
        f"# Adaptive K rules\n\nCommand: `{cmd}`  \n{machine_line('cpu')}\n\n"
        f"Chosen on the tuning documents ({len(tune)} questions): {rule_name(chosen) if chosen else 'none'}; "
        f"best fixed K there: {rule_name(best_fixed)}. On the test questions ({len(test)}), best fixed K: "
        f"{rule_name(best_fixed_test)} {res_test[best_fixed_test][0]}/{len(test)}, "
        f"{res_test[best_fixed_test][1]:.0f} tokens; chosen rule: "
        + (f"{res_test[chosen][0]}/{len(test)}, {res_test[chosen][1]:.0f} tokens.\n\n" if chosen else "-\n\n")
        + f"## Tuning documents\n\n{table(res_tune, len(tune), marks)}\n\n"
        f"## Test documents (heldout_eval's questions)\n\n{table(res_test, len(test), marks)}\n"
    )
    save_text(args.out, "adaptive_k.md", text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
