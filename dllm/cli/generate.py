"""``python -m dllm generate``: answer a prompt, or several questions, from a context file, a saved document
(``--document``) or the prompt alone; the answers on stdout, one stats line per answer on stderr.

Imports: the other modules of :mod:`dllm.cli` except the command modules, the public API :mod:`dllm`,
:mod:`dllm.prefilling`, :mod:`dllm.model` and :mod:`dllm.eval.evaluation` (one-line answers).
"""

from __future__ import annotations

import inspect
import json
import sys
import time

from dllm.cli import files
from dllm.cli.args import (
    ALL,
    add_command,
    add_common_args,
    add_decode_args,
    existing_file,
    input_file,
)
from dllm.cli.errors import UserError
from dllm.cli.files import read_text, strip_one_newline
from dllm.cli.options import (
    decode_kwargs,
    decoding_check,
    fit_top_k,
    graph_kwargs,
    kept_positions,
    note_unencodable,
    prefilling_config,
    progress_bars,
    timed_load,
    window_check,
)
from dllm.prefilling.chunks import chunk_char_spans
from dllm.prefilling.config import PrefillingConfig

# Every example runs as written on the bundled tiny model (tests/test_cli.py runs them from the help text).
EXAMPLES = (
    "python -m dllm generate --prompt-file prompt.txt --context-file doc.txt --method prefilling --gen-length 8",
    "python -m dllm generate --prompt-file prompt.txt --context-file doc.txt --method prefilling --chunk-size 128 "
    "--top-k 8 --gen-length 8",
    "python -m dllm generate --prompt-file ask.txt --context-file doc.txt --questions-file questions.txt "
    "--gen-length 8",
)
# what the examples' input files hold
EXAMPLE_FILES = """\
prompt.txt holds the question around one {context} slot (the bundled model answers this wording;
the last line ends with "is" and a space):
  There is a pass key hidden in the text below.

  {context}

  What is the pass key? The pass key is
doc.txt holds a few thousand characters of "The grass is green. The sky is blue. " with
"The pass key is 12345. Remember it." somewhere inside. ask.txt is prompt.txt with a {question} slot,
its last line "{question} The pass key is " (a space at the end); questions.txt holds one question a
line ("What is the pass key?", "Which number is hidden in the text?"): each answer prints as Q1:/A1:
lines, from one model load and one encoding of doc.txt."""
HELP = "answer one prompt (or several questions)"  # in python -m dllm --help
DESCRIPTION = (
    "Answer one prompt (or each question): the answer on stdout (labelled Q1:/A1: with questions),\n"
    "one stats line per answer on stderr (--stats json for all of them); progress bars only on a terminal."
)
STATS_MODES = ("summary", "json", "none")  # generate --stats
QUESTION_SLOT = "{question}"
DEFAULT_QUESTION_TEMPLATE = "{context}{question}"  # generate --question without --prompt-file


def _questions_file(text: str) -> str:
    """``--questions-file``: ``-`` (stdin) or a file read once (:func:`input_file`)."""
    return text if text == "-" else input_file(text)


def _read_questions_file(path: str) -> list[str]:
    """``--questions-file``: one question per line (a trailing ``\\r`` removed, blank lines skipped, a UTF-8
    BOM before the first skipped); ``-`` reads stdin to its end (on a terminal, stderr says so first)."""
    if path == "-":
        if sys.stdin.isatty():
            print("reading questions from stdin, one per line; end with Ctrl-D", file=sys.stderr)
        data = sys.stdin.buffer.read(files.MAX_INPUT_BYTES + 1)
        if len(data) > files.MAX_INPUT_BYTES:
            raise UserError(f"--questions-file -: more than {files.MAX_INPUT_BYTES:,} bytes of text")
        try:
            text = files.decode_utf8(data)
        except UnicodeDecodeError:
            raise UserError("--questions-file -: stdin is not UTF-8 text") from None
    else:
        text = read_text(path, "--questions-file")
    questions = [line.removesuffix("\r") for line in text.split("\n")]
    questions = [q for q in questions if q.strip()]
    if not questions:
        raise UserError(f"--questions-file {path}: no questions (one per line; blank lines are skipped)")
    return questions


def collect_questions(args) -> list[str] | None:
    """The questions to answer, in order: every ``--question``, then the lines of ``--questions-file``;
    None when neither is given."""
    questions = list(args.question or [])
    for i, question in enumerate(questions, 1):
        if not question.strip():
            raise UserError(f"--question #{i} is empty")
        try:  # bytes that are not UTF-8 reach argv as lone surrogates (Python's surrogateescape)
            question.encode("utf-8")
        except UnicodeEncodeError:
            raise UserError(f"--question #{i} is not UTF-8 text") from None
    if args.questions_file is not None:
        questions += _read_questions_file(args.questions_file)
    for i, question in enumerate(questions, 1):
        if "{context}" in question or QUESTION_SLOT in question:
            raise UserError(f"question {i} holds a {{context}} or {{question}} slot: a question is plain text")
    return questions or None


def prompt_templates(args, questions: list[str] | None) -> tuple[str, list[str]]:
    """The prompt as given and the prompts to answer: the prompt file (or :data:`DEFAULT_QUESTION_TEMPLATE`
    with questions and no prompt file), once per question, which fills the prompt's one ``{question}`` slot.
    A prompt file without the slot is an error when questions are given (nothing is appended silently), and
    so is a slot without questions (its literal text would be decoded)."""
    if args.prompt_file is None and not questions:
        raise UserError("generate needs --prompt-file, --question or --questions-file")
    if args.prompt_file is None:
        template = DEFAULT_QUESTION_TEMPLATE
    else:
        template = strip_one_newline(read_text(args.prompt_file, "--prompt-file"))
    slots = template.count(QUESTION_SLOT)
    if not questions:
        if slots:  # decoding the slot's literal text would answer a question nobody asked
            raise UserError(
                f"--prompt-file {args.prompt_file} holds a {QUESTION_SLOT} slot but no question was given: pass "
                "--question or --questions-file, or remove the slot"
            )
        return template, [template]
    if slots != 1:
        raise UserError(
            f"--prompt-file {args.prompt_file} must hold exactly one {QUESTION_SLOT} slot for the questions, found "
            f'{slots} (e.g. a last line "Question: {QUESTION_SLOT} Answer:"; without --prompt-file the prompt is '
            f"{DEFAULT_QUESTION_TEMPLATE})"
        )
    return template, [template.replace(QUESTION_SLOT, q) for q in questions]


def _one_line_answer(text: str) -> str:
    """An answer on one line of labelled output: backslashes doubled, CR and LF written as ``\\r`` and ``\\n``
    (as in eval's CSV: :func:`dllm.eval.evaluation.one_line_cell`)."""
    from dllm.eval.evaluation import one_line_cell

    return one_line_cell(text)


def print_answer(res, label: int | None, question: str | None) -> None:
    """The answer on stdout: as is for a single prompt; ``Q<n>: question`` and ``A<n>: answer`` lines (the
    answer on one line, :func:`_one_line_answer`) for the n-th question."""
    answer = res.text[0] if res.text is not None else " ".join(map(str, res.tokens[0].tolist()))
    if label is None:
        print(answer, flush=True)
        return
    print(f"Q{label}: {_one_line_answer(question.strip())}", flush=True)
    print(f"A{label}: {_one_line_answer(answer)}".rstrip(" "), flush=True)


def _stats_dict(res, chars: list | None) -> dict:
    """The full stats of one answer (``--stats json``): forwards, steps, seconds per phase, tokens per second,
    the prefilling details of ``res.stats.extra`` (the kept chunks' ``selected_chunk_tokens`` among them) and,
    when the context text is known, their ``selected_chunk_chars`` (``chars``: every chunk's span in it)."""
    stats = {
        "nfe": res.stats.nfe,
        "steps": res.stats.steps,
        "seconds": {k: round(v, 4) for k, v in res.stats.seconds.items()},
        "tokens_per_second": round(res.stats.tokens_per_second, 2),
        **{k: v for k, v in res.stats.extra.items() if k != "gen_tokens"},
    }
    if chars is not None and "selected_chunks" in stats:
        stats["selected_chunk_chars"] = [list(chars[j]) for j in stats["selected_chunks"]]
    return stats


def _stats_line(res, chars: list | None, chunk_size: int | None) -> str:
    """The one-line summary of ``--stats summary``: the kept chunks with their spans in the context
    (``chars``: every chunk's ``(start, end)`` in the context text; else the kept chunks' token spans of
    ``stats.extra``, as with --document; end exclusive), seconds per phase, steps, forwards and tokens per
    second, and the block cache's mode and refreshes when one ran."""
    extra = res.stats.extra
    parts = []
    if "selected_chunks" in extra:
        kept = extra["selected_chunks"]
        if chars is not None:
            where = [f"{j} [chars {chars[j][0]}:{chars[j][1]}]" for j in kept]
        else:
            where = [f"{j} [tokens {a}:{b}]" for j, (a, b) in zip(kept, extra["selected_chunk_tokens"])]
        size = f" of {chunk_size} tokens" if chunk_size else ""
        parts.append(f"kept {len(kept)} of {extra['num_chunks']} chunks{size}: {', '.join(where)}")
    parts.append(", ".join(f"{k} {v:.2f} s" for k, v in res.stats.seconds.items()))
    parts.append(f"{res.stats.steps} steps, {res.stats.nfe} forwards, {res.stats.tokens_per_second:.1f} tokens/s")
    if extra.get("block_cache", "off") != "off":
        n = extra["block_cache_refreshes"]
        parts.append(f"block cache {extra['block_cache']}, {n} refresh{'es' if n != 1 else ''}")
    if extra.get("reselections"):
        kept = "; ".join(f"at token {at}: {', '.join(map(str, ks))}" for at, ks in extra["reselected_chunks"])
        n = extra["reselections"]
        parts.append(f"re-selected {n} time{'s' if n != 1 else ''} ({kept})")
    return "; ".join(parts)


def print_stats(args, res, label: int | None, chars: list | None, chunk_size: int | None) -> None:
    """``--stats``: one summary line (default), the full JSON line, or nothing, on stderr."""
    if args.stats == "none":
        return
    if args.stats == "json":
        line = json.dumps({"question": label, **_stats_dict(res, chars)} if label else _stats_dict(res, chars))
    else:
        line = f"stats{f' Q{label}' if label else ''}: {_stats_line(res, chars, chunk_size)}"
    print(line, file=sys.stderr, flush=True)


def document_config(args, header: dict) -> PrefillingConfig:
    """The prefilling config of an answer from a document: the document's chunk size unless one is given
    (a different one is an error), a default K above its chunk count keeps every chunk."""
    from dllm.model.loader import default_model_dir

    if args.chunk_size is not None and args.chunk_size != header["chunk_size"]:
        raise UserError(
            f"--chunk-size {args.chunk_size}: the document {args.document} was encoded with chunk size "
            f"{header['chunk_size']}"
        )
    args.chunk_size = header["chunk_size"]
    snap = header.get("boundary_snap", 0)
    if args.boundary_snap is not None and args.boundary_snap != snap:
        raise UserError(f"--boundary-snap {args.boundary_snap}: the document {args.document} was encoded with {snap}")
    args.boundary_snap = snap
    cfg = prefilling_config(args, args.model or default_model_dir())
    return fit_top_k(cfg, header["num_chunks"], header["num_tokens"], explicit=args.top_k not in (None, ALL))


def _check_templates(args, templates: list[str], context: str | None) -> None:
    """The ``{context}`` slot rules of every prompt, before the model loads."""
    for template in templates:
        slots = template.count("{context}")
        if args.document is not None:
            if slots > 1:
                raise UserError(f"the prompt must hold at most one {{context}} slot for --document, found {slots}")
        elif context is not None and slots != 1:
            raise UserError(
                f"--prompt-file {args.prompt_file} must hold exactly one {{context}} slot for --context-file, "
                f"found {slots}"
            )
        elif context is None and slots:
            raise UserError("the prompt has a {context} slot but no --context-file or --document was given")
        if not template.strip() and context is None:
            raise UserError(f"--prompt-file {args.prompt_file} is empty")
        if args.method == "prefilling" and slots == 1 and not template.split("{context}")[1].strip():
            raise UserError(
                f"--prompt-file {args.prompt_file} has no text after its {{context}} slot: --method prefilling (the "
                "default with a context) scores the chunks by the question that follows the context; put the question "
                "after the slot, or pass --method dense"
            )


def _encode_context_once(model, args, context: str, cfg: PrefillingConfig):
    """Several questions about one --context-file with --method prefilling: the context's chunks are encoded
    once, as a :class:`dllm.DocumentCache` in memory, and every question is answered from it (answers equal
    fresh ones token for token: :func:`dllm.encode_document`). Returns ``(document, config, context tokens)``."""
    import dllm
    from dllm.model.tokenization import encode_text
    from dllm.prefilling.chunks import count_chunks

    ids = encode_text(model, context)
    fitted = fit_top_k(cfg, count_chunks(model, ids, cfg), ids.numel(), explicit=args.top_k not in (None, ALL))
    t0 = time.perf_counter()
    document = dllm.encode_document(model, ids, prefilling=fitted, progress=progress_bars())
    seconds = time.perf_counter() - t0
    if args.stats == "json":  # every stderr line is JSON with --stats json
        once = {"tokens": ids.numel(), "chunks": document.num_chunks, "seconds": round(seconds, 4)}
        print(json.dumps({"context_encoded_once": once}), file=sys.stderr)
    elif args.stats != "none":
        print(
            f"encoded the context once for every question: {ids.numel()} tokens in {document.num_chunks} chunks, "
            f"{seconds:.2f} s",
            file=sys.stderr,
        )
    return document, fitted, ids.numel()


def _answer_from_document(model, args, template, document, cfg, context_tokens, kw):
    """One answer from a :class:`dllm.DocumentCache` (--document, or a context encoded once)."""
    import dllm
    from dllm.prefilling import split_document_prompt

    parts = split_document_prompt(model, template, apply_chat_template=args.chat)
    live = parts.prefix.numel() + parts.query.numel()
    window_check(
        model,
        live,
        kw["gen"],
        "prefilling",
        True,
        kept_positions(cfg, context_tokens, document.num_chunks),
        json_notes=args.stats == "json",
        adaptive=cfg.adaptive_k is not None,
    )
    return dllm.generate(
        model, prompt=parts, document=document, method="prefilling", prefilling=cfg, seed=args.seed,
        progress=progress_bars(), **graph_kwargs(args), **kw["decode"],
    )  # fmt: skip


def _answer_fresh(model, args, template, context, cfg, kw):
    """One answer with the context in the prompt: prefilling (chunked prefill, selection) or a baseline."""
    import dllm
    from dllm.model.tokenization import encode_text

    gen = kw["gen"]
    if cfg is not None:
        from dllm.prefilling import split_prompt
        from dllm.prefilling.chunks import count_chunks

        parts = split_prompt(
            model, template, context=context, query_window=cfg.query_window, apply_chat_template=args.chat
        )
        n_chunks, n_tokens = count_chunks(model, parts.context, cfg), parts.context.numel()
        fitted = fit_top_k(cfg, n_chunks, n_tokens, explicit=args.top_k not in (None, ALL))
        live = parts.prefix.numel() + parts.query.numel()
        kept = kept_positions(fitted, n_tokens, n_chunks)
        window_check(
            model,
            live,
            gen,
            "prefilling",
            True,
            kept,
            json_notes=args.stats == "json",
            adaptive=fitted.adaptive_k is not None,
        )
        return dllm.generate(
            model, prompt=parts, method="prefilling", prefilling=fitted, seed=args.seed, progress=progress_bars(),
            **graph_kwargs(args), **kw["decode"],
        )  # fmt: skip
    text = template if context is None else template.replace("{context}", context)
    if args.chat:  # the chat template decides the leading special tokens
        from dllm.prefilling.prompt import render_chat

        ids = encode_text(model, render_chat(model, text))[None]
    else:
        ids = encode_text(model, text, bos=True)[None]
    window_check(model, ids.shape[1], gen, args.method, context is not None, json_notes=args.stats == "json")
    return dllm.generate(model, ids, method=args.method, seed=args.seed, progress=progress_bars(), **kw["decode"])


def cmd_generate(args) -> int:
    """``generate``: answer one prompt, or each question, from a context file, a document cache or the prompt alone
    (under torchrun: :func:`dllm.cli.distributed.cmd_generate`)."""
    import dllm
    from dllm.distributed.single_process import load_document, read_document_header
    from dllm.model.loader import default_model_dir

    header = None
    if args.document is not None:
        if args.context_file is not None:
            raise UserError("--document and --context-file both give the context: pass one")
        if args.method not in (None, "prefilling"):
            raise UserError(f"--document answers with --method prefilling, not --method {args.method}")
        args.method = "prefilling"
        header = read_document_header(args.document)  # before the model loads; a cache file or a sharded index
    # the product with a context; a prompt alone (nothing to chunk) decodes densely
    args.method = args.method or ("prefilling" if args.context_file is not None else "dense")
    questions = collect_questions(args)
    prompt, templates = prompt_templates(args, questions)
    context = None
    if args.context_file is not None:
        context = read_text(args.context_file, "--context-file")
        if not context.strip():
            raise UserError(f"--context-file {args.context_file} is empty")
    _check_templates(args, templates, context)
    decoding_check(args)
    if args.document is not None:
        cfg = document_config(args, header)
    else:
        cfg = prefilling_config(args, args.model or default_model_dir())

    model, _ = timed_load(args)
    json_notes = args.stats == "json"
    note_unencodable(model, context, f"--context-file {args.context_file}", json_notes)
    note_unencodable(model, prompt.replace(QUESTION_SLOT, ""), "the prompt", json_notes)
    note_unencodable(model, "".join(questions or []), "the questions", json_notes)
    gen = args.gen_length or inspect.signature(dllm.generate).parameters["gen_length"].default
    kw = {"gen": gen, "decode": decode_kwargs(args, args.gen_length)}
    document = context_tokens = None
    if args.document is not None:
        document, context_tokens = load_document(args.document, model), header["num_tokens"]
    elif cfg is not None and context is not None and len(templates) > 1:
        document, cfg, context_tokens = _encode_context_once(model, args, context, cfg)
    chars = None  # every chunk's (start, end) in the context text, for the stats (else their token spans)
    if cfg is not None and args.stats != "none" and context is not None:
        chars = chunk_char_spans(model, context, cfg)
    for i, template in enumerate(templates):
        if document is not None:
            res = _answer_from_document(model, args, template, document, cfg, context_tokens, kw)
        else:
            res = _answer_fresh(model, args, template, context, cfg, kw)
        label = i + 1 if questions else None
        print_answer(res, label, questions[i] if questions else None)
        print_stats(args, res, label, chars, cfg.chunk_size if cfg is not None else None)
    return 0


def add_parser(sub, model_dir: str | None) -> None:
    """The ``generate`` subcommand of ``sub`` (its help shows the prefilling defaults of ``model_dir``)."""
    g = add_command(sub, "generate", HELP, DESCRIPTION, EXAMPLES, EXAMPLE_FILES)
    g.add_argument(
        "--prompt-file",
        type=input_file,
        default=None,
        help="UTF-8 prompt; may hold one {context} slot (and must hold one {question} slot with --question or "
        "--questions-file); one trailing newline (an editor's) is removed. Without a slot and --context-file, "
        "--method prefilling takes the last 64 tokens as the query, the rest as context (default: none; needed "
        "unless questions are given)",
    )
    g.add_argument(
        "--context-file",
        type=input_file,
        default=None,
        help="UTF-8 text put into the prompt's {context} slot, read as is; a pipe such as <(...) works (default: none)",
    )
    g.add_argument(
        "--document",
        type=existing_file,
        default=None,
        help="a document cache written by encode: the context, already encoded (default: none)",
    )
    g.add_argument(
        "--question",
        action="append",
        default=None,
        help="a question, repeatable: each fills the prompt's one {question} slot (a prompt file without the slot "
        "is an error; without --prompt-file the prompt is {context}{question}) and is answered in turn from one "
        "model load and, with --method prefilling, one encoding of the context; the answers print as 'Q1: ...' "
        "and 'A1: ...' lines, an answer's line breaks written as \\n (default: none)",
    )
    g.add_argument(
        "--questions-file",
        type=_questions_file,
        default=None,
        metavar="FILE|-",
        help="questions one per line ('-': stdin, read to its end), blank lines skipped; after any --question, "
        "answered as --question is (default: none)",
    )
    g.add_argument(
        "--stats",
        choices=STATS_MODES,
        default="summary",
        help="what stderr gets after each answer: one line (the kept chunks with their character spans "
        "[start:end) in the context, seconds per phase, steps, forwards, tokens/s), the full stats as one JSON "
        'line (and every note as a {"note": ...} line), or nothing; progress bars appear only when stderr is a '
        "terminal",
    )
    g.add_argument(
        "--chat",
        action="store_true",
        help="instruct checkpoints: the prompt (context slot inside) is the user turn of the tokenizer's chat template",
    )
    add_common_args(g)
    add_decode_args(g, 32, document=True, model_dir=model_dir)
    g.set_defaults(func=cmd_generate)
