"""The three parts of a long-context prompt: prefix template, context, query."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dllm.tokenization import encode_text


@dataclass
class PromptParts:
    """Token ids of a prompt split for Prefilling-dLLM.

    Attributes:
        prefix: ``[P]`` int64, instructions before the context (normally starting with BOS);
            may be empty. Encoded once as its own static segment.
        context: ``[L_ctx]`` int64, the long document; cut into chunks. Non-empty, or None when
            the document comes as a :class:`~dllm.prefilling.document.DocumentCache`
            (``dllm.generate(..., document=doc)``).
        query: ``[L_q]`` int64, the question after the context; live in every step. Non-empty.
    """

    prefix: torch.Tensor
    context: torch.Tensor | None
    query: torch.Tensor

    def full(self) -> torch.Tensor:
        """``[P + L_ctx + L_q]``: the prompt as one sequence (what dense decoding reads).

        Raises:
            ValueError: no context (it lives in a document cache).
        """
        if self.context is None:
            raise ValueError("these PromptParts hold no context (it is in a DocumentCache)")
        return torch.cat([self.prefix, self.context, self.query])


def split_prompt(model, template: str, *, context: str | None = None, query_window: int | None = None) -> PromptParts:
    """Split a prompt text into :class:`PromptParts` with the model's tokenizer.

    Rules, in order:
      1. ``context`` given: ``template`` must hold one ``{context}`` slot; the text before it is
         the prefix, the text after it the query.
      2. ``template`` holds a ``{context}`` slot but no ``context`` was given: error.
      3. No slot (documented fallback): the last ``query_window`` tokens (default 64) of the
         prompt are the query, everything before them the context, and the prefix is BOS only.

    Raises:
        ValueError: several slots, a slot without context, empty context or query.
    """
    n_slots = template.count("{context}")
    if n_slots > 1:
        raise ValueError("the prompt template holds more than one {context} slot")
    if context is not None:
        if n_slots != 1:
            raise ValueError("a context was given but the prompt template has no {context} slot")
        before, after = template.split("{context}")
        parts = PromptParts(
            encode_text(model, before, bos=True), encode_text(model, context), encode_text(model, after)
        )
    elif n_slots == 1:
        raise ValueError("the prompt template has a {context} slot but no context was given")
    else:
        ids = encode_text(model, template)
        w = query_window or 64
        if ids.numel() <= w:
            raise ValueError(f"prompt of {ids.numel()} tokens is too short to split off a {w}-token query")
        bos = encode_text(model, "", bos=True)
        parts = PromptParts(bos, ids[:-w], ids[-w:])
    if parts.context.numel() == 0:
        raise ValueError("the context is empty")
    if parts.query.numel() == 0:
        raise ValueError("the query (text after {context}) is empty")
    return parts


def split_document_prompt(model, template: str) -> PromptParts:
    """Prefix and query of a prompt whose context is a :class:`~dllm.prefilling.document.DocumentCache`.

    With one ``{context}`` slot the text before it (after BOS) is the prefix and the text after it
    the query; without a slot the prefix is BOS alone and the whole template is the query.

    Returns:
        ``PromptParts(prefix, None, query)``.

    Raises:
        ValueError: several slots, or an empty query.
    """
    n_slots = template.count("{context}")
    if n_slots > 1:
        raise ValueError("the prompt template holds more than one {context} slot")
    before, after = template.split("{context}") if n_slots else ("", template)
    parts = PromptParts(encode_text(model, before, bos=True), None, encode_text(model, after))
    if parts.query.numel() == 0:
        raise ValueError("the query (the prompt text after the document) is empty")
    return parts
