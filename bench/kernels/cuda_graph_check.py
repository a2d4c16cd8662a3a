"""CUDA-graph decode step vs eager: token for token, and the time per denoising step both ways (GPU only).

    python -m bench.kernels.cuda_graph_check [--out DIR] [--layers 28] [--steps 32] [--repeats 20] [--dry-run]

The prefilling loop replays each denoising step's forward from a CUDA graph
(:class:`dllm.decode.step_graph.GraphedStep`; ``generate(cuda_graph=None)`` turns it on where supported). This
check runs the same generations both ways and compares them:

1. The bundled tiny model (real weights) on passkey prompts, one at a time and as a ragged batch:
   ``generate(cuda_graph=False)`` and ``generate(cuda_graph=True)`` must give the same tokens; the
   decode phase's seconds per step are reported both ways (each after an untimed warm-up run; a graph
   run's decode phase includes its capture).
2. A model of Dream-v0-7B's shape (the vendored ``config.json``: 28 layers, hidden 3584, 28 / 4 heads of
   D = 128; random bf16 weights, ``--layers`` to shorten it) decoding over a random static cache of the
   paper's default selection (a 16-token prefix and K = 4 chunks of C = 1024 tokens + anchor), 1 row and 8
   ragged rows: the steady-state time of one step's forward eager vs replayed (median of ``--repeats``,
   after the capture), the largest logit difference, and a whole ``--steps``-step denoising loop both
   ways, token for token.

Without CUDA (or with the Triton interpreter, or the torch reference backend forced, or ``--dry-run``)
it writes why it skipped and exits 0: the dry run of ``bench/gpu_check.sh``, which runs this stage with
8 layers (a step's host launches and weight reads both grow with the layers, so eager / graph is about
the same at 28; predicted, the 28-layer figure is one ``--layers 28`` away). It exits 1 when a
graph run's tokens differ from the eager run's. Writes ``cuda_graph.csv`` (provenance on every
row) and ``cuda_graph.md`` to ``--out`` (default ``runs/bench/``, git-ignored).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import sys
import time
from pathlib import Path

import torch

from bench.outputs import REPO_ROOT
from bench.provenance import machine_line, write_csv
from bench.speed.e2e_dream_shape import _sync, build_random_model, dream7b_config
from dllm.decode.step_graph import cuda_graph_support

PASSKEY_LENGTHS = (4096, 8192, 6000)


def bundled_rows(gen: int, device="cuda") -> list[dict]:
    """Part 1: the bundled model, single prompts and one ragged batch, graph vs eager."""
    from bench.fidelity.demo import TINY_PREFILLING
    from dllm import generate, load_model
    from dllm.eval.evaluation import case_inputs
    from dllm.eval.tasks import make_case, score

    model = load_model(device=device)
    cases = [make_case("passkey", n, 0.5, 50 + i, tokenizer=None) for i, n in enumerate(PASSKEY_LENGTHS)]
    prompts = [case_inputs(model, c, "prefilling")["prompt"] for c in cases]
    kw = dict(method="prefilling", prefilling=TINY_PREFILLING, gen_length=gen, steps=gen)
    runs = [(f"passkey {c.length}", p, [c]) for c, p in zip(cases, prompts)] + [("batch of 3", prompts, cases)]
    rows = []
    for name, prompt, its_cases in runs:
        out = {}
        for graph in (False, True):
            generate(model, prompt=prompt, cuda_graph=graph, **kw)  # warm-up: compilation, allocator
            out[graph] = generate(model, prompt=prompt, cuda_graph=graph, **kw)
        e, g = out[False], out[True]
        rows.append(
            {
                "part": "bundled",
                "case": name,
                "rows": len(its_cases),
                "equal_tokens": int(torch.equal(e.tokens, g.tokens)),
                "eager_ms_per_step": round(1e3 * e.stats.seconds["decode"] / e.stats.steps, 3),
                "graph_ms_per_step": round(1e3 * g.stats.seconds["decode"] / g.stats.steps, 3),
                "correct": sum(int(score("passkey", g.text[i], c)) for i, c in enumerate(its_cases)),
                "graph": g.stats.extra.get("cuda_graph", "-"),  # "replayed", or why it ran eagerly
            }
        )
        print(rows[-1], flush=True)
    return rows


def dream_model(layers: int):
    """Dream-v0-7B's architecture with ``layers`` layers and random bf16 weights, on the GPU (built as
    :func:`bench.speed.e2e_dream_shape.build_random_model` does: never in fp32)."""
    return build_random_model(dataclasses.replace(dream7b_config(), num_layers=layers), "cuda", torch.bfloat16).eval()


def _random_cache(model, n_rows: int, seed: int, chunk: int):
    """A 16-token prefix + 4 chunks of ``chunk`` tokens + anchor per row, random K/V in the model's dtype."""
    from dllm.model.kv_cache import Segment, StaticKVCache

    cfg, dev = model.config, model.device
    g = torch.Generator(device=dev).manual_seed(seed)

    def seg(n):
        shape = (n, cfg.num_kv_heads, cfg.head_dim)
        ks = [torch.randn(shape, generator=g, device=dev, dtype=model.dtype) for _ in range(cfg.num_layers)]
        vs = [torch.randn(shape, generator=g, device=dev, dtype=model.dtype) for _ in range(cfg.num_layers)]
        return Segment(ks, vs, n)

    return StaticKVCache.from_rows([[seg(16)] + [seg(chunk + 1) for _ in range(4)] for _ in range(n_rows)])


def dream_rows(model, steps: int, repeats: int, *, chunk: int = 1024) -> list[dict]:
    """Part 2: steady-state step time and a whole loop, eager vs graph, over a random cache (1 and 8 rows)."""
    from dllm.decode.denoise import denoise
    from dllm.decode.policies import PrefillingPolicy
    from dllm.decode.unmasking import UnmaskingConfig

    dev = model.device
    vocab = min(model.config.vocab_size, model.mask_token_id)  # token ids below the mask id
    rows = []
    with torch.no_grad():
        for n_rows in (1, 8):
            cache = _random_cache(model, n_rows, seed=n_rows, chunk=chunk)
            g = torch.Generator(device=dev).manual_seed(1)
            queries = [torch.randint(0, vocab, (40 + 3 * b,), generator=g, device=dev) for b in range(n_rows)]
            query = queries[0][None] if n_rows == 1 else queries
            start = 16 + 4 * (chunk + 1)
            resp0 = torch.full((n_rows, steps), model.mask_token_id, dtype=torch.long, device=dev)
            result = {}
            for graph in (False, True):
                policy = PrefillingPolicy(model, query, start, cache, steps, 0, cuda_graph=graph)
                first = policy.logits(resp0).clone()  # eager: warm-up; graph: warm-up + capture
                times = []
                for _ in range(repeats):
                    _sync(dev)
                    t0 = time.perf_counter()
                    policy.logits(resp0)
                    _sync(dev)
                    times.append(time.perf_counter() - t0)
                resp = resp0.clone()
                denoise(
                    policy,
                    resp,
                    mask_id=model.mask_token_id,
                    block_length=steps,
                    steps_per_block=steps,
                    cfg=UnmaskingConfig(alg="maskgit_plus"),
                )
                result[graph] = (first, statistics.median(times), resp)
            (e_logits, e_s, e_tok), (g_logits, g_s, g_tok) = result[False], result[True]
            rows.append(
                {
                    "part": "dream7b-shape",
                    "case": f"{model.config.num_layers} layers, {n_rows} row(s)",
                    "rows": n_rows,
                    "equal_tokens": int(torch.equal(e_tok, g_tok)),
                    "max_logit_diff": float((e_logits.float() - g_logits.float()).abs().max()),
                    "eager_ms_per_step": round(1e3 * e_s, 3),
                    "graph_ms_per_step": round(1e3 * g_s, 3),
                }
            )
            print(rows[-1], flush=True)
            del cache
    return rows


def summarize(rows: list[dict]) -> str:
    lines = [
        "| part | case | rows | tokens graph == eager | eager ms / step | graph ms / step | eager / graph | "
        "max logit diff |",
        "|---|---|---:|:---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        ratio = r["eager_ms_per_step"] / r["graph_ms_per_step"] if r["graph_ms_per_step"] else float("nan")
        diff = f"{r['max_logit_diff']:.3g}" if "max_logit_diff" in r else "-"
        lines.append(
            f"| {r['part']} | {r['case']} | {r['rows']} | {'yes' if r['equal_tokens'] else 'NO'} | "
            f"{r['eager_ms_per_step']:.3f} | {r['graph_ms_per_step']:.3f} | {ratio:.2f}x | {diff} |"
        )
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default=str(REPO_ROOT / "runs" / "bench"), help="output folder (default: runs/bench)")
    p.add_argument("--layers", type=int, default=28, help="layers of the Dream-7B-shaped model (default: 28)")
    p.add_argument("--steps", type=int, default=32, help="response tokens = denoising steps of the loops")
    p.add_argument("--repeats", type=int, default=20, help="timed step forwards per way (median)")
    p.add_argument("--skip-dream", action="store_true", help="only the bundled model")
    p.add_argument("--dry-run", action="store_true", help="skip (gpu_check.sh's dry run): say so and exit 0")
    args = p.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    cmd = " ".join(["python -m bench.kernels.cuda_graph_check", *(sys.argv[1:] if argv is None else argv)])
    head = ["# CUDA-graph decode step vs eager", "", f"Command: `{cmd}`  "]
    ok, why = cuda_graph_support("cuda") if torch.cuda.is_available() else (False, "no CUDA device here")
    if args.dry_run:
        ok, why = False, "dry run (--dry-run): a CUDA graph needs the GPU run"
    if not ok:
        text = "\n".join([*head, f"{machine_line()}.", "", f"Skipped: {why}."])
        Path(args.out, "cuda_graph.md").write_text(text + "\n")
        print(f"cuda_graph_check skipped: {why}")
        return 0
    t0 = time.perf_counter()
    rows = bundled_rows(gen=8)
    if not args.skip_dream:
        rows += dream_rows(dream_model(args.layers), args.steps, args.repeats)
    write_csv(os.path.join(args.out, "cuda_graph.csv"), rows, "cuda")
    text = "\n".join(
        [
            *head,
            f"{machine_line('cuda')}; {time.perf_counter() - t0:.0f} s in all.",
            "",
            summarize(rows),
            "",
            "Bundled rows: decode seconds per step of whole generations (a graph run includes its capture). "
            "Dream-7B-shape rows: the median steady-state step forward after the capture, random weights and cache.",
        ]
    )
    Path(args.out, "cuda_graph.md").write_text(text + "\n")
    print(text)
    return 0 if all(r["equal_tokens"] for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
