"""Prefilling-dLLM (arXiv 2606.10537): chunked prefill, predictive chunk scoring, two-level sparsity,
static KV decode. Entry point: ``dllm.generate(..., method="prefilling", prompt=PromptParts(...),
prefilling=PrefillingConfig(...))``.
"""

from dllm.prefilling.chunks import ChunkCache, cut_chunks, encode_chunks
from dllm.prefilling.config import PrefillingConfig, resolve_anchor_token_id
from dllm.prefilling.pipeline import PrefillingPolicy, build_prefilling_policy
from dllm.prefilling.positions import chunk_offsets
from dllm.prefilling.prompt import PromptParts, render_chat, split_prompt
from dllm.prefilling.scoring import ChunkScores, draft_pseudo_labels, score_chunks

__all__ = [
    "ChunkCache",
    "ChunkScores",
    "PrefillingConfig",
    "PrefillingPolicy",
    "PromptParts",
    "build_prefilling_policy",
    "chunk_offsets",
    "cut_chunks",
    "draft_pseudo_labels",
    "render_chat",
    "resolve_anchor_token_id",
    "encode_chunks",
    "score_chunks",
    "split_prompt",
]
