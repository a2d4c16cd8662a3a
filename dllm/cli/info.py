"""``python -m dllm info``: what a checkpoint is and what running it will cost, read from its files without
loading the weights.

``python -m dllm info --model DIR`` prints :func:`checkpoint_info`. Sizes come from the
safetensors headers (so a 7B checkpoint is described in well under a second), the
architecture from ``config.json`` (:mod:`dllm.model.config`), the prefilling defaults from
``prefilling_config.json`` (:meth:`PrefillingConfig.from_pretrained`): it reads prefilling's defaults, so it
lives with the command line, above :mod:`dllm.prefilling`, not in the model layer.

Imports: :mod:`dllm.cli.args`, :mod:`dllm.model` and :mod:`dllm.prefilling.config`.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict

import torch

from dllm.cli.args import add_command, add_common_args
from dllm.model.config import load_config, read_raw_config
from dllm.model.loader import default_model_dir, load_tokenizer, resolve_device_dtype
from dllm.model.rope import RotaryEmbedding
from dllm.model.weights import WeightError, checkpoint_files, checkpoint_to_module_name, open_safetensors
from dllm.prefilling.config import CONFIG_NAME, PrefillingConfig, resolve_anchor_token_id

# Every example runs as written on the bundled tiny model (tests/test_cli.py runs them from the help text).
EXAMPLES = ("python -m dllm info", "python -m dllm info --json")
# what the examples' input files hold
EXAMPLE_FILES = "With no --model, info describes the bundled tiny model."
HELP = "describe a checkpoint: family, size, dtype, KV bytes, prefilling defaults"  # in python -m dllm --help
DESCRIPTION = (
    "Describe a checkpoint (no weights are loaded): family, size, dtype, KV bytes per 1K tokens,\n"
    "and the prefilling defaults dllm would use for it."
)

# bytes per element of the safetensors dtype names
_ST_BYTES = {
    "F64": 8,
    "I64": 8,
    "U64": 8,
    "F32": 4,
    "I32": 4,
    "U32": 4,
    "F16": 2,
    "BF16": 2,
    "I16": 2,
    "U16": 2,
    "F8_E4M3": 1,
    "F8_E5M2": 1,
    "I8": 1,
    "U8": 1,
    "BOOL": 1,
}
_ST_NAMES = {"F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16"}


# English prose in the public domain (Lincoln's Gettysburg Address, the opening of the US Declaration of
# Independence), the fixed text on which info measures how many characters a token covers
TEXT_SAMPLE = os.path.join(os.path.dirname(os.path.dirname(__file__)), "assets", "english_sample.txt")
TEXT_SAMPLE_NAME = "dllm/assets/english_sample.txt, English prose"


def chars_per_token(tok, path: str = TEXT_SAMPLE) -> dict:
    """How many characters one token of ``tok`` covers on the text of ``path`` (default :data:`TEXT_SAMPLE`):
    ``{"chars_per_token": characters / tokens, "characters": int, "tokens": int, "sample": name}``, tokens
    without special ones. Raises ``OSError`` when the sample cannot be read."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    n = len(tok(text, add_special_tokens=False)["input_ids"])
    name = TEXT_SAMPLE_NAME if path == TEXT_SAMPLE else path
    return {"chars_per_token": round(len(text) / max(n, 1), 3), "characters": len(text), "tokens": n, "sample": name}


def kv_bytes_per_token(cfg, dtype: torch.dtype) -> int:
    """Bytes of cached K and V per token over all layers of ``cfg`` (a :class:`dllm.ModelConfig`) in
    ``dtype``: ``2 * layers * Hkv * D * itemsize``."""
    return 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * torch.empty(0, dtype=dtype).element_size()


def weight_stats(model_dir: str, family: str) -> dict:
    """Parameters, bytes and dtypes of a checkpoint's tensors, from the safetensors headers only.

    Returns:
        ``{"parameters": int, "weight_bytes": int, "dtypes": {name: tensor count}, "files": int}``
        (ignorable buffers such as ``rotary_emb.inv_freq`` are left out).

    Raises:
        WeightError: missing/unreadable files, a tensor name foreign to the family, an unknown dtype.
    """
    params = nbytes = 0
    dtypes: dict = {}
    files = checkpoint_files(model_dir)
    for path in files:
        with open_safetensors(path) as f:
            for name in f.keys():
                if checkpoint_to_module_name(name, family) is None:
                    continue
                sl = f.get_slice(name)
                dt = sl.get_dtype()
                if dt not in _ST_BYTES:
                    raise WeightError(f"{path}: tensor {name!r} has dtype {dt}, unknown to dllm")
                numel = 1
                for n in sl.get_shape():
                    numel *= int(n)
                params += numel
                nbytes += numel * _ST_BYTES[dt]
                dtypes[dt] = dtypes.get(dt, 0) + 1
    return {"parameters": params, "weight_bytes": nbytes, "dtypes": dtypes, "files": len(files)}


def checkpoint_info(model_dir: str | None = None, *, device=None, dtype=None) -> dict:
    """A summary of a checkpoint and of the run settings dllm would use for it.

    Args:
        model_dir: checkpoint directory (None = the bundled tiny model).
        device, dtype: as for :func:`dllm.load_model` (they decide the runtime dtype, hence the KV size).

    Returns:
        A JSON-ready dict: ``family``, ``model_type``, ``architecture`` (layers, heads, KV heads,
        head_dim, hidden, vocab, max positions), ``parameters``, ``checkpoint_dtype``, ``weight_bytes``,
        ``runtime_device``/``runtime_dtype``, ``kv_bytes_per_1k_tokens`` (K and V of 1024 cached tokens,
        all layers, runtime dtype), ``rope`` (type, theta, scaling, attention factor), ``tokenizer``
        (class, chat template or not), ``anchor_token_id``/``anchor_source`` and ``prefilling`` (the
        defaults :func:`dllm.generate` uses, with their ``source``).

    Raises:
        dllm.model.config.ConfigError, dllm.model.weights.WeightError: as :func:`dllm.load_model` would.
    """
    model_dir = default_model_dir() if model_dir is None else str(model_dir)
    cfg = load_config(model_dir)
    raw = read_raw_config(model_dir)
    weights = weight_stats(model_dir, cfg.family)
    dev, run_dtype = resolve_device_dtype(device, dtype)
    rope = RotaryEmbedding.from_config(cfg)
    tok = load_tokenizer(model_dir, family=cfg.family)
    prefilling = PrefillingConfig.from_pretrained(model_dir)
    anchor, anchor_source = resolve_anchor_token_id(cfg, tok, prefilling)
    has_file = os.path.isfile(os.path.join(model_dir, CONFIG_NAME))
    stored = sorted(weights["dtypes"], key=lambda d: -weights["dtypes"][d])
    return {
        "model_dir": model_dir,
        "family": cfg.family,
        "model_type": raw.get("model_type"),
        "architecture": {
            "layers": cfg.num_layers,
            "hidden_size": cfg.hidden_size,
            "intermediate_size": cfg.intermediate_size,
            "heads": cfg.num_heads,
            "kv_heads": cfg.num_kv_heads,
            "head_dim": cfg.head_dim,
            "vocab_size": cfg.vocab_size,
            "max_position_embeddings": cfg.max_position_embeddings,
            "shift_logits": cfg.shift_logits,
        },
        "parameters": weights["parameters"],
        "checkpoint_dtype": _ST_NAMES.get(stored[0], stored[0]) if stored else raw.get("torch_dtype"),
        "weight_bytes": weights["weight_bytes"],
        "weight_files": weights["files"],
        "runtime_device": str(dev),
        "runtime_dtype": str(run_dtype).removeprefix("torch."),
        "kv_bytes_per_1k_tokens": 1024 * kv_bytes_per_token(cfg, run_dtype),
        "rope": {
            "type": rope.rope_type,
            "theta": rope.theta,
            "scaling": cfg.rope_scaling,
            "attention_factor": rope.attention_factor,
        },
        "tokenizer": None
        if tok is None
        else {
            "class": type(tok).__name__,
            "chat_template": bool(getattr(tok, "chat_template", None)),
            **chars_per_token(tok),
        },
        "mask_token_id": cfg.mask_token_id,
        "anchor_token_id": anchor,
        "anchor_source": anchor_source,
        "prefilling": {
            "source": CONFIG_NAME if has_file else "paper defaults",
            **{k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(prefilling).items()},
        },
    }


def _human_bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    return f"{n} B"


def format_info(info: dict) -> str:
    """:func:`checkpoint_info` as aligned ``key: value`` lines (exact byte counts, plus a readable size).
    Raises ``KeyError`` for a dict that did not come from :func:`checkpoint_info`."""
    a = info["architecture"]
    rope = info["rope"]
    rope_txt = f"{rope['type']}, theta {rope['theta']:g}"
    if rope["scaling"]:
        rope_txt += f", scaling {rope['scaling']}, attention factor {rope['attention_factor']:.4g}"
    tok = info["tokenizer"]
    pre = info["prefilling"]
    pre_txt = ", ".join(f"{k}={v}" for k, v in pre.items() if k != "source")
    rows = [
        ("model", info["model_dir"]),
        ("family", f"{info['family']} (model_type {info['model_type']})"),
        (
            "architecture",
            f"{a['layers']} layers, hidden {a['hidden_size']}, {a['heads']} heads / {a['kv_heads']} KV heads "
            f"(GQA {a['heads'] // a['kv_heads']}), head_dim {a['head_dim']}, vocab {a['vocab_size']}, "
            f"max positions {a['max_position_embeddings']}",
        ),
        ("parameters", f"{info['parameters']:,}"),
        ("checkpoint dtype", info["checkpoint_dtype"]),
        (
            "weight bytes",
            f"{info['weight_bytes']:,} ({_human_bytes(info['weight_bytes'])}, {info['weight_files']} file(s))",
        ),
        ("runtime", f"{info['runtime_device']}, {info['runtime_dtype']}"),
        (
            "KV bytes / 1K tokens",
            f"{info['kv_bytes_per_1k_tokens']:,} ({_human_bytes(info['kv_bytes_per_1k_tokens'])}, "
            f"{info['runtime_dtype']})",
        ),
        ("RoPE", rope_txt),
        (
            "tokenizer",
            "none" if tok is None else f"{tok['class']}, chat template: {'yes' if tok['chat_template'] else 'no'}",
        ),
        (
            "characters / token",
            "n/a (no tokenizer)"
            if tok is None
            else f"{tok['chars_per_token']:.2f} on {tok['sample']} ({tok['characters']:,} characters, "
            f"{tok['tokens']:,} tokens): a 100K-character document is ~{100_000 / tok['chars_per_token']:,.0f} tokens",
        ),
        ("mask token id", info["mask_token_id"]),
        ("chunk anchor id", f"{info['anchor_token_id']} (from {info['anchor_source']})"),
        ("prefilling", f"{pre_txt} (from {pre['source']})"),
    ]
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k + ':':<{width + 1}} {v}" for k, v in rows)


def cmd_info(args) -> int:
    """``info``: the checkpoint's family, size, dtype, KV cost and the prefilling defaults that will be used."""
    info = checkpoint_info(args.model, device=args.device, dtype=args.dtype)
    print(json.dumps(info, indent=2) if args.json else format_info(info))
    return 0


def add_parser(sub, model_dir: str | None) -> None:
    """The ``info`` subcommand of ``sub``."""
    i = add_command(sub, "info", HELP, DESCRIPTION, EXAMPLES, EXAMPLE_FILES)
    add_common_args(i)
    i.add_argument("--json", action="store_true", help="print the summary as JSON")
    i.set_defaults(func=cmd_info)
