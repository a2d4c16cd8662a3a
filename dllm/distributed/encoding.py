"""Sharded encoding: every rank cuts the whole document into the chunks one process would cut (fixed, or
snapped to sentence ends: the boundaries depend on the whole token sequence, which every rank holds), takes
its contiguous share of them and encodes it with :func:`dllm.encode_document`.

A share's snapped chunks are cut again, the same, from the share's tokens alone (so a shard file checks its own
boundaries when loaded): the greedy cut ends a chunk at the last sentence end in ``[s + C - tol, s + C]`` (else
at ``s + C``), so the next chunk of the whole document ends past ``s + C``, and a share's cut never runs out of
tokens before its last chunk (tests/test_distributed.py checks it on random cases)."""

from __future__ import annotations

import hashlib

import torch

from dllm.distributed.group import all_gather, run_on_all, world
from dllm.distributed.sharded_document import ShardedDocument
from dllm.distributed.shares import shard_bounds
from dllm.model.devices import check_ids_for_model
from dllm.prefilling.chunks import chunk_spans, pad_token_id
from dllm.prefilling.config import PrefillingConfig, checkpoint_config
from dllm.prefilling.document import encode_document as encode_one_process


def _ids_digest(ids: torch.Tensor) -> str:
    return hashlib.sha256(ids.detach().long().cpu().contiguous().numpy().tobytes()).hexdigest()


@torch.no_grad()
def encode_document(
    model,
    context_ids: torch.Tensor,
    chunk_size: int | None = None,
    *,
    prefilling: PrefillingConfig | None = None,
    group=None,
    progress: bool = False,
) -> ShardedDocument:
    """Chunked prefill of a document shared by the ranks of ``group``: each encodes a contiguous share.

    Collective: every rank passes the same ``context_ids`` (checked: a SHA-256 of the ids is compared), cuts
    the whole sequence into chunks as one process does (:func:`~dllm.prefilling.chunks.chunk_spans`: fixed, or
    snapped to sentence ends with ``boundary_snap``), takes its share ``[lo_r, hi_r)`` (:func:`shard_bounds`)
    and runs :func:`dllm.encode_document` on those chunks' tokens, so each chunk is encoded exactly as in one
    process (BOS anchor, local positions, ``prefill_batch`` chunks per forward). Time: the slowest rank's
    share, ``ceil(N / W)`` chunks; no communication but the checks.

    Args:
        model: the dLLM, on this rank's device.
        context_ids: ``[L_ctx]`` int64/int32 token ids of the whole document on the model's device.
        chunk_size, prefilling, progress: as :func:`dllm.encode_document` (default: the checkpoint's
            configuration, its ``boundary_snap`` included; the bar on rank 0 only).
        group: the process group (None: the default one, or one process without a group).

    Returns:
        A :class:`ShardedDocument` (this rank's chunks in ``.local``, every chunk's span in ``.spans``).

    Raises:
        RankError: on every rank when any rank raised (``TypeError``/``ValueError`` of
            :func:`dllm.encode_document`, other ids on some rank, fewer chunks than ranks); in one process
            without a group the error itself.
    """
    rank, size = world(group)

    def check():
        cfg = prefilling or checkpoint_config(model, chunk_size)
        if chunk_size is not None and chunk_size != cfg.chunk_size:
            raise ValueError(f"chunk_size={chunk_size} differs from prefilling.chunk_size={cfg.chunk_size}")
        if not isinstance(cfg, PrefillingConfig):
            raise TypeError(f"prefilling= must be a PrefillingConfig, got {type(cfg).__name__}")
        if not torch.is_tensor(context_ids) or context_ids.dtype not in (torch.int64, torch.int32):
            raise TypeError("context_ids must be an int64/int32 tensor of token ids")
        if context_ids.dim() != 1 or context_ids.numel() == 0:
            raise ValueError(f"context_ids must be a non-empty 1-D tensor, got shape {tuple(context_ids.shape)}")
        return cfg, _ids_digest(context_ids)

    cfg, digest = run_on_all(check, group)
    digests = all_gather(digest, group)

    def encode_share():
        if digests[rank] != digests[0]:  # raised by the odd ranks, so the error names them
            raise ValueError(
                "this rank was given other context token ids than rank 0: every rank passes the whole document"
            )
        check_ids_for_model(model, context_ids, "context_ids are", "context_ids contain", "context")
        spans = chunk_spans(model, context_ids, cfg.chunk_size, cfg.boundary_snap)  # the whole document's
        bounds = shard_bounds(len(spans), size)
        lo, hi = bounds[rank]
        a, b = spans[lo][0], spans[hi - 1][0] + spans[hi - 1][1]
        local = encode_one_process(model, context_ids[a:b], prefilling=cfg, progress=progress and rank == 0)
        if [(s + a, n) for s, n in zip(local.chunks.starts, local.chunks.sizes())] != spans[lo:hi]:
            raise RuntimeError(f"rank {rank}: its share's chunks differ from the whole document's {lo}..{hi - 1}")
        return ShardedDocument(local, bounds, context_ids.numel(), pad_token_id(model, local.anchor_token_id),
                               group, spans)  # fmt: skip

    return run_on_all(encode_share, group)
