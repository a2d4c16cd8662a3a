"""``python -m dllm eval``: accuracy on seeded cases of a retrieval task, or on a local LongBench file; one CSV
row per case (with its provenance) and a table.

Imports: the other modules of :mod:`dllm.cli` except the command modules, :mod:`dllm.eval`, :mod:`dllm.model`
and :mod:`dllm.prefilling`.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from dllm.cli.args import (
    ALL,
    add_command,
    add_common_args,
    add_decode_args,
    input_file,
    positive_int,
)
from dllm.cli.errors import UserError
from dllm.cli.files import check_out, refuse_overwriting_inputs
from dllm.cli.options import (
    decode_kwargs,
    decoding_check,
    fit_top_k,
    graph_kwargs,
    kept_positions,
    prefilling_config,
    progress_bars,
    timed_load,
)
from dllm.eval.tasks import HAYSTACKS, TASKS
from dllm.prefilling.config import PrefillingConfig

# Every example runs as written on the bundled tiny model (tests/test_cli.py runs them from the help text).
EXAMPLES = (
    "python -m dllm eval passkey --method prefilling",
    "python -m dllm eval passkey --lengths 4096 --depths 0 0.5 1 --samples 1 --method prefilling "
    "--chunk-size 256 --score-terms draft_contrast",
    "python -m dllm eval number_string --lengths 1024 --depths 0.5 --samples 2 --method prefix_cache",
    "python -m dllm eval longbench --data hotpotqa.jsonl --limit 2 --method prefilling",
)
# what the examples' input files hold
EXAMPLE_FILES = """\
hotpotqa.jsonl is a LongBench file (data/hotpotqa.jsonl of THUDM/LongBench; not bundled, and the
bundled model does not answer it)."""
HELP = "accuracy on a seeded retrieval task (CSV + table)"  # in python -m dllm --help
DESCRIPTION = (
    "Accuracy on seeded cases of a retrieval task. One untimed warm-up case runs first (its time\n"
    "and the model's load time are reported apart); then one CSV row per case and a table of accuracy\n"
    "and mean seconds per case."
)
RUNS_DIR = "runs"  # default output folder, relative to the working directory (git-ignored in the repository)
LONGBENCH = "longbench"  # eval's task for a local LongBench file (--data), beside the seeded tasks


# The longest task context eval builds, in tokens: 1M (2**20), the longest the package documents running
# (README: 1M-token documents, bench/results/long_context.md). Larger lengths are refused before anything
# loads: the haystack, its tokens and the model's cache would run out of memory long after the start.
MAX_LENGTH = 1 << 20


def _length(text: str) -> int:
    """``--lengths``: a context length in tokens, in ``[1, MAX_LENGTH]``."""
    value = positive_int(text)
    if value > MAX_LENGTH:
        raise argparse.ArgumentTypeError(
            f"{value} tokens is more than {MAX_LENGTH} (1M), the longest context eval builds; lower it"
        )
    return value


def _depth(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a depth in [0, 1], got {text!r}") from None
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"expected a depth in [0, 1], got {text!r}")
    return value


def _unique_eval_path(task: str, method: str) -> str:
    """eval's default CSV: ``runs/eval_TASK_METHOD_YYYYmmdd-HHMMSS.csv`` (UTC), with ``-2``, ``-3``, ... when
    that name is taken. The name is reserved at once (an empty file created exclusively), so two runs
    started in the same second never write the same file; :func:`cmd_eval` removes it if the run fails
    before writing."""
    import datetime as dt

    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%d-%H%M%S")
    base = os.path.join(RUNS_DIR, f"eval_{task}_{method}_{stamp}")
    check_out(base + ".csv", create_folder=True)
    path, n = base + ".csv", 1
    while True:
        try:
            os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o666))
            return path
        except FileExistsError:
            n += 1
            path = f"{base}-{n}.csv"


# what None means in each optional PrefillingConfig field, as the eval CSV writes it
_NONE_WORDS = {
    "top_k": "all",
    "token_budget": "all",
    "query_window": "all",
    "prefill_batch": "auto",
    "anchor_token_id": "auto",
    "redundancy_threshold": "off",
    "candidates": "off",
    "candidate_layer": "all",
    "adaptive_k": "off",
}


def prefilling_columns(cfg: PrefillingConfig | None) -> dict:
    """Every field of the run's :class:`PrefillingConfig`, one CSV column each, in field order: a None as the
    word for what it means (``all``, ``auto``, ``off``: :data:`_NONE_WORDS`), the score terms joined by a space;
    every column empty for the baselines (``cfg`` None)."""
    import dataclasses

    if cfg is None:
        return {field.name: "" for field in dataclasses.fields(PrefillingConfig)}
    columns = {}
    for field in dataclasses.fields(PrefillingConfig):
        value = getattr(cfg, field.name)
        if value is None:
            value = _NONE_WORDS.get(field.name, "none")
        elif field.name == "score_terms":
            value = " ".join(value)
        columns[field.name] = value
    return columns


def _eval_columns(args, model, cfg: PrefillingConfig | None) -> dict:
    """The constant columns of every eval CSV row: provenance (:func:`dllm.eval.provenance.provenance`: device,
    torch/triton/CUDA versions, git commit, UTC date) and the settings (model, dtype, decoding options, and
    every prefilling setting, :func:`prefilling_columns`: C, K, B, the score terms, the boundary snap, the
    redundancy threshold, the candidates, ...; empty for the baselines)."""
    from dllm.eval.provenance import provenance

    def opt(v):
        return "" if v is None else "all" if v == ALL else v

    return {
        **provenance(str(model.device)),
        "device": str(model.device),
        "model": args.model or "bundled tiny-dream",
        "dtype": str(model.dtype).removeprefix("torch."),
        "haystack": args.haystack,
        "gen_length": opt(args.gen_length),
        "steps": opt(args.steps),
        "block_length": opt(args.block_length),
        "block_cache": opt(args.block_cache),
        "alg": opt(args.alg),
        "temperature": args.temperature,
        "sampling_top_p": opt(args.sampling_top_p),
        "sampling_top_k": opt(args.sampling_top_k),
        "threshold": args.threshold,
        "confidence_from": opt(args.confidence_from),
        "draw_order": args.draw_order,
        "sampling_seed": opt(args.seed),
        **prefilling_columns(cfg),
    }


def cmd_eval(args) -> int:
    """``eval``: accuracy on seeded cases of a task (or a local LongBench file), a CSV row per case and a table."""
    from dllm.model.loader import default_model_dir

    args.method = args.method or "prefilling"  # every task case has a context
    longbench = args.task == LONGBENCH
    if longbench != (args.data is not None):
        raise UserError("--data FILE.jsonl (a local LongBench file) goes with the longbench task, and only with it")
    if args.limit is not None and not longbench:
        raise UserError("--limit goes with the longbench task")
    if args.haystack != "filler":
        from dllm.eval.tasks import PROSE_TASKS

        if args.task not in PROSE_TASKS:
            raise UserError(f"--haystack {args.haystack} goes with the tasks {', '.join(PROSE_TASKS)}")
    decoding_check(args)
    cfg = prefilling_config(args, args.model or default_model_dir())
    if args.out is not None and not args.out.strip():
        raise UserError("--out is empty; give a file name (or leave --out out for the default)")
    if args.out is not None:
        check_out(args.out)
        refuse_overwriting_inputs(args.out, {"--data": args.data}, "the CSV would overwrite the data set")
        return _eval(args, cfg, longbench, args.out)
    out = _unique_eval_path(args.task, args.method)
    try:
        return _eval(args, cfg, longbench, out)
    except BaseException:
        if os.path.isfile(out) and os.path.getsize(out) == 0:  # the reserved name, never written
            os.remove(out)
        raise


def _eval(args, cfg, longbench: bool, out: str) -> int:
    """The rest of :func:`cmd_eval` once the arguments are checked: cases, model, runs, table, CSV ``out``."""
    from tqdm.auto import tqdm

    from dllm.eval.evaluation import accuracy_table, run_case, run_longbench_case, write_csv

    if longbench:  # the file is read and checked before the model is loaded
        from dllm.eval.longbench import load_longbench, metric_for

        try:
            cases = load_longbench(args.data, limit=args.limit)
        except UnicodeDecodeError:
            raise UserError(f"--data {args.data}: not UTF-8 text") from None
        if not cases:
            raise UserError(f"--data {args.data}: no LongBench examples to score (--limit {args.limit})")
        for case in cases:
            metric_for(case.dataset)
        if cfg is not None:
            _check_contexts(args, cases, [len(c.context.strip()) for c in cases])  # blank = empty, as generate's

    model, load_s = timed_load(args)
    if longbench:
        from dllm.model.tokenization import encode_text

        contexts = [encode_text(model, c.context) for c in cases] if cfg is not None else None
        context_tokens = [ids.numel() for ids in contexts] if cfg is not None else None
        if cfg is not None:  # a context of characters the tokenizer drops
            _check_contexts(args, cases, context_tokens)
        run_one = run_longbench_case
    else:
        from dllm.eval.tasks import make_cases

        cases = make_cases(
            args.task,
            args.lengths,
            args.depths,
            args.samples,
            args.seed_base,
            tokenizer=model.tokenizer,
            haystack=args.haystack,
        )
        contexts = None
        if cfg is not None:
            from dllm.model.tokenization import encode_text

            contexts = [encode_text(model, c.context) for c in cases]
        context_tokens = [c.context_tokens for c in cases]
        run_one = run_case
    configs, chunk_counts = [cfg] * len(cases), None
    if cfg is not None:  # every case is checked before the first one runs
        from dllm.prefilling.chunks import count_chunks

        explicit = args.top_k not in (None, ALL)
        chunk_counts = [count_chunks(model, ids, cfg) for ids in contexts]  # snapped, as the library fits K
        configs = [fit_top_k(cfg, n, ids.numel(), explicit) for n, ids in zip(chunk_counts, contexts)]
    positions = _case_positions(model, args, cases, configs, context_tokens, chunk_counts)  # errors before notes
    if cfg is not None and cfg.top_k is not None:
        fewer = sum(f.top_k is None for f in configs)
        if fewer:
            what = (
                "adaptive K chooses among all of their chunks"
                if cfg.adaptive_k is not None
                else "they keep every chunk"
            )
            print(
                f"note: {fewer} of {len(cases)} contexts have fewer than the default top_k={cfg.top_k} chunks of "
                f"{cfg.chunk_size} tokens: {what}",
                file=sys.stderr,
            )
    kw = decode_kwargs(args, args.gen_length)

    def run(i):
        extra = {"prefilling": configs[i], **graph_kwargs(args)} if cfg is not None else {}
        return run_one(model, cases[i], args.method, seed=args.seed, **kw, **extra)

    t0 = time.perf_counter()
    run(0)  # warm-up: one untimed case absorbs the one-off start-up costs
    warm_s = time.perf_counter() - t0
    rows = [run(i) for i in tqdm(range(len(cases)), desc=f"{args.task}/{args.method}", disable=not progress_bars())]
    limit = model.config.trained_positions
    window = {"positions": positions, "past_window": [bool(limit) and n > limit for n in positions]}
    write_csv(rows, out, provenance=_eval_columns(args, model, cfg), per_row=window)
    if longbench:
        print(accuracy_table(rows, by=("dataset", "method"), value="score"))
    else:
        by = ("task", "method", "length", "depth") if args.by_depth else ("task", "method", "length")
        print(accuracy_table(rows, by=by))
    print(f"start-up, not in the table: model load {load_s:.1f} s, one warm-up case {warm_s:.1f} s")
    print(f"wrote {out}")
    return 0


def _where(args, case) -> str:
    """A case as a message names it: ``--data FILE:LINE`` of a LongBench example, else its task, length,
    depth and seed."""
    if args.task == LONGBENCH:
        return f"--data {args.data}:{case.line}"
    return f"the {case.task} case of length {case.length}, depth {case.depth}, seed {case.seed}"


def _check_contexts(args, cases, sizes) -> None:
    """--method prefilling chunks each case's context: an empty one (``sizes``: characters other than whitespace,
    as ``generate --context-file`` counts them, or tokens once the model is loaded) is an error naming its line,
    before anything is decoded."""
    empty = [c for c, n in zip(cases, sizes) if n == 0]
    if empty:
        more = f" (and {len(empty) - 1} more)" if len(empty) > 1 else ""
        raise UserError(
            f"{_where(args, empty[0])}: the context is empty{more}: --method prefilling has nothing to chunk; pass "
            "--method dense or prefix_cache"
        )


def _case_positions(model, args, cases, configs, context_tokens, chunk_counts) -> list[int]:
    """The positions each case's decoding reaches, checked before the first case runs, as ``generate`` checks
    one prompt (:func:`dllm.cli.options.window_check`): the prompt (dense, prefix_cache) or prefix + kept
    chunks + query (prefilling: :func:`kept_positions` of each context's snapped chunk count, ``chunk_counts``),
    plus the response.

    Past the model's trained positions: with --method prefilling, a case whose prefix + query and response
    alone do not fit is an error naming the case (``generate`` refuses that prompt); every other case past
    the window runs, and one note says how many (the CSV's ``past_window`` column says which).

    Raises:
        UserError: see above.
    """
    from dllm.eval.evaluation import response_length
    from dllm.model.tokenization import encode_text

    limit = model.config.trained_positions
    prefilling = args.method == "prefilling"
    positions, refused = [], []
    for i, case in enumerate(cases):
        gen = response_length(case, args.gen_length)
        if prefilling:
            live = len(encode_text(model, case.prefix, bos=True)) + len(encode_text(model, case.query))
            if limit and live + gen > limit:
                refused.append((case, live, gen))
            positions.append(live + kept_positions(configs[i], context_tokens[i], chunk_counts[i]) + gen)
        else:
            positions.append(len(encode_text(model, case.prompt, bos=True)) + gen)
    if refused:
        case, live, gen = refused[0]
        more = f" ({len(refused)} of {len(cases)} cases)" if len(refused) > 1 else ""
        raise UserError(
            f"{_where(args, case)}: its prefix + query ({live} tokens) and {gen} response tokens take {live + gen} "
            f"positions, more than the model's {limit} trained positions{more}; shorten the question or lower "
            "--gen-length, or pass --method dense"
        )
    past = sum(bool(limit) and n > limit for n in positions)
    if past:
        what = "prefix, kept chunks, query and response" if prefilling else "prompt and response"
        hint = "lower --top-k, --chunk-size or --gen-length" if prefilling else "--method prefilling keeps K chunks"
        print(
            f"note: in {past} of {len(cases)} cases the {what} reach past the model's {limit} trained positions "
            f"(the CSV's past_window column says which): answers past the window are unreliable; {hint}",
            file=sys.stderr,
        )
    return positions


def add_parser(sub, model_dir: str | None) -> None:
    """The ``eval`` subcommand of ``sub`` (its help shows the prefilling defaults of ``model_dir``)."""
    e = add_command(sub, "eval", HELP, DESCRIPTION, EXAMPLES, EXAMPLE_FILES)
    e.add_argument(
        "task",
        choices=(*TASKS, LONGBENCH),
        help="a seeded InfiniteBench-style task (needle: Needle-in-a-Haystack QA), or longbench with --data",
    )
    e.add_argument(
        "--lengths",
        type=_length,
        nargs="+",
        default=[1024],
        help=f"context lengths in tokens, each at most {MAX_LENGTH} (1M, the longest the package documents)",
    )
    e.add_argument(
        "--depths", type=_depth, nargs="+", default=[0.0, 0.25, 0.5, 0.75, 1.0], help="needle depths in [0, 1]"
    )
    e.add_argument("--samples", type=positive_int, default=5, help="cases per (length, depth)")
    e.add_argument(
        "--seed-base", type=int, default=0, help="task seed of the first sample; sample i uses seed-base + i"
    )
    e.add_argument("--by-depth", action="store_true", help="one table row per depth")
    e.add_argument(
        "--haystack",
        choices=HAYSTACKS,
        default="filler",
        help="the text the needle hides in: the task's own filler, or held-out natural prose (essays: the 9 "
        "evaluation essays; pydoc: every fifth of CPython's pydoc topics; generated: varied-vocabulary "
        "sentences) for passkey, number_string and word_fact",
    )
    e.add_argument(
        "--data",
        type=input_file,
        default=None,
        help="longbench: a local LongBench JSONL file, e.g. data/hotpotqa.jsonl of THUDM/LongBench (default: none)",
    )
    e.add_argument(
        "--limit", type=positive_int, default=None, help="longbench: score the first N examples (default: all)"
    )
    e.add_argument(
        "--out",
        default=None,
        help=f"CSV path, replaced if it exists (default: a new {RUNS_DIR}/eval_TASK_METHOD_DATE-TIME.csv in the "
        "working directory, UTC, never an earlier run's); every row carries the device, torch/triton versions, git "
        "commit, date and the settings (model, C, K, B, ...)",
    )
    add_common_args(e)
    add_decode_args(e, None, model_dir=model_dir)
    e.set_defaults(func=cmd_eval)
