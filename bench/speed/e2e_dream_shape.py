"""End-to-end speed at the shape of Dream-7B with random weights: the paper's headline, ready to measure.

    python -m bench.speed.e2e_dream_shape [--shape dream7b|cpu] [--out DIR] [--budget-s 200] [--predict-only]

Decoding speed does not depend on the weights: every method runs a fixed number of denoising steps
(Dream's ``maskgit_plus`` rule, one token per step by default) and the same shapes whatever the
logits say. So a model of Dream-v0-7B's exact shape (``tests/data/reference/dream-v0-7b/config.json``:
28 layers, hidden 3584, SwiGLU 18944, 28 query / 4 KV heads of D = 128, vocabulary 152064; 7.6 B
parameters) is built without a checkpoint, with random bf16 weights created on the device (15 GB,
never an fp32 copy), and decodes random prompts of 8K, 16K and 32K tokens with

* ``dense``: every step re-encodes prompt + response (the transformers baseline of the paper);
* ``prefix_cache``: the prompt's K/V cached once per block, the live block recomputed (Fast-dLLM);
* ``prefilling``: Prefilling-dLLM (arXiv 2606.10537) at its defaults C = 1024, K = 4 chunks.

All through the public API, ``dllm.generate``, side by side in one run. Each cell first decodes once
untimed with one denoising step (same shapes, so Triton compilation, cuBLAS set-up and the allocator's
growth are paid there; :mod:`bench.warmup` explains why), then is timed: the median of 3 runs when a
run is predicted to take under 3 s, else one run. Per cell it reports total, prefill, scoring and
decode seconds, seconds per denoising step, NFE, the CUDA memory peak, the speedups against dense and
against prefix_cache, and the paper's anchor beside them (9.1x-28.0x end to end at 8K-32K over a
transformers baseline).

Time budget: a cell is skipped, with its predicted time in the table, when its prediction exceeds the
time left (:class:`bench.budget.TimeBudget`). Predictions come from :func:`predict_cell_s`, a roofline
of each forward the method runs on an H200 (FLOPs of :mod:`bench.speed.flop_model`, weights and KV read
from HBM; stated efficiencies), scaled by the ratio of measured to modelled time of the method's last
measured cell. ``--predict-only`` prints that a-priori table without running anything (predicted
figures, not measurements).

``--shape cpu`` is the same path at a 2-layer narrow shape (7 query heads over 1 KV head, as Dream's
GQA group of 7) and short contexts, for the CPU test and the dry run of ``bench/gpu_check.sh``; its
timings mean nothing. Writes ``e2e_dream_shape.csv`` (provenance on every row) and
``e2e_dream_shape.md`` to ``--out`` (default ``runs/bench/``, git-ignored).

The host time of one prefilling denoising step at Dream-7B's layer and head layout, beside the predicted H200
GPU time of the same step, is :mod:`bench.speed.host_step`'s (``e2e_dream_shape_host.md``).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from bench.budget import TimeBudget
from bench.kernels.roofline import H200_PEAK
from bench.outputs import REPO_ROOT
from bench.provenance import machine_line, write_csv
from bench.speed import flop_model
from dllm import DiffusionLM, ModelConfig, PrefillingConfig, PromptParts, generate, load_config

DREAM_CONFIG_DIR = REPO_ROOT / "tests" / "data" / "reference" / "dream-v0-7b"  # Dream-v0-Instruct-7B's config.json
METHODS = ("prefilling", "prefix_cache", "dense")  # run order in a length: cheapest first, dense last
TABLE_ORDER = ("dense", "prefix_cache", "prefilling")
PAPER_ANCHOR = "9.1-28.0x"  # arXiv 2606.10537: Prefilling-dLLM vs a transformers baseline, end to end, 8K-32K
PREFIX_TOKENS, QUERY_TOKENS = 16, 48  # prompt = BOS + 15 prefix tokens, context, a 48-token question

# Roofline assumptions of the prediction (H200 SXM figures of bench/kernels/roofline.py).
MMA_EFFICIENCY = 0.5  # of the 989 TFLOPS bf16 dense tensor peak (large GEMMs and FlashAttention reach 50-70%)
HBM_EFFICIENCY = 0.8  # of 4.8 TB/s, for the weight / KV reads of the short decode forwards
HOST_S_PER_LAYER = 100e-6  # eager launches (~20 kernels per layer) and the per-step synchronisation


@dataclass(frozen=True)
class Shape:
    """A model shape and its grid: the contexts, and Prefilling-dLLM's chunking at that shape."""

    name: str
    config: ModelConfig
    lengths: tuple
    chunk_size: int
    top_k: int


def dream7b_config() -> ModelConfig:
    """Dream-v0-Instruct-7B's architecture, read from its vendored ``config.json``."""
    return load_config(str(DREAM_CONFIG_DIR))


def cpu_config() -> ModelConfig:
    """Dream's family and GQA group (7 query heads per KV head) at 2 layers and narrow widths."""
    return dataclasses.replace(
        dream7b_config(),
        vocab_size=1024,
        hidden_size=112,
        intermediate_size=256,
        num_layers=2,
        num_heads=7,
        num_kv_heads=1,
        head_dim=16,
        mask_token_id=1023,
        bos_token_id=1022,
        eos_token_id=1021,
        pad_token_id=1021,
    )


def shape_of(name: str) -> Shape:
    """``dream7b`` (8K/16K/32K, C = 1024, K = 4: the paper's defaults) or ``cpu`` (512-2048, C = 64, K = 4:
    7 to 31 chunks, so every length scores and selects as at 8K-32K)."""
    if name == "dream7b":
        return Shape(name, dream7b_config(), (8192, 16384, 32768), 1024, 4)
    if name == "cpu":
        return Shape(name, cpu_config(), (512, 1024, 2048), 64, 4)
    raise ValueError(f"unknown shape {name!r}; expected 'dream7b' or 'cpu'")


def n_params(cfg: ModelConfig) -> int:
    """Parameters of a :class:`~dllm.model.modeling.DiffusionLM` of ``cfg`` (untied head, q/k/v bias as configured)."""
    d, hq, hkv, hd, inter = cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.intermediate_size
    attn = d * hq * hd + 2 * d * hkv * hd + hq * hd * d + (hq * hd + 2 * hkv * hd if cfg.qkv_bias else 0)
    layer = attn + 3 * d * inter + 2 * d
    heads = cfg.vocab_size * d * (1 if cfg.tie_word_embeddings else 2)
    return cfg.num_layers * layer + heads + d


def build_random_model(cfg: ModelConfig, device, dtype: torch.dtype, *, seed: int = 0, std: float = 0.02):
    """A :class:`~dllm.model.modeling.DiffusionLM` of ``cfg`` with random weights, allocated on ``device`` in ``dtype``.

    The module is built on the meta device, cast there (no memory), then allocated once on ``device``
    in ``dtype``: 7.6 B parameters cost 15 GB in bf16 and never exist in fp32. Linear and embedding
    weights are N(0, ``std``) (Dream's ``initializer_range``), biases 0, RMSNorm weights 1.

    Args:
        cfg: the architecture.
        device: where the weights live (``cuda`` for the Dream-7B shape).
        dtype: floating dtype of every parameter (bf16 on CUDA, fp32 on CPU).
        seed: seeds the weights (``torch.Generator`` on ``device``).
        std: standard deviation of the weight matrices.

    Returns:
        The model in eval mode, gradients off, ``tokenizer`` None.

    Raises:
        ValueError: a non-floating ``dtype``.
    """
    if not dtype.is_floating_point:
        raise ValueError(f"dtype must be a floating dtype, got {dtype}")
    device = torch.device(device)
    with torch.device("meta"):
        model = DiffusionLM(cfg)
    model = model.to(dtype).to_empty(device=device)
    if cfg.tie_word_embeddings:  # to_empty breaks the tie
        model.lm_head.weight = model.embed_tokens.weight
    gen = torch.Generator(device=device).manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.fill_(1.0)
            elif name.endswith(".bias"):
                p.zero_()
            else:
                p.normal_(0.0, std, generator=gen)
    return model.eval().requires_grad_(False)


def random_prompt(cfg: ModelConfig, length: int, device, *, seed: int = 0) -> PromptParts:
    """Random token ids of ``length`` prompt tokens: BOS + 15 prefix tokens, the context, a 48-token query.

    Ids are drawn on the CPU (the same prompt on every device) from ``[0, vocab)`` without the mask id.

    Raises:
        ValueError: ``length`` leaves no context (at most 64 tokens).
    """
    n_ctx = length - PREFIX_TOKENS - QUERY_TOKENS
    if n_ctx < 1:
        raise ValueError(f"a prompt of {length} tokens leaves no context after {PREFIX_TOKENS + QUERY_TOKENS} tokens")
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, cfg.vocab_size - 1, (length,), generator=g)
    ids[ids >= cfg.mask_token_id] += 1  # skip the mask id, keep the draw uniform over the others
    if cfg.bos_token_id is not None:
        ids[0] = cfg.bos_token_id
    ids = ids.to(device)
    return PromptParts(ids[:PREFIX_TOKENS], ids[PREFIX_TOKENS : PREFIX_TOKENS + n_ctx], ids[PREFIX_TOKENS + n_ctx :])


# ----------------------------------------------------------------------------- prediction


def _forward_s(arch: flop_model.Arch, weight_bytes: float, queries, keys, logits=0.0, kv_tokens=0.0, elt=2) -> float:
    """Roofline seconds of one forward on an H200: max(FLOPs, HBM bytes) at the stated efficiencies + host."""
    flops = arch.forward(queries, keys, logits)
    kv_bytes = 2 * arch.layers * arch.hkv * arch.head * kv_tokens * elt  # cached K and V read once
    compute = flops / (MMA_EFFICIENCY * H200_PEAK.mma_flops_s)
    memory = (weight_bytes + kv_bytes) / (HBM_EFFICIENCY * H200_PEAK.hbm_bytes_s)
    return max(compute, memory) + HOST_S_PER_LAYER * arch.layers


def predict_cell_s(
    cfg: ModelConfig,
    method: str,
    length: int,
    gen: int,
    steps: int,
    chunk: int,
    top_k: int | None,
    token_budget: int | None = None,
) -> dict:
    """Predicted seconds of one generation on an H200 in bf16, per phase (``prefill``, ``scoring``, ``decode``).

    Forwards counted as :func:`dllm.generate` runs them: ``dense`` ``steps`` x prompt + response;
    ``prefix_cache`` one build over prompt + response, then ``steps`` live forwards of 1 + ``gen`` tokens
    over the whole prompt's K/V; ``prefilling`` one batched forward over the ``N`` chunks of ``chunk`` + 1
    tokens (and the prefix), the draft pass, two scoring passes of ``N`` rows (query + draft tokens each,
    logits of every row), then ``steps`` live forwards of query + response over prefix + ``top_k``
    chunks (``top_k`` None: all; ``token_budget`` B: B + 1 tokens of each). Every forward reads all
    weights once. Assumptions: :data:`MMA_EFFICIENCY`,
    :data:`HBM_EFFICIENCY`, :data:`HOST_S_PER_LAYER`. A prediction, not a measurement.
    """
    a = flop_model.Arch.of(cfg)
    w = 2.0 * n_params(cfg)
    n = length + gen
    if method == "dense":
        return {"prefill": 0.0, "scoring": 0.0, "decode": steps * _forward_s(a, w, n, n, gen)}
    if method == "prefix_cache":
        live = 1 + gen
        return {
            "prefill": _forward_s(a, w, n, n),
            "scoring": 0.0,
            "decode": steps * _forward_s(a, w, live, n, gen, kv_tokens=n),
        }
    if method != "prefilling":
        raise ValueError(f"unknown method {method!r}")
    ctx = length - PREFIX_TOKENS - QUERY_TOKENS
    n_chunks = math.ceil(ctx / chunk)
    t = chunk + 1
    m = QUERY_TOKENS + 4  # query + PrefillingConfig's 4 draft slots
    prefill = _forward_s(a, w, n_chunks * t, t) + _forward_s(a, w, PREFIX_TOKENS, PREFIX_TOKENS)
    scoring = _forward_s(a, w, PREFIX_TOKENS + m, PREFIX_TOKENS + m, 4) + 2 * _forward_s(
        a, w, n_chunks * m, t + m, n_chunks * m, kv_tokens=n_chunks * t
    )
    kept = PREFIX_TOKENS + min(top_k or n_chunks, n_chunks) * (t if token_budget is None else token_budget + 1)
    live = QUERY_TOKENS + gen
    decode = steps * _forward_s(a, w, live, kept + live, gen, kv_tokens=kept)
    return {"prefill": prefill, "scoring": scoring, "decode": decode}


def predicted_total(cfg, method, length, gen, steps, pcfg: PrefillingConfig) -> float:
    """Seconds of :func:`predict_cell_s` summed over its phases, with ``pcfg``'s C, K and B."""
    return sum(predict_cell_s(cfg, method, length, gen, steps, pcfg.chunk_size, pcfg.top_k, pcfg.token_budget).values())


# ----------------------------------------------------------------------------- the run


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _decode(model, parts: PromptParts, method: str, pcfg: PrefillingConfig, gen: int, steps: int):
    if method == "prefilling":
        return generate(model, method=method, prompt=parts, prefilling=pcfg, gen_length=gen, steps=steps)
    return generate(model, parts.full()[None], method=method, gen_length=gen, steps=steps)


def run_cell(model, parts, method, pcfg, gen, steps, repeats) -> dict:
    """One untimed 1-step warm-up decode, then ``repeats`` timed decodes; the median run's figures."""
    dev = model.device
    t0 = time.perf_counter()
    _decode(model, parts, method, pcfg, gen, 1)
    _sync(dev)
    warm_s = time.perf_counter() - t0
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)
    runs = [_decode(model, parts, method, pcfg, gen, steps) for _ in range(repeats)]
    res = sorted(runs, key=lambda r: r.stats.seconds["total"])[len(runs) // 2]
    sec, st = res.stats.seconds, res.stats
    return {
        "status": "ok",
        "repeats": repeats,
        "total_s": sec["total"],
        "total_s_spread": (max(r.stats.seconds["total"] for r in runs) - min(r.stats.seconds["total"] for r in runs)),
        "prefill_s": sec.get("prefill", 0.0),
        "scoring_s": sec.get("scoring", 0.0),
        "decode_s": sec.get("decode", 0.0),
        "step_s": sec.get("decode", 0.0) / max(1, st.steps),
        "steps": st.steps,
        "nfe": st.nfe,
        "cached_tokens": st.extra.get("cached_tokens", ""),
        "peak_gib": round(torch.cuda.max_memory_allocated(dev) / 2**30, 2) if dev.type == "cuda" else "",
        "warmup_s": warm_s,
    }


def _timed_cell(model, parts, method, pcfg, gen, steps, repeats) -> dict:
    try:
        return run_cell(model, parts, method, pcfg, gen, steps, repeats)
    except torch.cuda.OutOfMemoryError as e:  # report and go on: the next cells may still fit
        torch.cuda.empty_cache()
        return {"status": "OOM", "error": str(e).splitlines()[0]}


def _cell_line(r: dict, model_s: float) -> str:
    head = f"  {r['method']:>12} @ {r['length']:>6}: "
    if r["status"] != "ok":
        return head + r["status"]
    return head + (
        f"{r['total_s']:.3f} s total, {1e3 * r['step_s']:.2f} ms/step (x{r['repeats']}; "
        f"predicted on an H200 {model_s:.2f} s)"
    )


def run(
    shape: Shape,
    *,
    device,
    dtype,
    lengths,
    methods,
    gen: int,
    steps: int,
    pcfg: PrefillingConfig,
    budget_s: float,
    log=print,
    checkpoint=None,
) -> tuple[list[dict], str]:
    """Build the random model and time every (length, method) cell the budget allows.

    ``checkpoint(rows)``, if given, is called after every cell (the CSV is rewritten there, so a run
    stopped by a timeout keeps its finished cells).

    Returns:
        (rows, start-up line). One row per cell: ``status`` ``ok``, ``OOM`` or ``skipped: predicted ...``,
        the measured figures of :func:`run_cell` and ``predicted_s`` (:func:`predict_cell_s`).
    """
    budget = TimeBudget(budget_s)
    device = torch.device(device)
    t0 = time.perf_counter()
    model = build_random_model(shape.config, device, dtype)
    _sync(device)
    build_s = time.perf_counter() - t0
    log(f"model: {_count(n_params(shape.config))} random parameters in {dtype} on {device}, built in {build_s:.1f} s")
    rows, warm = [], {}
    for length in lengths:
        parts = random_prompt(shape.config, length, device, seed=length)
        for method in methods:
            model_s = predicted_total(shape.config, method, length, gen, steps, pcfg)
            warm_model_s = predicted_total(shape.config, method, length, gen, 1, pcfg)
            predicted = budget.predict(method, model_s)
            repeats = 3 if predicted < 3.0 else 1
            row = {"shape": shape.name, "length": length, "method": method, "gen_length": gen}
            row |= {"chunk_size": pcfg.chunk_size, "top_k": pcfg.top_k, "token_budget": pcfg.token_budget}
            row["predicted_h200_s"] = round(model_s, 3)
            reason = budget.skip_if_over((method, length), predicted * repeats + budget.predict(method, warm_model_s))
            if reason:  # predicted_s: this run's calibrated prediction of the timed decode
                rows.append(row | {"status": reason, "predicted_s": round(predicted, 3)})
                log(f"  {method:>12} @ {length:>6}: {reason}")
            else:
                rows.append(row | _timed_cell(model, parts, method, pcfg, gen, steps, repeats))
                log(_cell_line(rows[-1], model_s))
                if rows[-1]["status"] == "ok":
                    budget.calibrate(method, rows[-1]["total_s"], model_s)
                    warm[method] = warm.get(method, 0.0) + rows[-1]["warmup_s"]
            if checkpoint is not None:
                checkpoint(rows)
    warm_txt = ", ".join(f"{m} {s:.2f} s" for m, s in warm.items())
    return rows, (
        f"Start-up, not in the table: model build {build_s:.2f} s; untimed warm-up decodes (one denoising step "
        f"before every cell), summed per method: {warm_txt or 'none'}."
    )


def _count(n: int) -> str:
    return f"{n / 1e9:.2f} B" if n >= 1e9 else f"{n / 1e6:.2f} M"


def _fmt(x, spec=".2f", unit="") -> str:
    return "-" if x in (None, "") else f"{x:{spec}}{unit}"


def summarize(rows, shape: Shape, *, steps: int, gen: int, predict_only: bool = False) -> str:
    """The Markdown summary: one row per (length, method), ratios against dense and prefix_cache."""
    by = {(r["length"], r["method"]): r for r in rows}
    head = (
        "| context tokens | method | status | total s | prefill s | scoring s | decode s | per-step ms | NFE "
        "| peak GiB | vs dense | vs prefix_cache | predicted H200 s | predicted vs dense | paper vs dense |"
    )
    lines = [head, "|---:|---|---|" + "---:|" * 12]
    estimated = False
    for length in sorted({r["length"] for r in rows}):
        for method in TABLE_ORDER:
            r = by.get((length, method))
            if r is None:
                continue
            ok = r.get("status") == "ok"
            ratios = []  # only of a method over a baseline it is meant to beat
            for base in ("dense", "prefix_cache"):
                b = by.get((length, base))
                beats = TABLE_ORDER.index(method) > TABLE_ORDER.index(base)
                if not (ok and beats and b is not None):
                    ratios.append("-")
                elif b.get("status") == "ok":
                    ratios.append(f"{b['total_s'] / r['total_s']:.1f}x")
                elif "predicted_s" in b:  # the baseline was skipped: its calibrated prediction, marked
                    ratios.append(f"~{b['predicted_s'] / r['total_s']:.1f}x")
                    estimated = True
                else:
                    ratios.append("-")
            pd = by.get((length, "dense"))
            pred = f"{pd['predicted_h200_s'] / r['predicted_h200_s']:.1f}x" if pd and method != "dense" else "-"
            lines.append(
                f"| {length} | {method} | {r.get('status', '-')} | {_fmt(r.get('total_s'), '.3f')} "
                f"| {_fmt(r.get('prefill_s'), '.3f')} | {_fmt(r.get('scoring_s'), '.3f')} "
                f"| {_fmt(r.get('decode_s'), '.3f')} | {_fmt(r['step_s'] * 1e3 if ok else None)} "
                f"| {_fmt(r.get('nfe'), 'd') if ok else '-'} | {_fmt(r.get('peak_gib'))} | {ratios[0]} | {ratios[1]} "
                f"| {r['predicted_h200_s']:.2f} | {pred} | {PAPER_ANCHOR if method == 'prefilling' else '-'} |"
            )
    cfg = shape.config
    p0 = rows[0]
    notes = [
        "",
        f"Shape {shape.name}: {cfg.num_layers} layers, hidden {cfg.hidden_size}, SwiGLU {cfg.intermediate_size}, "
        f"{cfg.num_heads}/{cfg.num_kv_heads} heads of D={cfg.head_dim}, vocabulary {cfg.vocab_size} "
        f"({_count(n_params(cfg))} parameters, random weights). {gen} new tokens in {steps} denoising steps, "
        f"one block; prefilling C={p0['chunk_size']}, K={p0['top_k']}, B={p0['token_budget'] or 'all'}. "
        f"Prompt: {PREFIX_TOKENS} prefix + context + {QUERY_TOKENS} query tokens = context tokens.",
        "Predicted H200 s: a roofline of every forward (FLOPs at "
        f"{MMA_EFFICIENCY:.0%} of 989 TFLOPS bf16, weights and KV at {HBM_EFFICIENCY:.0%} of 4.8 TB/s, "
        f"{HOST_S_PER_LAYER * 1e6:.0f} us host time per layer per forward): predicted, not measured.",
        f"Paper: Prefilling-dLLM {PAPER_ANCHOR} end to end at 8K-32K against a transformers baseline "
        "(arXiv 2606.10537); our dense uses SDPA (FlashAttention on a GPU), a stronger baseline.",
    ]
    if estimated:
        notes.append(
            "~: against a baseline skipped for time, at its prediction calibrated on this run's smaller contexts."
        )
    if predict_only:
        notes.append("Nothing was run (--predict-only): every figure above is predicted.")
    return "\n".join(lines + notes)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    cuda = torch.cuda.is_available()
    p.add_argument("--shape", choices=("dream7b", "cpu"), default="dream7b" if cuda else "cpu")
    p.add_argument("--device", default=None, help="default: cuda for dream7b, cpu for the cpu shape")
    p.add_argument("--lengths", type=int, nargs="+", default=None, help="context tokens (default: the shape's)")
    p.add_argument("--methods", nargs="+", choices=METHODS, default=list(METHODS))
    p.add_argument("--gen-length", type=int, default=32, help="new tokens (one block)")
    p.add_argument("--steps", type=int, default=None, help="denoising steps (default: gen length)")
    p.add_argument("--chunk-size", type=int, default=None, help="C (default: the shape's; 1024 for dream7b)")
    p.add_argument("--top-k", type=int, default=None, help="K (default: the shape's; 4)")
    p.add_argument("--token-budget", type=int, default=None, help="B (default: all tokens of a kept chunk)")
    p.add_argument("--budget-s", type=float, default=200.0, help="seconds for the whole run, model build included")
    p.add_argument("--predict-only", action="store_true", help="print the predicted table, run nothing")
    p.add_argument("--out", default=str(REPO_ROOT / "runs" / "bench"), help="output folder (default: runs/bench/)")
    p.add_argument(
        "--threads",
        type=int,
        default=1,
        help="CPU: torch threads (default 1: on a small shared box an OpenMP team waiting for a descheduled "
        "thread made steps 50x slower)",
    )
    args = p.parse_args(argv)
    shape = shape_of(args.shape)
    device = torch.device(args.device or ("cuda" if args.shape == "dream7b" else "cpu"))
    steps = args.steps or args.gen_length
    try:
        if device.type == "cuda" and not cuda and not args.predict_only:
            raise ValueError("CUDA is not available (pass --shape cpu, or --predict-only for the predicted table)")
        if args.shape == "dream7b" and device.type != "cuda" and not args.predict_only:
            raise ValueError("the dream7b shape needs a CUDA device (15 GB of bf16 weights); use --shape cpu")
        if args.gen_length < 1 or steps < 1:
            raise ValueError("--gen-length and --steps must be >= 1")
        pcfg = PrefillingConfig(
            chunk_size=args.chunk_size or shape.chunk_size,
            top_k=args.top_k or shape.top_k,
            token_budget=args.token_budget,
        )
        lengths = tuple(args.lengths or shape.lengths)
        for length in lengths:
            n_chunks = math.ceil((length - PREFIX_TOKENS - QUERY_TOKENS) / pcfg.chunk_size)
            if length <= PREFIX_TOKENS + QUERY_TOKENS or n_chunks < pcfg.top_k:
                raise ValueError(
                    f"context length {length} gives {max(n_chunks, 0)} chunks of {pcfg.chunk_size}, fewer than "
                    f"top-k {pcfg.top_k}"
                )
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if device.type == "cpu" and args.threads:
        torch.set_num_threads(args.threads)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    if args.predict_only:
        rows = [
            {"length": n, "method": m, "status": "predicted", "chunk_size": pcfg.chunk_size, "top_k": pcfg.top_k}
            | {"token_budget": pcfg.token_budget}
            | {"predicted_h200_s": predicted_total(shape.config, m, n, args.gen_length, steps, pcfg)}
            for n in lengths
            for m in args.methods
        ]
        print(summarize(rows, shape, steps=steps, gen=args.gen_length, predict_only=True))
        return 0
    print(machine_line(str(device)), flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows, startup = run(
        shape,
        device=device,
        dtype=dtype,
        lengths=lengths,
        methods=args.methods,
        gen=args.gen_length,
        steps=steps,
        pcfg=pcfg,
        budget_s=args.budget_s,
        log=lambda s: print(s, flush=True),
        checkpoint=lambda rows: write_csv(out / "e2e_dream_shape.csv", rows, str(device)),
    )
    table = "\n".join([summarize(rows, shape, steps=steps, gen=args.gen_length), startup, machine_line(str(device))])
    (out / "e2e_dream_shape.md").write_text(table + "\n", encoding="utf-8")
    print(table)
    failed = [r for r in rows if r["status"] == "OOM"]
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
