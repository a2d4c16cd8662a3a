"""Text <-> token ids with a model's own HF tokenizer."""

from __future__ import annotations

import torch


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
