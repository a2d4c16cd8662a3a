"""From parsed options to the library's settings, checked before the model loads (a mistake costs no load),
and the checks that need the loaded model before decoding (the trained window).

:func:`prefilling_config` builds the :class:`~dllm.PrefillingConfig` of a command line over the checkpoint's
``prefilling_config.json``; the messages name the flags, not the fields (:func:`as_flags`).

Imports: :mod:`dllm.cli.errors`, :mod:`dllm.cli.args`, the public API :mod:`dllm`, :mod:`dllm.decode`,
:mod:`dllm.prefilling` and :mod:`dllm.model`.
"""

from __future__ import annotations

import os
import re
import sys
import time

from dllm.cli.args import ALL, OFF, PREFILLING_OPTIONS
from dllm.cli.errors import UserError
from dllm.decode.unmasking import UnmaskingConfig
from dllm.prefilling.config import PrefillingConfig, with_overrides

# UnmaskingConfig field -> CLI option (its top_k is the sampling filter, not prefilling's --top-k)
DECODING_OPTIONS = {
    "threshold": "--threshold",
    "temperature": "--temperature",
    "top_p": "--sampling-top-p",
    "top_k": "--sampling-top-k",
}


def as_flags(exc: Exception, decoding: bool = False) -> str:
    """A config error in the words of the command line: field names become their flags, None 'all'.
    ``decoding``: an error of :class:`~dllm.decode.unmasking.UnmaskingConfig`, whose ``top_k`` is
    ``--sampling-top-k`` (else a PrefillingConfig's, whose ``top_k`` is ``--top-k``)."""
    msg = str(exc)
    fields = {**PREFILLING_OPTIONS, **DECODING_OPTIONS} if decoding else {**DECODING_OPTIONS, **PREFILLING_OPTIONS}
    for field, flag in fields.items():
        msg = re.sub(rf"(?<![\w-]){field}\b", flag, msg)  # not inside a flag already written
    return re.sub(r"\bor None\b", "or 'all'", msg)


def unmasking_check(args, gen_length: int | None) -> None:
    """Validate the decoding options as :func:`dllm.generate` will, before the model is loaded."""
    try:
        cfg = UnmaskingConfig(
            alg=args.alg or "maskgit_plus",
            temperature=args.temperature,
            top_p=args.sampling_top_p,
            top_k=args.sampling_top_k,
            threshold=args.threshold,
            confidence_from=args.confidence_from,
        )
    except ValueError as exc:
        raise UserError(f"decoding options: {as_flags(exc, decoding=True)}") from exc
    if gen_length is None:
        if args.block_length is not None:
            raise UserError("--block-length needs --gen-length (the default gen length differs per case)")
        return
    block = args.block_length or gen_length
    if gen_length % block:
        raise UserError(f"--block-length {block} does not divide --gen-length {gen_length}")
    if getattr(args, "reselect", None) and block == gen_length:
        raise UserError(
            f"--reselect re-selects at block starts: pass --block-length (e.g. 32) so that --gen-length {gen_length} "
            "has several blocks"
        )
    steps = args.steps or gen_length
    if cfg.fixed_steps and steps % (gen_length // block):
        raise UserError(f"--steps {steps} is not a multiple of the {gen_length // block} blocks")


def _model_config(args):
    """The checkpoint's ``config.json`` (a :class:`dllm.ModelConfig`), read once per command, before the
    weights load; its errors name the file."""
    from dllm.model.config import load_config
    from dllm.model.loader import default_model_dir

    if getattr(args, "_model_config", None) is None:
        args._model_config = load_config(args.model or default_model_dir())
    return args._model_config


def positions_check(args, gen_length: int | None) -> None:
    """``--gen-length`` against the positions the checkpoint was trained for: a response longer than the
    model's whole window is a mistake, not a long answer."""
    if gen_length is None:
        return
    cfg = _model_config(args)
    if cfg.trained_positions and gen_length > cfg.trained_positions:
        field = "max_sequence_length" if cfg.family == "llada" else "max_position_embeddings"
        scaled = (
            f" x its rope_scaling factor = {cfg.trained_positions}"
            if cfg.trained_positions != cfg.max_position_embeddings
            else ""
        )
        raise UserError(
            f"--gen-length {gen_length} exceeds the model's {field}={cfg.max_position_embeddings}{scaled} "
            "(the positions it was trained for)"
        )


def decoding_check(args) -> None:
    """The decoding options and ``--gen-length`` checked before the model loads (:func:`unmasking_check`,
    :func:`positions_check`): generate and eval, in one process or under torchrun."""
    unmasking_check(args, args.gen_length)
    positions_check(args, args.gen_length)


def prefilling_config(args, model_dir: str) -> PrefillingConfig | None:
    """The PrefillingConfig of the command line, or None for the other methods.

    Base: the checkpoint's tuned settings (``prefilling_config.json``, read by
    ``PrefillingConfig.from_pretrained``), else the library defaults; the options given override it.
    """
    given = {f: getattr(args, f) for f in PREFILLING_OPTIONS if getattr(args, f) is not None}
    if args.method != "prefilling":
        if getattr(args, "no_cuda_graph", False):
            given["no_cuda_graph"] = True
        if getattr(args, "reselect", None):
            given["reselect"] = args.reselect
        if given:
            extra = {"no_cuda_graph": "--no-cuda-graph", "reselect": "--reselect"}
            names = ", ".join(PREFILLING_OPTIONS.get(f) or extra[f] for f in given)
            raise UserError(f"{names}: option(s) of --method prefilling, not of --method {args.method}")
        return None
    given = {f: None if v in (ALL, OFF) else tuple(v) if isinstance(v, list) else v for f, v in given.items()}
    terms = given.get("score_terms", ())
    twice = sorted({t for t in terms if terms.count(t) > 1})
    if twice:  # the chunk score sums its terms: a repeated one would count twice
        raise UserError(f"--score-terms: {', '.join(twice)} given more than once; name each term once")
    base = PrefillingConfig.from_pretrained(model_dir)  # its errors name the file
    try:  # replace, not from_pretrained's overrides: "--top-k all" (None) must override the file too
        cfg = with_overrides(base, given)
    except ValueError as exc:
        raise UserError(f"prefilling options: {as_flags(exc)}") from exc
    chunk_fits(cfg.chunk_size, args)
    return cfg


def encode_config(args) -> PrefillingConfig:
    """The PrefillingConfig ``encode`` cuts and encodes a document with: the checkpoint's defaults
    (``prefilling_config.json``) with ``--chunk-size``, ``--prefill-batch`` and ``--boundary-snap`` over them.

    Raises:
        UserError: a bad value among them, or a chunk past the model's trained positions.
    """
    from dllm.model.loader import default_model_dir

    given = {"chunk_size": args.chunk_size, "prefill_batch": args.prefill_batch, "boundary_snap": args.boundary_snap}
    base = PrefillingConfig.from_pretrained(args.model or default_model_dir())
    try:
        cfg = with_overrides(base, {k: v for k, v in given.items() if v is not None})
    except ValueError as exc:
        raise UserError(f"encode options: {as_flags(exc)}") from exc
    chunk_fits(cfg.chunk_size, args)
    return cfg


def chunk_fits(chunk_size: int, args) -> None:
    """A chunk is encoded alone at positions 0..C (its BOS anchor first): past the checkpoint's trained
    positions its keys would be out of distribution, silently."""
    limit = _model_config(args).trained_positions
    if limit and chunk_size + 1 > limit:
        raise UserError(
            f"--chunk-size {chunk_size}: a chunk and its BOS anchor take {chunk_size + 1} positions, more than "
            f"the model's {limit} trained positions"
        )


def fit_top_k(cfg: PrefillingConfig, num_chunks: int, context_tokens: int, explicit: bool) -> PrefillingConfig:
    """``cfg`` for a context of ``context_tokens`` cut into ``num_chunks`` chunks (the snapped count with
    --boundary-snap): the library's rule (:meth:`PrefillingConfig.for_chunks`); an explicit K above N is a
    user error, a default K above it keeps every chunk (top_k None)."""
    from dllm.prefilling.config import TopKError, chunking

    try:
        return cfg.for_chunks(num_chunks, explicit=explicit)
    except TopKError:
        raise UserError(
            f"--top-k {cfg.top_k} exceeds the {num_chunks} chunk(s) of a {context_tokens}-token context at "
            f"{chunking(cfg, flags=True)}; lower --top-k or --chunk-size, or pass --top-k all"
        ) from None


def backend_check(args) -> None:
    """``PREFILLING_DLLM_BACKEND=triton`` on a CPU run needs the Triton interpreter: say so before the model
    loads (the kernels would raise deep inside the first forward)."""
    import torch

    if getattr(args, "command", None) not in ("generate", "eval", "encode"):
        return  # info and the like run no kernel
    choice = os.environ.get("PREFILLING_DLLM_BACKEND", "auto").strip().lower() or "auto"
    if choice not in ("auto", "triton", "torch"):
        raise UserError(f"PREFILLING_DLLM_BACKEND={choice!r}: use triton, torch or auto (or unset it)")
    from triton_kernels._dispatch import values_checked

    try:  # a misspelt PREFILLING_DLLM_CHECK_VALUES: one line now, not a traceback from the first kernel call
        values_checked(None)
    except ValueError as exc:
        raise UserError(str(exc)) from None
    device = getattr(args, "device", None) or ("cuda" if torch.cuda.is_available() else "cpu")
    if choice != "triton" or str(device).startswith("cuda"):
        return
    from triton_kernels._dispatch import is_interpreted
    from triton_kernels.split_s import _split_s_partial_kernel

    if not is_interpreted(_split_s_partial_kernel):
        raise UserError(
            "PREFILLING_DLLM_BACKEND=triton on the CPU needs the Triton interpreter: set TRITON_INTERPRET=1 too "
            "(slow; for tests), or unset PREFILLING_DLLM_BACKEND"
        )


def note(text: str, json_line: bool = False) -> None:
    """A note on stderr: the line ``note: text``, or, when every stderr line is JSON (``--stats json``),
    the JSON line ``{"note": text}`` (as the other lines of that mode: one object per line)."""
    import json

    print(json.dumps({"note": text}) if json_line else f"note: {text}", file=sys.stderr, flush=True)


def note_unencodable(model, text: str | None, what: str, json_notes: bool = False) -> None:
    """A note when the tokenizer drops or blurs characters of an input (:func:`~dllm.model.tokenization.
    unencodable_characters`): the user's text is not what the model reads, and nothing else would say so."""
    from dllm.model.tokenization import describe_unencodable, unencodable_characters

    if not text:
        return
    bad = unencodable_characters(model, text)
    if bad:
        note(f"{what}: {describe_unencodable(bad)}", json_notes)


def window_check(
    model,
    live_tokens: int,
    gen_length: int,
    method: str,
    context_given: bool,
    kept_positions: int = 0,
    *,
    json_notes: bool = False,
    adaptive: bool = False,
    notes: bool = True,
) -> None:
    """The tokens that must share the model's trained positions with the response, checked before decoding.

    ``live_tokens``: the whole prompt for dense / prefix_cache, prefix + query for prefilling;
    ``kept_positions``: prefilling only, the positions its kept chunks take before the query
    (:func:`kept_positions`). Past the window the response is out of distribution: an error when
    nothing but the response and the prompt's own text fills it, a note when a long context (or the
    kept chunks) do (the dense baselines beyond the window are measured on purpose); ``json_notes``:
    the note as a JSON line (:func:`note`); ``adaptive``: K is chosen per question (``--adaptive-k``), so
    ``kept_positions`` is the most the kept chunks can take and the note says so; ``notes`` False: errors only
    (torchrun's ranks other than 0 check the same prompt, rank 0 alone notes)."""
    limit = model.config.trained_positions
    if (
        notes
        and limit
        and method == "prefilling"
        and live_tokens + gen_length <= limit < live_tokens + kept_positions + gen_length
    ):
        total = live_tokens + kept_positions + gen_length
        # under adaptive K the count is chosen after scoring: the note can only speak of the ceiling
        head = "if adaptive K keeps as many chunks as --top-k allows, " if adaptive else ""
        tail = "the stats line shows what was kept; " if adaptive else ""
        note(
            f"{head}prefix, kept chunks, query and --gen-length {gen_length} reach position {total}, past the "
            f"model's {limit} trained positions: {tail}lower --top-k, --chunk-size or --gen-length",
            json_notes,
        )
    if not limit or live_tokens + gen_length <= limit:
        return
    what = "prefix + query" if method == "prefilling" else "prompt"
    line = (
        f"the {what} ({live_tokens} tokens) and --gen-length {gen_length} take {live_tokens + gen_length} "
        f"positions, more than the model's {limit} trained positions"
    )
    if method == "prefilling" or not context_given:
        raise UserError(f"{line}; shorten the prompt or lower --gen-length")
    note(f"{line}: answers past the window are unreliable (--method prefilling keeps only K chunks)", json_notes)


def kept_positions(cfg: PrefillingConfig, context_tokens: int, num_chunks: int) -> int:
    """Positions the kept chunks take between the prefix and the query, at most: K chunks with their anchors
    (``continuous``; every chunk when K >= N: the context plus N anchors), one chunk's (``reuse``: all at the
    same positions) or the whole context (``absolute``).

    ``num_chunks``: N, the chunks the context is really cut into, the snapped ones with ``boundary_snap``
    (:func:`dllm.prefilling.chunks.count_chunks`, a document's ``num_chunks``), as the library fits K
    (:meth:`PrefillingConfig.for_chunks`); ``ceil(L / C)`` would undercount where snapping adds chunks."""
    width = min(cfg.chunk_size, context_tokens) + 1
    if cfg.position_mode == "absolute":
        return context_tokens + 1
    if cfg.position_mode == "reuse":
        return width
    kept = min(num_chunks, cfg.top_k or num_chunks)
    return min(kept * width, context_tokens + kept)  # no chunk is longer than C; K chunks hold <= L tokens


def decode_kwargs(args, gen_length) -> dict:
    return dict(
        gen_length=gen_length,
        steps=args.steps,
        block_length=args.block_length,
        block_cache=args.block_cache,
        reselect=getattr(args, "reselect", None) or None,
        alg=args.alg,
        temperature=args.temperature,
        top_p=args.sampling_top_p,
        top_k=args.sampling_top_k,
        confidence_from=args.confidence_from,
        threshold=args.threshold,
        draw_order=args.draw_order,
    )


def graph_kwargs(args) -> dict:
    """``cuda_graph=False`` for ``--no-cuda-graph`` (prefilling only; checked by :func:`prefilling_config`)."""
    return {"cuda_graph": False} if getattr(args, "no_cuda_graph", False) else {}


def timed_load(args):
    import dllm

    t0 = time.perf_counter()
    model = dllm.load_model(args.model, device=args.device, dtype=args.dtype)
    return model, time.perf_counter() - t0


def progress_bars() -> bool:
    """Progress bars only on a terminal: piped or redirected stderr gets none (no bar residue in logs)."""
    return sys.stderr.isatty()
