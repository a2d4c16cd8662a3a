"""Fused ops for long-context dLLM inference (Prefilling-dLLM).

Public API (DESIGN section 3): ``split_s_attention``, ``merge_states``,
``chunk_attention_scores``, ``chunk_row_mass``, ``topb_gather``.
Torch references with the same signatures live in ``triton_kernels.reference``.
"""

from triton_kernels.reference import (  # noqa: F401  (temporary: kernels plug in behind these names)
    chunk_attention_scores,
    chunk_row_mass,
    merge_states,
    split_s_attention,
    topb_gather,
)

__all__ = ["split_s_attention", "merge_states", "chunk_attention_scores", "chunk_row_mass", "topb_gather"]
