"""What every subcommand declares: the parser and help classes, the argument types (checked while
parsing) and the argument groups the subcommands share (model and device, decoding, prefilling).

The help of every prefilling option states the default that ``--model`` will use: its
``prefilling_config.json`` over the library's (:func:`default_help`).

Imports: :mod:`dllm.cli.errors`, :mod:`dllm.decode`, :mod:`dllm.prefilling.config`, :mod:`dllm.model` and
:data:`dllm.generate.METHODS`; no command module.
"""

from __future__ import annotations

import argparse
import math
import os
import stat

from dllm.cli.errors import UserError
from dllm.decode.block_cache import BLOCK_CACHE_MODES
from dllm.decode.unmasking import ALGS, CONFIDENCE_SOURCES, DRAW_ORDERS
from dllm.generate import METHODS
from dllm.prefilling.config import AUTO, CACHE_MODES, POSITION_MODES, SCORE_MODES, SCORE_TERMS, PrefillingConfig

ALL = "all"  # --top-k all / --token-budget all: keep every chunk / every token (the library's None)
OFF = "off"  # --adaptive-k off / --redundancy-threshold off: off even where the checkpoint turns it on (None)
_PREFILLING_DEFAULTS = PrefillingConfig()
# CLI option -> PrefillingConfig field; these options apply to --method prefilling only
PREFILLING_OPTIONS = {
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
    "adaptive_k": "--adaptive-k",
    "lexical_weight": "--lexical-weight",
}
_BOUNDARY_SNAP_HELP = (
    "tokens a chunk boundary may move back to follow a sentence or paragraph end (0 = fixed chunks of C tokens; "
    "a document is encoded with it and answered with it)"
)
_PREFILL_BATCH_HELP = (
    "chunks encoded per forward (default: as many as fit in a quarter of the device's free memory; lower it "
    "if encoding runs out of memory)"
)


class Parser(argparse.ArgumentParser):
    """argparse with one-line errors (raised, so :func:`main` reports every user error the same way) and no
    abbreviations: a misspelt option is an error, not silently another one (``--context`` is not ``--context-file``)."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message):
        raise UserError(f"{message} (see {self.prog} --help)")


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
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


positive_int = _int_at_least(1)
non_negative_int = _int_at_least(0)


def positive_int_or_all(text: str):
    return ALL if text == ALL else positive_int(text)


def block_cache_arg(text: str):
    """``--block-cache``: ``off``, ``block``, ``step`` or a refresh interval, an int >= 1
    (:mod:`dllm.decode.block_cache`)."""
    if text in BLOCK_CACHE_MODES:
        return text
    try:
        return positive_int(text)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(
            f"expected one of {', '.join(BLOCK_CACHE_MODES)} or an int >= 1, got {text!r}"
        ) from None


def candidates_arg(text: str):
    """``--candidates``: an int >= 1, ``auto`` (:func:`dllm.prefilling.config.auto_candidates`) or ``all``
    (every chunk scored: the library's None)."""
    return text if text in (ALL, AUTO) else positive_int(text)


def _finite_float(low: float, strict: bool):
    """An argparse type: a finite number >= ``low`` (> ``low`` when ``strict``), one message for every refusal
    (inf would turn every token distribution into NaN)."""
    bound = f"> {low:g}" if strict else f">= {low:g}"

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not (math.isfinite(value) and (value > low if strict else value >= low)):
            raise argparse.ArgumentTypeError(f"expected a finite number {bound}, got {text!r}")
        return value

    return parse


non_negative_float = _finite_float(0, strict=False)
positive_float = _finite_float(0, strict=True)  # --adaptive-k's margin: 0 would cut at the first tie


def or_off(parse):
    """An argparse type: ``off`` (any case: the library's None, overriding a checkpoint's setting) or ``parse``."""

    def parse_or_off(text: str):
        if text.strip().lower() == OFF:
            return OFF
        try:
            return parse(text)
        except argparse.ArgumentTypeError as exc:
            raise argparse.ArgumentTypeError(f"{exc}, or off") from None

    return parse_or_off


def top_p_arg(text: str) -> float:
    """``--sampling-top-p``: a number in (0, 1] (1 keeps every token; NaN, 0 and anything outside are refused)."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0 < value <= 1:  # (False for NaN)
        raise argparse.ArgumentTypeError(f"expected a number in (0, 1], got {text!r}")
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


def existing_file(text: str) -> str:
    """A regular file (a document cache: it is read twice, its header first, so not a pipe)."""
    if not os.path.isfile(text):
        raise argparse.ArgumentTypeError(
            f"{text!r}: " + ("not a regular file" if os.path.exists(text) else "no such file")
        )
    return text


def input_file(text: str) -> str:
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


def add_common_args(p):
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


def default_help(model_dir: str | None, field: str, show=str) -> str:
    """``default: X`` of one prefilling field for ``--model model_dir``, saying whose value X is when the
    checkpoint's prefilling_config.json changes the library's (e.g. the bundled model's C=256 beside 1024)."""
    cfg, label = _model_defaults(model_dir)
    mine, lib = getattr(cfg, field), getattr(_PREFILLING_DEFAULTS, field)
    if mine == lib:
        return f"default: {show(lib)}"
    return f"default: {show(mine)}, {label}'s; the library's and the paper's: {show(lib)}"


def model_in_argv(argv: list[str]) -> str | None:
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


def add_decode_args(p, gen_length_default: int | None, document: bool = False, model_dir: str | None = None):

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
    p.add_argument("--gen-length", type=positive_int, default=gen_length_default, help=gen_help)
    p.add_argument("--steps", type=positive_int, default=None, help="denoising steps in all (default: the gen length)")
    p.add_argument(
        "--block-length",
        type=positive_int,
        default=None,
        help="semi-autoregressive block, divides the gen length (default: the gen length, one block)",
    )
    p.add_argument(
        "--block-cache",
        type=block_cache_arg,
        default=None,
        metavar="off|block|step|N",
        help="a step recomputes the current block only, reading the K/V of the query and the other blocks from a "
        "cache refreshed at each block start (block), also every N steps (N), or every step (step: exact, slow); "
        "off recomputes the whole response every step (default: block when the answer has several blocks, "
        "else off)",
    )
    p.add_argument(
        "--alg",
        default=None,
        choices=ALGS,
        help="unmasking rule (default: maskgit_plus for Dream, low_confidence for LLaDA)",
    )
    p.add_argument("--temperature", type=non_negative_float, default=0.0, help="0 = greedy; > 0 samples tokens")
    p.add_argument(
        "--sampling-top-p",
        type=top_p_arg,
        default=None,
        metavar="P",
        help="nucleus filter of the token distribution: keep the most likely tokens up to probability P, in (0, 1] "
        "(Dream's top_p; its demo samples with --temperature 0.2 --sampling-top-p 0.95 --alg entropy) "
        "(default: off)",
    )
    p.add_argument(
        "--sampling-top-k",
        type=positive_int,
        default=None,
        metavar="N",
        help="keep the N most likely tokens of the token distribution (Dream's top_k; not --top-k, prefilling's "
        "chunks kept) (default: off, as Dream's generation_config.json)",
    )
    p.add_argument(
        "--confidence-from",
        default=None,
        choices=CONFIDENCE_SOURCES,
        help="research option: the distribution that ranks positions at temperature > 0: the tempered one the tokens "
        "are drawn from (Dream's reference) or softmax(logits) (LLaDA's, Fast-dLLM's); ties go to the leftmost "
        "position (--draw-order official: where the official loops' torch.topk puts them) (default: the rule's "
        "reference: tempered for Dream's rules, logits for the others)",
    )
    p.add_argument("--threshold", type=float, default=0.9, help="tau of confidence_threshold, in (0, 1]")
    p.add_argument(
        "--seed", type=_seed, default=None, help="seeds the sampling RNG, an integer in [0, 2**64) (default: unseeded)"
    )
    p.add_argument(
        "--draw-order",
        default="batched",
        choices=DRAW_ORDERS,
        help="random draws of sampled runs: batched (default: no host-device sync) or official (the official "
        "Dream/LLaDA/Fast-dLLM loops' draws: same seed, same tokens as those loops)",
    )
    _add_prefilling_args(p, model_dir)


def _add_prefilling_args(p, model_dir: str | None) -> None:
    """The options of ``--method prefilling``: the product's (C, K, batch, CUDA graph), then the research
    options (the paper's ablations; their defaults are the method as shipped). Each help states the
    default ``--model model_dir`` will use (:func:`default_help`)."""
    label = _model_defaults(model_dir)[1]
    g = p.add_argument_group(
        "prefilling (with --method prefilling; the defaults shown are those of --model, here "
        f"{label}: its prefilling_config.json, else the library's, which are the paper's)"
    )
    add_chunk_size(g, model_dir)
    g.add_argument(
        "--top-k",
        type=positive_int_or_all,
        default=None,
        metavar="K|all",
        help="K, chunks kept, or 'all'; an explicit K above the chunk count is an error "
        f"({default_help(model_dir, 'top_k', lambda k: 'all' if k is None else k)}, or every chunk when the "
        "context has fewer)",
    )
    add_prefill_batch_and_snap(g, model_dir)
    g.add_argument(
        "--redundancy-threshold",
        type=or_off(non_negative_float),
        default=None,
        metavar="J|off",
        help="Jaccard similarity of token 8-grams in (0, 1] at which a chunk counts as a near-copy of a kept one "
        "and is passed over while others remain; off: the paper's top-K even where the checkpoint sets it "
        f"({default_help(model_dir, 'redundancy_threshold', lambda r: 'off' if r is None else r)})",
    )
    g.add_argument(
        "--candidates",
        type=candidates_arg,
        default=None,
        metavar="N|auto|all",
        help="chunks a cheap first stage (max attention logits over the cached keys, against the median chunk's) "
        "passes to the predictive score: N, auto (sqrt(chunks), at least 8 K, once that leaves out half of them) "
        "or all (every chunk "
        f"scored, the paper) ({default_help(model_dir, 'candidates', lambda c: 'all' if c is None else c)})",
    )
    g.add_argument(
        "--no-cuda-graph",
        action="store_true",
        help="run each denoising step's forward eagerly (default: replayed from a CUDA graph where supported: "
        "CUDA with the compiled Triton kernels; same tokens)",
    )
    g.add_argument(
        "--reselect",
        type=non_negative_int,
        default=None,
        metavar="N",
        help="re-score the chunks every N blocks against the question plus the answer so far and keep the new "
        "top-K (no chunk re-encoded; for long answers in several --block-length blocks; the steps then run "
        "eagerly) (default: 0, off: the question's selection serves the whole answer)",
    )
    r = p.add_argument_group(
        "research options of prefilling (the paper's ablations and our variants; the defaults are the method as "
        "shipped, other values are for experiments)"
    )
    r.add_argument(
        "--token-budget",
        type=positive_int_or_all,
        default=None,
        metavar="B|all",
        help="B, tokens kept per chunk, 1 <= B <= C, or 'all' "
        f"({default_help(model_dir, 'token_budget', lambda b: 'all' if b is None else b)})",
    )
    r.add_argument(
        "--position-mode",
        default=None,
        choices=POSITION_MODES,
        help="where the kept chunks sit: back to back after the prefix (continuous), all right after it (reuse) "
        f"or where they were in the prompt (absolute) ({default_help(model_dir, 'position_mode')})",
    )
    r.add_argument(
        "--cache-mode",
        default=None,
        choices=CACHE_MODES,
        help="decode over the prefill's chunk caches (independent) or re-encode the kept chunks together once "
        f"(joint) ({default_help(model_dir, 'cache_mode')})",
    )
    r.add_argument(
        "--score-mode",
        default=None,
        choices=SCORE_MODES,
        help="how chunks are scored: masked (dllm) or next-token (causal) log-probs "
        f"({default_help(model_dir, 'score_mode')})",
    )
    r.add_argument(
        "--score-terms",
        nargs="+",
        default=None,
        choices=SCORE_TERMS,
        help="terms summed into the chunk score: s_I, s_P (the paper's), s_C, s_C - s_P (ours) "
        f"({default_help(model_dir, 'score_terms', ' '.join)})",
    )
    r.add_argument(
        "--adaptive-k",
        type=or_off(positive_float),
        default=None,
        metavar="MARGIN|off",
        help="choose K per question, from 1 up to the K set (up to every chunk when K is all): keep the chunks "
        "above the first drop between ranked scores of at least MARGIN robust spreads (> 0; 1.5 was tuned on "
        "held-out documents: bench/results/adaptive_k.md); off: a fixed K even where the checkpoint sets a margin "
        f"({default_help(model_dir, 'adaptive_k', lambda m: 'off' if m is None else m)})",
    )
    r.add_argument(
        "--lexical-weight",
        type=non_negative_float,
        default=None,
        metavar="W",
        help="add the query's words to the chunk score: z(predictive) + W * z(share of the query's token n-grams "
        f"in the chunk, idf-weighted); 0 = off ({default_help(model_dir, 'lexical_weight', lambda w: w or 'off')})",
    )


def add_chunk_size(g, model_dir: str | None) -> None:
    """``--chunk-size`` (C), whose help states the default of ``--model model_dir``: generate, eval, encode."""
    g.add_argument(
        "--chunk-size",
        type=positive_int,
        default=None,
        help=f"C, context tokens per chunk ({default_help(model_dir, 'chunk_size')})",
    )


def add_prefill_batch_and_snap(g, model_dir: str | None) -> None:
    """``--prefill-batch`` and ``--boundary-snap``, the options of how a context is encoded: generate, eval, encode
    (the snap's default is that of ``model_dir``, as for ``--chunk-size``)."""
    g.add_argument("--prefill-batch", type=positive_int, default=None, help=_PREFILL_BATCH_HELP)
    g.add_argument(
        "--boundary-snap",
        type=non_negative_int,
        default=None,
        help=f"{_BOUNDARY_SNAP_HELP} ({default_help(model_dir, 'boundary_snap')}; with another --chunk-size it "
        "keeps the same share of C)",
    )


def examples_text(examples) -> str:
    """Runnable example command lines, one per line, indented as argparse indents its help."""
    return "\n".join("  " + line for line in examples)


def epilog(examples, files: str) -> str:
    """A subcommand's help epilog: its examples, then what their input files hold."""
    return f"examples:\n{examples_text(examples)}\n\n{files}"


def add_command(sub, name: str, help: str, description: str, examples, files: str) -> argparse.ArgumentParser:
    """The subparser of one command, with its runnable ``examples`` and what their input ``files`` hold as
    the epilog, and the help formatter of every command."""
    return sub.add_parser(
        name, help=help, description=description, epilog=epilog(examples, files), formatter_class=HelpFormatter
    )
