"""The three parts of a long-context prompt: prefix template, context, query.

Instruct checkpoints (``apply_chat_template=True``, CLI ``--chat``): the prompt text, context
slot included, becomes the user turn of the tokenizer's own chat template (assistant turn
opened); the rendered text is cut at the slot, so the system/user header is the prefix, the
context alone is chunked, and the rest of the user turn plus the assistant header is the query.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dllm.model.tokenization import encode_text


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

    Raises:
        TypeError: ``prefix`` or ``query`` not a tensor (None included: an empty prefix is ``torch.empty(0,
            dtype=torch.long)``). Shapes, dtypes and token values are checked by ``dllm.generate``.
    """

    prefix: torch.Tensor
    context: torch.Tensor | None
    query: torch.Tensor

    def __post_init__(self):
        # a None prefix or query would fail deep in the prefill with an AttributeError naming nothing
        for name in ("prefix", "query"):
            if not isinstance(getattr(self, name), torch.Tensor):
                raise TypeError(
                    f"PromptParts.{name} must be a 1-D int64 tensor of token ids (an empty one for no {name}), "
                    f"got {type(getattr(self, name)).__name__}"
                )

    def full(self) -> torch.Tensor:
        """``[P + L_ctx + L_q]``: the prompt as one sequence (what dense decoding reads).

        Raises:
            ValueError: no context (it lives in a document cache).
        """
        if self.context is None:
            raise ValueError("these PromptParts hold no context (it is in a DocumentCache)")
        return torch.cat([self.prefix, self.context, self.query])


CONTEXT_SLOT = "{context}"


def render_chat(model, user_message: str, *, system: str | None = None) -> str:
    """``user_message`` as one user turn of the tokenizer's chat template, the assistant turn opened.

    Args:
        model: a dLLM with a tokenizer that has a ``chat_template`` (e.g. Dream-v0-Instruct's).
        user_message: the user's text (may hold the ``{context}`` slot; Jinja leaves message text alone).
        system: optional system message (default: whatever the template uses, e.g. Qwen2's
            "You are a helpful assistant.").

    Returns:
        The rendered prompt text (special tokens as text; encode it without adding any).

    Raises:
        ValueError: no tokenizer, or a tokenizer without a chat template.
    """
    tok = model.tokenizer
    if tok is None:
        raise ValueError(f"model {model.model_dir!r} has no tokenizer: cannot apply a chat template")
    if not getattr(tok, "chat_template", None):
        raise ValueError(
            f"the tokenizer of {model.model_dir!r} has no chat template (a base model?): "
            "drop apply_chat_template / --chat"
        )
    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": user_message}]
    return tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def split_prompt(
    model,
    template: str,
    *,
    context: str | None = None,
    query_window: int | None = None,
    apply_chat_template: bool = False,
    system: str | None = None,
) -> PromptParts:
    """Split a prompt text into :class:`PromptParts` with the model's tokenizer.

    With ``apply_chat_template=True`` (instruct checkpoints) ``template`` is the user message: it is
    wrapped by :func:`render_chat` (with ``system``) and then cut at its ``{context}`` slot as in rule 1;
    the chat template decides the leading special tokens (no BOS is added), and ``context`` and a slot
    are required.

    Rules, in order:
      1. ``context`` given: ``template`` must hold one ``{context}`` slot; the text before it is
         the prefix, the text after it the query.
      2. ``template`` holds a ``{context}`` slot but no ``context`` was given: error.
      3. No slot (documented fallback): the last ``query_window`` tokens (default 64) of the
         prompt are the query, everything before them the context, and the prefix is BOS only.

    Raises:
        ValueError: several slots, a slot without context, empty context or query; with
            ``apply_chat_template``: no slot or context, or no chat template.
    """
    n_slots = template.count(CONTEXT_SLOT)
    if apply_chat_template:
        if n_slots != 1 or context is None:
            raise ValueError(
                "apply_chat_template needs a context and one {context} slot in the prompt (the context goes "
                "inside the user turn and is the only part that is chunked)"
            )
        rendered = render_chat(model, template, system=system)
        if rendered.count(CONTEXT_SLOT) != 1:
            raise ValueError("the chat template dropped or repeated the {context} slot of the user message")
        before, after = rendered.split(CONTEXT_SLOT)
        parts = PromptParts(encode_text(model, before), encode_text(model, context), encode_text(model, after))
        return _checked(parts)
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
    return _checked(parts)


def _checked(parts: PromptParts) -> PromptParts:
    if parts.context.numel() == 0:
        raise ValueError("the context is empty")
    if parts.query.numel() == 0:
        raise ValueError("the query (text after {context}) is empty")
    return parts


def split_document_prompt(model, template: str, *, apply_chat_template: bool = False, system=None) -> PromptParts:
    """Prefix and query of a prompt whose context is a :class:`~dllm.prefilling.document.DocumentCache`.

    With one ``{context}`` slot the text before it (after BOS) is the prefix and the text after it
    the query; without a slot the prefix is BOS alone and the whole template is the query. With
    ``apply_chat_template=True`` the template (slot required) is the user turn of
    :func:`render_chat`, cut at the slot as in :func:`split_prompt`.

    Returns:
        ``PromptParts(prefix, None, query)``.

    Raises:
        ValueError: several slots (or none, with the chat template), or an empty query.
    """
    n_slots = template.count(CONTEXT_SLOT)
    if n_slots > 1 or (apply_chat_template and n_slots != 1):
        raise ValueError(
            f"the prompt template must hold {'one' if apply_chat_template else 'at most one'} {{context}} slot"
        )
    if apply_chat_template:
        before, after = render_chat(model, template, system=system).split(CONTEXT_SLOT)
        prefix = encode_text(model, before)
    else:
        before, after = template.split(CONTEXT_SLOT) if n_slots else ("", template)
        prefix = encode_text(model, before, bos=True)
    parts = PromptParts(prefix, None, encode_text(model, after))
    if parts.query.numel() == 0:
        raise ValueError("the query (the prompt text after the document) is empty")
    return parts
