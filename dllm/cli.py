"""Command line of prefilling-dllm: ``python -m dllm generate|encode|eval|info`` (installed as ``dllm`` too).

:func:`main` is the entry point; ``python -m dllm --help`` prints the runnable examples of :data:`EXAMPLES`.
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import json
import math
import os
import re
import stat
import sys
import time

from dllm.decode.unmasking import ALGS, CONFIDENCE_SOURCES, UnmaskingConfig
from dllm.eval.tasks import HAYSTACKS, TASKS
from dllm.generate import METHODS
from dllm.prefilling.config import CACHE_MODES, POSITION_MODES, SCORE_MODES, SCORE_TERMS, PrefillingConfig

RUNS_DIR = "runs"  # default output folder, relative to the working directory (git-ignored in the repository)
_PREFILLING_DEFAULTS = PrefillingConfig()
# CLI option -> PrefillingConfig field; these options apply to --method prefilling only
_PREFILLING_OPTIONS = {
    "chunk_size": "--chunk-size",
    "top_k": "--top-k",
    "token_budget": "--token-budget",
    "position_mode": "--position-mode",
    "cache_mode": "--cache-mode",
    "score_mode": "--score-mode",
    "score_terms": "--score-terms",
    "prefill_batch": "--prefill-batch",
    "boundary_snap": "--boundary-snap",
    "redundancy_threshold": "--redundancy-threshold",
    "candidates": "--candidates",
}
_BOUNDARY_SNAP_HELP = (
    "tokens a chunk boundary may move back to follow a sentence or paragraph end (0 = fixed chunks of C tokens; "
    "a document is encoded with it and answered with it)"
)
_PREFILL_BATCH_HELP = (
    "chunks encoded per forward (default: as many as fit in a quarter of the device's free memory; lower it "
    "if encoding runs out of memory)"
)
# Every example runs as written on the bundled tiny model (tests/test_cli.py runs them from the help text).
EXAMPLES = {
    "generate": (
        "python -m dllm generate --prompt-file prompt.txt --context-file doc.txt --method prefilling --gen-length 8",
        "python -m dllm generate --prompt-file prompt.txt --context-file doc.txt --method prefilling --chunk-size 128 "
        "--top-k 8 --gen-length 8",
        "python -m dllm generate --prompt-file ask.txt --context-file doc.txt --questions-file questions.txt "
        "--gen-length 8",
    ),
    "encode": ("python -m dllm encode --context-file doc.txt --out doc.cache",),
    "eval": (
        "python -m dllm eval passkey --method prefilling",
        "python -m dllm eval passkey --lengths 4096 --depths 0 0.5 1 --samples 1 --method prefilling "
        "--chunk-size 256 --score-terms draft_contrast",
        "python -m dllm eval number_string --lengths 1024 --depths 0.5 --samples 2 --method prefix_cache",
        "python -m dllm eval longbench --data hotpotqa.jsonl --limit 2 --method prefilling",
    ),
    "info": ("python -m dllm info", "python -m dllm info --json"),
}
EXAMPLE_FILES = {  # what the examples' input files hold
    "generate": """\
prompt.txt holds the question around one {context} slot (the bundled model answers this wording;
the last line ends with "is" and a space):
  There is a pass key hidden in the text below.

  {context}

  What is the pass key? The pass key is
doc.txt holds a few thousand characters of "The grass is green. The sky is blue. " with
"The pass key is 12345. Remember it." somewhere inside. ask.txt is prompt.txt with a {question} slot,
its last line "{question} The pass key is " (a space at the end); questions.txt holds one question a
line ("What is the pass key?", "Which number is hidden in the text?"): each answer prints as Q1:/A1:
lines, from one model load and one encoding of doc.txt.""",
    "eval": """\
hotpotqa.jsonl is a LongBench file (data/hotpotqa.jsonl of THUDM/LongBench; not bundled, and the
bundled model does not answer it).""",
    "encode": """\
doc.txt as for generate. Answer questions from the saved cache without encoding the document again
(the prompt's {context} slot marks where the document goes; each --question fills its {question} slot):
  dllm generate --document doc.cache --prompt-file prompt.txt --gen-length 8""",
    "info": "With no --model, info describes the bundled tiny model.",
}


def _examples(*commands: str) -> str:
    return "\n".join("  " + line for command in commands for line in EXAMPLES[command])


DESCRIPTION = f"""\
Long-context inference of diffusion LMs (Dream, LLaDA) with Prefilling-dLLM.

examples (each runs as written on the bundled tiny model, given the files described below):
{_examples("generate", "encode", "eval", "info")}

{EXAMPLE_FILES["generate"]}
{EXAMPLE_FILES["eval"]}

A user error (a missing file, a bad option value, an empty context, --top-k above the number of
chunks, ...) prints one line "error: ..." and exits with status 2, as does running out of memory (the
line says what to lower); Ctrl-C exits with status 130. --debug shows the traceback instead.
The demo and the benchmarks live in bench/ of the repository (make demo, make bench)."""
LONGBENCH = "longbench"  # eval's task for a local LongBench file (--data), beside the seeded tasks
STATS_MODES = ("summary", "json", "none")  # generate --stats
_ALL = "all"  # --top-k all / --token-budget all: keep every chunk / every token (the library's None)


class UserError(Exception):
    """A mistake in the command line or its inputs: reported as one ``error:`` line, exit status 2."""


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors (raised, so :func:`main` reports every user error the same way) and no
    abbreviations: a misspelt option is an error, not silently another one (``--context`` is not ``--context-file``)."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message):
        raise UserError(f"{message} (see {self.prog} --help)")


class _HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Keeps the description's layout and appends ``(default: X)`` to every option whose help does not
    already state its default."""

    def _get_help_string(self, action):
        text = action.help or ""
        d = action.default
        if "default" in text or not action.option_strings or d is None or d is False or d == argparse.SUPPRESS:
            return text
        shown = " ".join(map(str, d)) if isinstance(d, (list, tuple)) else d
        return f"{text} (default: {shown})"


# ---------------------------------------------------------------- argument types (checked while parsing)


def _int_at_least(low: int):
    """An argparse type: an integer >= ``low`` (one message for a non-integer and for a small one)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or value < low:
            raise argparse.ArgumentTypeError(f"expected an integer >= {low}, got {text!r}")
        return value

    return parse


_positive_int = _int_at_least(1)
_non_negative_int = _int_at_least(0)


def _positive_int_or_all(text: str):
    return _ALL if text == _ALL else _positive_int(text)


def _non_negative_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a finite number >= 0, got {text!r}") from None
    if not (math.isfinite(value) and value >= 0):  # inf would turn every token distribution into NaN
        raise argparse.ArgumentTypeError(f"expected a finite number >= 0, got {text!r}")
    return value


_SEED_LIMIT = 2**64  # torch.Generator.manual_seed takes 64 bits


def _seed(text: str) -> int:
    """A seed in [0, 2**64): a negative one is refused (to many tools -1 means "unseeded")."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer in [0, 2**64), got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(
            f"expected an integer in [0, 2**64), got {text!r} (leave --seed out: unseeded)"
        )
    if value >= _SEED_LIMIT:
        raise argparse.ArgumentTypeError(f"expected an integer in [0, 2**64), got {text!r}")
    return value


def _depth(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a depth in [0, 1], got {text!r}") from None
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"expected a depth in [0, 1], got {text!r}")
    return value


def _device(text: str) -> str:
    import torch

    try:
        dev = torch.device(text)
    except RuntimeError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a device (use cpu, cuda or cuda:N)") from None
    if dev.type not in ("cpu", "cuda"):
        raise argparse.ArgumentTypeError(f"{text!r}: only cpu and cuda devices are supported")
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise argparse.ArgumentTypeError(f"{text!r}: CUDA is not available on this machine")
    return text


def _existing_dir(text: str) -> str:
    if not os.path.isdir(text):
        raise argparse.ArgumentTypeError(
            f"{text!r}: " + ("not a directory" if os.path.exists(text) else "no such directory")
        )
    return text


def _existing_file(text: str) -> str:
    """A regular file (a document cache: it is read twice, its header first, so not a pipe)."""
    if not os.path.isfile(text):
        raise argparse.ArgumentTypeError(
            f"{text!r}: " + ("not a regular file" if os.path.exists(text) else "no such file")
        )
    return text


def _input_file(text: str) -> str:
    """A file read once: a regular file, or a pipe such as the shell's ``<(...)``."""
    try:
        mode = os.stat(text).st_mode
    except FileNotFoundError:
        raise argparse.ArgumentTypeError(f"{text!r}: no such file") from None
    except OSError as exc:
        raise argparse.ArgumentTypeError(f"{text!r}: {exc.strerror or exc}") from None
    if not (stat.S_ISREG(mode) or stat.S_ISFIFO(mode) or stat.S_ISCHR(mode)):
        raise argparse.ArgumentTypeError(f"{text!r}: not a file")
    if stat.S_ISCHR(mode) and not _is_terminal(text):
        # /dev/zero or /dev/urandom would be read without end; a terminal (typed input) is fine
        raise argparse.ArgumentTypeError(f"{text!r}: a device, not a file, pipe or terminal")
    return text


def _questions_file(text: str) -> str:
    """``--questions-file``: ``-`` (stdin) or a file read once (:func:`_input_file`)."""
    return text if text == "-" else _input_file(text)


def _is_terminal(path: str) -> bool:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY)
    except OSError:
        return False
    try:
        return os.isatty(fd)
    finally:
        os.close(fd)


# ---------------------------------------------------------------- options shared by the subcommands


def _add_common_args(p):
    p.add_argument(
        "--model",
        type=_existing_dir,
        default=None,
        help="checkpoint directory, Dream or LLaDA layout (default: the bundled tiny model, dllm/assets/tiny-dream)",
    )
    p.add_argument(
        "--device", type=_device, default=None, help="cpu, cuda or cuda:N (default: cuda if available, else cpu)"
    )
    p.add_argument(
        "--dtype",
        default=None,
        choices=["float32", "bfloat16", "float16"],
        help="weights and activations (default: bfloat16 on CUDA, float32 on CPU)",
    )
    p.add_argument("--debug", action="store_true", help="on an error, show the traceback instead of one line")


def _model_defaults(model_dir: str | None) -> tuple[PrefillingConfig, str]:
    """The prefilling settings ``--model model_dir`` will use (its ``prefilling_config.json`` over the
    library's, which are the paper's) and how the help names it, for the help text. A folder that cannot
    be read gives the library's settings here: its error is reported when the command runs."""
    from dllm.model.loader import default_model_dir

    label = "the bundled model" if model_dir is None else model_dir
    try:
        return PrefillingConfig.from_pretrained(model_dir or default_model_dir()), label
    except (OSError, ValueError):
        return _PREFILLING_DEFAULTS, label


def _default_help(model_dir: str | None, field: str, show=str) -> str:
    """``default: X`` of one prefilling field for ``--model model_dir``, saying whose value X is when the
    checkpoint's prefilling_config.json changes the library's (e.g. the bundled model's C=256 beside 1024)."""
    cfg, label = _model_defaults(model_dir)
    mine, lib = getattr(cfg, field), getattr(_PREFILLING_DEFAULTS, field)
    if mine == lib:
        return f"default: {show(lib)}"
    return f"default: {show(mine)}, {label}'s; the library's and the paper's: {show(lib)}"


def _model_in_argv(argv: list[str]) -> str | None:
    """The ``--model`` value of a command line, read before parsing, so that ``--help`` shows the defaults
    of that model (None: the bundled one, or a --model that is not a folder: parsing reports it)."""
    for i, arg in enumerate(argv):
        value = None
        if arg == "--model" and i + 1 < len(argv):
            value = argv[i + 1]
        elif arg.startswith("--model="):
            value = arg.removeprefix("--model=")
        if value is not None:
            return value if os.path.isdir(value) else None
    return None


def _add_decode_args(p, gen_length_default: int | None, document: bool = False, model_dir: str | None = None):

    p.add_argument(
        "--method",
        default=None,
        choices=METHODS,
        help="dense (recompute all every step), prefix_cache (Fast-dLLM style) or prefilling (Prefilling-dLLM) "
        + (
            "(default: prefilling with --context-file or --document, dense without a context)"
            if document
            else "(default: prefilling; dense and prefix_cache are the baselines)"
        ),
    )
    gen_help = "response tokens" + ("" if gen_length_default else " (default: the answer's tokens + 4, per case)")
    p.add_argument("--gen-length", type=_positive_int, default=gen_length_default, help=gen_help)
    p.add_argument("--steps", type=_positive_int, default=None, help="denoising steps in all (default: the gen length)")
    p.add_argument(
        "--block-length",
        type=_positive_int,
        default=None,
        help="semi-autoregressive block, divides the gen length (default: the gen length, one block)",
    )
    p.add_argument(
        "--alg",
        default=None,
        choices=ALGS,
        help="unmasking rule (default: maskgit_plus for Dream, low_confidence for LLaDA)",
    )
    p.add_argument("--temperature", type=_non_negative_float, default=0.0, help="0 = greedy; > 0 samples tokens")
    p.add_argument(
        "--confidence-from",
        default=None,
        choices=CONFIDENCE_SOURCES,
        help="research option: the distribution that ranks positions at temperature > 0: the tempered one the tokens "
        "are drawn from (Dream's reference) or softmax(logits) (LLaDA's, Fast-dLLM's); ties go to the leftmost "
        "position (default: the rule's reference: tempered for Dream's rules, logits for the others)",
    )
    p.add_argument("--threshold", type=float, default=0.9, help="tau of confidence_threshold, in (0, 1]")
    p.add_argument(
        "--seed", type=_seed, default=None, help="seeds the sampling RNG, an integer in [0, 2**64) (default: unseeded)"
    )
    _add_prefilling_args(p, model_dir)


def _add_prefilling_args(p, model_dir: str | None) -> None:
    """The options of ``--method prefilling``: the product's (C, K, batch, CUDA graph), then the research
    options (the paper's ablations; their defaults are the method as shipped). Each help states the
    default ``--model model_dir`` will use (:func:`_default_help`)."""
    label = _model_defaults(model_dir)[1]
    g = p.add_argument_group(
        "prefilling (with --method prefilling; the defaults shown are those of --model, here "
        f"{label}: its prefilling_config.json, else the library's, which are the paper's)"
    )
    g.add_argument(
        "--chunk-size",
        type=_positive_int,
        default=None,
        help=f"C, context tokens per chunk ({_default_help(model_dir, 'chunk_size')})",
    )
    g.add_argument(
        "--top-k",
        type=_positive_int_or_all,
        default=None,
        metavar="K|all",
        help="K, chunks kept, or 'all'; an explicit K above the chunk count is an error "
        f"({_default_help(model_dir, 'top_k', lambda k: 'all' if k is None else k)}, or every chunk when the "
        "context has fewer)",
    )
    g.add_argument("--prefill-batch", type=_positive_int, default=None, help=_PREFILL_BATCH_HELP)
    g.add_argument("--boundary-snap", type=_non_negative_int, default=None, help=_BOUNDARY_SNAP_HELP + " (default: 0)")
    g.add_argument(
        "--redundancy-threshold",
        type=_non_negative_float,
        default=None,
        help="Jaccard similarity of token 8-grams in (0, 1] at which a chunk counts as a near-copy of a kept one "
        "and is passed over while others remain (default: off, the paper's top-K)",
    )
    g.add_argument(
        "--candidates",
        type=_positive_int,
        default=None,
        help="chunks a cheap first stage (max attention logit over the cached keys) passes to the predictive "
        "score (default: off, every chunk scored)",
    )
    g.add_argument(
        "--no-cuda-graph",
        action="store_true",
        help="run each denoising step's forward eagerly (default: replayed from a CUDA graph where supported: "
        "CUDA with the compiled Triton kernels; same tokens)",
    )
    r = p.add_argument_group(
        "research options of prefilling (the paper's ablations and our variants; the defaults are the method as "
        "shipped, other values are for experiments)"
    )
    r.add_argument(
        "--token-budget",
        type=_positive_int_or_all,
        default=None,
        metavar="B|all",
        help="B, tokens kept per chunk, 1 <= B <= C, or 'all' "
        f"({_default_help(model_dir, 'token_budget', lambda b: 'all' if b is None else b)})",
    )
    r.add_argument(
        "--position-mode",
        default=None,
        choices=POSITION_MODES,
        help="where the kept chunks sit: back to back after the prefix (continuous), all right after it (reuse) "
        f"or where they were in the prompt (absolute) ({_default_help(model_dir, 'position_mode')})",
    )
    r.add_argument(
        "--cache-mode",
        default=None,
        choices=CACHE_MODES,
        help="decode over the prefill's chunk caches (independent) or re-encode the kept chunks together once "
        f"(joint) ({_default_help(model_dir, 'cache_mode')})",
    )
    r.add_argument(
        "--score-mode",
        default=None,
        choices=SCORE_MODES,
        help="how chunks are scored: masked (dllm) or next-token (causal) log-probs "
        f"({_default_help(model_dir, 'score_mode')})",
    )
    r.add_argument(
        "--score-terms",
        nargs="+",
        default=None,
        choices=SCORE_TERMS,
        help="terms summed into the chunk score: s_I, s_P (the paper's), s_C, s_C - s_P (ours) "
        f"({_default_help(model_dir, 'score_terms', ' '.join)})",
    )


# ---------------------------------------------------------------- checks and builders (no model work)


def _as_flags(exc: Exception) -> str:
    """A config error in the words of the command line: field names become their flags, None 'all'."""
    msg = str(exc)
    for field, flag in {**_PREFILLING_OPTIONS, "threshold": "--threshold", "temperature": "--temperature"}.items():
        msg = re.sub(rf"(?<![\w-]){field}\b", flag, msg)  # not inside a flag already written
    return re.sub(r"\bor None\b", "or 'all'", msg)


def _unmasking_check(args, gen_length: int | None) -> None:
    """Validate the decoding options as :func:`dllm.generate` will, before the model is loaded."""
    try:
        cfg = UnmaskingConfig(
            alg=args.alg or "maskgit_plus",
            temperature=args.temperature,
            threshold=args.threshold,
            confidence_from=args.confidence_from,
        )
    except ValueError as exc:
        raise UserError(f"decoding options: {_as_flags(exc)}") from exc
    if gen_length is None:
        if args.block_length is not None:
            raise UserError("--block-length needs --gen-length (the default gen length differs per case)")
        return
    block = args.block_length or gen_length
    if gen_length % block:
        raise UserError(f"--block-length {block} does not divide --gen-length {gen_length}")
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


def _positions_check(args, gen_length: int | None) -> None:
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


def _prefilling_config(args, model_dir: str) -> PrefillingConfig | None:
    """The PrefillingConfig of the command line, or None for the other methods.

    Base: the checkpoint's tuned settings (``prefilling_config.json``, read by
    ``PrefillingConfig.from_pretrained``), else the library defaults; the options given override it.
    """
    given = {f: getattr(args, f) for f in _PREFILLING_OPTIONS if getattr(args, f) is not None}
    if args.method != "prefilling":
        if getattr(args, "no_cuda_graph", False):
            given["no_cuda_graph"] = True
        if given:
            names = ", ".join(_PREFILLING_OPTIONS.get(f, "--no-cuda-graph") for f in given)
            raise UserError(f"{names}: option(s) of --method prefilling, not of --method {args.method}")
        return None
    given = {f: None if v == _ALL else tuple(v) if isinstance(v, list) else v for f, v in given.items()}
    base = PrefillingConfig.from_pretrained(model_dir)  # its errors name the file
    try:  # replace, not from_pretrained's overrides: "--top-k all" (None) must override the file too
        cfg = dataclasses.replace(base, **given)
    except ValueError as exc:
        raise UserError(f"prefilling options: {_as_flags(exc)}") from exc
    _chunk_fits(cfg.chunk_size, args)
    return cfg


def _chunk_fits(chunk_size: int, args) -> None:
    """A chunk is encoded alone at positions 0..C (its BOS anchor first): past the checkpoint's trained
    positions its keys would be out of distribution, silently."""
    limit = _model_config(args).trained_positions
    if limit and chunk_size + 1 > limit:
        raise UserError(
            f"--chunk-size {chunk_size}: a chunk and its BOS anchor take {chunk_size + 1} positions, more than "
            f"the model's {limit} trained positions"
        )


def _fit_top_k(cfg: PrefillingConfig, context_tokens: int, explicit: bool) -> PrefillingConfig:
    """``cfg`` for a context of ``context_tokens``: an explicit K above its chunk count is a user error;
    a default K above it keeps every chunk (top_k None; :meth:`PrefillingConfig.fit_top_k`)."""
    fitted = cfg.fit_top_k(context_tokens)
    if explicit and fitted is not cfg:
        raise UserError(
            f"--top-k {cfg.top_k} exceeds the {cfg.chunks_of(context_tokens)} chunk(s) of a {context_tokens}-token "
            f"context at --chunk-size {cfg.chunk_size}; lower --top-k or --chunk-size, or pass --top-k all"
        )
    return fitted


MAX_INPUT_BYTES = 1 << 30  # 1 GiB of text is ~250M tokens: far past any context this package encodes


def _read_text(path: str, what: str) -> str:
    """A UTF-8 text file, pipe or terminal, at most :data:`MAX_INPUT_BYTES`. Opening a FIFO blocks until
    a writer opens it: after a second of waiting, stderr says so (a silent hang looks like a crash)."""
    import threading

    waiting = threading.Timer(1.0, lambda: print(f"waiting for a writer on {what} {path} ...", file=sys.stderr))
    waiting.daemon = True
    waiting.start()
    try:
        f = open(path, "rb")
    finally:
        waiting.cancel()
    with f:
        data = f.read(MAX_INPUT_BYTES + 1)
    if len(data) > MAX_INPUT_BYTES:
        raise UserError(f"{what} {path}: more than {MAX_INPUT_BYTES:,} bytes of text")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise UserError(f"{what} {path}: not UTF-8 text") from None


def _strip_one_newline(text: str) -> str:
    """Remove the one line ending an editor adds at the end of a file (``\\n`` or ``\\r\\n``)."""
    if text.endswith("\r\n"):
        return text[:-2]
    return text[:-1] if text.endswith("\n") else text


def _backend_check(args) -> None:
    """``PREFILLING_DLLM_BACKEND=triton`` on a CPU run needs the Triton interpreter: say so before the model
    loads (the kernels would raise deep inside the first forward)."""
    import torch

    if getattr(args, "command", None) not in ("generate", "eval", "encode"):
        return  # info and the like run no kernel
    choice = os.environ.get("PREFILLING_DLLM_BACKEND", "auto").strip().lower() or "auto"
    if choice not in ("auto", "triton", "torch"):
        raise UserError(f"PREFILLING_DLLM_BACKEND={choice!r}: use triton, torch or auto (or unset it)")
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


def _window_check(
    model, live_tokens: int, gen_length: int, method: str, context_given: bool, kept_positions: int = 0
) -> None:
    """The tokens that must share the model's trained positions with the response, checked before decoding.

    ``live_tokens``: the whole prompt for dense / prefix_cache, prefix + query for prefilling;
    ``kept_positions``: prefilling only, the positions its kept chunks take before the query
    (:func:`_kept_positions`). Past the window the response is out of distribution: an error when
    nothing but the response and the prompt's own text fills it, a note when a long context (or the
    kept chunks) do (the dense baselines beyond the window are measured on purpose)."""
    limit = model.config.trained_positions
    if (
        limit
        and method == "prefilling"
        and live_tokens + gen_length <= limit < live_tokens + kept_positions + gen_length
    ):
        total = live_tokens + kept_positions + gen_length
        line = (
            f"note: prefix, kept chunks, query and --gen-length {gen_length} reach position {total}, past the "
            f"model's {limit} trained positions: lower --top-k, --chunk-size or --gen-length"
        )
        print(line, file=sys.stderr)
    if not limit or live_tokens + gen_length <= limit:
        return
    what = "prefix + query" if method == "prefilling" else "prompt"
    line = (
        f"the {what} ({live_tokens} tokens) and --gen-length {gen_length} take {live_tokens + gen_length} "
        f"positions, more than the model's {limit} trained positions"
    )
    if method == "prefilling" or not context_given:
        raise UserError(f"{line}; shorten the prompt or lower --gen-length")
    print(f"note: {line}: answers past the window are unreliable (--method prefilling keeps only K chunks)",
          file=sys.stderr)  # fmt: skip


def _kept_positions(cfg: PrefillingConfig, context_tokens: int) -> int:
    """Positions the kept chunks take between the prefix and the query: K chunks with their anchors
    (``continuous``), one chunk's (``reuse``: all at the same positions) or the whole context
    (``absolute``)."""
    from dllm.prefilling import cut_chunks

    n = len(cut_chunks(context_tokens, cfg.chunk_size))
    width = min(cfg.chunk_size, context_tokens) + 1
    if cfg.position_mode == "absolute":
        return context_tokens + 1
    if cfg.position_mode == "reuse":
        return width
    return min(n, cfg.top_k or n) * width


def _decode_kwargs(args, gen_length) -> dict:
    return dict(
        gen_length=gen_length,
        steps=args.steps,
        block_length=args.block_length,
        alg=args.alg,
        temperature=args.temperature,
        confidence_from=args.confidence_from,
        threshold=args.threshold,
    )


def _graph_kwargs(args) -> dict:
    """``cuda_graph=False`` for ``--no-cuda-graph`` (prefilling only; checked by :func:`_prefilling_config`)."""
    return {"cuda_graph": False} if getattr(args, "no_cuda_graph", False) else {}


def _load(args):
    import dllm

    t0 = time.perf_counter()
    model = dllm.load_model(args.model, device=args.device, dtype=args.dtype)
    return model, time.perf_counter() - t0


# ---------------------------------------------------------------- generate

QUESTION_SLOT = "{question}"
DEFAULT_QUESTION_TEMPLATE = "{context}{question}"  # generate --question without --prompt-file


def _read_questions_file(path: str) -> list[str]:
    """``--questions-file``: one question per line (a trailing ``\\r`` removed, blank lines skipped); ``-`` reads
    stdin to its end (on a terminal, stderr says so first)."""
    if path == "-":
        if sys.stdin.isatty():
            print("reading questions from stdin, one per line; end with Ctrl-D", file=sys.stderr)
        data = sys.stdin.buffer.read(MAX_INPUT_BYTES + 1)
        if len(data) > MAX_INPUT_BYTES:
            raise UserError(f"--questions-file -: more than {MAX_INPUT_BYTES:,} bytes of text")
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            raise UserError("--questions-file -: stdin is not UTF-8 text") from None
    else:
        text = _read_text(path, "--questions-file")
    questions = [line.removesuffix("\r") for line in text.split("\n")]
    questions = [q for q in questions if q.strip()]
    if not questions:
        raise UserError(f"--questions-file {path}: no questions (one per line; blank lines are skipped)")
    return questions


def _questions(args) -> list[str] | None:
    """The questions to answer, in order: every ``--question``, then the lines of ``--questions-file``;
    None when neither is given."""
    questions = list(args.question or [])
    for i, question in enumerate(questions, 1):
        if not question.strip():
            raise UserError(f"--question #{i} is empty")
    if args.questions_file is not None:
        questions += _read_questions_file(args.questions_file)
    for i, question in enumerate(questions, 1):
        if "{context}" in question or QUESTION_SLOT in question:
            raise UserError(f"question {i} holds a {{context}} or {{question}} slot: a question is plain text")
    return questions or None


def _templates(args, questions: list[str] | None) -> list[str]:
    """The prompts to answer: the prompt file (or :data:`DEFAULT_QUESTION_TEMPLATE` with questions and no
    prompt file), once per question, which fills the prompt's one ``{question}`` slot. A prompt file
    without the slot is an error when questions are given (nothing is appended silently)."""
    if args.prompt_file is None and not questions:
        raise UserError("generate needs --prompt-file, --question or --questions-file")
    if args.prompt_file is None:
        template = DEFAULT_QUESTION_TEMPLATE
    else:
        template = _strip_one_newline(_read_text(args.prompt_file, "--prompt-file"))
    if not questions:
        return [template]
    slots = template.count(QUESTION_SLOT)
    if slots != 1:
        raise UserError(
            f"--prompt-file {args.prompt_file} must hold exactly one {QUESTION_SLOT} slot for the questions, found "
            f'{slots} (e.g. a last line "Question: {QUESTION_SLOT} Answer:"; without --prompt-file the prompt is '
            f"{DEFAULT_QUESTION_TEMPLATE})"
        )
    return [template.replace(QUESTION_SLOT, q) for q in questions]


def _one_line_answer(text: str) -> str:
    """An answer on one line of labelled output: backslashes doubled, CR and LF written as ``\\r`` and ``\\n``
    (as in eval's CSV: :func:`dllm.eval.evaluation.one_line_cell`)."""
    from dllm.eval.evaluation import one_line_cell

    return one_line_cell(text)


def _print_answer(res, label: int | None, question: str | None) -> None:
    """The answer on stdout: as is for a single prompt; ``Q<n>: question`` and ``A<n>: answer`` lines (the
    answer on one line, :func:`_one_line_answer`) for the n-th question."""
    answer = res.text[0] if res.text is not None else " ".join(map(str, res.tokens[0].tolist()))
    if label is None:
        print(answer, flush=True)
        return
    print(f"Q{label}: {_one_line_answer(question.strip())}", flush=True)
    print(f"A{label}: {_one_line_answer(answer)}".rstrip(" "), flush=True)


def _chunk_char_spans(model, context: str, cfg: PrefillingConfig) -> list | None:
    """``[(start, end)]`` character offsets into ``context`` of each chunk ``cfg`` cuts it into (fixed or
    snapped boundaries; end exclusive), from the tokenizer's offset mapping of the one tokenization of the
    context (:func:`dllm.model.tokenization.token_offsets`); None when the tokenizer gives no offsets."""
    from dllm.model.tokenization import encode_text, token_offsets
    from dllm.prefilling.chunks import chunk_spans

    offsets = token_offsets(model, context)
    if offsets is None or offsets.shape[0] == 0:
        return None
    ids = encode_text(model, context)
    return [
        (int(offsets[s, 0]), int(offsets[s + n - 1, 1]))
        for s, n in chunk_spans(model, ids, cfg.chunk_size, cfg.boundary_snap)
    ]


def _stats_dict(res, spans: tuple | None) -> dict:
    """The full stats of one answer (``--stats json``): forwards, steps, seconds per phase, tokens per second,
    the prefilling details of ``res.stats.extra`` and, when known, the kept chunks' spans
    (``selected_chunk_chars`` into the context text, else ``selected_chunk_tokens``; :func:`_stats_line`)."""
    stats = {
        "nfe": res.stats.nfe,
        "steps": res.stats.steps,
        "seconds": {k: round(v, 4) for k, v in res.stats.seconds.items()},
        "tokens_per_second": round(res.stats.tokens_per_second, 2),
        **{k: v for k, v in res.stats.extra.items() if k != "gen_tokens"},
    }
    if spans is not None and "selected_chunks" in stats:
        unit, where = spans
        stats[f"selected_chunk_{unit}"] = [list(where[j]) for j in stats["selected_chunks"]]
    return stats


def _stats_line(res, spans: tuple | None, chunk_size: int | None) -> str:
    """The one-line summary of ``--stats summary``: the kept chunks with their spans in the context
    (``spans``: ``("chars", [(start, end)])`` into the context text, or ``("tokens", ...)`` when the text is
    not known, as with --document; end exclusive), seconds per phase, steps, forwards and tokens per second."""
    extra = res.stats.extra
    parts = []
    if "selected_chunks" in extra:
        kept = extra["selected_chunks"]
        if spans is not None:
            unit, where = spans
            where = [f"{j} [{unit} {where[j][0]}:{where[j][1]}]" for j in kept]
        else:
            where = [str(j) for j in kept]
        size = f" of {chunk_size} tokens" if chunk_size else ""
        parts.append(f"kept {len(kept)} of {extra['num_chunks']} chunks{size}: {', '.join(where)}")
    parts.append(", ".join(f"{k} {v:.2f} s" for k, v in res.stats.seconds.items()))
    parts.append(f"{res.stats.steps} steps, {res.stats.nfe} forwards, {res.stats.tokens_per_second:.1f} tokens/s")
    return "; ".join(parts)


def _print_stats(args, res, label: int | None, spans: tuple | None, chunk_size: int | None) -> None:
    """``--stats``: one summary line (default), the full JSON line, or nothing, on stderr."""
    if args.stats == "none":
        return
    if args.stats == "json":
        line = json.dumps({"question": label, **_stats_dict(res, spans)} if label else _stats_dict(res, spans))
    else:
        line = f"stats{f' Q{label}' if label else ''}: {_stats_line(res, spans, chunk_size)}"
    print(line, file=sys.stderr, flush=True)


def _progress() -> bool:
    """Progress bars only on a terminal: piped or redirected stderr gets none (no bar residue in logs)."""
    return sys.stderr.isatty()


def _document_config(args, header: dict) -> PrefillingConfig:
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
    cfg = _prefilling_config(args, args.model or default_model_dir())
    return _fit_top_k(cfg, header["num_tokens"], explicit=args.top_k not in (None, _ALL))


def _torchrun() -> bool:
    """Launched by torchrun (``WORLD_SIZE`` set): ``encode`` and ``generate`` run on every rank
    (:mod:`dllm.distributed.cli`: a sharded document, distributed chunk scoring, rank 0 decodes)."""
    return "WORLD_SIZE" in os.environ


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

    ids = encode_text(model, context)
    fitted = _fit_top_k(cfg, ids.numel(), explicit=args.top_k not in (None, _ALL))
    t0 = time.perf_counter()
    document = dllm.encode_document(model, ids, prefilling=fitted, progress=_progress())
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
    _window_check(model, live, kw["gen"], "prefilling", True, _kept_positions(cfg, context_tokens))
    return dllm.generate(
        model, prompt=parts, document=document, method="prefilling", prefilling=cfg, seed=args.seed,
        progress=_progress(), **_graph_kwargs(args), **kw["decode"],
    )  # fmt: skip


def _answer_fresh(model, args, template, context, cfg, kw):
    """One answer with the context in the prompt: prefilling (chunked prefill, selection) or a baseline."""
    import dllm
    from dllm.model.tokenization import encode_text

    gen = kw["gen"]
    if cfg is not None:
        from dllm.prefilling import split_prompt

        parts = split_prompt(
            model, template, context=context, query_window=cfg.query_window, apply_chat_template=args.chat
        )
        fitted = _fit_top_k(cfg, parts.context.numel(), explicit=args.top_k not in (None, _ALL))
        live = parts.prefix.numel() + parts.query.numel()
        _window_check(model, live, gen, "prefilling", True, _kept_positions(fitted, parts.context.numel()))
        return dllm.generate(
            model, prompt=parts, method="prefilling", prefilling=fitted, seed=args.seed, progress=_progress(),
            **_graph_kwargs(args), **kw["decode"],
        )  # fmt: skip
    text = template if context is None else template.replace("{context}", context)
    if args.chat:  # the chat template decides the leading special tokens
        from dllm.prefilling.prompt import render_chat

        ids = encode_text(model, render_chat(model, text))[None]
    else:
        ids = encode_text(model, text, bos=True)[None]
    _window_check(model, ids.shape[1], gen, args.method, context is not None)
    return dllm.generate(model, ids, method=args.method, seed=args.seed, progress=_progress(), **kw["decode"])


def cmd_generate(args) -> int:
    if _torchrun():
        from dllm.distributed import cli as distributed_cli

        return distributed_cli.cmd_generate(args)
    import dllm
    from dllm.model.loader import default_model_dir

    header = None
    if args.document is not None:
        if args.context_file is not None:
            raise UserError("--document and --context-file both give the context: pass one")
        if args.method not in (None, "prefilling"):
            raise UserError(f"--document answers with --method prefilling, not --method {args.method}")
        args.method = "prefilling"
        header = dllm.DocumentCache.read_header(args.document)  # before the model loads
    # the product with a context; a prompt alone (nothing to chunk) decodes densely
    args.method = args.method or ("prefilling" if args.context_file is not None else "dense")
    questions = _questions(args)
    templates = _templates(args, questions)
    context = None
    if args.context_file is not None:
        context = _read_text(args.context_file, "--context-file")
        if not context.strip():
            raise UserError(f"--context-file {args.context_file} is empty")
    _check_templates(args, templates, context)
    _unmasking_check(args, args.gen_length)
    _positions_check(args, args.gen_length)
    if args.document is not None:
        cfg = _document_config(args, header)
    else:
        cfg = _prefilling_config(args, args.model or default_model_dir())

    model, _ = _load(args)
    gen = args.gen_length or inspect.signature(dllm.generate).parameters["gen_length"].default
    kw = {"gen": gen, "decode": _decode_kwargs(args, args.gen_length)}
    document = context_tokens = None
    if args.document is not None:
        document, context_tokens = dllm.DocumentCache.load(args.document, model), header["num_tokens"]
    elif cfg is not None and context is not None and len(templates) > 1:
        document, cfg, context_tokens = _encode_context_once(model, args, context, cfg)
    spans = None  # ("chars" | "tokens", [(start, end)] per chunk), for the stats
    if cfg is not None and args.stats != "none":
        if context is not None:
            chars = _chunk_char_spans(model, context, cfg)
            spans = ("chars", chars) if chars is not None else None
        if spans is None and document is not None:  # the document's own chunks (fixed or snapped)
            chunks = document.chunks  # lens count the BOS anchor
            spans = ("tokens", [(s, s + int(n) - 1) for s, n in zip(chunks.starts, chunks.lens.tolist())])
        elif spans is None and context_tokens is not None:
            from dllm.prefilling import cut_chunks

            spans = ("tokens", [(s, s + n) for s, n in cut_chunks(context_tokens, cfg.chunk_size)])
    for i, template in enumerate(templates):
        if document is not None:
            res = _answer_from_document(model, args, template, document, cfg, context_tokens, kw)
        else:
            res = _answer_fresh(model, args, template, context, cfg, kw)
        label = i + 1 if questions else None
        _print_answer(res, label, questions[i] if questions else None)
        _print_stats(args, res, label, spans, cfg.chunk_size if cfg is not None else None)
    return 0


# ---------------------------------------------------------------- encode


def _check_out(out: str, create_folder: bool = False) -> None:
    """``--out``: a file name (not a folder) in an existing folder. Only our default folder (runs/) is
    created (``create_folder``): a mistyped path must not create folders."""
    if os.path.isdir(out):
        raise UserError(f"--out {out} is a directory; give a file name")
    if os.path.exists(out) and not os.path.isfile(out):  # /dev/null, a FIFO: never replaced by a file
        raise UserError(f"--out {out} exists and is not a regular file")
    folder = os.path.dirname(os.path.abspath(out))
    if not create_folder and not os.path.isdir(folder):
        raise UserError(f"--out {out}: no such directory {folder}")
    try:
        os.makedirs(folder, exist_ok=True)
    except OSError as exc:
        raise UserError(f"--out {out}: cannot create its folder ({exc.strerror or exc})") from exc


def cmd_encode(args) -> int:
    """``encode``: the chunked prefill of a document, saved as a :class:`dllm.DocumentCache` (under torchrun:
    one shard per rank and an index, :mod:`dllm.distributed.cli`)."""
    if _torchrun():
        from dllm.distributed import cli as distributed_cli

        return distributed_cli.cmd_encode(args)
    import dllm
    from dllm.model.loader import default_model_dir

    text = _read_text(args.context_file, "--context-file")
    if not text.strip():
        raise UserError(f"--context-file {args.context_file} is empty")
    if not args.out.strip():
        raise UserError("--out is empty; give a file name")
    _check_out(args.out)
    given = {"chunk_size": args.chunk_size, "prefill_batch": args.prefill_batch, "boundary_snap": args.boundary_snap}
    base = PrefillingConfig.from_pretrained(args.model or default_model_dir())
    try:
        cfg = dataclasses.replace(base, **{k: v for k, v in given.items() if v is not None})
    except ValueError as exc:
        raise UserError(f"encode options: {_as_flags(exc)}") from exc
    _chunk_fits(cfg.chunk_size, args)

    model, _ = _load(args)
    doc = dllm.encode_document(model, dllm.encode_text(model, text), prefilling=cfg, progress=_progress())
    doc.save(args.out)
    print(
        f"wrote {args.out}: {len(doc)} tokens in {doc.num_chunks} chunks of {doc.chunk_size} "
        f"({os.path.getsize(args.out) / 2**20:.1f} MiB)"
    )
    return 0


# ---------------------------------------------------------------- eval


def _unique_eval_path(task: str, method: str) -> str:
    """eval's default CSV: ``runs/eval_TASK_METHOD_YYYYmmdd-HHMMSS.csv`` (UTC), with ``-2``, ``-3``, ... when
    that name is taken. The name is reserved at once (an empty file created exclusively), so two runs
    started in the same second never write the same file; :func:`cmd_eval` removes it if the run fails
    before writing."""
    import datetime as dt

    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%d-%H%M%S")
    base = os.path.join(RUNS_DIR, f"eval_{task}_{method}_{stamp}")
    _check_out(base + ".csv", create_folder=True)
    path, n = base + ".csv", 1
    while True:
        try:
            os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o666))
            return path
        except FileExistsError:
            n += 1
            path = f"{base}-{n}.csv"


def _eval_columns(args, model, cfg: PrefillingConfig | None) -> dict:
    """The constant columns of every eval CSV row: provenance (:func:`dllm.eval.provenance.provenance`: device,
    torch/triton/CUDA versions, git commit, UTC date) and the settings (model, dtype, decoding options, and
    C, K, B and the score terms of prefilling; empty for the baselines)."""
    from dllm.eval.provenance import provenance

    def opt(v):
        return "" if v is None else "all" if v == _ALL else v

    return {
        **provenance(str(model.device)),
        "device": str(model.device),
        "model": args.model or "bundled tiny-dream",
        "dtype": str(model.dtype).removeprefix("torch."),
        "haystack": args.haystack,
        "gen_length": opt(args.gen_length),
        "steps": opt(args.steps),
        "block_length": opt(args.block_length),
        "alg": opt(args.alg),
        "temperature": args.temperature,
        "sampling_seed": opt(args.seed),
        "chunk_size": cfg.chunk_size if cfg is not None else "",
        "top_k": ("all" if cfg.top_k is None else cfg.top_k) if cfg is not None else "",
        "token_budget": ("all" if cfg.token_budget is None else cfg.token_budget) if cfg is not None else "",
        "score_terms": " ".join(cfg.score_terms) if cfg is not None else "",
    }


def cmd_eval(args) -> int:
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
    _unmasking_check(args, args.gen_length)
    _positions_check(args, args.gen_length)
    cfg = _prefilling_config(args, args.model or default_model_dir())
    if args.out is not None and not args.out.strip():
        raise UserError("--out is empty; give a file name (or leave --out out for the default)")
    if args.out is not None:
        _check_out(args.out)
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

    model, load_s = _load(args)
    if longbench:
        from dllm.model.tokenization import encode_text

        context_tokens = [len(encode_text(model, c.context)) for c in cases] if cfg is not None else None
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
        context_tokens = [c.context_tokens for c in cases]
        run_one = run_case
        if args.gen_length is not None:  # the response and the case's own prefix + query must fit the window
            from dllm.model.tokenization import encode_text

            live = max(len(encode_text(model, c.prefix)) + len(encode_text(model, c.query)) + 1 for c in cases)
            _window_check(model, live, args.gen_length, "prefilling", True)
    configs = [cfg] * len(cases)
    if cfg is not None:  # every case is checked before the first one runs
        configs = [_fit_top_k(cfg, n, explicit=args.top_k not in (None, _ALL)) for n in context_tokens]
        fewer = sum(f.top_k is None for f in configs) if cfg.top_k is not None else 0
        if fewer:
            print(
                f"note: {fewer} of {len(cases)} contexts have fewer than the default top_k={cfg.top_k} chunks of "
                f"{cfg.chunk_size} tokens: they keep every chunk",
                file=sys.stderr,
            )
    kw = _decode_kwargs(args, args.gen_length)

    def run(i):
        extra = {"prefilling": configs[i], **_graph_kwargs(args)} if cfg is not None else {}
        return run_one(model, cases[i], args.method, seed=args.seed, **kw, **extra)

    t0 = time.perf_counter()
    run(0)  # warm-up: one untimed case absorbs the one-off start-up costs
    warm_s = time.perf_counter() - t0
    rows = [run(i) for i in tqdm(range(len(cases)), desc=f"{args.task}/{args.method}", disable=not _progress())]
    write_csv(rows, out, provenance=_eval_columns(args, model, cfg))
    if longbench:
        print(accuracy_table(rows, by=("dataset", "method"), value="score"))
    else:
        by = ("task", "method", "length", "depth") if args.by_depth else ("task", "method", "length")
        print(accuracy_table(rows, by=by))
    print(f"start-up, not in the table: model load {load_s:.1f} s, one warm-up case {warm_s:.1f} s")
    print(f"wrote {out}")
    return 0


# ---------------------------------------------------------------- info


def cmd_info(args) -> int:
    """``info``: the checkpoint's family, size, dtype, KV cost and the prefilling defaults that will be used."""
    from dllm.checkpoint_info import checkpoint_info, format_info

    info = checkpoint_info(args.model, device=args.device, dtype=args.dtype)
    print(json.dumps(info, indent=2) if args.json else format_info(info))
    return 0


# ---------------------------------------------------------------- parser and entry point


def _epilog(command: str) -> str:
    return f"examples:\n{_examples(command)}\n\n{EXAMPLE_FILES[command]}"


def build_parser(model_dir: str | None = None) -> argparse.ArgumentParser:
    """The ``python -m dllm`` parser (its subcommands' help texts hold the runnable examples); the help shows
    the prefilling defaults of the checkpoint ``model_dir`` (default: the bundled model)."""
    p = _Parser(prog="python -m dllm", description=DESCRIPTION, formatter_class=_HelpFormatter)
    sub = p.add_subparsers(dest="command", metavar="COMMAND", required=True, parser_class=_Parser)

    g = sub.add_parser(
        "generate",
        help="answer one prompt (or several questions)",
        description="Answer one prompt (or each question): the answer on stdout (labelled Q1:/A1: with questions),\n"
        "one stats line per answer on stderr (--stats json for all of them); progress bars only on a terminal.",
        epilog=_epilog("generate"),
        formatter_class=_HelpFormatter,
    )
    g.add_argument(
        "--prompt-file",
        type=_input_file,
        default=None,
        help="UTF-8 prompt; may hold one {context} slot (and must hold one {question} slot with --question or "
        "--questions-file); one trailing newline (an editor's) is removed. Without a slot and --context-file, "
        "--method prefilling takes the last 64 tokens as the query, the rest as context (default: none; needed "
        "unless questions are given)",
    )
    g.add_argument(
        "--context-file",
        type=_input_file,
        default=None,
        help="UTF-8 text put into the prompt's {context} slot, read as is; a pipe such as <(...) works (default: none)",
    )
    g.add_argument(
        "--document",
        type=_existing_file,
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
        "line, or nothing; progress bars appear only when stderr is a terminal",
    )
    g.add_argument(
        "--chat",
        action="store_true",
        help="instruct checkpoints: the prompt (context slot inside) is the user turn of the tokenizer's chat template",
    )
    _add_common_args(g)
    _add_decode_args(g, 32, document=True, model_dir=model_dir)
    g.set_defaults(func=cmd_generate)

    c = sub.add_parser(
        "encode",
        help="encode a document once for later questions (a document cache)",
        description="Chunked prefill of a document, saved as one safetensors file (a dllm.DocumentCache) that\n"
        "generate --document answers from without encoding the document again.",
        epilog=_epilog("encode"),
        formatter_class=_HelpFormatter,
    )
    c.add_argument("--context-file", type=_input_file, required=True, help="UTF-8 document text, read as is")
    c.add_argument("--out", required=True, help="the cache file to write")
    c.add_argument(
        "--chunk-size",
        type=_positive_int,
        default=None,
        help=f"C, context tokens per chunk ({_default_help(model_dir, 'chunk_size')})",
    )
    c.add_argument("--prefill-batch", type=_positive_int, default=None, help=_PREFILL_BATCH_HELP)
    c.add_argument("--boundary-snap", type=_non_negative_int, default=None, help=_BOUNDARY_SNAP_HELP + " (default: 0)")
    _add_common_args(c)
    c.set_defaults(func=cmd_encode)

    e = sub.add_parser(
        "eval",
        help="accuracy on a seeded retrieval task (CSV + table)",
        description="Accuracy on seeded cases of a retrieval task. One untimed warm-up case runs first (its time\n"
        "and the model's load time are reported apart); then one CSV row per case and a table of accuracy\n"
        "and mean seconds per case.",
        epilog=_epilog("eval"),
        formatter_class=_HelpFormatter,
    )
    e.add_argument(
        "task",
        choices=(*TASKS, LONGBENCH),
        help="a seeded InfiniteBench-style task (needle: Needle-in-a-Haystack QA), or longbench with --data",
    )
    e.add_argument("--lengths", type=_positive_int, nargs="+", default=[1024], help="context lengths in tokens")
    e.add_argument(
        "--depths", type=_depth, nargs="+", default=[0.0, 0.25, 0.5, 0.75, 1.0], help="needle depths in [0, 1]"
    )
    e.add_argument("--samples", type=_positive_int, default=5, help="cases per (length, depth)")
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
        type=_input_file,
        default=None,
        help="longbench: a local LongBench JSONL file, e.g. data/hotpotqa.jsonl of THUDM/LongBench (default: none)",
    )
    e.add_argument(
        "--limit", type=_positive_int, default=None, help="longbench: score the first N examples (default: all)"
    )
    e.add_argument(
        "--out",
        default=None,
        help=f"CSV path, replaced if it exists (default: a new {RUNS_DIR}/eval_TASK_METHOD_DATE-TIME.csv in the "
        "working directory, UTC, never an earlier run's); every row carries the device, torch/triton versions, git "
        "commit, date and the settings (model, C, K, B, ...)",
    )
    _add_common_args(e)
    _add_decode_args(e, None, model_dir=model_dir)
    e.set_defaults(func=cmd_eval)

    i = sub.add_parser(
        "info",
        help="describe a checkpoint: family, size, dtype, KV bytes, prefilling defaults",
        description="Describe a checkpoint (no weights are loaded): family, size, dtype, KV bytes per 1K tokens,\n"
        "and the prefilling defaults dllm would use for it.",
        epilog=_epilog("info"),
        formatter_class=_HelpFormatter,
    )
    _add_common_args(i)
    i.add_argument("--json", action="store_true", help="print the summary as JSON")
    i.set_defaults(func=cmd_info)
    return p


# what to lower when a command runs out of memory (its options that size the tensors)
_OOM_HINTS = {
    "generate": (
        "lower --gen-length or the context's length (with --method prefilling: --top-k, --token-budget, "
        "--prefill-batch)"
    ),
    "encode": "lower --prefill-batch (chunks per forward) or --chunk-size",
    "eval": "lower --lengths or --gen-length (with --method prefilling: --top-k, --token-budget, --prefill-batch)",
}
_CPU_OOM = re.compile(r"DefaultCPUAllocator: (can't allocate|not enough) memory", re.IGNORECASE)


def _out_of_memory(exc: BaseException) -> str | None:
    """Where ``exc`` ran out of memory ("the GPU", "CPU memory"), or None when it is no allocation failure."""
    import torch

    if isinstance(exc, torch.OutOfMemoryError):
        return "the GPU"
    if isinstance(exc, MemoryError) or (isinstance(exc, RuntimeError) and _CPU_OOM.search(str(exc))):
        return "CPU memory"
    return None


def _oom_line(exc: BaseException, where: str, command: str | None) -> str:
    size = re.search(r"tried to allocate ([\d.]+ ?[KMGT]i?B|\d+ bytes)", str(exc), re.IGNORECASE)
    asked = f", tried to allocate {size[1]}" if size else ""
    hint = _OOM_HINTS.get(command, "use smaller inputs")
    return f"out of memory ({where}{asked}): {hint}, or a 16-bit --dtype (--debug shows the traceback)"


def main(argv=None) -> int:
    """Run the command line; returns the exit status (0; 2 for a user error; 130 after Ctrl-C).

    User errors (bad options or paths, invalid values that the library rejects with ``ValueError``,
    files that cannot be read or written) and running out of GPU or CPU memory (with what to lower)
    print one ``error:`` line on stderr; Ctrl-C prints ``interrupted``. With ``--debug`` the exception
    propagates with its traceback. Other exceptions (bugs) always propagate.
    """
    argv = sys.argv[1:] if argv is None else list(argv)
    debug = "--debug" in argv
    command = None
    try:
        args = build_parser(_model_in_argv(argv)).parse_args(argv)
        command = args.command
        _backend_check(args)
        return args.func(args)
    except (UserError, ValueError, OSError) as exc:
        if debug:
            raise
        print(f"error: {_one_line(exc)}", file=sys.stderr)
        return 2
    except (RuntimeError, MemoryError) as exc:
        where = _out_of_memory(exc)
        if where is None or debug:  # any other RuntimeError is a bug: its traceback is the report
            raise
        print(f"error: {_oom_line(exc, where, command)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        if debug:
            raise
        print("interrupted", file=sys.stderr)
        return 130  # 128 + SIGINT, as a shell reports a program stopped by Ctrl-C


def _one_line(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.filename is not None:
        return f"{exc.filename}: {exc.strerror or exc}"
    return " ".join(str(exc).split()) or type(exc).__name__
