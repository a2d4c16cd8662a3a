"""Prefilling-dLLM (arXiv 2606.10537): chunked prefill, predictive chunk scoring, two-level sparsity,
static KV decode. Entry point: ``dllm.generate(..., method="prefilling", prompt=PromptParts(...),
prefilling=PrefillingConfig(...))``; read :mod:`dllm.prefilling.pipeline` top to bottom for the steps.
A document's chunked prefill can be kept and reused across questions: :mod:`dllm.prefilling.document`.
A long answer can re-select the chunks at block starts, against the question plus the answer so far:
:mod:`dllm.prefilling.reselect`.
"""

from dllm.decode.policies import PrefillingPolicy
from dllm.prefilling.chunks import ChunkCache, chunk_char_spans, cut_chunks, encode_chunks
from dllm.prefilling.config import PrefillingConfig, resolve_anchor_token_id
from dllm.prefilling.document import DocumentCache, encode_document
from dllm.prefilling.pipeline import (
    Prefill,
    PrefillingSetup,
    RowCache,
    Selection,
    build_cache,
    build_prefilling_policy,
    prefill,
    score_and_select,
)
from dllm.prefilling.positions import chunk_offsets
from dllm.prefilling.prompt import PromptParts, render_chat, split_document_prompt, split_prompt
from dllm.prefilling.scoring import ChunkScores, draft_pseudo_labels, score_chunks

__all__ = [
    "ChunkCache",
    "ChunkScores",
    "DocumentCache",
    "Prefill",
    "PrefillingConfig",
    "PrefillingPolicy",
    "PrefillingSetup",
    "PromptParts",
    "RowCache",
    "Selection",
    "build_cache",
    "build_prefilling_policy",
    "chunk_char_spans",
    "chunk_offsets",
    "cut_chunks",
    "draft_pseudo_labels",
    "encode_chunks",
    "encode_document",
    "prefill",
    "render_chat",
    "resolve_anchor_token_id",
    "score_and_select",
    "score_chunks",
    "split_document_prompt",
    "split_prompt",
]
