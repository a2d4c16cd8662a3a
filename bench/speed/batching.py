"""Batched ragged requests on the bundled tiny model: 8 passkey prompts one by one vs as one batch.

    python -m bench.speed.batching [--out DIR | --record] [--lengths 3072 10240 ...] [--rounds 2] [--token-budget B]
    python -m bench.speed.batching --decode-cpu [--rounds 4] [--out DIR]

Eight passkey prompts of 3K-10K tokens (ragged: each has its own context length, needle depth and
chunk count) are answered with the demo's prefilling configuration, once one by one
(``generate(prompt=parts)`` eight times) and once as one batch (``generate(prompt=[parts, ...])``:
the chunks of all rows encoded and scored in shared forwards, one denoising loop over live blocks
padded to the longest row). Each row's tokens must equal its single run (checked and reported).
The table gives the seconds of each phase (prefill, scoring, decode) summed over the eight single
runs beside the batch's, and their ratio; rounds alternate which goes first.

What to expect on this CPU: prefill and scoring are compute-bound (matrix multiplies at full width,
chunk attention), so stacking rows gains little there. A denoising step is one forward over a
48-token live block against about 1.2K cached keys per row: its projections, MLP and LM head batch
(one call for all rows instead of one per row), and so does the call of its split-S attention (on CPU
torch's fused attention, one call for all rows of the same shape: :mod:`triton_kernels.split_s_cpu`),
but that attention computes each row's attention over that row's keys: the arithmetic is the same
batched or not and is compute-bound on a CPU (the share is measured and reported), so the decode
phase gains less than the number of rows. ``--token-budget`` keeps fewer keys per chunk and shows the trend.
On a GPU the Triton kernel serves all rows in one launch and a step of the 7B-class models is
bound by launches and weight reads, not by this attention: the gain there is predicted to be
larger, not measured.

An untimed warm-up (one single run and one batch) runs first and is reported apart with the model's
load time. ``--decode-cpu`` times the denoising phase alone in process CPU seconds at 1 torch thread,
with split-S attention apart, and states what bounds the ratio (``batching_decode_cpu.md``).
Writes ``batching.csv`` (provenance columns on every row) and ``batching.md`` (machine line)
to ``runs/bench/`` (git-ignored), to ``--out DIR``, or with ``--record`` to ``bench/results/``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import time

import torch

import dllm.model.modeling
from bench.fidelity.demo import TINY_PREFILLING
from bench.outputs import output_dir, study_parser, write_report, write_results
from dllm.eval.evaluation import case_inputs
from dllm.eval.tasks import make_case, score
from dllm.generate import generate
from dllm.model.loader import load_model

# ragged on purpose, long and short interleaved
LENGTHS = (3072, 10240, 4096, 9216, 5120, 8192, 6144, 7168)
DEPTHS = (0.0, 0.25, 0.5, 0.75, 1.0)
GEN, STEPS = 8, 8
# The demo's configuration; chunks encoded and scored 32 at a time (one run or the batch alike).
CONFIG = dataclasses.replace(TINY_PREFILLING, prefill_batch=32)
SEED = 10**9 + 29
PHASES = ("prefill", "scoring", "decode", "total")


def requests(model, lengths) -> tuple[list, list]:
    """The passkey cases and their prompt parts (needle depth cycling over :data:`DEPTHS`)."""
    cases = [make_case("passkey", n, DEPTHS[i % len(DEPTHS)], SEED + i, tokenizer=None) for i, n in enumerate(lengths)]
    return cases, [case_inputs(model, c, "prefilling")["prompt"] for c in cases]


def _generate(model, prompt, cfg):
    t0 = time.perf_counter()
    res = generate(model, method="prefilling", prompt=prompt, prefilling=cfg, gen_length=GEN, steps=STEPS)
    return res, time.perf_counter() - t0


def sequential(model, prompts, cfg) -> tuple[list, dict]:
    """The prompts one by one: results and per-phase seconds summed (``wall`` = the runs' wall clock)."""
    results, sums = [], dict.fromkeys(PHASES, 0.0) | {"wall": 0.0, "nfe": 0, "steps": 0}
    for parts in prompts:
        res, wall = _generate(model, parts, cfg)
        results.append(res)
        for k in PHASES:
            sums[k] += res.stats.seconds.get(k, 0.0)
        sums["wall"] += wall
        sums["nfe"] += res.stats.nfe
        sums["steps"] += res.stats.steps
    return results, sums


def batched(model, prompts, cfg) -> tuple:
    """The prompts as one batch: the result and its per-phase seconds."""
    res, wall = _generate(model, list(prompts), cfg)
    secs = {k: res.stats.seconds.get(k, 0.0) for k in PHASES} | {"wall": wall, "nfe": res.stats.nfe}
    return res, secs | {"steps": res.stats.steps}


@contextlib.contextmanager
def attention_timer(clock=time.perf_counter):
    """Seconds spent inside ``triton_kernels.split_s_attention`` as the model calls it (a list to sum),
    read from ``clock`` (wall by default; ``time.process_time`` for CPU time)."""
    kernels = dllm.model.modeling.triton_kernels
    inner, spent = kernels.split_s_attention, []

    def timed(*args, **kwargs):
        t0 = clock()
        out = inner(*args, **kwargs)
        spent.append(clock() - t0)
        return out

    kernels.split_s_attention = timed
    try:
        yield spent
    finally:
        kernels.split_s_attention = inner


def timed_denoise(model, policy, clock=time.perf_counter) -> tuple[float, float, torch.Tensor]:
    """One whole denoising loop of ``policy`` (maskgit_plus, :data:`GEN` tokens in :data:`STEPS` steps) from an
    all-mask response: its seconds, the seconds inside split-S attention (:func:`attention_timer`), both read
    from ``clock``, and the response tokens ``[B, GEN]``."""
    from dllm.decode.denoise import denoise
    from dllm.decode.unmasking import UnmaskingConfig

    resp = torch.full((policy.batch_size, GEN), model.mask_token_id, dtype=torch.long)
    with attention_timer(clock) as spent, torch.no_grad():
        t0 = clock()
        denoise(
            policy,
            resp,
            mask_id=model.mask_token_id,
            block_length=GEN,
            steps_per_block=STEPS,
            cfg=UnmaskingConfig(alg="maskgit_plus"),
        )
        total = clock() - t0
    return total, sum(spent), resp


def decode_cpu_time(model, prompts, cfg, rounds: int) -> list[dict]:
    """The denoising phase alone, 8 single runs vs one batch, in process CPU seconds (call it with 1 torch thread).

    The policies (prefill, scoring, static cache) are built once, untimed; then each round decodes the
    prompts one by one and as one batch (order alternating between rounds, one untimed decode of each
    first), timing the whole denoising loop and, inside it, the split-S attention calls
    (:func:`attention_timer` with ``time.process_time``). CPU time rather than wall time: on a shared
    machine a descheduled process does not count. Tokens of each batch row are compared with its single run.

    Returns:
        One dict per round: ``singles_s`` / ``batch_s`` (decode), ``singles_attn_s`` / ``batch_attn_s``
        (split-S attention inside it), ``equal_rows``, ``rows``.
    """
    from dllm.decode.timer import PhaseTimer
    from dllm.prefilling import build_prefilling_policy

    def policy(prompt):
        return build_prefilling_policy(model, None, prompt, cfg, PhaseTimer("cpu"), gen_length=GEN).policy

    def decode(pol):
        return timed_denoise(model, pol, time.process_time)

    singles, batch = [policy(p) for p in prompts], policy(list(prompts))
    for pol in [*singles, batch]:  # warm-up
        decode(pol)
    rows = []
    for r in range(rounds):
        if r % 2 == 0:
            one = [decode(pol) for pol in singles]
            bat = decode(batch)
        else:
            bat = decode(batch)
            one = [decode(pol) for pol in singles]
        equal = sum(int(torch.equal(o[2][0], bat[2][i])) for i, o in enumerate(one))
        rows.append(
            {
                "run": "decode-cpu",
                "round": r,
                "singles_s": sum(o[0] for o in one),
                "batch_s": bat[0],
                "singles_attn_s": sum(o[1] for o in one),
                "batch_attn_s": bat[1],
                "equal_rows": equal,
                "rows": len(prompts),
            }
        )
        print(f"  round {r}: decode CPU one by one {rows[-1]['singles_s']:.3f} s, batch {bat[0]:.3f} s", flush=True)
    return rows


def summarize_decode_cpu(rows: list[dict], load: tuple) -> str:
    """Markdown of :func:`decode_cpu_time`: decode, split-S and the rest, one by one vs batch, and what
    bounds the ratio (the batch's split-S alone against half the single runs' time)."""
    n = len(rows)
    mean = {k: sum(r[k] for r in rows) / n for k in ("singles_s", "batch_s", "singles_attn_s", "batch_attn_s")}
    rest_s, rest_b = mean["singles_s"] - mean["singles_attn_s"], mean["batch_s"] - mean["batch_attn_s"]
    lines = [
        f"| denoising phase, CPU s (mean of {n} rounds) | {rows[0]['rows']} runs one by one | one batch "
        "| one by one / batch |",
        "|---|---:|---:|---:|",
        f"| whole phase | {mean['singles_s']:.3f} | {mean['batch_s']:.3f} "
        f"| {mean['singles_s'] / mean['batch_s']:.2f}x |",
        f"| split-S attention | {mean['singles_attn_s']:.3f} | {mean['batch_attn_s']:.3f} "
        f"| {mean['singles_attn_s'] / mean['batch_attn_s']:.2f}x |",
        f"| the rest (projections, MLP, LM head, unmasking) | {rest_s:.3f} | {rest_b:.3f} | {rest_s / rest_b:.2f}x |",
        "",
        "Per round: "
        + "; ".join(f"{r['singles_s'] / r['batch_s']:.2f}x" for r in rows)
        + f". Rows equal to their single runs: {sum(r['equal_rows'] for r in rows)}/{n * rows[0]['rows']}. "
        f"Load average (1, 5, 15 min) at the end: {load[0]:.2f}, {load[1]:.2f}, {load[2]:.2f}.",
        "",
        f"Bound: 2x needs the batch's phase at or under {mean['singles_s'] / 2:.3f} s; its split-S attention alone "
        f"takes {mean['batch_attn_s']:.3f} s. Even if everything else in the batch cost nothing the ratio would be "
        f"{mean['singles_s'] / mean['batch_attn_s']:.2f}x at most.",
    ]
    return "\n".join(lines)


def attention_share(model, prompts, cfg) -> dict:
    """Share of the denoising phase spent in split-S attention: the longest prompt alone and the batch
    (one instrumented run each, after the timed rounds; the attention of the scoring passes is excluded
    by timing the decode phase only: the policy is built first)."""
    from dllm.decode.timer import PhaseTimer
    from dllm.prefilling import build_prefilling_policy

    longest = max(range(len(prompts)), key=lambda i: prompts[i].context.numel())
    out = {}
    for name, prompt in (("single", prompts[longest]), ("batch", list(prompts))):
        policy = build_prefilling_policy(model, None, prompt, cfg, PhaseTimer("cpu"), gen_length=GEN).policy
        total, attention, _ = timed_denoise(model, policy)
        out[name] = attention / total
    return out


def run(model, lengths, rounds: int, out_dir: str, *, cfg=CONFIG) -> list[dict]:
    """Warm-up, then ``rounds`` rounds of sequential vs batch (alternating order); returns the CSV rows."""
    cases, prompts = requests(model, lengths)
    t0 = time.perf_counter()
    _generate(model, prompts[0], cfg)  # warm-up at the measured shapes, untimed
    _generate(model, list(prompts), cfg)
    warm_s = time.perf_counter() - t0
    rows = [{"run": "warm-up", "seconds": round(warm_s, 4)}]
    for r in range(rounds):
        if r % 2 == 0:
            singles, seq = sequential(model, prompts, cfg)
            batch, bat = batched(model, prompts, cfg)
        else:
            batch, bat = batched(model, prompts, cfg)
            singles, seq = sequential(model, prompts, cfg)
        for run_name, secs in (("sequential", seq), ("batch", bat)):
            rows.append(
                {"run": run_name, "round": r, **{f"{k}_s": round(secs[k], 4) for k in (*PHASES, "wall")}}
                | {"nfe": secs["nfe"], "steps": secs["steps"]}
            )
        for i, (case, single) in enumerate(zip(cases, singles)):
            rows.append(
                {
                    "run": "request",
                    "round": r,
                    "request": i,
                    "tokens": prompts[i].context.numel(),
                    "depth": case.depth,
                    "answer_single": single.text[0],
                    "answer_batch": batch.text[i],
                    "correct": int(score("passkey", batch.text[i], case)),
                    "equal_tokens": int(torch.equal(single.tokens[0], batch.tokens[i])),
                    "selected_chunks": " ".join(map(str, batch.stats.rows[i]["selected_chunks"])),
                }
            )
        print(
            f"  round {r}: decode sequential {seq['decode']:.2f} s, batch {bat['decode']:.2f} s; "
            f"equal rows {sum(row.get('equal_tokens', 0) for row in rows if row.get('round') == r)}/{len(prompts)}",
            flush=True,
        )
    share = attention_share(model, prompts, cfg)
    rows.append({"run": "attention-share", **{f"{k}_decode_share": round(v, 4) for k, v in share.items()}})
    return rows


def summarize(rows: list[dict]) -> str:
    """Markdown: per-phase seconds (summed over rounds), ratio, and the per-request answers."""
    seq = [r for r in rows if r["run"] == "sequential"]
    bat = [r for r in rows if r["run"] == "batch"]
    req = [r for r in rows if r["run"] == "request"]
    n_req = len({r["request"] for r in req})
    lines = [
        f"| phase | {n_req} runs one by one s | one batch s | one by one / batch |",
        "|---|---:|---:|---:|",
    ]
    for phase in (*PHASES, "wall"):
        s = sum(r[f"{phase}_s"] for r in seq) / len(seq)
        b = sum(r[f"{phase}_s"] for r in bat) / len(bat)
        name = {"total": "total (generate)", "wall": "wall clock"}.get(phase, phase)
        lines.append(
            f"| {name} | {s:.2f} | {b:.2f} | {s / b:.2f}x |" if b > 0 else f"| {name} | {s:.2f} | {b:.2f} | - |"
        )
    nfe_s, nfe_b = seq[0]["nfe"], bat[0]["nfe"]
    lines += [
        "",
        f"Seconds are means over {len(seq)} round(s). Model forwards: {nfe_s} one by one, {nfe_b} as a batch; "
        f"denoising steps: {seq[0]['steps']} one by one, {bat[0]['steps']} as a batch.",
    ]
    share = next((r for r in rows if r["run"] == "attention-share"), None)
    if share:
        lines += [
            "",
            "Share of the denoising phase spent in split-S attention (on CPU torch's fused attention, one call "
            "for the rows of each shape: each row's attention over its own cached keys): "
            f"{share['single_decode_share']:.0%} for the longest prompt alone, "
            f"{share['batch_decode_share']:.0%} for the batch. That work does not shrink with batching; on a GPU "
            "the Triton kernel serves every row in one launch (the gain there is predicted, not measured).",
        ]
    equal = sum(r["equal_tokens"] for r in req)
    lines += [
        "",
        f"Each row equal to its single run: {equal}/{len(req)} (rows x rounds); "
        f"answers correct: {sum(r['correct'] for r in req)}/{len(req)}.",
        "",
        "| request | context tokens | needle depth | single-run answer | batch answer | equal tokens | kept chunks |",
        "|---:|---:|---:|---|---|:---:|---|",
    ]
    for r in req:
        if r["round"] != 0:
            continue
        lines.append(
            f"| {r['request']} | {r['tokens']} | {r['depth']:.2f} | {r['answer_single']!r} | {r['answer_batch']!r} "
            f"{'ok' if r['correct'] else 'wrong'} | {'yes' if r['equal_tokens'] else 'NO'} | {r['selected_chunks']} |"
        )
    return "\n".join(lines)


def main(argv=None) -> int:
    p = study_parser(__doc__, "bench")
    p.add_argument("--lengths", type=int, nargs="+", default=list(LENGTHS), help="context tokens of each request")
    p.add_argument("--rounds", type=int, default=2, help="sequential-vs-batch rounds (alternating order)")
    p.add_argument("--model", default=None, help="checkpoint directory (default: the bundled tiny model)")
    p.add_argument(
        "--token-budget",
        type=int,
        default=None,
        help="B, tokens kept per chunk (default: all): fewer cached keys make the steps' attention cheaper",
    )
    p.add_argument(
        "--decode-cpu",
        action="store_true",
        help="time the denoising phase alone in process CPU seconds with 1 torch thread, split-S attention "
        "apart (writes batching_decode_cpu.md)",
    )
    args = p.parse_args(argv)
    cfg = dataclasses.replace(CONFIG, token_budget=args.token_budget)
    out = str(output_dir(args, "bench"))
    if args.decode_cpu:
        return decode_cpu_main(args, argv, cfg, out)
    torch.set_num_threads(2)
    t0 = time.perf_counter()
    model = load_model(args.model, device="cpu")
    load_s = time.perf_counter() - t0
    rows = run(model, args.lengths, max(1, args.rounds), out, cfg=cfg)
    warm = next(r["seconds"] for r in rows if r["run"] == "warm-up")
    title = f"Batched ragged requests: {len(args.lengths)} passkey prompts one by one vs one batch (bundled tiny model)"
    paragraphs = [
        f"Configuration: {cfg}; {GEN} response tokens, {STEPS} steps; context lengths {args.lengths}.",
        f"Start-up, not in the table: model load {load_s:.2f} s; untimed warm-up (one single run and one batch) "
        f"{warm:.2f} s.",
        summarize(rows),
    ]
    seconds = time.perf_counter() - t0
    write_results(out, "batching", rows, "bench.speed.batching", argv, seconds, title, paragraphs)
    return 0


def decode_cpu_main(args, argv, cfg, out: str) -> int:
    """``--decode-cpu``: :func:`decode_cpu_time` at 1 torch thread; writes ``batching_decode_cpu.md``."""
    torch.set_num_threads(1)
    t0 = time.perf_counter()
    model = load_model(args.model, device="cpu")
    _cases, prompts = requests(model, args.lengths)
    rows = decode_cpu_time(model, prompts, cfg, max(1, args.rounds))
    os.makedirs(out, exist_ok=True)
    write_report(
        os.path.join(out, "batching_decode_cpu.md"),
        f"Denoising phase in CPU time: {len(args.lengths)} passkey prompts one by one vs one batch (1 thread)",
        "bench.speed.batching",
        argv,
        "cpu",
        time.perf_counter() - t0,
        [
            f"Configuration: {cfg}; {GEN} response tokens, {STEPS} steps; context lengths {args.lengths}.",
            summarize_decode_cpu(rows, os.getloadavg()),
        ],
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
