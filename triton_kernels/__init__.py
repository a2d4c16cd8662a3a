"""Fused ops for long-context dLLM inference (Prefilling-dLLM).

Public API: ``split_s_attention``, ``merge_states``,
``chunk_attention_scores``, ``chunk_row_mass``, ``topb_gather``; the decode step's fused
elementwise ops ``add_rms_norm`` (residual add + RMSNorm), ``rope_qk`` (RoPE of q and k) and
``swiglu``; for a KV-cache
owner, ``check_segment_table`` (validate once) and ``skip_value_checks`` (then skip
the per-call checks); ``check_errors`` (raise if a kernel met a bad index: on CUDA the
ops do not read index values on the host) and ``eager_value_checks`` (checked mode).
:mod:`triton_kernels.plan` holds the launch plans,
:mod:`triton_kernels.testing` the accuracy oracle the tests and benchmarks share.

Each op validates its inputs, then dispatches (see :mod:`triton_kernels._dispatch`):
CUDA tensors -> Triton kernels, other devices -> the torch references of
:mod:`triton_kernels.reference` (same signatures; ``split_s_attention`` on CPU: torch's
fused CPU attention, :mod:`triton_kernels.split_s_cpu`); ``backend="triton"|"torch"`` or
``PREFILLING_DLLM_BACKEND`` overrides. The attention and scoring ops are registered with
``torch.library`` (namespace ``prefilling_dllm``) so they compose with ``torch.compile``; the
elementwise ops are plain functions (the model calls them on CUDA only, outside any trace).
"""

from triton_kernels._dispatch import check_errors, eager_value_checks, skip_value_checks
from triton_kernels.chunk_scores import chunk_attention_scores, chunk_row_mass
from triton_kernels.glu import swiglu
from triton_kernels.merge import merge_states
from triton_kernels.rms_norm import add_rms_norm
from triton_kernels.rope import rope_qk
from triton_kernels.split_s import check_segment_table, split_s_attention
from triton_kernels.topb import topb_gather

__all__ = [
    "split_s_attention",
    "merge_states",
    "chunk_attention_scores",
    "chunk_row_mass",
    "topb_gather",
    "add_rms_norm",
    "rope_qk",
    "swiglu",
    "check_segment_table",
    "skip_value_checks",
    "eager_value_checks",
    "check_errors",
]
