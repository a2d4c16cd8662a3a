"""``split_s_attention`` for CPU tensors: one fused attention call per batch row.

The naive reference (:func:`triton_kernels.reference.split_s_attention`) repeats K/V per query
head and materialises the scores ``[Hq, M, L]`` of every row: fine as a specification, but on
CPU it is most of a denoising step. This implementation, per batch row ``b``:

1. concatenates the row's valid keys (its segments in table order, then its ``live_lens[b]``
   real live keys) into one ``[L_b, Hkv, D]`` fp32 buffer: only valid entries are read, so
   whatever the pool or the live padding holds (NaN, huge values) never reaches a result;
2. folds GQA into the query length (query head ``h * G + g`` of token ``m`` becomes row
   ``m * G + g`` of KV head ``h``), so K/V are never repeated per query head, and drops the
   padded query rows (``m >= live_lens[b]``);
3. runs one call of torch's fused CPU flash attention
   (``aten._scaled_dot_product_flash_attention_for_cpu``: online softmax over key blocks, no
   score matrix, all heads of the row in one call; it returns the LSE in natural log, fp32).

Padded query rows and rows without any key get ``out = 0``, ``lse = -inf`` (the fused kernel
is never called for them). A row whose logits may not all be finite (NaN/inf in its queries or
keys, or ``max|q| * max|k| * D * sm_scale`` beyond fp32) runs the reference instead, which
applies the package's rule (a non-finite logit makes the query row NaN, see
:mod:`triton_kernels.reference`); the fused kernel would report some such rows as
``out = 0, lse = 0`` or ``lse = +inf``. Why a call per row and not one padded call for the batch: a row's
call sees exactly the shapes and values of the same request run alone, so batched generation
stays bit-equal to single runs (a padded batch changes the fused kernel's key blocking and
with it the float summation order), and in a microbenchmark on this 2-core CPU (under load) a
padded one-call variant was slower: its masked gathers cost more than the per-row loop saved. Arithmetic is fp32 for
every input dtype, as in the reference. Tested against the reference in
``tests/kernels/test_split_s_cpu.py``.

Sources: Prefilling-dLLM (arXiv 2606.10537) split-S attention (the contract);
FlashAttention-2 (Dao, 2023; the online-softmax kernel torch runs on CPU); the GQA-into-M
packing of our Triton kernel (:mod:`triton_kernels.split_s`).
"""

from __future__ import annotations

import torch

from triton_kernels import reference as _ref

# In torch since 2.2 (attn_mask/scale keywords since 2.3); guarded for builds without it.
_FUSED = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)


def has_fused_attention() -> bool:
    """True when this torch build has the fused CPU attention that :func:`split_s_attention_cpu` calls."""
    return _FUSED is not None


def _logits_finite(q: torch.Tensor, k: torch.Tensor, scale: float) -> bool:
    """True when every logit ``q . k * scale`` is surely finite (False on NaN/inf, one host read each)."""
    bound = 1.0
    for x in (q, k):
        lo, hi = torch.aminmax(x)
        bound *= max(-float(lo), float(hi), 0.0)  # NaN stays NaN
    return bound * q.shape[-1] * abs(scale) < torch.finfo(torch.float32).max


def split_s_attention_cpu(
    q: torch.Tensor,
    k_pool: torch.Tensor,
    v_pool: torch.Tensor,
    seg_slots: torch.Tensor,
    seg_lens: torch.Tensor,
    k_live: torch.Tensor | None = None,
    v_live: torch.Tensor | None = None,
    sm_scale: float | None = None,
    live_lens: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Split-S attention of CPU tensors through torch's fused CPU attention (one call per row).

    The path :func:`triton_kernels.split_s_attention` takes with ``backend="torch"`` on CPU;
    same contract, inputs validated there (this function checks nothing itself):

    Args:
        q: ``[B, M, Hq, D]`` live-block queries, fp32/fp16/bf16, ``Hq = G * Hkv``.
        k_pool, v_pool: ``[P, T, Hkv, D]`` chunk KV slots (any strides but the last).
        seg_slots, seg_lens: ``[B, S]`` int32/int64; segment ``s`` of row ``b`` is the first
            ``seg_lens[b, s]`` tokens of slot ``seg_slots[b, s]`` (slot -1: no segment).
        k_live, v_live: ``[B, M, Hkv, D]`` live-block keys/values, or None (no live keys).
        sm_scale: softmax scale, None for ``1/sqrt(D)``.
        live_lens: ``[B]`` int, real live tokens per row (None: all M); query rows and live
            keys at ``m >= live_lens[b]`` are padding and are never read.

    Returns:
        ``(out [B, M, Hq, D] in q.dtype, lse [B, M, Hq] fp32, natural log)``, computed in fp32;
        padded query rows and rows without any valid key get ``out = 0``, ``lse = -inf``.

    Falls back to the reference when this torch build lacks the fused CPU op
    (:func:`has_fused_attention`). Algorithm: see the module docstring.
    """
    if _FUSED is None:
        return _ref.split_s_attention(
            q, k_pool, v_pool, seg_slots, seg_lens, k_live, v_live, sm_scale=sm_scale, live_lens=live_lens
        )
    bsz, m, hq, d = q.shape
    hkv = k_pool.shape[2]
    g = hq // hkv
    scale = _ref._scale(sm_scale, d)
    out = torch.zeros(bsz, m, hq, d, dtype=torch.float32)
    lse = torch.full((bsz, m, hq), float("-inf"))
    slots, lens = seg_slots.tolist(), seg_lens.tolist()  # the small table, read once
    n_live = [m] * bsz if live_lens is None else live_lens.tolist()
    for b in range(bsz):
        n = n_live[b]  # real query rows (and live keys) of this row
        segs = [(s, t) for s, t in zip(slots[b], lens[b], strict=True) if s >= 0 and t > 0]
        ks = [k_pool[s, :t] for s, t in segs] + ([k_live[b, :n]] if k_live is not None else [])
        vs = [v_pool[s, :t] for s, t in segs] + ([v_live[b, :n]] if v_live is not None else [])
        n_keys = sum(x.shape[0] for x in ks)
        if n == 0 or n_keys == 0:
            continue  # out 0, lse -inf
        k = torch.cat(ks).float().transpose(0, 1)[None]  # [1, Hkv, L_b, D] (a view; the kernel takes strides)
        v = torch.cat(vs).float().transpose(0, 1)[None]
        if not _logits_finite(q[b, :n], k, scale):  # NaN rows by the reference's rule
            out[b, :n], lse[b, :n] = _ref._attend(q[b, :n], k[0].transpose(0, 1), v[0].transpose(0, 1), scale)
            continue
        # GQA packed into M: row m * G + g of KV head h is query head h * G + g of token m.
        qb = q[b, :n].float().reshape(n, hkv, g, d).permute(1, 0, 2, 3).reshape(1, hkv, n * g, d)
        o, lb = _FUSED(qb, k, v, 0.0, False, scale=scale)  # [1, Hkv, n*G, D], [1, Hkv, n*G]
        out[b, :n] = o[0].view(hkv, n, g, d).permute(1, 0, 2, 3).reshape(n, hq, d)
        lse[b, :n] = lb[0].view(hkv, n, g).permute(1, 0, 2).reshape(n, hq)
    return out.to(q.dtype), lse
