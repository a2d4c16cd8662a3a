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

from triton_kernels import _dispatch, _launch
from triton_kernels import _validate as V
from triton_kernels import merge as _merge
from triton_kernels import plan as _plan
from triton_kernels import reference as _ref
from triton_kernels._constants import LN2, LOG2E
from triton_kernels._dispatch import ERR_LIVE_LEN, ERR_SEG_LEN, ERR_SEG_SLOT, call_op, require_runnable
from triton_kernels._launch import PreparedLaunch
from triton_kernels.merge import merge_prepared
from triton_kernels.plan import gpu_spec, plan_split_s
from triton_kernels.split_s_cpu import split_s_attention_cpu

# ----------------------------------------------------------------------------- kernels


@triton.jit
def _attend_range(
    acc,  # [BLOCK_M, BLOCK_D] fp32 running un-normalised output
    m_i,  # [BLOCK_M] fp32 running max of base-2 logits
    l_i,  # [BLOCK_M] fp32 running sum of exp2(logit - m_i)
    q,  # [BLOCK_M, BLOCK_D] query tile in COMPUTE dtype
    k_base,  # pointer to key token 0 of this (slot, KV head)
    v_base,
    stride_kt,  # int64 token strides
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
    tok = (lo + offs_n).to(tl.int64)  # [BLOCK_N] 64-bit: token * stride may pass 2**31
    k_ptrs = k_base + tok[:, None] * stride_kt + offs_d[None, :]  # [BLOCK_N, BLOCK_D]
    v_ptrs = v_base + tok[:, None] * stride_vt + offs_d[None, :]  # [BLOCK_N, BLOCK_D]
    for start in tl.range(lo, hi, BLOCK_N):
        n_ok = (start + offs_n) < hi  # [BLOCK_N]; every block holds >= 1 valid key
        kv_mask = n_ok[:, None] & d_ok[None, :]  # [BLOCK_N, BLOCK_D]
        k = tl.load(k_ptrs, mask=kv_mask, other=0.0).to(COMPUTE)  # [BLOCK_N, BLOCK_D]
        s = tl.dot(q, tl.trans(k), input_precision=DOT_PREC) * qk_scale  # [BLOCK_M, BLOCK_N] base-2 logits
        # A valid key's -inf logit becomes NaN (NaN and +inf already end in NaN through the max
        # subtraction): a non-finite logit makes the row NaN whichever partial holds it.
        s = tl.where(n_ok[None, :], tl.where(s == float("-inf"), float("nan"), s), float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))  # [BLOCK_M], finite unless a logit is not
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
    kl_ptr,  # [B, M, Hkv, D] live keys (the pool again when HAS_LIVE = 0: never read)
    vl_ptr,
    slots_ptr,  # [B, S] int
    lens_ptr,  # [B, S] int
    live_lens_ptr,  # [B] int valid live tokens per row (read only when HAS_LIVE_LENS)
    o_ptr,  # [NP, B, M, Hq, D] partial outputs (fp32, or the final dtype when NP == 1)
    lse_ptr,  # [NP, B, M, Hq] fp32 partial LSEs, natural log
    err_ptr,  # [1] int32 device error word (triton_kernels.check_errors): bits OR-ed in on a bad index
    M,
    S,
    P,  # slots in the pool: a slot outside [-1, P) reads nothing (bounds guard)
    T,  # tokens per slot: a length outside [0, T] reads nothing
    split_len,  # tokens of one segment per partial (multiple of BLOCK_N)
    n_splits,  # pieces per segment
    segs_per_prog,  # consecutive segments per partial (1 when split, 0 without segments)
    n_parts,  # partials per (row, tile); the last one also reads the live block
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
    HAS_LIVE: tl.constexpr,  # 1: live keys k_live/v_live are attended, 0: none
    HAS_LIVE_LENS: tl.constexpr,
    BLOCK_M: tl.constexpr,  # packed (token, head) rows per tile
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    COMPUTE: tl.constexpr,
    DOT_PREC: tl.constexpr,
):  # fmt: skip
    pid_mh = tl.program_id(0)  # query tile fastest: tiles of one KV head share K/V in L2
    part = tl.program_id(1)
    b = tl.program_id(2).to(tl.int64)  # 64-bit from here on: b * stride_qb may pass 2**31
    n_mtiles = tl.cdiv(M * GROUP, BLOCK_M)
    h = (pid_mh // n_mtiles).to(tl.int64)
    mt = pid_mh % n_mtiles
    n_live = M  # real query rows (and live keys) of this batch row; the rest is padding
    bad_live = n_live < 0  # bounds guard: a live length outside [0, M] ...
    if HAS_LIVE_LENS:
        n_live = tl.load(live_lens_ptr + b).to(tl.int32)
        bad_live = (n_live < 0) | (n_live > M)
        if bad_live:
            tl.atomic_or(err_ptr, 4)  # ERR_LIVE_LEN of triton_kernels._dispatch
        n_live = tl.where(bad_live, M, n_live)  # ... reads only the M rows that exist; NaN rows below

    rows = mt * BLOCK_M + tl.arange(0, BLOCK_M)  # [BLOCK_M] packed (token, head-in-group)
    row_in = rows < M * GROUP  # rows of the output tensor
    row_ok = rows < n_live * GROUP  # real query rows
    tile_live = mt * BLOCK_M < n_live * GROUP  # a tile of padding rows attends nothing
    m_idx = (rows // GROUP).to(tl.int64)  # [BLOCK_M] query token
    hq = h * GROUP + rows % GROUP  # [BLOCK_M] query head (int64)
    offs_d = tl.arange(0, BLOCK_D)  # [BLOCK_D]
    d_ok = offs_d[None, :] < HEAD_DIM
    q_ptrs = q_ptr + b * stride_qb + m_idx[:, None] * stride_qm + hq[:, None] * stride_qh + offs_d[None, :]
    q = tl.load(q_ptrs, mask=row_ok[:, None] & d_ok, other=0.0).to(COMPUTE)  # [BLOCK_M, BLOCK_D]

    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)  # [BLOCK_M, BLOCK_D]
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)  # [BLOCK_M]
    l_i = tl.where(bad_live, float("nan"), tl.zeros([BLOCK_M], tl.float32))  # [BLOCK_M]; NaN: NaN rows

    # One inlined copy of the key loop serves segments and the live block: a second copy (an
    # if/else around two calls) would double the shared memory of its software pipeline.
    # Iterations 0..segs_per_prog-1 read segments; iteration segs_per_prog (HAS_LIVE) reads the
    # live block, in the last partial only.
    seg0 = (part // n_splits) * segs_per_prog
    lo_seg = (part % n_splits) * split_len
    live_hi = tl.where(part == n_parts - 1, n_live, 0)
    for j in range(segs_per_prog + HAS_LIVE):
        is_live = j == segs_per_prog
        seg = seg0 + j
        in_table = (seg < S) & (j < segs_per_prog)
        slot = tl.load(slots_ptr + b * stride_sb + seg * stride_ss, mask=in_table, other=-1)
        n_valid = tl.load(lens_ptr + b * stride_nb + seg * stride_ns, mask=in_table, other=0)
        # Bounds guard: a slot outside [-1, P) or a length outside [0, T] reads no key; the row is
        # NaN (l_i below) and the error word says why (no host read of the table on CUDA).
        bad_slot = (slot < -1) | (slot >= P)
        bad_len = (n_valid < 0) | (n_valid > T)
        bad = bad_slot | bad_len
        if bad:
            tl.atomic_or(err_ptr, tl.where(bad_slot, 1, 0) | tl.where(bad_len, 2, 0))  # ERR_SEG_SLOT/LEN
        n_valid = tl.where((slot >= 0) & ~bad, n_valid, 0)  # slot -1: no segment
        slot64 = tl.where(bad, 0, tl.maximum(slot, 0)).to(tl.int64)
        k_base = kp_ptr + slot64 * stride_kp + h * stride_kh
        v_base = vp_ptr + slot64 * stride_vp + h * stride_vh
        s_kt = stride_kt + tl.zeros([], tl.int64)  # int64 in both branches (scf.if needs one type)
        s_vt = stride_vt + tl.zeros([], tl.int64)
        if is_live:
            k_base = kl_ptr + b * stride_klb + h * stride_klh
            v_base = vl_ptr + b * stride_vlb + h * stride_vlh
            s_kt = stride_klm + tl.zeros([], tl.int64)
            s_vt = stride_vlm + tl.zeros([], tl.int64)
        lo = tl.where(is_live, 0, lo_seg)
        hi = tl.where(is_live, live_hi, tl.minimum(n_valid, lo_seg + split_len)).to(tl.int32)
        hi = tl.where(tile_live, hi, lo)
        acc, m_i, l_i = _attend_range(
            acc, m_i, l_i, q, k_base, v_base, s_kt, s_vt, lo, hi, qk_scale,
            HEAD_DIM, BLOCK_N, BLOCK_D, COMPUTE, DOT_PREC,
        )  # fmt: skip
        l_i = tl.where(bad, float("nan"), l_i)  # a NaN sum stays NaN: out and lse of the row are NaN

    # No keys (empty segment / split past the end) or a padding row: o = 0, lse = -inf. A row with
    # keys has l_i >= 1, or NaN after a non-finite logit: that NaN reaches o and lse.
    live = (l_i != 0) & row_ok
    l_safe = tl.where(live, l_i, 1.0)
    out = tl.where(live[:, None], acc / l_safe[:, None], 0.0)  # [BLOCK_M, BLOCK_D]
    lse = tl.where(live, (m_i + tl.log2(l_safe)) * LN2, float("-inf"))  # [BLOCK_M] natural log

    part64 = part.to(tl.int64)
    o_ptrs = (
        o_ptr + part64 * stride_op + b * stride_ob + m_idx[:, None] * stride_om + hq[:, None] * stride_oh
        + offs_d[None, :]
    )  # fmt: skip
    tl.store(o_ptrs, out.to(o_ptr.dtype.element_ty), mask=row_in[:, None] & d_ok)
    x_ptrs = lse_ptr + part64 * stride_xp + b * stride_xb + m_idx * stride_xm + hq * stride_xh
    tl.store(x_ptrs, lse, mask=row_in)


# ----------------------------------------------------------------------------- launcher


class _SplitSCall:
    """A prepared split-S call (:func:`_prepare`): all a call with this metadata needs but its pointers."""

    __slots__ = ("out", "lse", "o_part", "lse_part", "phase1", "merge", "native", "err", "device_type")


def _prepare(
    q, k_pool, v_pool, seg_slots, seg_lens, k_live, v_live, sm_scale, live_lens=None,
    block_m=None, block_n=None, split_len=None, segs_per_prog=None,
):  # fmt: skip
    """The :class:`_SplitSCall` of these inputs (reads their metadata only), or None when the call
    launches nothing (an empty output, or no key to attend to)."""
    bsz, m, hq, d = q.shape
    t, hkv = k_pool.shape[1], k_pool.shape[2]
    s = seg_slots.shape[1]
    has_live = k_live is not None
    plan = plan_split_s(
        bsz, m, hq, hkv, d, s, t, has_live, q.element_size(), gpu_spec(q.device),
        block_m, block_n, split_len, segs_per_prog,
    )  # fmt: skip
    n_parts = plan.n_parts
    if n_parts == 0 or q.numel() == 0:
        return None
    call = _SplitSCall()
    call.out = _dispatch.out_spec((bsz, m, hq, d), q.dtype, q.device)
    call.lse = _dispatch.out_spec((bsz, m, hq), torch.float32, q.device)
    if n_parts == 1:  # a single partial is already the answer: phase 1 writes the outputs, no merge
        call.o_part = call.lse_part = call.merge = None
        so, sx = (0, *call.out[1]), (0, *call.lse[1])  # partial 0 is the output (its stride is never used)
    else:
        call.o_part = _dispatch.out_spec((n_parts, bsz, m, hq, d), torch.float32, q.device)
        call.lse_part = _dispatch.out_spec((n_parts, bsz, m, hq), torch.float32, q.device)
        so, sx = call.o_part[1], call.lse_part[1]
        # the partial buffers are contiguous: rows of (b, m, h) flatten to strides d (o) and 1 (lse)
        call.merge = merge_prepared(n_parts, bsz * m * hq, d, so[0], d, sx[0], 1, plan.merge)
    kl = k_live if has_live else k_pool
    vl = v_live if has_live else v_pool
    tiles = _dispatch.dot_tiles(_split_s_partial_kernel, q.dtype, plan.block_m, plan.block_n, plan.block_d)
    strides = (*q.stride()[:3], *k_pool.stride()[:3], *v_pool.stride()[:3], *kl.stride()[:3], *vl.stride()[:3])
    strides += (*seg_slots.stride(), *seg_lens.stride(), *so[:4], *sx)
    # the kernel's signature order after its 11 pointers (triton_kernels._launch.launch)
    tail = (m, s, k_pool.shape[0], t, plan.split_len, plan.n_splits, plan.segs_per_prog, n_parts)
    tail += (float(sm_scale) * LOG2E.value, *strides, hq // hkv, d, int(has_live), live_lens is not None, *tiles)
    call.phase1 = PreparedLaunch(_split_s_partial_kernel, plan.grid, tail, plan.num_warps, plan.num_stages)
    call.device_type = q.device.type
    call.native = call.device_type == "cuda"  # else require_runnable per call
    call.err = _dispatch.error_word(q.device)
    return call


def _current(call: _SplitSCall) -> bool:
    """Whether the call launches the modules' kernels of now (the AOT compile gate swaps in stand-ins)."""
    return call.phase1.kernel is _split_s_partial_kernel and (
        call.merge is None or call.merge.kernel is _merge._merge_states_kernel
    )


def _run(call: _SplitSCall, q, k_pool, v_pool, seg_slots, seg_lens, k_live, v_live, live_lens):
    """Run a prepared call on tensors of the metadata it was prepared for: allocate, launch (1 or 2)."""
    if not call.native and _launch._STUB is None:
        require_runnable(_split_s_partial_kernel, q.device, "split_s_attention")
    spec = _dispatch.alloc_spec
    out, lse = spec(call.out), spec(call.lse)
    o_part, lse_part = (out, lse) if call.merge is None else (spec(call.o_part), spec(call.lse_part))
    kl = k_pool if k_live is None else k_live
    vl = v_pool if v_live is None else v_live
    ll = q if live_lens is None else live_lens  # a dummy pointer when HAS_LIVE_LENS is False
    # Triton specialises pointers on 16-byte alignment; the outputs are fresh allocations (aligned).
    ptrs = q.data_ptr() | k_pool.data_ptr() | v_pool.data_ptr() | kl.data_ptr() | vl.data_ptr()
    ptrs |= seg_slots.data_ptr() | seg_lens.data_ptr() | ll.data_ptr()
    call.phase1((q, k_pool, v_pool, kl, vl, seg_slots, seg_lens, ll, o_part, lse_part, call.err), not ptrs & 15)
    if call.merge is not None:
        call.merge((o_part, lse_part, out, lse), True)
    return out, lse


def split_s_launch(
    q, k_pool, v_pool, seg_slots, seg_lens, k_live, v_live, sm_scale, live_lens=None, *,
    block_m=None, block_n=None, split_len=None, segs_per_prog=None,
):  # fmt: skip
    """Run phase 1 (+ the merge when the plan has more than one partial) on validated inputs.

    Shapes as in :func:`split_s_attention`; ``sm_scale`` is a float. The plan comes from
    :func:`triton_kernels.plan.plan_split_s` for the tensors' device (memoised per shape);
    the keyword arguments override it (tests force splits and grouped partials with them).
    Returns ``(out [B, M, Hq, D] q.dtype, lse [B, M, Hq] fp32)``.
    """
    require_runnable(_split_s_partial_kernel, q.device, "split_s_attention")
    call = _prepare(
        q, k_pool, v_pool, seg_slots, seg_lens, k_live, v_live, sm_scale, live_lens,
        block_m, block_n, split_len, segs_per_prog,
    )  # fmt: skip
    if call is not None:
        return _run(call, q, k_pool, v_pool, seg_slots, seg_lens, k_live, v_live, live_lens)
    out = _dispatch.alloc(q.shape, q.dtype, q.device)
    lse = _dispatch.alloc(q.shape[:-1], torch.float32, q.device)
    if out.numel() == 0:
        return out, lse
    return out.zero_(), lse.fill_(float("-inf"))  # no segment columns and no live block: nothing to attend to


SPLIT_S_LAYOUT = "q [B, M, Hq, D], k_pool/v_pool [P, T, Hkv, D], k_live/v_live [B, M, Hkv, D] (token-major)"


def _sdpa_hint(q, k_pool, k_live) -> str:
    """A hint naming the tensor that looks like SDPA's [B, H, M, D] (empty when none does)."""
    hkv = k_pool.shape[2] if k_pool.dim() == 4 else None
    if k_live is not None and k_live.dim() == 4 and q.dim() == 4:
        if k_live.shape[1] == hkv and k_live.shape[2] != hkv:
            return f"k_live {tuple(k_live.shape)} looks like SDPA's [B, Hkv, M, D]: pass k_live.transpose(1, 2)"
        if k_live.shape[1] == q.shape[2] and k_live.shape[1] != q.shape[1]:
            m = k_live.shape[1]
            return f"q {tuple(q.shape)} looks like SDPA's [B, Hq, M, D] (k_live has M={m}): pass q.transpose(1, 2)"
    return V.SDPA_NOTE


def _validate(q, k_pool, v_pool, seg_slots, seg_lens, k_live, v_live, live_lens, sm_scale) -> None:
    """The metadata checks of a call (the arguments of the registered op but ``backend``)."""
    try:
        _validate_shapes(q, k_pool, v_pool, seg_slots, seg_lens, k_live, v_live, live_lens)
    except ValueError as err:
        raise V.with_layout(err, SPLIT_S_LAYOUT, _sdpa_hint(q, k_pool, k_live)) from None
    op = "split_s_attention"
    table = dict(seg_slots=seg_slots, seg_lens=seg_lens)
    V.check_device(op, q=q, k_pool=k_pool, v_pool=v_pool, **table, k_live=k_live, v_live=v_live, live_lens=live_lens)
    V.check_last_dim_contiguous(op, q=q, k_pool=k_pool, v_pool=v_pool, k_live=k_live, v_live=v_live)
    V.check_scale(op, sm_scale)


def _validate_shapes(q, k_pool, v_pool, seg_slots, seg_lens, k_live, v_live, live_lens) -> None:
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
    V.check_head_dim_positive(op, d)
    V.check_shape(op, "v_pool", v_pool, k_pool.shape, "k_pool.shape [P, T, Hkv, D]")
    V.check_gqa(op, hq, hkv)
    V.check_ndim(op, "seg_slots", seg_slots, 2, "[B, S]")
    V.check_index_tensor(op, "seg_slots", seg_slots, (bsz, seg_slots.shape[1]), "[B, S] with B = q.shape[0]")
    V.check_index_tensor(op, "seg_lens", seg_lens, tuple(seg_slots.shape), "seg_slots.shape [B, S]")
    if seg_lens.dtype != seg_slots.dtype:
        raise TypeError(f"{op}: seg_slots ({seg_slots.dtype}) and seg_lens ({seg_lens.dtype}) must share a dtype")
    if k_live is not None:
        V.check_ndim(op, "k_live", k_live, 4, "[B, M, Hkv, D]")
        V.check_shape(op, "k_live", k_live, (bsz, m, hkv, d), "[B, M, Hkv, D] (M = q.shape[1], Hkv = k_pool.shape[2])")
        V.check_shape(op, "v_live", v_live, (bsz, m, hkv, d), "[B, M, Hkv, D] (M = q.shape[1], Hkv = k_pool.shape[2])")
    if live_lens is not None:
        V.check_index_tensor(op, "live_lens", live_lens, (bsz,), "[B] with B = q.shape[0]")


# ----------------------------------------------------------------------------- public op


def _split_s_impl(
    q: torch.Tensor,
    k_pool: torch.Tensor,
    v_pool: torch.Tensor,
    seg_slots: torch.Tensor,
    seg_lens: torch.Tensor,
    k_live: torch.Tensor | None,
    v_live: torch.Tensor | None,
    live_lens: torch.Tensor | None,
    sm_scale: float,
    backend: str,
) -> tuple[torch.Tensor, torch.Tensor]:
    # The torch paths index with the table's values: they are checked first, or guarded as the kernel does.
    p, t = k_pool.shape[0], k_pool.shape[1]
    checked = _dispatch.check_values_enabled(q.device if backend == "triton" else None)
    if checked:
        V.check_segment_table_values("split_s_attention", seg_slots, seg_lens, p, t, live_lens, q.shape[1])
    if backend == "triton":
        return split_s_launch(q, k_pool, v_pool, seg_slots, seg_lens, k_live, v_live, sm_scale, live_lens)
    bad = None
    if not checked:
        seg_slots, seg_lens, live_lens, bad = _guard_table(seg_slots, seg_lens, live_lens, p, t, q.shape[1])
    if q.device.type == "cpu":  # torch fused attention, one call per row shape (same bits alone or batched)
        out, lse = split_s_attention_cpu(q, k_pool, v_pool, seg_slots, seg_lens, k_live, v_live, sm_scale, live_lens)
    else:
        out, lse = _ref.split_s_attention(
            q, k_pool, v_pool, seg_slots, seg_lens, k_live, v_live, sm_scale=sm_scale, live_lens=live_lens
        )
    if bad is not None:
        out = out.masked_fill(bad[:, None, None, None], float("nan"))
        lse = lse.masked_fill(bad[:, None, None], float("nan"))
    return out, lse


def _guard_table(seg_slots, seg_lens, live_lens, p: int, t: int, m: int):
    """The kernel's bounds guard for the torch paths when no host check ran: a batch row holding a slot
    outside ``[-1, P)``, a length outside ``[0, T]`` or a live length outside ``[0, M]`` reads nothing
    (its table entries become empty segments), its ``out``/``lse`` become NaN (``bad [B]`` says which;
    None when no row is bad) and the error word gets the kernel's bits. One host read (the torch paths
    read the table on the host anyway).

    Returns ``(seg_slots, seg_lens, live_lens, bad)``.
    """
    slots_l, lens_l = seg_slots.tolist(), seg_lens.tolist()  # the torch paths read the table on the host anyway
    if (
        all(-1 <= x < p for row in slots_l for x in row)
        and all(0 <= x <= t for row in lens_l for x in row)
        and (live_lens is None or all(0 <= x <= m for x in live_lens.tolist()))
    ):
        return seg_slots, seg_lens, live_lens, None
    bad_slot = (seg_slots < -1) | (seg_slots >= p)
    bad_len = (seg_lens < 0) | (seg_lens > t)
    bad = (bad_slot | bad_len).any(1)
    bad_live = None if live_lens is None else (live_lens < 0) | (live_lens > m)
    if bad_live is not None:
        bad = bad | bad_live
    bits = bad_slot.any().to(torch.int32) * ERR_SEG_SLOT | bad_len.any().to(torch.int32) * ERR_SEG_LEN
    if bad_live is not None:
        bits = bits | bad_live.any().to(torch.int32) * ERR_LIVE_LEN
        live_lens = live_lens.masked_fill(bad, m)
    _dispatch.error_word(seg_slots.device).bitwise_or_(bits)
    seg_slots = seg_slots.masked_fill(bad[:, None], -1)
    seg_lens = seg_lens.masked_fill(bad[:, None], 0)
    return seg_slots, seg_lens, live_lens, bad


def _split_s_fake(q, k_pool, v_pool, seg_slots, seg_lens, k_live, v_live, live_lens, sm_scale, backend):
    return q.new_empty(q.shape), q.new_empty(q.shape[:-1], dtype=torch.float32)


# the registered op; its body runs the metadata checks first (triton_kernels._dispatch.register_op)
_split_s_entry, _split_s_op = _dispatch.register_op("split_s_attention", _split_s_impl, _validate, _split_s_fake)


def split_s_attention(
    q: torch.Tensor,
    k_pool: torch.Tensor,
    v_pool: torch.Tensor,
    seg_slots: torch.Tensor,
    seg_lens: torch.Tensor,
    k_live: torch.Tensor | None = None,
    v_live: torch.Tensor | None = None,
    *,
    live_lens: torch.Tensor | None = None,
    sm_scale: float | None = None,
    backend: str | None = None,
):
    """Bidirectional attention of the live block over static segments plus its own K/V.

    Every query of batch row ``b`` sees every valid key of that row's segments
    (``k_pool[seg_slots[b, s], :seg_lens[b, s]]`` for each ``s`` with a slot >= 0)
    and, if given, the live keys ``k_live[b, :live_lens[b]]``. No causal mask.

    Args:
        q: ``[B, M, Hq, D]`` live-block queries (RoPE applied), fp32/fp16/bf16.
        k_pool, v_pool: ``[P, T, Hkv, D]`` static segment keys/values, same dtype as q.
        seg_slots: ``[B, S]`` int32 (or int64) slot of each segment per row; ``-1`` = none.
        seg_lens: ``[B, S]`` same dtype, valid tokens ``0..T`` of that segment (0 allowed).
        k_live, v_live: ``[B, M, Hkv, D]`` the live block's own K/V, or None.
        live_lens: ``[B]`` int32/int64 real live tokens per row, each in ``0..M``, for a batch of
            ragged live blocks padded to the longest (None: all M). Row ``b``'s live keys past
            ``live_lens[b]`` are masked out for every query, and its padded query rows
            ``m >= live_lens[b]`` get ``out = 0`` and ``lse = -inf``.
        sm_scale: softmax scale, default ``1/sqrt(D)``.
        backend: ``"triton"``, ``"torch"`` or None (auto; see :mod:`triton_kernels._dispatch`).
            ``"torch"`` on CPU tensors runs :func:`triton_kernels.split_s_cpu.split_s_attention_cpu`
            (torch's fused CPU attention, one call for the rows of each shape); elsewhere the naive reference.

    Only the last dim of q/k/v must be contiguous; other strides are free
    (e.g. K/V views of a fused QKV projection), and offsets are 64-bit. ``Hq = G * Hkv`` with any G.

    Returns:
        ``(out [B, M, Hq, D] in q.dtype, lse [B, M, Hq] fp32, natural log)``. A query row
        with no valid key at all gets ``out = 0`` and ``lse = -inf`` (never NaN); a row with keys
        never does. Non-finite inputs, the same on every backend: a non-finite logit (NaN or
        +-inf anywhere in the query row or in a valid key of its KV head, or ``q . k * sm_scale``
        beyond fp32) makes that row's ``out`` and ``lse`` NaN (IEEE for NaN and for
        ``inf - inf`` in the max subtraction; -inf logits too, see :mod:`triton_kernels.reference`);
        NaN/inf in a valid value makes only those ``out`` components non-finite. Values past the
        valid lengths are never read.

    Paging and rounding: the Triton kernel's summation order follows the segment table (one or
    more partials per segment, key blocks restarting at each segment, the running max per
    partial) and the plan, which depends on the shapes (S, T, B, M, ...). The same keys paged
    differently (another slot size, more segments) are therefore not bit-identical: ``out``
    differs by at most ``eps(dtype) * max|v|`` (measured through the interpreter: 0.44 of that in
    fp32, 0.06 in fp16, i.e. 1-2 fp16 ulps; on an H200 in bf16, 1 ulp in 1-7 of 12,288 elements)
    and ``lse`` by a few fp32 ulps (``test_paging_changes_only_rounding`` pins both). The torch
    paths concatenate the valid keys first: the same keys in the same order give the same bits
    whatever the paging.

    Raises:
        TypeError: dtype not fp32/fp16/bf16 or q/k/v dtypes differ; segment tables or live_lens
            not int32/int64, or seg_slots and seg_lens of different dtypes; sm_scale not a number.
        ValueError: sm_scale NaN or infinite; wrong ranks or shapes (every such message states the
            expected layout, and names q or k_live when it looks like SDPA's ``[B, H, M, D]``: caught
            when k_live is given or when ``Hq % Hkv != 0``; a transposed q without live keys whose
            M divides by Hkv cannot be told from a valid call), ``D = 0``, device mismatch, ``Hq % Hkv != 0``,
            unsupported D for the Triton kernels (a multiple of 16 in 16..256), last dim not contiguous,
            only one of k_live/v_live; and, where the host value checks run (CPU, the torch backend,
            the checked mode: see :mod:`triton_kernels._dispatch`), a slot outside ``[-1, P)``, a length
            outside ``[0, T]`` or a live length outside ``[0, M]``. Where they do not (CUDA by
            default, no host sync; any backend inside :func:`triton_kernels.skip_value_checks`),
            nothing is read for such an entry, that batch row's
            ``out`` and ``lse`` are NaN, and :func:`triton_kernels.check_errors` raises later.
        RuntimeError: ``backend="triton"`` on CPU without ``TRITON_INTERPRET=1``.

    Algorithm: Prefilling-dLLM Split-S attention (per-segment programs + LSE
    merge); FlashAttention-2 online softmax in base 2; flash-decoding split-K for
    long segments; FlashInfer merge_states math. Partials are fp32; the partition of
    the keys into partials is planned per shape (:func:`triton_kernels.plan.plan_split_s`).
    """
    backend = _dispatch.resolve_backend(backend, q.device) if isinstance(q, torch.Tensor) else backend
    tensors = (q, k_pool, v_pool, seg_slots, seg_lens, k_live, v_live, live_lens)
    # type(sm_scale): 1 == True == 1.0 as keys, but a bool scale must still raise
    sig = V.signature("split_s_attention", tensors, (sm_scale, type(sm_scale), backend, _plan.assumed_gpu()))
    call = V.recall(sig)
    if call is None or (type(call) is _SplitSCall and not _current(call)):  # metadata checks, memoised per
        # metadata signature with the prepared call (made again when its kernels were swapped)
        _validate(q, k_pool, v_pool, seg_slots, seg_lens, k_live, v_live, live_lens, sm_scale)
        if backend == "triton":  # the torch reference takes any D
            V.check_head_dim("split_s_attention", q.shape[-1])
            if sig is not None:
                scale = 1.0 / math.sqrt(q.shape[-1]) if sm_scale is None else float(sm_scale)
                call = _prepare(q, k_pool, v_pool, seg_slots, seg_lens, k_live, v_live, scale, live_lens)
        V.remember(sig, call)
    if type(call) is _SplitSCall and _dispatch.eager():  # the prepared call: allocate, launch
        if _dispatch.values_checked(call.device_type):
            p, t = k_pool.shape[0], k_pool.shape[1]
            V.check_segment_table_values("split_s_attention", seg_slots, seg_lens, p, t, live_lens, q.shape[1])
        return _run(call, q, k_pool, v_pool, seg_slots, seg_lens, k_live, v_live, live_lens)
    scale = 1.0 / math.sqrt(q.shape[-1]) if sm_scale is None else float(sm_scale)
    args = (q, k_pool, v_pool, seg_slots, seg_lens, k_live, v_live, live_lens, scale, backend)
    return call_op(_split_s_op, _split_s_impl, *args)


def check_segment_table(
    seg_slots: torch.Tensor,
    seg_lens: torch.Tensor,
    num_slots: int,
    slot_len: int,
    live_lens: torch.Tensor | None = None,
    live_capacity: int = 0,
) -> None:
    """Check a segment table's values once, for a cache that then calls the ops without checks.

    One device-to-host sync on CUDA. ``split_s_attention`` checks the same ranges on the host
    on every call where the host checks are on (CPU by default; on CUDA its kernel guards the
    indices instead and :func:`triton_kernels.check_errors` reports a bad one). A KV-cache owner
    calls this when its table changes, then runs its decode loop inside
    :func:`triton_kernels.skip_value_checks`.

    Args:
        seg_slots, seg_lens: ``[B, S]`` int32/int64 tables as for :func:`split_s_attention`.
        num_slots: ``P``, the pool's slot count; slots must be -1 or in ``[0, P)``.
        slot_len: ``T``, tokens per slot; lengths must be in ``[0, T]``.
        live_lens: ``[B]`` live lengths or None; each must be in ``[0, live_capacity]``.
        live_capacity: ``M``, the padded live-block length.

    Raises:
        TypeError / ValueError: as :func:`split_s_attention` for the same tables.
    """
    op = "check_segment_table"
    V.check_ndim(op, "seg_slots", seg_slots, 2, "[B, S]")
    V.check_index_tensor(op, "seg_lens", seg_lens, tuple(seg_slots.shape), "seg_slots.shape [B, S]")
    V.check_index_tensor(op, "seg_slots", seg_slots, tuple(seg_slots.shape), "[B, S]")
    if live_lens is not None:
        V.check_index_tensor(op, "live_lens", live_lens, (seg_slots.shape[0],), "[B]")
    V.check_segment_table_values(op, seg_slots, seg_lens, int(num_slots), int(slot_len), live_lens, int(live_capacity))
