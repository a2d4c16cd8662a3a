"""``encode`` and ``generate`` under ``torchrun``: every rank runs the command, rank 0 speaks.

``python -m dllm`` hands these two commands here when ``WORLD_SIZE`` is in the environment (torchrun
sets it; :func:`dllm.cli.parser.main` checks it first)::

    torchrun --nproc-per-node 2 -m dllm encode --context-file book.txt --out book.idx
    torchrun --nproc-per-node 2 -m dllm generate --document book.idx --prompt-file q.txt

``encode`` writes the index ``--out`` and one shard per rank beside it
(:meth:`dllm.distributed.ShardedDocument.save`); ``generate --document`` answers from such an index on
any number of ranks up to its chunk count (each rank scores its own chunks, rank 0 decodes). Devices:
``--device cuda`` (the default where CUDA is available) puts rank r on ``cuda:LOCAL_RANK`` with NCCL,
``--device cpu`` runs gloo. ``PREFILLING_DLLM_DIST_TIMEOUT`` (seconds, default 1800) bounds how long a
rank waits for a silent peer.

Inputs: ``--context-file``, ``--prompt-file`` and ``--questions-file`` (``-``: stdin) are read by rank 0 only
and broadcast (:func:`dllm.distributed.read_on_root`), so a pipe or FIFO is read once.

Errors: a user error on any rank (bad option, unreadable file, a document of another model) ends every
rank; rank 0 alone prints one ``error: rank R: ...`` line (``rank R`` when it arose on one rank only),
and every rank exits with status 2 (1 for a bug, whose traceback ``--debug`` prints on rank 0).

Imports: :mod:`dllm.distributed`, the single-process commands' checks (:mod:`dllm.cli.generate`,
:mod:`dllm.cli.options`, :mod:`dllm.cli.files`, :mod:`dllm.cli.errors`) and the public API :mod:`dllm`.
"""

from __future__ import annotations

import os
import sys

import torch.distributed as dist

from dllm import distributed as dd
from dllm.cli.errors import UserError
from dllm.cli.files import read_document_to_encode
from dllm.cli.generate import collect_questions, document_config, print_answer, print_stats, prompt_templates
from dllm.cli.options import (
    decode_kwargs,
    decoding_check,
    encode_config,
    graph_kwargs,
    kept_positions,
    note_unencodable,
    progress_bars,
    window_check,
)


def _rank_env() -> int:
    try:
        return int(os.environ.get("RANK", "0"))
    except ValueError:
        return 0


def _on_every_rank(body, args) -> int:
    """Run ``body(args)`` on this rank; report failures on rank 0 only (see the module docstring)."""
    rank = _rank_env()
    try:
        return body(args)
    except dd.RankError as exc:
        if rank != 0:
            return 2 if exc.user_error else 1
        if exc.user_error:
            raise UserError(str(exc)) from None  # one error: line from cli.main, status 2
        if getattr(args, "debug", False) and exc.trace:
            print(exc.trace, file=sys.stderr, end="")
        print(f"error: {exc} ({exc.kind}: a bug; --debug prints the failing rank's traceback)", file=sys.stderr)
        return 1
    except (UserError, ValueError, OSError):
        if rank != 0:  # the same check failed on every rank (same options and files): rank 0 says it
            return 2
        raise
    finally:
        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()


def _rank_device(args) -> str:
    """This rank's device (``cuda:LOCAL_RANK`` or ``cpu``); the process group is initialised here."""
    if args.device is not None and args.device.startswith("cuda:"):
        raise UserError(f"--device {args.device}: under torchrun pass --device cuda (rank r takes cuda:LOCAL_RANK)")
    return dd.init_from_env(args.device)


def _load_model(args, device):
    import dllm

    return dd.run_on_all(lambda: dllm.load_model(args.model, device=device, dtype=args.dtype))


def cmd_encode(args) -> int:
    """``torchrun ... -m dllm encode``: each rank encodes its share of the chunks; index + shards written."""
    return _on_every_rank(_encode, args)


def _read_on_rank0(fn):
    """``fn()`` (reading the command's input files) on rank 0 only, its value broadcast: stdin and a FIFO are
    read once, and every rank works on the same text. A :class:`UserError` there is every rank's one error."""

    def guarded():
        try:
            return fn()
        except UserError as exc:
            raise ValueError(str(exc)) from None  # a user error for run_on_all (RankError.user_error)

    return dd.read_on_root(guarded)


def _encode(args) -> int:
    from dllm.model.tokenization import encode_text

    cfg = encode_config(args)
    device = _rank_device(args)
    from dllm.distributed.group import world
    from dllm.distributed.index_file import shard_path

    shards = [shard_path(args.out, r, world()[1]) for r in range(world()[1])]
    text = _read_on_rank0(lambda: read_document_to_encode(args, shards))
    model = _load_model(args, device)
    if world()[0] == 0:  # one note, as in one process
        note_unencodable(model, text, f"--context-file {args.context_file}")
    doc = dd.encode_document(model, encode_text(model, text), prefilling=cfg, progress=progress_bars())
    doc.save(args.out)
    if doc.rank == 0:
        size = sum(os.path.getsize(doc.shard_path(args.out, r)) for r in range(doc.world_size))
        snapped = f", boundaries snapped within {doc.boundary_snap}" if doc.boundary_snap else ""
        print(
            f"wrote {args.out} and {doc.world_size} shard(s) beside it: {len(doc)} tokens in {doc.num_chunks} chunks "
            f"of at most {doc.chunk_size}{snapped} ({size / 2**20:.1f} MiB)"
        )
    return 0


def cmd_generate(args) -> int:
    """``torchrun ... -m dllm generate --document INDEX``: distributed scoring, rank 0 decodes and prints."""
    return _on_every_rank(_generate, args)


def _generate(args) -> int:
    from dllm.prefilling import split_document_prompt

    if args.document is None:
        raise UserError(
            "under torchrun, generate answers from --document INDEX (written by torchrun ... -m dllm encode)"
        )
    if args.context_file is not None:
        raise UserError("--document and --context-file both give the context: pass one")
    if args.method not in (None, "prefilling"):
        raise UserError(f"--document answers with --method prefilling, not --method {args.method}")
    args.method = "prefilling"
    header = dd.read_index(args.document)  # before the model loads
    device = _rank_device(args)

    def inputs():
        questions = collect_questions(args)
        return questions, *prompt_templates(args, questions)

    questions, prompt, templates = _read_on_rank0(inputs)
    for template in templates:
        if template.count("{context}") > 1:
            raise UserError("the prompt must hold at most one {context} slot for --document")
        if "{context}" in template and not template.split("{context}")[1].strip():
            raise UserError(
                f"--prompt-file {args.prompt_file} has no text after its {{context}} slot: the chunks are scored by "
                "the question that follows the context"
            )
    decoding_check(args)
    cfg = document_config(args, header)
    if cfg.position_mode == "absolute":
        raise UserError(
            "--position-mode absolute is not supported under torchrun (rank 0 holds only the kept chunks); "
            "use continuous or reuse"
        )
    model = _load_model(args, device)
    doc = dd.ShardedDocument.load(args.document, model)
    if doc.rank == 0:  # one note per input, as in one process
        note_unencodable(model, prompt.replace("{question}", ""), "the prompt", args.stats == "json")
        note_unencodable(model, "".join(questions or []), "the questions", args.stats == "json")
    kw = decode_kwargs(args, args.gen_length)
    gen = args.gen_length or 32
    for n, template in enumerate(templates, 1):

        def prompt_parts(template=template):
            parts = split_document_prompt(model, template, apply_chat_template=args.chat)
            live = parts.prefix.numel() + parts.query.numel()
            kept = kept_positions(cfg, header["num_tokens"], header["num_chunks"])
            window_check(
                model, live, gen, "prefilling", True, kept, json_notes=args.stats == "json",
                adaptive=cfg.adaptive_k is not None, notes=doc.rank == 0,
            )  # every rank checks (an error is every rank's), rank 0 alone notes  # fmt: skip
            return parts

        parts = dd.run_on_all(prompt_parts)
        res = dd.generate(
            model, doc, parts, prefilling=cfg, seed=args.seed, progress=doc.rank == 0 and progress_bars(),
            **graph_kwargs(args), **kw,
        )  # fmt: skip
        if res is not None:  # rank 0: labelled as in a single-process run (Q<n>/A<n> with questions)
            label = n if questions else None
            print_answer(res, label, questions[n - 1] if questions else None)
            print_stats(args, res, label, None, None)
    return 0
