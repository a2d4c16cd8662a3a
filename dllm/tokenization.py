"""Text <-> token ids with a model's own HF tokenizer, and saving a tokenizer every supported transformers reads."""

from __future__ import annotations

import json
import os

import torch

# Names transformers 5.x writes for a plain tokenizers-backed tokenizer; 4.x knows only the last.
_PORTABLE_CLASS = "PreTrainedTokenizerFast"
_5X_ONLY_CLASSES = ("TokenizersBackend",)


def encode_text(model, text: str, *, bos: bool = False) -> torch.Tensor:
    """Token ids ``[L]`` int64 on the model's device, no special tokens (optionally BOS first).

    Raises:
        ValueError: the model has no tokenizer.
    """
    tok = model.tokenizer
    if tok is None:
        raise ValueError(f"model {model.model_dir!r} has no tokenizer; pass token ids instead of text")
    ids = tok(text, add_special_tokens=False)["input_ids"]
    if bos and tok.bos_token_id is not None:
        ids = [tok.bos_token_id] + ids
    return torch.tensor(ids, dtype=torch.long, device=model.device)


def decode_text(model, tokens: torch.Tensor) -> list | None:
    """Decode responses ``[B, L]``, each cut at its first EOS/PAD; None when the model has no tokenizer."""
    tok = model.tokenizer
    if tok is None:
        return None
    stops = {i for i in (model.config.eos_token_id, model.config.pad_token_id, tok.eos_token_id) if i is not None}
    texts = []
    for row in tokens.tolist():
        cut = next((i for i, t in enumerate(row) if t in stops), len(row))
        texts.append(tok.decode(row[:cut], skip_special_tokens=True))
    return texts


def save_portable_tokenizer(tok, out_dir: str) -> None:
    """``tok.save_pretrained(out_dir)``, then make ``tokenizer_config.json`` readable by transformers 4.46 too.

    transformers 5.x saves a plain ``tokenizer.json`` tokenizer as ``"tokenizer_class": "TokenizersBackend"``
    (plus a ``"backend"`` key), a class 4.x does not have ("does not exist or is not currently imported");
    both versions read the same files as ``PreTrainedTokenizerFast``.

    Args:
        tok: a transformers fast tokenizer.
        out_dir: directory (created).

    Raises:
        OSError: ``out_dir`` cannot be created or written.
    """
    os.makedirs(out_dir, exist_ok=True)
    tok.save_pretrained(out_dir)
    path = os.path.join(out_dir, "tokenizer_config.json")
    with open(path, encoding="utf-8") as f:
        cfg = json.load(f)
    if cfg.get("tokenizer_class") in _5X_ONLY_CLASSES:
        cfg["tokenizer_class"] = _PORTABLE_CLASS
    cfg.pop("backend", None)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)
        f.write("\n")
