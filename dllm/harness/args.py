"""``--model_args`` of the ``prefilling-dllm`` harness model: names, types, defaults, checks.

lm-evaluation-harness turns ``--model_args a=1,b=x`` into keyword arguments, already typed by its own
rule (``4`` -> int, ``0.5`` -> float, ``true`` -> bool, ``none`` -> None, anything else a str), and
adds ``batch_size``, ``max_batch_size`` and ``device`` from its own options. :func:`parse_model_args`
checks every key and value here, before any weights load (against the checkpoint's ``config.json`` where
the value depends on it), and raises :class:`ModelArgsError` (one line naming the key) for an unknown key,
a value of the wrong type or range, or an option of another method. No lm-eval import: the checks run
(and are tested) without the harness installed.

The keys (:data:`MODEL_ARGS`) are those of :func:`dllm.load_model`, :func:`dllm.generate` and
:class:`dllm.PrefillingConfig`, plus the harness's own. One rename: ``top_k`` is K, the chunks kept
(:class:`dllm.PrefillingConfig`), as in the CLI's ``--top-k``; the sampling filter
``generate(top_k=...)`` is ``sampling_top_k``.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from dllm.decode.block_cache import BLOCK_CACHE_MODES
from dllm.decode.unmasking import ALGS, CONFIDENCE_SOURCES, DRAW_ORDERS, UnmaskingConfig
from dllm.generate import METHODS
from dllm.prefilling.config import (
    AUTO,
    CACHE_MODES,
    POSITION_MODES,
    SCORE_MODES,
    SCORE_TERMS,
    PrefillingConfig,
    with_overrides,
)

ALL = "all"  # top_k=all / token_budget=all: keep every chunk / token (the library's None)
DTYPES = ("float32", "bfloat16", "float16")
TERMS_SEPARATOR = "+"  # score_terms=self_info+pseudo_label (the harness splits model_args at commas)


class ModelArgsError(ValueError):
    """A bad ``--model_args`` key or value: the message is one line naming the key."""


# ---------------------------------------------------------------- value types


_ASCII_INT = re.compile(r"-?[0-9]+")  # str.isdigit and int() take other scripts' digits too ('٣' is 3)


def non_ascii_number(text: str) -> bool:
    """Whether ``text`` holds a character outside ASCII and yet reads as a number to Python (``int('٣')`` is
    3, ``float('١.٥')`` 1.5), as lm-eval's ``--model_args`` parser reads it: such a value is refused."""
    if text.isascii():
        return False
    try:
        float(text)
    except ValueError:
        return text.strip().isnumeric()  # (vulgar fractions and the like: isnumeric, not float())
    return True


def check_model_args_text(text: str) -> None:
    """``--model_args`` as text (``key=value,key=value``), before lm-eval types it: a value in another script's
    digits (:func:`non_ascii_number`), which lm-eval's parser turns into a number, is refused.

    Raises:
        ModelArgsError: naming the key and value.
    """
    if text.lstrip().startswith("{"):  # a JSON object: its numbers are ASCII by JSON's grammar
        return
    for item in text.split(","):
        key, sep, value = item.partition("=")
        if sep and non_ascii_number(value.strip()):
            raise ModelArgsError(f"model_args {key.strip()}={value.strip()!r}: expected ASCII digits (0-9)")


def _int(low: int) -> Callable[[Any], int]:
    def parse(v):
        if isinstance(v, str) and _ASCII_INT.fullmatch(v.strip()):
            try:
                v = int(v)
            except ValueError:  # more digits than Python converts (sys.get_int_max_str_digits)
                raise TypeError(f"expected an integer >= {low} (got {len(v.strip())} digits)") from None
        if isinstance(v, bool) or not isinstance(v, int) or v < low:
            raise TypeError(f"expected an integer >= {low}")
        return v

    parse.kind = f"integer >= {low}"
    return parse


def _int_or_all(v):
    if v is None or (isinstance(v, str) and v.strip().lower() == ALL):
        return None
    try:
        return _int(1)(v)
    except TypeError:
        raise TypeError("expected an integer >= 1 or 'all'") from None


def _float(low: float, high: float, low_open: bool = False, high_open: bool = False) -> Callable[[Any], float]:
    def parse(v):
        if isinstance(v, str) and v.isascii() and "_" not in v:  # ASCII digits only, as for integers
            try:
                v = float(v)
            except ValueError:
                pass
        ok = isinstance(v, (int, float)) and not isinstance(v, bool)
        if ok and isinstance(v, int):  # an int past float's range (lm-eval types long digit strings as int)
            try:
                v = float(v)
            except OverflowError:
                ok = False
        ok = ok and math.isfinite(v)
        if ok:
            ok = (v > low if low_open else v >= low) and (v < high if high_open else v <= high)
        if not ok:
            if math.isinf(high):
                raise TypeError(f"expected a finite number {'>' if low_open else '>='} {low}")
            lb, hb = "(" if low_open else "[", ")" if high_open else "]"
            raise TypeError(f"expected a number in {lb}{low}, {high}{hb}")
        return float(v)

    return parse


def _candidates(v):
    if v is None or (isinstance(v, str) and v.strip().lower() == ALL):
        return None
    if isinstance(v, str) and v.strip().lower() == AUTO:
        return AUTO
    try:
        return _int(1)(v)
    except TypeError:
        raise TypeError("expected an integer >= 1, 'auto' or 'all'") from None


def _layer_or_all(v):
    if v is None or (isinstance(v, str) and v.strip().lower() == ALL):
        return None
    try:
        return _int(-(2**31))(v)
    except TypeError:
        raise TypeError("expected an integer or 'all'") from None


def _or_none(inner):
    def parse(v):
        return None if v is None else inner(v)

    return parse


def _choice(options) -> Callable[[Any], str]:
    def parse(v):
        if not isinstance(v, str) or v not in options:
            raise TypeError(f"expected one of {', '.join(options)}")
        return v

    return parse


def _bool(v):
    if isinstance(v, bool):
        return v
    if isinstance(v, str) and v.strip().lower() in ("true", "false"):
        return v.strip().lower() == "true"
    raise TypeError("expected true or false")


def _text(v):
    if not isinstance(v, str) or not v.strip():
        raise TypeError("expected a non-empty string")
    return v


def _text_or_none(v):
    return None if v is None else _text(v)


def _terms(v):
    items = v.split(TERMS_SEPARATOR) if isinstance(v, str) else v
    if not isinstance(items, (list, tuple)) or not items or any(t not in SCORE_TERMS for t in items):
        raise TypeError(f"expected terms of {', '.join(SCORE_TERMS)} joined by '{TERMS_SEPARATOR}'")
    twice = sorted({t for t in items if items.count(t) > 1})
    if twice:  # the chunk score sums its terms: a repeated one would count twice
        raise TypeError(f"expected each term once, got {', '.join(twice)} more than once")
    return tuple(items)


def _batch_size(v):
    if isinstance(v, str) and v.strip().startswith("auto"):
        raise TypeError("expected an integer >= 1 ('auto' is not supported: rows of a batch share every forward)")
    return _int(1)(v)


def _seed(v):
    v = _int(0)(v)
    if v >= 2**64:
        raise TypeError("expected an integer in [0, 2**64)")
    return v


def _block_cache(v):
    if isinstance(v, str) and v in BLOCK_CACHE_MODES:
        return v
    try:
        return _int(1)(v)
    except TypeError:
        raise TypeError(f"expected one of {', '.join(BLOCK_CACHE_MODES)} or an integer >= 1") from None


_block_cache.kind = "off, block, step or an integer >= 1"


def _anything(v):
    return v


# ---------------------------------------------------------------- the keys

_ANY_METHOD, _PREFIX_CACHE, _PREFILLING = None, "prefix_cache", "prefilling"
# key -> (parser, default, what it is, the one method it belongs to or None)
MODEL_ARGS: dict[str, tuple[Callable, Any, str, str | None]] = {
    # loading (dllm.load_model)
    "pretrained": (_text_or_none, None, "checkpoint directory (default: the bundled tiny model)", _ANY_METHOD),
    "tokenizer": (_text_or_none, None, "tokenizer directory (default: the checkpoint's)", _ANY_METHOD),
    "device": (_text_or_none, None, "cpu, cuda or cuda:N (default: cuda if available)", _ANY_METHOD),
    "dtype": (_or_none(_choice(DTYPES)), None, "float32, bfloat16 or float16", _ANY_METHOD),
    "rope_theta": (_or_none(_float(0, math.inf, low_open=True)), None, "RoPE base override", _ANY_METHOD),
    # decoding (dllm.generate)
    "method": (_choice(METHODS), "prefilling", "dense, prefix_cache or prefilling", _ANY_METHOD),
    "gen_length": (_or_none(_int(1)), None, "response tokens (default: the task's max_gen_toks)", None),
    "steps": (_or_none(_int(1)), None, "denoising steps (default: the gen length)", _ANY_METHOD),
    "block_length": (_or_none(_int(1)), None, "semi-autoregressive block", _ANY_METHOD),
    "block_cache": (
        _or_none(_block_cache),
        None,
        "off, block, step or a refresh interval N (default: block when the answer has several blocks)",
        _ANY_METHOD,
    ),
    "alg": (_or_none(_choice(ALGS)), None, "unmasking rule (default by family)", _ANY_METHOD),
    "temperature": (_or_none(_float(0, math.inf)), None, "0 = greedy (default: the task's)", _ANY_METHOD),
    "top_p": (_or_none(_float(0, 1, low_open=True)), None, "nucleus filter", _ANY_METHOD),
    "sampling_top_k": (_or_none(_int(1)), None, "generate(top_k=): the sampling filter", _ANY_METHOD),
    "alg_temp": (_or_none(_float(0, math.inf)), None, "Dream's position temperature", _ANY_METHOD),
    "eps": (_float(0, 1, low_open=True, high_open=True), 1e-3, "Dream's final schedule time", _ANY_METHOD),
    "threshold": (_float(0, 1, low_open=True), 0.9, "tau of confidence_threshold", _ANY_METHOD),
    "confidence_from": (_or_none(_choice(CONFIDENCE_SOURCES)), None, "tempered or logits", _ANY_METHOD),
    "draw_order": (
        _choice(DRAW_ORDERS),
        "batched",
        "sampling draws: batched (sync-free) or official (the official loops' draws, same seed same tokens)",
        _ANY_METHOD,
    ),
    "seed": (_or_none(_seed), None, "seeds sampling and the Monte Carlo masks", _ANY_METHOD),
    "live_window": (_int(1), 1, "prefix_cache: live prompt tokens", _PREFIX_CACHE),
    "cache_refresh": (_choice(("block", "step")), "block", "prefix_cache: when to rebuild", _PREFIX_CACHE),
    "cache_scope": (_choice(("sequence", "prompt")), "sequence", "prefix_cache: what is cached", _PREFIX_CACHE),
    "cuda_graph": (_or_none(_bool), None, "prefilling: replay steps from a CUDA graph", _PREFILLING),
    "reselect": (_or_none(_int(0)), None, "prefilling: re-score the chunks every N blocks (0: off)", _PREFILLING),
    # dllm.PrefillingConfig (default: the checkpoint's prefilling_config.json, else the library's)
    "chunk_size": (_or_none(_int(1)), None, "C, context tokens per chunk", _PREFILLING),
    "top_k": (_int_or_all, None, "K, chunks kept, or all", _PREFILLING),
    "token_budget": (_int_or_all, None, "B, tokens kept per chunk, or all", _PREFILLING),
    "draft_tokens": (_or_none(_int(1)), None, "m, draft mask slots", _PREFILLING),
    "draft_threshold": (_or_none(_float(0, 1, low_open=True)), None, "draft confirmation", _PREFILLING),
    "position_mode": (_or_none(_choice(POSITION_MODES)), None, "kept chunks' positions", _PREFILLING),
    "cache_mode": (_or_none(_choice(CACHE_MODES)), None, "independent or joint", _PREFILLING),
    "score_mode": (_or_none(_choice(SCORE_MODES)), None, "dllm or causal scoring", _PREFILLING),
    "score_terms": (_terms, None, "chunk score terms joined by '+'", _PREFILLING),
    "pool_kernel": (_or_none(_int(1)), None, "odd max-pool width", _PREFILLING),
    "query_window": (_or_none(_int(1)), None, "trailing query tokens used in scoring", _PREFILLING),
    "prefill_batch": (_or_none(_int(1)), None, "chunks per prefill forward", _PREFILLING),
    "anchor_token_id": (_or_none(_int(0)), None, "the chunk anchor token", _PREFILLING),
    "boundary_snap": (_or_none(_int(0)), None, "tokens a chunk boundary may move back to a sentence end", _PREFILLING),
    "redundancy_threshold": (
        _or_none(_float(0, 1, low_open=True)),
        None,
        "Jaccard of token 8-grams at which a chunk is a near-copy",
        _PREFILLING,
    ),
    "candidates": (
        _candidates,
        None,
        "chunks the first stage passes to the predictive score, auto or all",
        _PREFILLING,
    ),
    "candidate_layer": (_layer_or_all, None, "the first stage's layer, or all", _PREFILLING),
    "adaptive_k": (_or_none(_float(0, math.inf, low_open=True)), None, "adaptive K's margin (None: off)", _PREFILLING),
    "lexical_weight": (_float(0, math.inf), None, "weight of the lexical chunk score (0: off)", _PREFILLING),
    # the harness's own
    "context_field": (_text, "context", "the doc field holding the long context", _PREFILLING),
    "add_bos": (_bool, True, "put BOS before the prompt (off under a chat template)", _ANY_METHOD),
    "mc_samples": (_int(1), 128, "loglikelihood: Monte Carlo samples per request", _ANY_METHOD),
    "mc_batch_size": (_int(1), 32, "loglikelihood: samples per forward (at most)", _ANY_METHOD),
    "mc_batch_tokens": (
        _int(1),
        32768,
        "loglikelihood: tokens per forward (at most): a long context runs fewer copies at once, 1 at least",
        _ANY_METHOD,
    ),
    "greedy_check": (_bool, True, "loglikelihood: decode greedily to report is_greedy", _ANY_METHOD),
    "batch_size": (_batch_size, 1, "requests decoded together (the harness's --batch_size)", _ANY_METHOD),
    "max_batch_size": (_anything, None, "accepted from the harness, unused (no 'auto')", _ANY_METHOD),
    "trust_remote_code": (_anything, None, "accepted from the harness, unused (no remote code)", _ANY_METHOD),
}
_PREFILLING_FIELDS = tuple(f.name for f in dataclasses.fields(PrefillingConfig))
# keys whose default belongs to no method (given explicitly, they fit every method)
_FIT_ALL = ("gen_length",)


@dataclass(frozen=True)
class HarnessSettings:
    """The checked ``--model_args``.

    Attributes:
        values: every key of :data:`MODEL_ARGS`, the given value (typed) or its default.
        given: the keys the user gave.
        prefilling: ``method=prefilling``: the checkpoint's :class:`PrefillingConfig` with the given fields
            over it (``top_k=all`` overriding the file too); else None.
    """

    values: dict
    given: frozenset
    prefilling: PrefillingConfig | None

    def __getattr__(self, name):
        try:
            return self.values[name]
        except KeyError:
            raise AttributeError(name) from None

    @property
    def explicit_top_k(self) -> bool:
        """``top_k`` given as a number: above a context's chunk count it is an error, not 'keep all'."""
        return "top_k" in self.given and self.values["top_k"] is not None

    def generate_kwargs(self) -> dict:
        """The :func:`dllm.generate` keyword arguments shared by every request (gen_length, temperature,
        prompt and prefilling config are per request)."""
        v = self.values
        kw = {k: v[k] for k in ("steps", "block_length", "block_cache", "alg", "top_p", "alg_temp", "eps", "threshold")}
        kw.update(
            top_k=v["sampling_top_k"], confidence_from=v["confidence_from"], seed=v["seed"], draw_order=v["draw_order"]
        )
        if v["method"] == "prefix_cache":
            kw.update(live_window=v["live_window"], cache_refresh=v["cache_refresh"], cache_scope=v["cache_scope"])
        if v["method"] == "prefilling" and v["cuda_graph"] is not None:
            kw["cuda_graph"] = v["cuda_graph"]
        if v["method"] == "prefilling" and v["reselect"]:
            kw["reselect"] = v["reselect"]
        return kw


def parse_model_args(kwargs: dict, model_dir: str | None = None) -> HarnessSettings:
    """Check ``--model_args`` (as the harness passes them: a dict of typed values) before any weights load:
    every value that can be checked without them, against the checkpoint's ``config.json`` and
    ``prefilling_config.json`` where it must be (a chunk longer than the trained positions, a layer the model
    does not have).

    Args:
        kwargs: key -> value; values may be the harness's typed values or strings.
        model_dir: the checkpoint whose ``config.json`` and ``prefilling_config.json`` are read (default:
            ``kwargs["pretrained"]``, else the bundled model).

    Returns:
        :class:`HarnessSettings`.

    Raises:
        ModelArgsError: an unknown key (the message lists the known ones), an ill-typed or out-of-range
            value (naming the key and what was expected; a score term given twice), an option of another
            method than ``method``, a combination :class:`dllm.PrefillingConfig` /
            :class:`dllm.decode.unmasking.UnmaskingConfig` rejects, a value the checkpoint cannot take
            (:func:`check_against_checkpoint`), a ``pretrained`` / ``tokenizer`` folder that does not
            exist, or a device that is not there.
        dllm.ConfigError: the checkpoint's ``config.json`` is invalid (the message names the file).
    """
    unknown = sorted(set(kwargs) - set(MODEL_ARGS))
    if unknown:
        hints = [difflib.get_close_matches(k, MODEL_ARGS, n=1) for k in unknown]
        named = ", ".join(k + (f" (did you mean {h[0]}?)" if h else "") for k, h in zip(unknown, hints))
        raise ModelArgsError(
            f"model_args: unknown key(s) {named}; python -m dllm.harness --help-model-args lists the keys"
        )
    values, given = {}, set()
    for key, (parse, default, _what, _method) in MODEL_ARGS.items():
        if key in kwargs:
            raw = kwargs[key]
            try:
                values[key] = parse(raw)
            except TypeError as exc:
                raise ModelArgsError(f"model_args {key}={raw!r}: {exc}") from None
            given.add(key)
        else:
            values[key] = default
    method = values["method"]
    foreign = [k for k in sorted(given) if MODEL_ARGS[k][3] not in (None, method) and k not in _FIT_ALL]
    if foreign:
        owners = ", ".join(f"{k} (method={MODEL_ARGS[k][3]})" for k in foreign)
        raise ModelArgsError(f"model_args: {owners}: not an option of method={method}")
    try:
        UnmaskingConfig(
            alg=values["alg"] or "maskgit_plus",
            temperature=values["temperature"] or 0.0,
            top_p=values["top_p"],
            top_k=values["sampling_top_k"],
            alg_temp=values["alg_temp"],
            eps=values["eps"],
            threshold=values["threshold"],
            confidence_from=values["confidence_from"],
            draw_order=values["draw_order"],
        )
    except ValueError as exc:
        raise ModelArgsError(f"model_args: {exc}") from None
    if values["draw_order"] == "official" and method == "prefilling" and values["batch_size"] > 1:
        raise ModelArgsError(
            f"model_args: draw_order=official needs batch_size=1 with method=prefilling (got {values['batch_size']}): "
            "the official loops decode one prompt length, and batched prefilling rows start at different positions"
        )
    if values["device"] is not None:
        check_device(values["device"])
    from dllm.model.config import load_config
    from dllm.model.loader import default_model_dir

    model_dir = model_dir or values["pretrained"] or default_model_dir()
    if not os.path.isdir(model_dir):
        raise ModelArgsError(f"model_args pretrained={model_dir}: no such directory (a local checkpoint folder)")
    if values["tokenizer"] is not None and not os.path.isdir(values["tokenizer"]):
        raise ModelArgsError(f"model_args tokenizer={values['tokenizer']}: no such directory")
    config = load_config(model_dir, rope_theta=values["rope_theta"])  # config.json alone: no weights
    cfg = None
    if method == "prefilling":
        base = PrefillingConfig.from_pretrained(model_dir)
        fields = {f: values[f] for f in _PREFILLING_FIELDS if f in given}
        try:  # replace, not from_pretrained's overrides: top_k=all (None) must override the file too
            cfg = with_overrides(base, fields)
        except (TypeError, ValueError) as exc:
            raise ModelArgsError(f"model_args: {exc}") from None
    settings = HarnessSettings(values, frozenset(given), cfg)
    check_against_checkpoint(settings, config)
    if values["gen_length"] is not None:
        check_gen_length(settings, values["gen_length"], config.trained_positions)
    return settings


def check_against_checkpoint(settings: HarnessSettings, config) -> None:
    """The values that depend on the checkpoint, checked against its :class:`dllm.ModelConfig` (read from
    ``config.json``, no weights): a chunk and its BOS anchor within the trained positions (as the CLI's
    ``--chunk-size``), ``candidate_layer`` among the model's layers, ``anchor_token_id`` in its vocabulary.

    Raises:
        ModelArgsError: naming the key, its value and the checkpoint's limit.
    """
    cfg = settings.prefilling
    if cfg is None:
        return
    limit = config.trained_positions
    if limit and cfg.chunk_size + 1 > limit:
        raise ModelArgsError(
            f"model_args chunk_size={cfg.chunk_size}: a chunk and its BOS anchor take {cfg.chunk_size + 1} "
            f"positions, more than the model's {limit} trained positions"
        )
    layers = config.num_layers
    if cfg.candidate_layer is not None and not -layers <= cfg.candidate_layer < layers:
        raise ModelArgsError(
            f"model_args candidate_layer={cfg.candidate_layer}: the model has {layers} layers (0..{layers - 1}, or "
            f"-{layers}..-1 from the last)"
        )
    if cfg.anchor_token_id is not None and cfg.anchor_token_id >= config.vocab_size:
        raise ModelArgsError(
            f"model_args anchor_token_id={cfg.anchor_token_id}: outside the model's vocabulary of {config.vocab_size}"
        )


def check_gen_length(settings: HarnessSettings, gen_length: int, trained_positions: int | None) -> None:
    """A response length (``gen_length``, or a task's ``max_gen_toks``) against the decoding options, as
    :func:`dllm.generate` would reject it: ``block_length`` must divide it, ``steps`` must be a multiple of
    its blocks (the step-budget rules), and it must fit the model's ``trained_positions``.

    Raises:
        ModelArgsError: naming the keys and values.
    """
    v = settings.values
    block = v["block_length"] or gen_length
    if gen_length % block:
        raise ModelArgsError(f"model_args: block_length={block} does not divide gen_length={gen_length}")
    fixed = UnmaskingConfig(alg=v["alg"] or "maskgit_plus", threshold=v["threshold"]).fixed_steps
    steps = v["steps"] or gen_length
    if fixed and steps % (gen_length // block):
        raise ModelArgsError(
            f"model_args: steps={steps} is not a multiple of the {gen_length // block} blocks of gen_length="
            f"{gen_length} (block_length={block})"
        )
    if trained_positions and gen_length > trained_positions:
        raise ModelArgsError(
            f"model_args: gen_length={gen_length} exceeds the model's {trained_positions} trained positions"
        )


def check_device(text: str) -> None:
    """``device``: cpu, cuda or cuda:N, and CUDA present for a cuda device.

    Raises:
        ModelArgsError: not a device, another device type, or no CUDA.
    """
    import torch

    try:
        dev = torch.device(text)
    except RuntimeError:
        raise ModelArgsError(f"device {text!r} is not a device (use cpu, cuda or cuda:N)") from None
    if dev.type not in ("cpu", "cuda"):
        raise ModelArgsError(f"device {text!r}: only cpu and cuda devices are supported")
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ModelArgsError(f"device {text!r}: CUDA is not available on this machine (pass --device cpu)")


def describe_model_args() -> str:
    """One line per key: name, default and what it sets (``python -m dllm.harness --help-model-args``)."""
    lines = []
    for key, (_parse, default, what, method) in MODEL_ARGS.items():
        scope = f" [method={method}]" if method else ""
        lines.append(f"  {key:<18} default {default!s:<11} {what}{scope}")
    return "\n".join(lines)
