"""``split_s_attention`` for CPU tensors: torch's fused CPU flash attention, one call per row shape.

The naive reference (:func:`triton_kernels.reference.split_s_attention`) repeats K/V per query
head and materialises the scores ``[Hq, M, L]`` of every row: fine as a specification, but on
CPU it is most of a denoising step. This implementation:

1. groups the batch rows by shape (real live tokens ``n = live_lens[b]``, valid keys ``L_b``); a
   batch whose rows keep chunks of the same lengths (``top_k`` full chunks each, the usual case) is
   one group;
2. per group, concatenates each row's valid keys (its segments in table order, then its ``n``
   real live keys) into one ``[R, L, Hkv, D]`` fp32 buffer: only valid entries are read, so
   whatever the pool or the live padding holds (NaN, huge values) never reaches a result;
3. folds GQA into the query length (query head ``h * G + g`` of token ``m`` becomes row
   ``m * G + g`` of KV head ``h``), so K/V are never repeated per query head, and drops the
   padded query rows (``m >= n``);
4. runs one call of torch's fused CPU flash attention for the whole group
   (``aten._scaled_dot_product_flash_attention_for_cpu``: online softmax over key blocks, no
   score matrix; it returns the LSE in natural log, fp32).

Padded query rows and rows without any key get ``out = 0``, ``lse = -inf`` (the fused kernel
is never called for them). A row whose logits may not all be finite (NaN/inf in its queries or
keys, or ``max|q| * max|k| * D * sm_scale`` beyond fp32; one host read per group) runs the
reference instead, which applies the package's rule (a non-finite logit makes the query row NaN,
see :mod:`triton_kernels.reference`); the fused kernel would report some such rows as
``out = 0, lse = 0`` or ``lse = +inf``.

Rows equal their single runs bit for bit: a row's inputs in its group's call are exactly those of
the same request run alone. Why rows of different shapes are not padded into one masked call:
padding a row's keys changes the size of its last key block in the fused kernel (blocks of 512
keys), so its gemm and softmax sums run in another order and the row no longer equals its single
run (measured: most padded rows differ in the last bits). Why some groups still run row by row
(:func:`batch_invariant`): for small query blocks, or a row that is a single work item of the
kernel, the bits depend on which thread computes it, hence on the other rows. Arithmetic is fp32
for every input dtype, as in the reference. Tested against the reference in
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


def _q_split(q_size: int) -> int:
    """Query rows per work item of torch's fused CPU attention for ``q_size`` query rows (its heuristic:
    256 from 768 rows, 64 from 192, else 32, capped at ``q_size``)."""
    return min(q_size, 256 if q_size >= 768 else 64 if q_size >= 192 else 32)


def batch_invariant(q_rows: int, n_kv_heads: int) -> bool:
    """True when one fused call over several rows of ``q_rows`` packed query rows (``n * G``) and
    ``n_kv_heads`` heads gives each row the bits of a call for that row alone.

    The fused kernel splits the work into items (batch row x head x block of :func:`_q_split` query rows)
    run on torch's threads, each with a per-thread scratch buffer. Two things make a row's bits depend on
    its batch (found by measurement on torch 2.13 / MKL, see ``tests/kernels/test_split_s_cpu.py``):
    with fewer than 32 query rows the scratch buffers of threads > 0 are not 64-byte aligned and MKL takes
    another path for them; a call of a single item runs outside a parallel region, where MKL's gemm may
    use several threads. Neither happens when ``q_rows >= 32`` and a row alone has at least two items.
    """
    return q_rows >= 32 and n_kv_heads * -(-q_rows // _q_split(q_rows)) >= 2


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
    """Split-S attention of CPU tensors through torch's fused CPU attention (one call per row shape).

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

    Rows with the same shape (real live tokens, valid keys) share one fused call, so a batch of
    requests with the same kept-chunk lengths (the usual case: ``top_k`` full chunks each) is a single
    call for all rows; see the module docstring for why rows of different shapes are not padded into it.

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
    groups: dict[tuple[int, int], list[int]] = {}  # (real query rows, valid keys) -> batch rows
    pieces = []  # per row: (segments as (slot, length), live keys read)
    for b in range(bsz):
        n = n_live[b]  # real query rows (and live keys) of this row
        segs = [(s, t) for s, t in zip(slots[b], lens[b], strict=True) if s >= 0 and t > 0]
        pieces.append(segs)
        n_keys = sum(t for _, t in segs) + (n if k_live is not None else 0)
        if n > 0 and n_keys > 0:  # else out 0, lse -inf
            groups.setdefault((n, n_keys), []).append(b)
    for (n, n_keys), rows in groups.items():
        if len(rows) > 1 and not batch_invariant(n * g, hkv):
            for b in rows:
                _attend(q, k_pool, v_pool, k_live, v_live, pieces, [b], n, n_keys, scale, out, lse)
        else:
            _attend(q, k_pool, v_pool, k_live, v_live, pieces, rows, n, n_keys, scale, out, lse)
    return out.to(q.dtype), lse


def _gather(pool, live, pieces, rows, n) -> torch.Tensor:
    """``[R, L, Hkv, D]`` fp32: each row's valid keys (segments in table order, then its ``n`` live keys)."""
    parts = []
    for b in rows:
        parts += [pool[s, :t] for s, t in pieces[b]] + ([live[b, :n]] if live is not None else [])
    return torch.cat(parts).float().view(len(rows), -1, *pool.shape[2:])


def _attend(q, k_pool, v_pool, k_live, v_live, pieces, rows, n, n_keys, scale, out, lse) -> None:
    """One fused call for ``rows`` (all with ``n`` real query rows and ``n_keys`` valid keys); writes
    ``out[rows, :n]`` / ``lse[rows, :n]``. Rows whose logits may not be finite take the reference."""
    bsz, m, hq, d = q.shape
    hkv = k_pool.shape[2]
    g = hq // hkv
    k = _gather(k_pool, k_live, pieces, rows, n)  # [R, L, Hkv, D]
    v = _gather(v_pool, v_live, pieces, rows, n)
    every = len(rows) == bsz  # rows == 0..B-1 (groups keep batch order)
    idx = None if every else torch.tensor(rows)
    qr = (q if every else q.index_select(0, idx))[:, :n].float()  # [R, n, Hq, D]
    finite = _rows_finite(qr, k, scale)
    if not all(finite):  # NaN rows by the reference's rule; the other rows of the group go on below
        for i, b in enumerate(rows):
            if not finite[i]:
                out[b, :n], lse[b, :n] = _ref._attend(qr[i], k[i], v[i], scale)
        keep = [i for i, ok in enumerate(finite) if ok]
        if not keep:
            return
        sel = torch.tensor(keep)
        rows, qr, k, v = [rows[i] for i in keep], qr[sel], k[sel], v[sel]
        every, idx = False, torch.tensor(rows)
    r = len(rows)
    # GQA packed into M: row m * G + g of KV head h is query head h * G + g of token m.
    qb = qr.reshape(r, n, hkv, g, d).permute(0, 2, 1, 3, 4).reshape(r, hkv, n * g, d)
    o, lb = _FUSED(qb, k.transpose(1, 2), v.transpose(1, 2), 0.0, False, scale=scale)  # [R, Hkv, n*G, D|]
    o = o.view(r, hkv, n, g, d).permute(0, 2, 1, 3, 4).reshape(r, n, hq, d)
    lb = lb.view(r, hkv, n, g).permute(0, 2, 1, 3).reshape(r, n, hq)
    if every and n == m:
        out.copy_(o)
        lse.copy_(lb)
    elif every:
        out[:, :n], lse[:, :n] = o, lb
    else:
        out[idx, :n], lse[idx, :n] = o, lb


def _rows_finite(q: torch.Tensor, k: torch.Tensor, scale: float) -> list[bool]:
    """Per row of ``q [R, n, Hq, D]`` / ``k [R, L, Hkv, D]``: every logit ``q . k * scale`` surely finite
    (False on NaN/inf); one host read for all rows."""
    bound = q.abs().amax(dim=(1, 2, 3)) * k.abs().amax(dim=(1, 2, 3))  # NaN stays NaN
    limit = torch.finfo(torch.float32).max / (q.shape[-1] * abs(scale)) if scale else float("inf")
    return [bool(x < limit) for x in bound.tolist()]
