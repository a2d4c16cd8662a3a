"""How a harness request's prompt text becomes Prefilling-dLLM's prefix / context / query.

The harness hands a model the rendered prompt string and the dataset row (``Instance.doc``). The
split, first rule that applies:

1. ``field``: the row has a non-empty string field ``context_field`` (default ``context``: the long
   document field of the harness's LongBench and InfiniteBench tasks) and its text occurs in the
   prompt with non-blank text after it. Its last occurrence (few-shot examples come before the
   evaluated row) is the context; the text before it the prefix, the text after it the query.
2. ``paragraph``: the prompt's last paragraph (the text after its last blank line, ``"\\n\\n"``) is the
   query, if it is not blank and holds at most half of the prompt's tokens; everything before it
   (the blank line included) is the context, the prefix is BOS alone.
3. ``tokens``: the last ``query_window`` tokens (default 64) are the query, the rest the context
   (:func:`dllm.prefilling.prompt.split_prompt`'s fallback); the prefix is BOS alone.

The prefix gets the BOS token unless ``add_bos`` is off (it is off under a chat template, whose
rendered text brings its own leading special tokens). Context and query are tokenized without
special tokens, each on its own, as ``dllm eval`` does (so a field split equals ``dllm eval`` on the
same case).
"""

from __future__ import annotations

from dllm.model.tokenization import encode_text
from dllm.prefilling import PromptParts

DEFAULT_QUERY_TOKENS = 64  # rule 3's query length when PrefillingConfig.query_window is None
PARAGRAPH = "\n\n"


def split_request(
    model,
    text: str,
    doc,
    *,
    context_field: str = "context",
    query_window: int | None = None,
    add_bos: bool = True,
) -> tuple[PromptParts, str]:
    """Split one request's prompt (see the module docstring for the rules).

    Args:
        model: a dLLM with a tokenizer.
        text: the prompt string the harness rendered.
        doc: the request's dataset row (a dict; anything else skips rule 1).
        context_field: rule 1's field name.
        query_window: rule 3's query length in tokens (None: 64).
        add_bos: put the tokenizer's BOS first in the prefix.

    Returns:
        ``(PromptParts, rule)``: int64 token ids on the model's device (prefix ``[P]``, context
        ``[L_ctx]``, query ``[L_q]``, context and query non-empty) and the rule that split it
        (``"field"``, ``"paragraph"`` or ``"tokens"``).

    Raises:
        ValueError: the prompt is too short for any rule (at most ``query_window`` tokens and no
            usable field or paragraph), or the model has no tokenizer.
    """
    bos = encode_text(model, "", bos=add_bos)
    field = doc.get(context_field) if isinstance(doc, dict) else None
    if isinstance(field, str) and field.strip():
        at = text.rfind(field)
        if at >= 0 and text[at + len(field) :].strip():
            before, after = text[:at], text[at + len(field) :]
            parts = PromptParts(
                encode_text(model, before, bos=add_bos), encode_text(model, field), encode_text(model, after)
            )
            if parts.query.numel():
                return parts, "field"
    ids = encode_text(model, text)
    cut = text.rfind(PARAGRAPH)
    if cut > 0 and text[: cut + len(PARAGRAPH)].strip() and text[cut + len(PARAGRAPH) :].strip():
        context = encode_text(model, text[: cut + len(PARAGRAPH)])
        query = encode_text(model, text[cut + len(PARAGRAPH) :])
        if context.numel() and query.numel() and 2 * query.numel() <= ids.numel():
            return PromptParts(bos, context, query), "paragraph"
    w = query_window or DEFAULT_QUERY_TOKENS
    if ids.numel() <= w:
        raise ValueError(
            f"method=prefilling: a prompt of {ids.numel()} tokens without a '{context_field}' field or a last "
            f"paragraph to split off is too short to split off a {w}-token query (use method=dense for short prompts)"
        )
    return PromptParts(bos, ids[:-w], ids[-w:]), "tokens"
