"""Text <-> token ids with a model's own HF tokenizer, and saving a tokenizer every supported transformers reads."""

from __future__ import annotations

import json
import os
import warnings
import weakref
from collections import Counter, OrderedDict

import torch

# Names transformers 5.x writes for a plain tokenizers-backed tokenizer; 4.x knows only the last.
_PORTABLE_CLASS = "PreTrainedTokenizerFast"
_5X_ONLY_CLASSES = ("TokenizersBackend",)


# Recent encodings per tokenizer: a long context is tokenized once however many callers ask for it
# (a LongBench case's length count, its prompt parts and its CSV row; each --question of the CLI).
_MEMO: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
MEMO_TOKENS = 1 << 22  # token ids remembered per tokenizer (int64 on CPU: 32 MiB); least recently used go first


def _tokenize(tok, text: str) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``tok(text, add_special_tokens=False)``: ids ``[L]`` int64 and, from a fast tokenizer, the character
    offsets ``[L, 2]`` int32 of each token (end exclusive) from the same call; None from a slow one."""
    if getattr(tok, "is_fast", False):
        enc = tok(text, add_special_tokens=False, return_offsets_mapping=True)
        offsets = torch.tensor(enc["offset_mapping"], dtype=torch.int32).reshape(-1, 2)
    else:
        enc, offsets = tok(text, add_special_tokens=False), None
    return torch.tensor(enc["input_ids"], dtype=torch.long), offsets


KEY_SAMPLE_IDS = 256  # id -> token pairs in tokenizer_state_key (every id of a vocabulary this small or smaller)


def tokenizer_state_key(tok) -> tuple | None:
    """What can change in a loaded tokenizer without a new object, cheaply read (~0.1 ms for Dream's): its
    length, special tokens, the serialised normaliser, pre-tokeniser, decoder and post-processor (a replaced
    normaliser maps other text to the same ids), the model's type and vocabulary size, and the tokens of
    :data:`KEY_SAMPLE_IDS` ids spread over the vocabulary (every id of a small one), so that a model of the same
    type and size with another id mapping changes it too (a swap between two unsampled ids of a large
    vocabulary does not: the key is a sample, not a digest). None without a tokenizer."""
    if tok is None:
        return None
    key = [len(tok), repr(sorted(tok.special_tokens_map.items()))]
    n = len(tok)
    ids = range(n) if n <= KEY_SAMPLE_IDS else [i * n // KEY_SAMPLE_IDS for i in range(KEY_SAMPLE_IDS)]
    backend = getattr(tok, "backend_tokenizer", None)
    if backend is not None:
        for name in ("normalizer", "pre_tokenizer", "decoder", "post_processor"):
            part = getattr(backend, name)
            key.append(None if part is None else part.__getstate__())
        key += [type(backend.model).__name__, backend.get_vocab_size(with_added_tokens=True)]
        key.append(tuple(backend.id_to_token(i) for i in ids))
    else:
        key.append(tuple(tok.convert_ids_to_tokens(list(ids))))
    return tuple(key)


def _encoding(tok, text: str) -> tuple[torch.Tensor, torch.Tensor | None]:
    """:func:`_tokenize` (do not modify the tensors), from the memo when this tokenizer, in the same state
    (:func:`tokenizer_state_key`: added tokens, a replaced normaliser or model invalidate it), encoded the same
    text lately."""
    try:
        memo = _MEMO.setdefault(tok, OrderedDict())
    except TypeError:  # a tokenizer that takes no weak reference: no memo
        return _tokenize(tok, text)
    key = (tokenizer_state_key(tok), text)
    hit = memo.get(key)
    if hit is not None:
        memo.move_to_end(key)
        return hit
    hit = memo[key] = _tokenize(tok, text)
    total = sum(ids.numel() for ids, _ in memo.values())
    while total > MEMO_TOKENS and len(memo) > 1:
        total -= memo.popitem(last=False)[1][0].numel()
    return hit


def _token_ids(tok, text: str) -> torch.Tensor:
    """``tok(text, add_special_tokens=False)["input_ids"]`` as an int64 CPU tensor (do not modify it)."""
    return _encoding(tok, text)[0]


def token_offsets(model, text: str) -> torch.Tensor | None:
    """Character offsets ``[L, 2]`` int32 (start, end exclusive) into ``text`` of each token that
    :func:`encode_text` gives for it (no BOS), from the same tokenizer call (remembered like the ids);
    None when the model has no tokenizer or a slow (Python) one, which reports no offsets.

    A tokenizer that drops characters it has no token for (a BPE model without an unknown token, such
    as the bundled character-level one with ``ó``, ``’`` or a tab) reports offsets that drift after each
    dropped character. So where a tokenizer spells its tokens as the raw text (:func:`_realigned` finds them
    in order) the offsets are the places of those tokens in the text; a tokenizer whose tokens are not raw
    text (byte-level BPE such as Qwen's and Dream's, whose offsets are exact) keeps its own."""
    tok = model.tokenizer
    if tok is None:
        return None
    ids, offsets = _encoding(tok, text)
    if offsets is None:
        return None
    pieces = tok.convert_ids_to_tokens(ids.tolist())
    if all(text[s:e] == p for p, (s, e) in zip(pieces, offsets.tolist())):
        return offsets.clone()
    found = _realigned(pieces, text)
    return offsets.clone() if found is None else found


def _realigned(pieces: list[str], text: str) -> torch.Tensor | None:
    """Offsets ``[L, 2]`` of tokens spelled ``pieces``, each located in ``text`` from where the previous one
    ended; None when a piece is not found there (tokens that are not raw text: byte-level or marked-up)."""
    out, pos = [], 0
    for piece in pieces:
        at = text.find(piece, pos) if piece else -1
        if at < 0:
            return None
        out.append((at, at + len(piece)))
        pos = at + len(piece)
    return torch.tensor(out, dtype=torch.int32).reshape(-1, 2)


class UnencodableCharactersWarning(UserWarning):
    """:func:`encode_text` was given characters the tokenizer drops or replaces (the CLI notes them itself)."""


def describe_unencodable(bad: dict) -> str:
    """The words of the note on :func:`unencodable_characters`' result (the CLI's and :func:`encode_text`'s):
    the count, then up to five characters with their code points (a lone combining mark or a lookalike such as
    'Å' U+212B reads ambiguously without it)."""
    total = sum(bad.values())
    shown = ", ".join(f"{ch!r} (U+{ord(ch):04X}) x{n}" for ch, n in list(bad.items())[:5])
    shown += ", ..." if len(bad) > 5 else ""
    return f"{total} character(s) the model's tokenizer cannot encode are left out or replaced: {shown}"


def encode_text(model, text: str, *, bos: bool = False) -> torch.Tensor:
    """Token ids ``[L]`` int64 on the model's device, no special tokens (optionally BOS first).

    The tokenizer's ids of recent texts (up to :data:`MEMO_TOKENS` ids per tokenizer) are remembered, so
    the same text (a long context) is tokenized once; each call returns a new tensor. Characters the tokenizer
    cannot encode (:func:`unencodable_characters`) are left out or replaced, with an
    :class:`UnencodableCharactersWarning` saying which.

    Raises:
        ValueError: the model has no tokenizer.
    """
    tok = model.tokenizer
    if tok is None:
        raise ValueError(f"model {model.model_dir!r} has no tokenizer; pass token ids instead of text")
    bad = unencodable_characters(model, text)
    if bad:
        warnings.warn(describe_unencodable(bad), UnencodableCharactersWarning, stacklevel=2)
    ids = _token_ids(tok, text)
    if bos and tok.bos_token_id is not None:
        ids = torch.cat([torch.tensor([tok.bos_token_id], dtype=torch.long), ids])
    return ids.to(model.device, copy=True)


def unencodable_characters(model, text: str) -> dict:
    """The characters of ``text`` that the model's tokenizer turns into no token or into its unknown token, so
    that :func:`encode_text` drops or blurs them (the bundled tokenizer knows printable ASCII and newline:
    "á", "€" and a tab vanish). Each distinct character is tokenized alone (a few hundred calls for any
    text); the space and the newline are taken as encodable (a tokenizer may fold a lone one into the next
    word); a lone surrogate (bytes that were not UTF-8) counts as unencodable.

    Args:
        model: a loaded model; its ``tokenizer`` may be None.
        text: any str.

    Returns:
        ``{character: count}`` in order of first occurrence; ``{}`` with no tokenizer.
    """
    tok = model.tokenizer
    if tok is None:
        return {}
    unk = getattr(tok, "unk_token_id", None)
    out = {}
    for ch, n in Counter(text).items():  # insertion order: first occurrence
        if ch in " \n":
            continue
        try:
            ids = tok.encode(ch, add_special_tokens=False)
        except (TypeError, ValueError):  # a lone surrogate: no tokenizer takes it
            ids = []
        if not ids or (unk is not None and unk in ids):
            out[ch] = n
    return out


def decode_text(model, tokens: torch.Tensor) -> list | str | None:
    """Decode responses ``[B, L]`` (a list of B strings) or one ``[L]`` (:func:`encode_text`'s shape: one string),
    each cut at its first EOS/PAD; None when the model has no tokenizer.

    Raises:
        ValueError: ``tokens`` neither 1-D nor 2-D.
    """
    tok = model.tokenizer
    if tok is None:
        return None
    if tokens.dim() == 1:
        return decode_text(model, tokens[None])[0]
    if tokens.dim() != 2:
        raise ValueError(f"decode_text takes token ids [L] or [B, L], got shape {tuple(tokens.shape)}")
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
