"""How many chunks one prefill forward may encode: a batch derived from the device's free memory.

Chunks are independent (Prefilling-dLLM, arXiv 2606.10537), so the chunked prefill can run in any
number of forwards; all at once is fastest but its transient memory grows with the document (a
5 MB document in one forward needs tens of GB). :func:`default_prefill_batch` caps one forward's
transient memory at a share of what the device has free; ``PrefillingConfig.prefill_batch``
(``--prefill-batch``) overrides it. The K/V kept for the document are not transient: they are the
result, allocated once (``chunks.encode_chunks_rows``).
"""

from __future__ import annotations

import torch

# share of the free memory one prefill forward may use: the rest is for the K/V being kept, the
# allocator's fragmentation and whatever else the process holds
BUDGET_SHARE = 0.25


def free_memory_bytes(device: torch.device) -> int:
    """Free memory of ``device`` in bytes: ``torch.cuda.mem_get_info`` on CUDA (plus what the caching
    allocator holds unused), else ``MemAvailable`` of ``/proc/meminfo`` (Linux); 8 GiB when unknown."""
    device = torch.device(device)
    if device.type == "cuda":
        free, _total = torch.cuda.mem_get_info(device)
        return int(free + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device))
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 8 << 30


def chunk_forward_bytes(config, tokens: int, element_size: int) -> int:
    """Upper estimate of one chunk's transient memory in a prefill forward, bytes.

    ``tokens`` = T (the chunk and its anchor). Per token: the residual stream and its norm, q/k/v
    (and their RoPE copies), the attention output, the SwiGLU's three inner activations, in the
    model dtype; per head: one fp32 ``T x T`` score matrix and its softmax (attention with a padding
    mask may materialise them). Layers run one after another, so one layer's activations count.
    """
    c = config
    qkv = (c.num_heads + 2 * c.num_kv_heads) * c.head_dim
    per_token = element_size * (4 * c.hidden_size + 2 * qkv + c.num_heads * c.head_dim + 3 * c.intermediate_size)
    scores = 2 * 4 * c.num_heads * tokens * tokens
    return tokens * per_token + scores


def default_prefill_batch(model, tokens: int, num_chunks: int, *, free_bytes: int | None = None) -> int:
    """Chunks per prefill forward so that one forward stays within :data:`BUDGET_SHARE` of free memory.

    Args:
        model: the dLLM (its config, dtype and device).
        tokens: T, positions per chunk (chunk + anchor).
        num_chunks: N, chunks to encode (the result is at most N).
        free_bytes: free memory to budget from (default :func:`free_memory_bytes` of the model's device).

    Returns:
        An int in ``[1, N]``.
    """
    free = free_memory_bytes(model.device) if free_bytes is None else free_bytes
    per_chunk = chunk_forward_bytes(model.config, tokens, torch.empty(0, dtype=model.dtype).element_size())
    return max(1, min(num_chunks, int(free * BUDGET_SHARE) // per_chunk))
