"""``split_s_attention``: attention of the live block over non-contiguous static segments.

The static KV cache of Prefilling-dLLM is a pool of slots ``[P, T, Hkv, D]``; a
batch row attends over a few of them (its kept chunks, in any slot order, each
with its own valid length) plus the live block's own keys. Nothing is gathered
into contiguous memory:

* Phase 1 (``_split_s_partial_kernel``): one program per
  (query tile x KV head, partial, batch row). A *partial* is one segment, or a
  split of a long segment (so a handful of long segments still fill the GPU), or
  a run of consecutive segments (so many segments do not blow up the partial
  buffer), or the live block. Each program runs FlashAttention's online softmax
  over its keys and writes a normalised fp32 partial output and its LSE.
* Phase 2: :func:`triton_kernels.merge.merge_states_launch` reduces the partials.
  With a single partial, phase 1 writes the final output directly.

GQA: the ``G`` query heads sharing one KV head are packed into the M dimension
of the tile (row ``r`` = query token ``r // G``, head ``h * G + r % G``), so each
K/V tile is loaded once per KV head; ``M * G`` need not be a power of two (the
tail of the last tile is masked).

Sources: Prefilling-dLLM (arXiv 2606.10537) "Split-S attention"; FlashAttention-2
online softmax (base-2 exponentials with ``sm_scale * log2(e)`` folded into the
logits); flash-decoding split-K; FlashInfer ``merge_states`` math.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from triton_kernels import _validate as V
from triton_kernels import reference as _ref
from triton_kernels._dispatch import LN2_C as LN2
from triton_kernels._dispatch import (
    LOG2E,
    alloc,
    check_values_enabled,
    compute_dtype,
    next_pow2,
    require_runnable,
    resolve_backend,
    sm_count,
)
from triton_kernels.merge import merge_states_launch

# ----------------------------------------------------------------------------- kernels


@triton.jit
def _attend_range(
    acc,  # [BLOCK_M, BLOCK_D] fp32 running un-normalised output
    m_i,  # [BLOCK_M] fp32 running max of base-2 logits
    l_i,  # [BLOCK_M] fp32 running sum of exp2(logit - m_i)
    q,  # [BLOCK_M, BLOCK_D] query tile in COMPUTE dtype
    k_base,  # pointer to key token 0 of this (slot, KV head)
    v_base,
    stride_kt,
    stride_vt,
    lo,  # first key token (inclusive)
    hi,  # last key token (exclusive); hi <= lo means no keys
    qk_scale,  # sm_scale * log2(e)
    HEAD_DIM: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    COMPUTE: tl.constexpr,
    DOT_PREC: tl.constexpr,
):
    offs_n = tl.arange(0, BLOCK_N)  # [BLOCK_N]
    offs_d = tl.arange(0, BLOCK_D)  # [BLOCK_D]
    d_ok = offs_d < HEAD_DIM  # all-true (folded away) when D is a power of two
    k_ptrs = k_base + (lo + offs_n)[:, None] * stride_kt + offs_d[None, :]  # [BLOCK_N, BLOCK_D]
    v_ptrs = v_base + (lo + offs_n)[:, None] * stride_vt + offs_d[None, :]  # [BLOCK_N, BLOCK_D]
    for start in tl.range(lo, hi, BLOCK_N):
        n_ok = (start + offs_n) < hi  # [BLOCK_N]; every block holds >= 1 valid key
        kv_mask = n_ok[:, None] & d_ok[None, :]  # [BLOCK_N, BLOCK_D]
        k = tl.load(k_ptrs, mask=kv_mask, other=0.0).to(COMPUTE)  # [BLOCK_N, BLOCK_D]
        s = tl.dot(q, tl.trans(k), input_precision=DOT_PREC) * qk_scale  # [BLOCK_M, BLOCK_N] base-2 logits
        s = tl.where(n_ok[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))  # [BLOCK_M], finite: the block has a valid key
        alpha = tl.exp2(m_i - m_new)  # [BLOCK_M]; exp2(-inf) = 0 on the first block
        p = tl.exp2(s - m_new[:, None])  # [BLOCK_M, BLOCK_N]
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(v_ptrs, mask=kv_mask, other=0.0).to(COMPUTE)  # [BLOCK_N, BLOCK_D]
        acc = acc * alpha[:, None] + tl.dot(p.to(COMPUTE), v, input_precision=DOT_PREC)  # [BLOCK_M, BLOCK_D]
        m_i = m_new
        k_ptrs += BLOCK_N * stride_kt
        v_ptrs += BLOCK_N * stride_vt
    return acc, m_i, l_i


@triton.jit
def _split_s_partial_kernel(
    q_ptr,  # [B, M, Hq, D]
    kp_ptr,  # [P, T, Hkv, D] key pool
    vp_ptr,  # [P, T, Hkv, D] value pool
    kl_ptr,  # [B, M, Hkv, D] live keys (the pool again when there are none: never read)
    vl_ptr,
    slots_ptr,  # [B, S] int
    lens_ptr,  # [B, S] int
    o_ptr,  # [NP, B, M, Hq, D] partial outputs (fp32, or the final dtype when NP == 1)
    lse_ptr,  # [NP, B, M, Hq] fp32 partial LSEs, natural log
    M,
    S,
    n_seg_parts,  # partials that read segments; partial n_seg_parts is the live block
    qk_scale,
    stride_qb, stride_qm, stride_qh,
    stride_kp, stride_kt, stride_kh,
    stride_vp, stride_vt, stride_vh,
    stride_klb, stride_klm, stride_klh,
    stride_vlb, stride_vlm, stride_vlh,
    stride_sb, stride_ss,
    stride_nb, stride_ns,
    stride_op, stride_ob, stride_om, stride_oh,
    stride_xp, stride_xb, stride_xm, stride_xh,
    GROUP: tl.constexpr,  # G = Hq // Hkv
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,  # packed (token, head) rows per tile
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    SPLIT_LEN: tl.constexpr,  # tokens of one segment per partial (multiple of BLOCK_N)
    N_SPLITS: tl.constexpr,  # cdiv(T, SPLIT_LEN)
    SEGS_PER_PROG: tl.constexpr,  # consecutive segments per partial (1 when N_SPLITS > 1)
    COMPUTE: tl.constexpr,
    DOT_PREC: tl.constexpr,
):  # fmt: skip
    pid_mh = tl.program_id(0)  # query tile fastest: tiles of one KV head share K/V in L2
    part = tl.program_id(1)
    b = tl.program_id(2)
    n_mtiles = tl.cdiv(M * GROUP, BLOCK_M)
    h = pid_mh // n_mtiles
    mt = pid_mh % n_mtiles

    rows = mt * BLOCK_M + tl.arange(0, BLOCK_M)  # [BLOCK_M] packed (token, head-in-group)
    row_ok = rows < M * GROUP
    m_idx = rows // GROUP  # [BLOCK_M] query token
    hq = h * GROUP + rows % GROUP  # [BLOCK_M] query head
    offs_d = tl.arange(0, BLOCK_D)  # [BLOCK_D]
    qd_mask = row_ok[:, None] & (offs_d[None, :] < HEAD_DIM)  # [BLOCK_M, BLOCK_D]
    q_ptrs = q_ptr + b * stride_qb + m_idx[:, None] * stride_qm + hq[:, None] * stride_qh + offs_d[None, :]
    q = tl.load(q_ptrs, mask=qd_mask, other=0.0).to(COMPUTE)  # [BLOCK_M, BLOCK_D]; padded rows are 0

    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)  # [BLOCK_M, BLOCK_D]
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)  # [BLOCK_M]
    l_i = tl.zeros([BLOCK_M], tl.float32)  # [BLOCK_M]

    # One inlined copy of the key loop serves both kinds of partial: a second copy (an
    # if/else around two calls) would double the shared memory of its software pipeline.
    is_live = part >= n_seg_parts  # the last partial reads the live block, as one "segment"
    seg0 = (part // N_SPLITS) * SEGS_PER_PROG
    lo_seg = (part % N_SPLITS) * SPLIT_LEN
    for j in range(SEGS_PER_PROG):
        seg = seg0 + j
        in_table = (seg < S) & (part < n_seg_parts)
        slot = tl.load(slots_ptr + b * stride_sb + seg * stride_ss, mask=in_table, other=-1)
        n_valid = tl.load(lens_ptr + b * stride_nb + seg * stride_ns, mask=in_table, other=0)
        n_valid = tl.where(slot >= 0, n_valid, 0)  # slot -1: no segment, whatever its length says
        slot64 = tl.maximum(slot, 0).to(tl.int64)  # 64-bit: P * T * Hkv * D may exceed 2**31
        k_base = kp_ptr + slot64 * stride_kp + h * stride_kh
        v_base = vp_ptr + slot64 * stride_vp + h * stride_vh
        s_kt = stride_kt
        s_vt = stride_vt
        if is_live:
            k_base = kl_ptr + b.to(tl.int64) * stride_klb + h * stride_klh
            v_base = vl_ptr + b.to(tl.int64) * stride_vlb + h * stride_vlh
            s_kt = stride_klm
            s_vt = stride_vlm
        lo = tl.where(is_live, 0, lo_seg)
        hi = tl.where(is_live, tl.where(j == 0, M, 0), tl.minimum(n_valid, lo_seg + SPLIT_LEN)).to(tl.int32)
        acc, m_i, l_i = _attend_range(
            acc, m_i, l_i, q, k_base, v_base, s_kt, s_vt, lo, hi, qk_scale,
            HEAD_DIM, BLOCK_N, BLOCK_D, COMPUTE, DOT_PREC,
        )  # fmt: skip

    # No keys (empty segment / split past the end): l_i = 0 -> o = 0, lse = -inf, no NaN.
    live = l_i > 0
    l_safe = tl.where(live, l_i, 1.0)
    out = acc / l_safe[:, None]  # [BLOCK_M, BLOCK_D]
    lse = tl.where(live, (m_i + tl.log2(l_safe)) * LN2, float("-inf"))  # [BLOCK_M] natural log

    part64 = part.to(tl.int64)
    o_ptrs = (
        o_ptr + part64 * stride_op + b * stride_ob + m_idx[:, None] * stride_om + hq[:, None] * stride_oh
        + offs_d[None, :]
    )  # fmt: skip
    tl.store(o_ptrs, out.to(o_ptr.dtype.element_ty), mask=qd_mask)
    x_ptrs = lse_ptr + part64 * stride_xp + b * stride_xb + m_idx * stride_xm + hq * stride_xh
    tl.store(x_ptrs, lse, mask=row_ok)


# ----------------------------------------------------------------------------- launcher


def plan_partials(b, m, g, hkv, s, t, has_live, block_m, block_n, device, split_len=None, segs_per_prog=None):
    """Choose how segments map to partials; returns (split_len, n_splits, segs_per_prog, n_seg_parts).

    Default on CUDA: aim for ~4 programs per SM. Too few programs (few long
    segments, small M) -> split each segment into ``n_splits`` pieces; far more
    partials than needed (many segments, large M) -> let one program walk
    ``segs_per_prog`` consecutive segments, which shrinks the fp32 partial buffer
    that phase 2 reads back. Elsewhere: one partial per segment (the plain Split-S grid).
    """
    n_tok_blocks = max(1, triton.cdiv(t, block_n))
    if s == 0:
        return n_tok_blocks * block_n, 1, 1, 0
    if split_len is None and segs_per_prog is None and device.type == "cuda":
        tiles = b * hkv * triton.cdiv(m * g, block_m)
        want = triton.cdiv(4 * sm_count(device), max(tiles, 1))  # partials per (row, tile, head)
        if want > s + int(has_live):
            split_len = triton.cdiv(n_tok_blocks, min(triton.cdiv(want, s), n_tok_blocks)) * block_n
        elif s >= 2 * want:
            segs_per_prog = s // want
    if split_len is None:
        split_len = n_tok_blocks * block_n
    if split_len <= 0 or split_len % block_n:
        raise ValueError(f"split_len must be a positive multiple of BLOCK_N={block_n}, got {split_len}")
    n_splits = triton.cdiv(max(t, 1), split_len)
    segs_per_prog = 1 if segs_per_prog is None else int(segs_per_prog)
    if segs_per_prog < 1 or (segs_per_prog > 1 and n_splits > 1):
        raise ValueError("segs_per_prog must be >= 1, and 1 when segments are split")
    n_seg_parts = triton.cdiv(s, segs_per_prog) * n_splits
    return split_len, n_splits, segs_per_prog, n_seg_parts


def split_s_launch(
    q, k_pool, v_pool, seg_slots, seg_lens, k_live, v_live, sm_scale, *,
    block_m=None, block_n=None, split_len=None, segs_per_prog=None,
):  # fmt: skip
    """Run phase 1 (+ phase 2 when there is more than one partial) on validated inputs.

    Shapes as in :func:`split_s_attention`; ``sm_scale`` is a float. The keyword
    arguments override the tile sizes and the partial plan (tests use them to
    force splits and multi-segment partials on small shapes).
    Returns ``(out [B, M, Hq, D] q.dtype, lse [B, M, Hq] fp32)``.
    """
    require_runnable(_split_s_partial_kernel, q.device, "split_s_attention")
    bsz, m, hq, d = q.shape
    p_slots, t, hkv, _ = k_pool.shape
    s = seg_slots.shape[1]
    g = hq // hkv
    has_live = k_live is not None
    out = alloc((bsz, m, hq, d), q.dtype, q.device)
    lse = alloc((bsz, m, hq), torch.float32, q.device)
    if out.numel() == 0:
        return out, lse

    block_d = next_pow2(d)
    if block_m is None:
        block_m = min(64, max(16, next_pow2(m * g)))
    if block_n is None:
        block_n = 64 if block_d <= 128 else 32
    split_len, n_splits, spp, n_seg_parts = plan_partials(
        bsz, m, g, hkv, s, t, has_live, block_m, block_n, q.device, split_len, segs_per_prog
    )
    n_parts = n_seg_parts + int(has_live)
    if n_parts == 0:  # no segment columns and no live block: nothing to attend to
        out.zero_()
        lse.fill_(float("-inf"))
        return out, lse

    if n_parts == 1:  # a single partial is already the answer: skip phase 2
        o_part, lse_part = out.unsqueeze(0), lse.unsqueeze(0)
    else:
        o_part = alloc((n_parts, bsz, m, hq, d), torch.float32, q.device)
        lse_part = alloc((n_parts, bsz, m, hq), torch.float32, q.device)

    kl = k_live if has_live else k_pool
    vl = v_live if has_live else v_pool
    comp = compute_dtype(_split_s_partial_kernel, q.dtype)
    grid = (hkv * triton.cdiv(m * g, block_m), n_parts, bsz)
    _split_s_partial_kernel[grid](
        q, k_pool, v_pool, kl, vl, seg_slots, seg_lens, o_part, lse_part,
        m, s, n_seg_parts, float(sm_scale) * LOG2E,
        q.stride(0), q.stride(1), q.stride(2),
        k_pool.stride(0), k_pool.stride(1), k_pool.stride(2),
        v_pool.stride(0), v_pool.stride(1), v_pool.stride(2),
        kl.stride(0), kl.stride(1), kl.stride(2),
        vl.stride(0), vl.stride(1), vl.stride(2),
        seg_slots.stride(0), seg_slots.stride(1),
        seg_lens.stride(0), seg_lens.stride(1),
        o_part.stride(0), o_part.stride(1), o_part.stride(2), o_part.stride(3),
        lse_part.stride(0), lse_part.stride(1), lse_part.stride(2), lse_part.stride(3),
        GROUP=g, HEAD_DIM=d, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_D=block_d,
        SPLIT_LEN=split_len, N_SPLITS=n_splits, SEGS_PER_PROG=spp,
        COMPUTE=comp, DOT_PREC="ieee" if comp == tl.float32 else "tf32",
        num_warps=4 if block_m * block_d <= 64 * 128 else 8,
        num_stages=2 if q.element_size() <= 2 else 1,
    )  # fmt: skip
    if n_parts == 1:
        return out, lse
    merged, merged_lse = merge_states_launch(
        o_part.view(n_parts, bsz * m * hq, d), lse_part.view(n_parts, bsz * m * hq), out_dtype=q.dtype
    )
    return merged.view(bsz, m, hq, d), merged_lse.view(bsz, m, hq)


def _validate(q, k_pool, v_pool, seg_slots, seg_lens, k_live, v_live, sm_scale) -> None:
    op = "split_s_attention"
    V.check_ndim(op, "q", q, 4, "[B, M, Hq, D]")
    V.check_ndim(op, "k_pool", k_pool, 4, "[P, T, Hkv, D]")
    V.check_ndim(op, "v_pool", v_pool, 4, "[P, T, Hkv, D]")
    if (k_live is None) != (v_live is None):
        raise ValueError(f"{op}: pass both k_live and v_live, or neither")
    V.check_float(op, q=q, k_pool=k_pool, v_pool=v_pool, k_live=k_live, v_live=v_live)
    bsz, m, hq, d = q.shape
    p_slots, t, hkv, dk = k_pool.shape
    if dk != d:
        raise ValueError(f"{op}: head_dim mismatch: q has D={d} but k_pool has D={dk}")
    V.check_shape(op, "v_pool", v_pool, k_pool.shape, "k_pool.shape [P, T, Hkv, D]")
    V.check_gqa(op, hq, hkv)
    V.check_ndim(op, "seg_slots", seg_slots, 2, "[B, S]")
    V.check_index_tensor(op, "seg_slots", seg_slots, (bsz, seg_slots.shape[1]), "[B, S] with B = q.shape[0]")
    V.check_index_tensor(op, "seg_lens", seg_lens, tuple(seg_slots.shape), "seg_slots.shape [B, S]")
    if seg_lens.dtype != seg_slots.dtype:
        raise TypeError(f"{op}: seg_slots ({seg_slots.dtype}) and seg_lens ({seg_lens.dtype}) must share a dtype")
    if k_live is not None:
        V.check_ndim(op, "k_live", k_live, 4, "[B, M, Hkv, D]")
        V.check_shape(op, "k_live", k_live, (bsz, m, hkv, d), "[B, M, Hkv, D]")
        V.check_shape(op, "v_live", v_live, (bsz, m, hkv, d), "[B, M, Hkv, D]")
    V.check_device(
        op,
        q=q,
        k_pool=k_pool,
        v_pool=v_pool,
        seg_slots=seg_slots,
        seg_lens=seg_lens,
        k_live=k_live,
        v_live=v_live,
    )
    V.check_last_dim_contiguous(op, q=q, k_pool=k_pool, v_pool=v_pool, k_live=k_live, v_live=v_live)
    V.check_scale(op, sm_scale)
    # Offsets inside one slot are 32-bit in the kernel (the slot offset itself is 64-bit).
    if t * max(abs(k_pool.stride(1)), abs(v_pool.stride(1)), 1) >= 2**31:
        raise ValueError(f"{op}: one slot of k_pool/v_pool spans >= 2**31 elements; use smaller slots")


# ----------------------------------------------------------------------------- public op


@torch.library.custom_op("prefilling_dllm::split_s_attention", mutates_args=())
def _split_s_op(
    q: torch.Tensor,
    k_pool: torch.Tensor,
    v_pool: torch.Tensor,
    seg_slots: torch.Tensor,
    seg_lens: torch.Tensor,
    k_live: torch.Tensor | None,
    v_live: torch.Tensor | None,
    sm_scale: float,
    backend: str,
) -> tuple[torch.Tensor, torch.Tensor]:
    if check_values_enabled():
        V.check_segment_table_values("split_s_attention", seg_slots, seg_lens, k_pool.shape[0], k_pool.shape[1])
    if backend == "torch":
        return _ref.split_s_attention(q, k_pool, v_pool, seg_slots, seg_lens, k_live, v_live, sm_scale=sm_scale)
    return split_s_launch(q, k_pool, v_pool, seg_slots, seg_lens, k_live, v_live, sm_scale)


@_split_s_op.register_fake
def _(q, k_pool, v_pool, seg_slots, seg_lens, k_live, v_live, sm_scale, backend):
    return q.new_empty(q.shape), q.new_empty(q.shape[:-1], dtype=torch.float32)


def split_s_attention(
    q: torch.Tensor,
    k_pool: torch.Tensor,
    v_pool: torch.Tensor,
    seg_slots: torch.Tensor,
    seg_lens: torch.Tensor,
    k_live: torch.Tensor | None = None,
    v_live: torch.Tensor | None = None,
    *,
    sm_scale: float | None = None,
    backend: str | None = None,
):
    """Bidirectional attention of the live block over static segments plus its own K/V.

    Every query of batch row ``b`` sees every valid key of that row's segments
    (``k_pool[seg_slots[b, s], :seg_lens[b, s]]`` for each ``s`` with a slot >= 0)
    and, if given, all ``M`` live keys ``k_live[b]``. No causal mask.

    Args:
        q: ``[B, M, Hq, D]`` live-block queries (RoPE applied), fp32/fp16/bf16.
        k_pool, v_pool: ``[P, T, Hkv, D]`` static segment keys/values, same dtype as q.
        seg_slots: ``[B, S]`` int32 (or int64) slot of each segment per row; ``-1`` = none.
        seg_lens: ``[B, S]`` same dtype, valid tokens ``0..T`` of that segment (0 allowed).
        k_live, v_live: ``[B, M, Hkv, D]`` the live block's own K/V (all valid), or None.
        sm_scale: softmax scale, default ``1/sqrt(D)``.
        backend: ``"triton"``, ``"torch"`` or None (auto; see :mod:`triton_kernels._dispatch`).

    Only the last dim of q/k/v must be contiguous; other strides are free
    (e.g. K/V views of a fused QKV projection). ``Hq = G * Hkv`` with any G.

    Returns:
        ``(out [B, M, Hq, D] in q.dtype, lse [B, M, Hq] fp32, natural log)``. A row
        with no valid key at all gets ``out = 0`` and ``lse = -inf`` (never NaN).

    Raises:
        TypeError: dtype not fp32/fp16/bf16 or q/k/v dtypes differ; segment tables
            not int32/int64 or of different dtypes; sm_scale not a number.
        ValueError: wrong ranks or shapes, device mismatch, ``Hq % Hkv != 0``,
            unsupported D for the Triton kernels (a multiple of 16 in 16..256), last dim not contiguous,
            only one of k_live/v_live, slot outside ``[-1, P)``, length outside ``[0, T]``.
        RuntimeError: ``backend="triton"`` on CPU without ``TRITON_INTERPRET=1``.

    Algorithm: Prefilling-dLLM Split-S attention (per-segment programs + LSE
    merge); FlashAttention-2 online softmax in base 2; flash-decoding split-K for
    long segments; FlashInfer merge_states math. Partials are fp32.
    """
    _validate(q, k_pool, v_pool, seg_slots, seg_lens, k_live, v_live, sm_scale)
    backend = resolve_backend(backend, q.device)
    if backend == "triton":  # the torch reference takes any D
        V.check_head_dim("split_s_attention", q.shape[-1])
    scale = 1.0 / math.sqrt(q.shape[-1]) if sm_scale is None else float(sm_scale)
    return _split_s_op(q, k_pool, v_pool, seg_slots, seg_lens, k_live, v_live, scale, backend)
