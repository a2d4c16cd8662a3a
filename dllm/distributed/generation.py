"""Answering from a sharded document: selection across ranks (:mod:`dllm.distributed.selection`), the kept
chunks' K/V sent to the decoding rank, which runs :func:`dllm.generate` over exactly those chunks."""

from __future__ import annotations

import dataclasses

import torch

from dllm.distributed.group import run_on_all, world
from dllm.distributed.selection import score_and_select
from dllm.distributed.sharded_document import ShardedDocument
from dllm.prefilling.chunks import ChunkCache
from dllm.prefilling.config import PrefillingConfig, checkpoint_config, resolve_anchor_token_id
from dllm.prefilling.pipeline import Selection, check_parts, check_top_k
from dllm.prefilling.prompt import PromptParts


@torch.no_grad()
def generate(
    model,
    document: ShardedDocument,
    prompt: PromptParts | None,
    *,
    prefilling: PrefillingConfig | None = None,
    root: int = 0,
    **kwargs,
):
    """Answer a question from a sharded document: distributed scoring and selection, decoding on ``root``.

    Collective. Runs :func:`score_and_select`, sends the K kept chunks' K/V to ``root``
    (:meth:`ShardedDocument.collect`) and there calls :func:`dllm.generate` with ``method="prefilling"``
    over a :class:`~dllm.DocumentCache` of exactly those chunks (so no chunk is scored again, and the
    static cache, positions and denoising steps are those of one process). The tokens equal a
    single-process ``dllm.generate(..., document=whole_document)`` with the same config (greedy
    decoding; bit for bit on the CPU).

    Args:
        model: the dLLM on this rank's device.
        document: the :class:`ShardedDocument`.
        prompt: ``PromptParts(prefix, None, query)`` (1-D token ids on the model's device); read on
            ``root`` only, may be None elsewhere.
        prefilling: :class:`~dllm.PrefillingConfig` (default: the checkpoint's, with the document's chunk
            size), the same on every rank. ``position_mode="absolute"`` is not supported here (the
            decoding rank holds the kept chunks only: a ``ValueError``); ``continuous`` and ``reuse`` are.
        root: the rank that decodes.
        **kwargs: :func:`dllm.generate`'s decoding options (``gen_length``, ``steps``, ``alg``, ``seed``...).

    Returns:
        On ``root``: the :class:`~dllm.GenerationResult`; ``stats.extra`` holds the whole document's
        ``num_chunks``, ``selected_chunks``, ``all_chunk_scores``, the kept chunks' scores, and
        ``distributed`` (``world_size``, ``kv_bytes_to_root``, ``scoring_nfe`` per rank). ``stats.nfe``
        counts the root's forwards (its draft and scoring passes included). None on other ranks.

    Raises:
        RankError: on every rank when any rank failed (bad prompt or config: the original ``ValueError``'s
            message, ``top_k`` larger than N, a document of another model...).
    """
    import dllm  # the package's generate (late: dllm imports this module lazily, never at import time)

    rank, _size = world(document.group)
    doc = document

    def setup():
        cfg = prefilling or checkpoint_config(model, doc.chunk_size, doc.boundary_snap)
        if not isinstance(cfg, PrefillingConfig):
            raise TypeError(f"prefilling= must be a PrefillingConfig, got {type(cfg).__name__}")
        if kwargs.get("reselect"):
            raise ValueError(
                "reselect= is not supported across ranks (the decoding rank holds only the kept chunks): "
                "gather the document (ShardedDocument.gather) and decode in one process"
            )
        if cfg.position_mode == "absolute":
            raise ValueError(
                "position_mode='absolute' is not supported across ranks "
                "(the decoding rank holds only the kept chunks): "
                "use continuous or reuse, or gather the document (ShardedDocument.gather) and decode in one process"
            )
        bos, _src = resolve_anchor_token_id(model.config, model.tokenizer, cfg)
        doc.local.check_model(model)
        doc.local.check_config(cfg, bos)
        check_top_k(cfg, doc.num_chunks, doc.num_tokens)
        parts = None
        if rank == root:
            if prompt is not None and prompt.context is not None:
                raise ValueError("pass the prompt as PromptParts(prefix, None, query): the context is the document")
            parts = check_parts(model, prompt, doc.local)
        return cfg, parts

    cfg, parts = run_on_all(setup, doc.group)
    sel, scoring_nfe = score_and_select(model, doc, parts, cfg, root=root)
    kept = run_on_all(lambda: doc.collect(sel.kept, root), doc.group)

    def decode():
        if rank != root:
            return None
        kept_doc = doc.whole_document(kept)  # exactly the kept chunks: nothing is scored or cut again
        res = dllm.generate(
            model, method="prefilling", prompt=parts, document=kept_doc,
            prefilling=dataclasses.replace(cfg, top_k=None, adaptive_k=None), **kwargs,
        )  # fmt: skip
        _restate_selection(res, sel, doc, kept, scoring_nfe, root)
        return res

    return run_on_all(decode, doc.group)


def _restate_selection(
    res, sel: Selection, doc: ShardedDocument, kept: ChunkCache, scoring_nfe: list, root: int
) -> None:
    """Stats of the whole document in ``res.stats`` (the root decoded over the kept chunks only)."""
    extra = res.stats.extra
    extra["num_chunks"] = doc.num_chunks
    sel.write_stats(extra, doc.spans)
    if sel.scores is not None:  # the root's draft, first stage and scoring passes
        res.stats.nfe += 1 + (sel.scores.candidates is not None) + scoring_nfe[root]
    elt = kept.k[0].element_size()
    sent = sum(1 for j in sel.kept if doc.owner(j) != doc.rank)
    per_chunk = 2 * len(kept.k) * kept.k[0][0].numel() * elt + kept.ids[0].numel() * 8 if kept.num_chunks else 0
    extra["distributed"] = {
        "world_size": len(scoring_nfe),
        "kv_bytes_to_root": sent * per_chunk,
        "scoring_nfe": scoring_nfe,
    }
    if res.stats.rows:
        res.stats.rows[0].update({k: extra[k] for k in ("num_chunks", "selected_chunks") if k in extra})
