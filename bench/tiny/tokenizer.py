"""Character-level tokenizer of the tiny model, saved as a standard HF fast tokenizer.

Vocabulary: 4 special tokens (ids 0-3) then newline and printable ASCII 32..126,
one token per character. Built with the ``tokenizers`` library (BPE with no merges
= one token per character, ``Fuse`` decoder) so ``transformers.AutoTokenizer``
loads it from ``tokenizer.json`` with no custom code.
"""

from __future__ import annotations

SPECIALS = {"pad": "<|pad|>", "bos": "<|beginoftext|>", "eos": "<|endoftext|>", "mask": "<|mask|>"}
CHARS = ["\n"] + [chr(c) for c in range(32, 127)]


def build_char_tokenizer():
    """A ``PreTrainedTokenizerFast`` over :data:`CHARS` with BOS/EOS/MASK/PAD."""
    from tokenizers import Tokenizer, decoders, models
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(SPECIALS.values())}
    for ch in CHARS:
        vocab[ch] = len(vocab)
    core = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=None, ignore_merges=True))
    core.decoder = decoders.Fuse()
    core.add_special_tokens(list(SPECIALS.values()))
    return PreTrainedTokenizerFast(
        tokenizer_object=core,
        bos_token=SPECIALS["bos"],
        eos_token=SPECIALS["eos"],
        mask_token=SPECIALS["mask"],
        pad_token=SPECIALS["pad"],
        clean_up_tokenization_spaces=False,
        model_max_length=1 << 20,
    )


def save_char_tokenizer(out_dir: str):
    from dllm.model.tokenization import save_portable_tokenizer  # readable by transformers 4.46 and 5.x

    tok = build_char_tokenizer()
    save_portable_tokenizer(tok, out_dir)
    return tok
