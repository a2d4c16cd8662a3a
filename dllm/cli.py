"""Command line: ``python -m dllm {generate,eval,info}``.

    python -m dllm generate --prompt-file prompt.txt [--model DIR] [--method dense|prefix_cache|prefilling] [--chat]
    python -m dllm eval passkey --lengths 1024 4096 --depths 0 0.5 1 --method prefilling --samples 5
    python -m dllm eval longbench --data hotpotqa.jsonl --method prefilling [--limit 50]
    python -m dllm info [--model DIR] [--json]

(The demo and the benchmarks live in ``bench/``: ``make demo``, ``make bench``.)

``--model`` defaults to the bundled tiny model (``dllm/assets/tiny-dream``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from dllm.unmasking import ALGS


def _add_model_args(p):
    p.add_argument("--model", default=None, help="checkpoint directory (default: the bundled tiny model)")
    p.add_argument("--device", default=None, help="cpu / cuda (default: cuda if available)")
    p.add_argument("--dtype", default=None, help="float32 / bfloat16 / float16 (default: bf16 on CUDA, fp32 on CPU)")


def _add_decode_args(p, gen_length_default):
    p.add_argument("--method", default="dense", choices=["dense", "prefix_cache", "prefilling"])
    p.add_argument("--gen-length", type=int, default=gen_length_default, help="response tokens")
    p.add_argument("--steps", type=int, default=None, help="denoising steps (default: gen-length)")
    p.add_argument("--block-length", type=int, default=None, help="semi-autoregressive block (default: gen-length)")
    p.add_argument("--alg", default=None, choices=ALGS, help="unmasking rule (default by family)")
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--threshold", type=float, default=0.9, help="tau of confidence_threshold")
    p.add_argument("--seed", type=int, default=None)
    g = p.add_argument_group("prefilling")
    g.add_argument("--chunk-size", type=int, default=None, help="C, tokens per chunk")
    g.add_argument("--top-k", type=int, default=None, help="K, chunks kept")
    g.add_argument("--token-budget", type=int, default=None, help="B, tokens kept per chunk (default: all)")
    g.add_argument("--position-mode", default=None, choices=["reuse", "continuous", "absolute"])
    g.add_argument("--cache-mode", default=None, choices=["independent", "joint"])
    g.add_argument("--score-mode", default=None, help="dllm (default) or causal")
    g.add_argument(
        "--score-terms",
        nargs="+",
        default=None,
        help="chunk score terms: self_info pseudo_label answer_confidence draft_contrast (default: the first two)",
    )


def _prefilling_config(args):
    """Flags over the checkpoint's ``prefilling_config.json`` (or the paper's defaults)."""
    from dllm.loader import default_model_dir
    from dllm.prefilling import PrefillingConfig

    fields = {
        "chunk_size": args.chunk_size,
        "top_k": args.top_k,
        "token_budget": args.token_budget,
        "position_mode": args.position_mode,
        "cache_mode": args.cache_mode,
        "score_mode": args.score_mode,
        "score_terms": tuple(args.score_terms) if args.score_terms else None,
    }
    return PrefillingConfig.from_pretrained(args.model or default_model_dir(), **fields)


def _decode_kwargs(args):
    kw = dict(
        method=args.method,
        gen_length=args.gen_length,
        steps=args.steps,
        block_length=args.block_length,
        alg=args.alg,
        temperature=args.temperature,
        threshold=args.threshold,
        seed=args.seed,
    )
    if args.method == "prefilling":
        kw["prefilling"] = _prefilling_config(args)
    return kw


def cmd_generate(args) -> int:
    import dllm
    from dllm.tokenization import encode_text

    model = dllm.load_model(args.model, device=args.device, dtype=args.dtype)
    with open(args.prompt_file, encoding="utf-8") as f:
        template = f.read()
    kw = _decode_kwargs(args)
    if args.method == "prefilling":
        from dllm.prefilling import split_prompt

        context = None
        if args.context_file:
            with open(args.context_file, encoding="utf-8") as f:
                context = f.read()
        parts = split_prompt(
            model, template, context=context, query_window=kw["prefilling"].query_window, apply_chat_template=args.chat
        )
        res = dllm.generate(model, prompt=parts, progress=True, **kw)
    else:
        text = template.replace("{context}", open(args.context_file).read()) if args.context_file else template
        if args.chat:  # the chat template decides the leading special tokens
            from dllm.prefilling.prompt import render_chat

            ids = encode_text(model, render_chat(model, text))
        else:
            ids = encode_text(model, text, bos=True)
        res = dllm.generate(model, ids[None], progress=True, **kw)
    print(res.text[0] if res.text is not None else res.tokens[0].tolist())
    stats = {
        "nfe": res.stats.nfe,
        "steps": res.stats.steps,
        "seconds": {k: round(v, 4) for k, v in res.stats.seconds.items()},
        "tokens_per_second": round(res.stats.tokens_per_second, 2),
        **{k: v for k, v in res.stats.extra.items() if k != "gen_tokens"},
    }
    print(json.dumps(stats), file=sys.stderr)
    return 0


def cmd_eval(args) -> int:
    import dllm
    from dllm.evaluation import accuracy_table, evaluate, evaluate_longbench, write_csv

    model = dllm.load_model(args.model, device=args.device, dtype=args.dtype)
    kw = _decode_kwargs(args)
    gen_length = kw.pop("gen_length")
    method = kw.pop("method")
    sampling_seed = kw.pop("seed")
    if args.task == "longbench":
        rows = evaluate_longbench(
            model,
            args.data,
            method,
            limit=args.limit,
            gen_length=gen_length,
            progress=True,
            sampling_seed=sampling_seed,
            **kw,
        )
        out = args.out or os.path.join("bench", "results", f"eval_longbench_{method}.csv")
        write_csv(rows, out)
        print(accuracy_table(rows, by=("dataset", "method"), value="score"))
        print(f"wrote {out}")
        return 0
    rows = evaluate(
        model,
        args.task,
        args.lengths,
        args.depths,
        method,
        args.samples,
        args.seed_base,
        gen_length=gen_length,
        progress=True,
        sampling_seed=sampling_seed,
        **kw,
    )
    out = args.out or os.path.join("bench", "results", f"eval_{args.task}_{method}.csv")
    write_csv(rows, out)
    print(
        accuracy_table(
            rows, by=("task", "method", "length", "depth") if args.by_depth else ("task", "method", "length")
        )
    )
    print(f"wrote {out}")
    return 0


def cmd_info(args) -> int:
    """``info``: the checkpoint's family, size, dtype, KV cost and the prefilling defaults that will be used."""
    from dllm.checkpoint_info import checkpoint_info, format_info

    info = checkpoint_info(args.model, device=args.device, dtype=args.dtype)
    print(json.dumps(info, indent=2) if args.json else format_info(info))
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m dllm", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = p.add_subparsers(dest="cmd", required=True)

    g = sub.add_parser("generate", help="answer one prompt")
    _add_model_args(g)
    g.add_argument("--prompt-file", required=True, help="prompt text; may hold a {context} slot")
    g.add_argument("--context-file", default=None, help="text put into the prompt's {context} slot")
    g.add_argument(
        "--chat",
        action="store_true",
        help="instruct checkpoints: the prompt (context slot inside) is the user turn of the tokenizer's chat template",
    )
    _add_decode_args(g, 32)
    g.set_defaults(func=cmd_generate)

    e = sub.add_parser("eval", help="accuracy on a seeded task (CSV + table)")
    e.add_argument("task", choices=["passkey", "number_string", "kv_retrieval", "needle", "longbench"])
    _add_model_args(e)
    e.add_argument("--lengths", type=int, nargs="+", default=[1024], help="context lengths in tokens")
    e.add_argument("--depths", type=float, nargs="+", default=[0.0, 0.25, 0.5, 0.75, 1.0])
    e.add_argument("--samples", type=int, default=5, help="cases per (length, depth)")
    e.add_argument("--seed-base", type=int, default=0)
    e.add_argument("--by-depth", action="store_true", help="one table row per depth")
    e.add_argument("--out", default=None, help="CSV path (default bench/results/eval_TASK_METHOD.csv)")
    e.add_argument("--data", default=None, help="longbench: a local LongBench JSONL file (required)")
    e.add_argument("--limit", type=int, default=None, help="longbench: score at most this many examples")
    _add_decode_args(e, None)
    e.set_defaults(func=cmd_eval)

    i = sub.add_parser("info", help="describe a checkpoint: family, size, dtype, KV bytes, prefilling defaults")
    _add_model_args(i)
    i.add_argument("--json", action="store_true", help="print the summary as JSON")
    i.set_defaults(func=cmd_info)

    args = p.parse_args(argv)
    if args.cmd == "eval" and (args.task == "longbench") != bool(args.data):
        e.error("--data FILE.jsonl (a local LongBench file) goes with the longbench task, and only with it")
    return args.func(args)
