"""Intra-chunk token scores: the attention mass exchanged between chunk tokens and scoring tokens.

Prefilling-dLLM ranks the tokens inside each kept chunk by the attention mass
they exchange with the scoring tokens (query window / pseudo-labels), then keeps
the top-B (:mod:`triton_kernels.topb`). Two directions, one file:

* :func:`chunk_attention_scores` (scoring tokens -> chunk keys): the softmax mass
  each chunk key receives from the ``M`` scoring queries attending over
  (valid chunk keys + extra keys), summed over the queries and the ``G`` query
  heads of its KV group. Two passes so that no ``[M, T]`` probability matrix per
  head ever reaches global memory: pass 1 (``_row_lse_kernel``) computes every
  query row's LSE over all its keys with an online max/sum (split over the keys
  when there are few chunks, :func:`triton_kernels.plan.plan_chunk_scores`);
  pass 2 (``_column_mass_kernel``) combines the split LSEs, recomputes ``Q K^T``
  one key tile at a time and sums ``exp(s - lse_row)`` down the columns.
* :func:`chunk_row_mass` (chunk tokens -> scoring tokens): for every chunk row,
  the mass it sends to the extra keys when attending over (valid chunk keys +
  extra keys) = ``exp(lse_extra - lse_all)``, summed over the G heads
  (``_row_mass_kernel``, one pass, two LSEs per row).

GQA packing as in :mod:`triton_kernels.split_s`: the G query heads of a KV head
are rows of the same tile (row ``r`` = token ``r // G``, head ``h * G + r % G``).

Sources: Prefilling-dLLM (arXiv 2606.10537) intra-chunk token selection;
FlashAttention-2 online softmax (base 2, scale folded into ``sm_scale*log2(e)``);
the recompute-the-scores-from-the-LSE trick of FlashAttention's backward pass.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from triton_kernels import _launch
from triton_kernels import _validate as V
from triton_kernels import plan as _plan
from triton_kernels import reference as _ref
from triton_kernels._constants import LN2, LOG2E
from triton_kernels._dispatch import (
    ERR_CHUNK_LEN,
    alloc,
    alloc_spec,
    call_op,
    check_values_enabled,
    compute_dtype,
    eager,
    error_word,
    out_spec,
    require_runnable,
    resolve_backend,
    values_checked,
)
from triton_kernels._launch import PreparedLaunch
from triton_kernels.plan import attention_tiles, cdiv, gpu_spec, plan_chunk_scores

ERR_LEN = tl.constexpr(ERR_CHUNK_LEN)

# ----------------------------------------------------------------------------- kernels


@triton.jit
def _lse_range(
    m_i,  # [BLOCK_M] fp32 running max of base-2 logits
    l_i,  # [BLOCK_M] fp32 running sum of exp2(logit - m_i)
    q,  # [BLOCK_M, BLOCK_D] query tile, COMPUTE dtype
    k_base,  # pointer to key token 0 of this (chunk, KV head)
    stride_kt,
    lo,  # keys [lo, hi) are read
    hi,
    qk_scale,  # sm_scale * log2(e)
    HEAD_DIM: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    COMPUTE: tl.constexpr,
    DOT_PREC: tl.constexpr,
):
    offs_n = tl.arange(0, BLOCK_N)  # [BLOCK_N]
    offs_d = tl.arange(0, BLOCK_D)  # [BLOCK_D]
    d_ok = offs_d < HEAD_DIM
    tok = (lo + offs_n).to(tl.int64)  # [BLOCK_N] 64-bit: token * stride may pass 2**31
    k_ptrs = k_base + tok[:, None] * stride_kt + offs_d[None, :]  # [BLOCK_N, BLOCK_D]
    step = BLOCK_N * (stride_kt + tl.zeros([], tl.int64))
    for start in tl.range(lo, hi, BLOCK_N):
        n_ok = (start + offs_n) < hi  # [BLOCK_N]
        k = tl.load(k_ptrs, mask=n_ok[:, None] & d_ok[None, :], other=0.0).to(COMPUTE)  # [BLOCK_N, BLOCK_D]
        s = tl.dot(q, tl.trans(k), input_precision=DOT_PREC) * qk_scale  # [BLOCK_M, BLOCK_N]
        # A valid key's -inf logit becomes NaN, as in split_s: a non-finite logit makes the row NaN.
        s = tl.where(n_ok[None, :], tl.where(s == float("-inf"), float("nan"), s), float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))  # [BLOCK_M] finite unless a logit is not
        l_i = l_i * tl.exp2(m_i - m_new) + tl.sum(tl.exp2(s - m_new[:, None]), 1)
        m_i = m_new
        k_ptrs += step
    return m_i, l_i


@triton.jit
def _row_lse_kernel(
    q_ptr,  # [N, M, Hq, D] scoring queries
    k_ptr,  # [N, T, Hkv, D] chunk keys
    x_ptr,  # [N, E, Hkv, D] extra keys (k again when E == 0: never read)
    lens_ptr,  # [N] int valid chunk keys (unused when HAS_LENS is False)
    lse_ptr,  # [NS, N, M, Hq] fp32 out: LSE of each key split, natural log
    err_ptr,  # [1] int32 device error word: ERR_CHUNK_LEN OR-ed in on a lens outside [0, T]
    M,
    T,
    E,
    split_len,  # chunk keys per split; the last split also reads the E extra keys
    n_splits,
    qk_scale,
    stride_qn, stride_qm, stride_qh,
    stride_kn, stride_kt, stride_kh,
    stride_xn, stride_xt, stride_xh,
    stride_ls, stride_ln, stride_lm, stride_lh,
    GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HAS_LENS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    COMPUTE: tl.constexpr,
    DOT_PREC: tl.constexpr,
):  # fmt: skip
    pid_mh = tl.program_id(0)
    split = tl.program_id(1)
    n = tl.program_id(2).to(tl.int64)
    n_mtiles = tl.cdiv(M * GROUP, BLOCK_M)
    h = (pid_mh // n_mtiles).to(tl.int64)
    rows = (pid_mh % n_mtiles) * BLOCK_M + tl.arange(0, BLOCK_M)  # [BLOCK_M] packed (token, head)
    row_ok = rows < M * GROUP
    m_idx = (rows // GROUP).to(tl.int64)
    hq = h * GROUP + rows % GROUP
    offs_d = tl.arange(0, BLOCK_D)  # [BLOCK_D]
    q_ptrs = q_ptr + n * stride_qn + m_idx[:, None] * stride_qm + hq[:, None] * stride_qh + offs_d[None, :]
    q = tl.load(q_ptrs, mask=row_ok[:, None] & (offs_d[None, :] < HEAD_DIM), other=0.0).to(COMPUTE)

    n_chunk = T
    bad = tl.zeros([], tl.int1)  # bounds guard (issue 35.2): a length outside [0, T] reads no key
    if HAS_LENS:
        n_chunk = tl.load(lens_ptr + n).to(tl.int32)
        bad = (n_chunk < 0) | (n_chunk > T)
        n_chunk = tl.where(bad, 0, n_chunk)
    lo = split * split_len
    hi = tl.minimum(n_chunk, lo + split_len)
    e_hi = tl.where(split == n_splits - 1, E, 0)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)  # [BLOCK_M]
    l_i = tl.zeros([BLOCK_M], tl.float32)  # [BLOCK_M]
    m_i, l_i = _lse_range(
        m_i, l_i, q, k_ptr + n * stride_kn + h * stride_kh, stride_kt, lo, hi, qk_scale,
        HEAD_DIM, BLOCK_N, BLOCK_D, COMPUTE, DOT_PREC,
    )  # fmt: skip
    m_i, l_i = _lse_range(
        m_i, l_i, q, x_ptr + n * stride_xn + h * stride_xh, stride_xt, 0, e_hi, qk_scale,
        HEAD_DIM, BLOCK_N, BLOCK_D, COMPUTE, DOT_PREC,
    )  # fmt: skip
    live = l_i != 0  # no keys: l_i = 0; keys: l_i >= 1, or NaN (a non-finite logit), which propagates
    lse = tl.where(live, (m_i + tl.log2(tl.where(live, l_i, 1.0))) * LN2, float("-inf"))  # [BLOCK_M]
    if bad:  # NaN rows (and so NaN mass in pass 2), and the error word says why
        lse = tl.where(row_ok, float("nan"), lse)
        tl.atomic_or(err_ptr, ERR_LEN)
    x_ptrs = lse_ptr + split.to(tl.int64) * stride_ls + n * stride_ln + m_idx * stride_lm + hq * stride_lh
    tl.store(x_ptrs, lse, mask=row_ok)


@triton.jit
def _row_lse2(lse_ptr, stride_ls, offs, row_ok, KEY_SPLITS: tl.constexpr):
    """Base-2 LSE of each row over all its keys, from the KEY_SPLITS LSEs of pass 1 (one pass)."""
    mx = tl.load(lse_ptr + offs, mask=row_ok, other=float("-inf")) * LOG2E  # [BLOCK_M]
    if KEY_SPLITS > 1:
        step = stride_ls + tl.zeros([], tl.int64)
        tot = tl.where(mx == float("-inf"), 0.0, 1.0)  # sum of exp2(lse2_s - mx)
        for s in tl.static_range(1, KEY_SPLITS):
            x = tl.load(lse_ptr + s * step + offs, mask=row_ok, other=float("-inf")) * LOG2E
            m_new = tl.maximum(mx, x)
            shift = tl.where(m_new == float("-inf"), 0.0, m_new)
            tot = tot * tl.exp2(mx - shift) + tl.exp2(x - shift)
            mx = m_new
        # tot = 0: no split had keys; NaN (a NaN split LSE) propagates.
        mx = tl.where(tot != 0, mx + tl.log2(tl.where(tot != 0, tot, 1.0)), float("-inf"))
    return mx


@triton.jit
def _column_mass_kernel(
    q_ptr,  # [N, M, Hq, D] scoring queries
    k_ptr,  # [N, L, Hkv, D] the key set scored by this launch (chunk keys or extra keys)
    lens_ptr,  # [N] int valid keys of the set (unused when HAS_LENS is False: all L valid)
    lse_ptr,  # [NS, N, M, Hq] fp32 row LSEs of pass 1, one per key split
    lse_out_ptr,  # [N, M, Hq] fp32 combined row LSEs (written when WRITE_LSE)
    mass_ptr,  # [N, Hkv, L] fp32 out
    M,
    L,
    qk_scale,
    stride_qn, stride_qm, stride_qh,
    stride_kn, stride_kt, stride_kh,
    stride_ls, stride_ln, stride_lm, stride_lh,
    stride_yn, stride_ym, stride_yh,
    stride_mn, stride_mh, stride_mt,
    GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HAS_LENS: tl.constexpr,
    KEY_SPLITS: tl.constexpr,  # LSE splits of pass 1
    WRITE_LSE: tl.constexpr,  # programs of key tile 0 store the combined LSEs (once per row)
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    COMPUTE: tl.constexpr,
    DOT_PREC: tl.constexpr,
):  # fmt: skip
    pid_t = tl.program_id(0)
    h = tl.program_id(1).to(tl.int64)
    n = tl.program_id(2).to(tl.int64)
    n_valid = L
    bad = tl.zeros([], tl.int1)  # a length outside [0, L] reads no key (pass 1 set the error word)
    if HAS_LENS:
        n_valid = tl.load(lens_ptr + n).to(tl.int32)
        bad = (n_valid < 0) | (n_valid > L)
        n_valid = tl.where(bad, 0, n_valid)
    offs_n = pid_t * BLOCK_N + tl.arange(0, BLOCK_N)  # [BLOCK_N] key positions of this tile
    col_ok = offs_n < n_valid
    offs_d = tl.arange(0, BLOCK_D)  # [BLOCK_D]
    d_ok = offs_d < HEAD_DIM
    mass = tl.zeros([BLOCK_N], tl.float32)  # [BLOCK_N]

    if WRITE_LSE:
        if pid_t == 0:
            for r0 in range(0, M * GROUP, BLOCK_M):
                rows = r0 + tl.arange(0, BLOCK_M)  # [BLOCK_M] packed (token, head)
                row_ok = rows < M * GROUP
                m_idx = (rows // GROUP).to(tl.int64)
                hq = h * GROUP + rows % GROUP
                lse2 = _row_lse2(
                    lse_ptr, stride_ls, n * stride_ln + m_idx * stride_lm + hq * stride_lh, row_ok, KEY_SPLITS
                )
                tl.store(lse_out_ptr + n * stride_yn + m_idx * stride_ym + hq * stride_yh, lse2 * LN2, mask=row_ok)

    if pid_t * BLOCK_N < n_valid:  # tiles past the valid length only write zeros
        tok = offs_n.to(tl.int64)
        k_ptrs = k_ptr + n * stride_kn + h * stride_kh + tok[:, None] * stride_kt + offs_d[None, :]
        k = tl.load(k_ptrs, mask=col_ok[:, None] & d_ok[None, :], other=0.0).to(COMPUTE)  # [BLOCK_N, BLOCK_D]
        # Every row of every query tile: p = exp2(s - lse2), summed down the columns.
        for r0 in tl.range(0, M * GROUP, BLOCK_M):
            rows = r0 + tl.arange(0, BLOCK_M)  # [BLOCK_M] packed (token, head)
            row_ok = rows < M * GROUP
            m_idx = (rows // GROUP).to(tl.int64)
            hq = h * GROUP + rows % GROUP
            q_ptrs = q_ptr + n * stride_qn + m_idx[:, None] * stride_qm + hq[:, None] * stride_qh + offs_d[None, :]
            q = tl.load(q_ptrs, mask=row_ok[:, None] & d_ok, other=0.0).to(COMPUTE)  # [BLOCK_M, BLOCK_D]
            lse2 = _row_lse2(
                lse_ptr, stride_ls, n * stride_ln + m_idx * stride_lm + hq * stride_lh, row_ok, KEY_SPLITS
            )  # [BLOCK_M] base 2; finite for every row that has a key
            s = tl.dot(q, tl.trans(k), input_precision=DOT_PREC) * qk_scale  # [BLOCK_M, BLOCK_N]
            p = tl.exp2(s - lse2[:, None])  # [BLOCK_M, BLOCK_N] softmax probabilities
            p = tl.where(row_ok[:, None] & col_ok[None, :], p, 0.0)
            mass += tl.sum(p, 0)
    mass = tl.where(bad, float("nan"), mass)
    tl.store(mass_ptr + n * stride_mn + h * stride_mh + offs_n.to(tl.int64) * stride_mt, mass, mask=offs_n < L)


@triton.jit
def _row_mass_kernel(
    q_ptr,  # [N, T, Hq, D] chunk tokens' queries
    k_ptr,  # [N, T, Hkv, D] chunk keys
    x_ptr,  # [N, E, Hkv, D] extra keys (scoring tokens'), E >= 1
    lens_ptr,  # [N] int valid chunk tokens (unused when HAS_LENS is False)
    out_ptr,  # [N, Hkv, T] fp32 out
    err_ptr,  # [1] int32 device error word: ERR_CHUNK_LEN OR-ed in on a lens outside [0, T]
    T,
    E,
    qk_scale,
    stride_qn, stride_qt, stride_qh,
    stride_kn, stride_kt, stride_kh,
    stride_xn, stride_xt, stride_xh,
    stride_on, stride_oh, stride_ot,
    GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HAS_LENS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    COMPUTE: tl.constexpr,
    DOT_PREC: tl.constexpr,
):  # fmt: skip
    pid_t = tl.program_id(0)
    h = tl.program_id(1).to(tl.int64)
    n = tl.program_id(2).to(tl.int64)
    n_valid = T
    bad = tl.zeros([], tl.int1)  # bounds guard (issue 35.2): a length outside [0, T] reads no key
    if HAS_LENS:
        n_valid = tl.load(lens_ptr + n).to(tl.int32)
        bad = (n_valid < 0) | (n_valid > T)
        n_valid = tl.where(bad, 0, n_valid)
        if bad:
            tl.atomic_or(err_ptr, ERR_LEN)
    rows = pid_t * BLOCK_M + tl.arange(0, BLOCK_M)  # [BLOCK_M] chunk tokens (one head at a time)
    row_ok = rows < n_valid
    rows64 = rows.to(tl.int64)
    offs_d = tl.arange(0, BLOCK_D)  # [BLOCK_D]
    qd_mask = row_ok[:, None] & (offs_d[None, :] < HEAD_DIM)  # [BLOCK_M, BLOCK_D]
    k_base = k_ptr + n * stride_kn + h * stride_kh
    x_base = x_ptr + n * stride_xn + h * stride_xh
    total = tl.zeros([BLOCK_M], tl.float32)  # [BLOCK_M]

    if pid_t * BLOCK_M < n_valid:
        # Rows here are tokens, not (token, head) pairs: the per-token sum over the G
        # heads then stays in registers (G = 7 would not reshape into a tile).
        for g in range(GROUP):
            hq = h * GROUP + g
            q_ptrs = q_ptr + n * stride_qn + rows64[:, None] * stride_qt + hq * stride_qh + offs_d[None, :]
            q = tl.load(q_ptrs, mask=qd_mask, other=0.0).to(COMPUTE)  # [BLOCK_M, BLOCK_D]
            m_c = tl.full([BLOCK_M], float("-inf"), tl.float32)
            l_c = tl.zeros([BLOCK_M], tl.float32)
            m_c, l_c = _lse_range(
                m_c, l_c, q, k_base, stride_kt, 0, n_valid, qk_scale, HEAD_DIM, BLOCK_N, BLOCK_D, COMPUTE, DOT_PREC
            )  # [BLOCK_M] each: LSE over the valid chunk keys
            m_x = tl.full([BLOCK_M], float("-inf"), tl.float32)
            l_x = tl.zeros([BLOCK_M], tl.float32)
            m_x, l_x = _lse_range(
                m_x, l_x, q, x_base, stride_xt, 0, E, qk_scale, HEAD_DIM, BLOCK_N, BLOCK_D, COMPUTE, DOT_PREC
            )  # [BLOCK_M] each: LSE over the extra keys (E > 0, so finite)
            mm = tl.maximum(m_c, m_x)  # finite
            w_c = l_c * tl.exp2(m_c - mm)
            w_x = l_x * tl.exp2(m_x - mm)
            total += w_x / (w_c + w_x)  # = exp(lse_extra - lse_all)
    tl.store(
        out_ptr + n * stride_on + h * stride_oh + rows64 * stride_ot,
        tl.where(bad, float("nan"), tl.where(row_ok, total, 0.0)),
        mask=rows < T,
    )


# ----------------------------------------------------------------------------- launchers


def _dot_prec(comp) -> str:
    return "ieee" if comp == tl.float32 else "tf32"


class _ScoresCall:
    """A prepared ``chunk_attention_scores`` call (:func:`_prepare_scores`): output specs, the row-LSE
    launch and one column launch per key set (chunk keys, extra keys); a call supplies the pointers."""

    __slots__ = (
        "mass", "extra_mass", "lse", "lse_part", "row_lse", "columns", "native", "err", "device_type", "kernels",
    )  # fmt: skip


def _prepare_scores(q, k, lens, k_extra, sm_scale, block_m=None, block_n=None):
    """The :class:`_ScoresCall` of these inputs' metadata, or None when no kernel runs (N = 0 or M = 0)."""
    n, m, hq, d = q.shape
    t, hkv = k.shape[1], k.shape[2]
    e = 0 if k_extra is None else k_extra.shape[1]
    if n == 0 or m == 0:
        return None
    plan = plan_chunk_scores(n, m, hq, hkv, d, t, q.element_size(), gpu_spec(q.device), block_m, block_n)
    split = plan.n_splits > 1
    if split and t == 0 and e == 0:  # pragma: no cover - a split needs chunk keys; kept for safety
        return None
    call = _ScoresCall()
    f32, dev = torch.float32, q.device
    call.mass = out_spec((n, hkv, t), f32, dev)
    call.extra_mass = out_spec((n, hkv, e), f32, dev)
    call.lse = out_spec((n, m, hq), f32, dev)
    # without a split, pass 1 writes the final LSEs: its partial buffer is lse itself ([1, N, M, Hq])
    call.lse_part = out_spec((plan.n_splits, n, m, hq), f32, dev) if split else None
    sp = call.lse_part[1] if split else (n * m * hq, *call.lse[1])
    x = k if k_extra is None else k_extra
    comp = compute_dtype(_row_lse_kernel, q.dtype)
    qk_scale = float(sm_scale) * LOG2E.value
    tiles = (plan.block_m, plan.block_n, plan.block_d, comp, _dot_prec(comp))  # the constexprs every kernel ends with
    sq = q.stride()[:3]
    group = hq // hkv
    tail = (
        m,
        t,
        e,
        plan.split_len,
        plan.n_splits,
        qk_scale,
        *sq,
        *k.stride()[:3],
        *x.stride()[:3],
        *sp,
        group,
        d,
        lens is not None,
        *tiles,
    )  # the kernel's signature order after its 6 pointers (triton_kernels._launch.launch)
    call.row_lse = PreparedLaunch(_row_lse_kernel, plan.lse_grid, tail, plan.num_warps)
    call.columns = []  # (True: chunk keys and mass / False: extra keys and extra_mass, launch)
    write_lse = split  # with splits, the first column launch stores the combined LSEs
    for is_chunk, keys, n_keys, has_lens, out in (
        (True, k, t, lens is not None, call.mass),
        (False, k_extra, e, False, call.extra_mass),
    ):
        if n_keys == 0:
            continue
        tail = (
            m,
            n_keys,
            qk_scale,
            *sq,
            *keys.stride()[:3],
            *sp,
            *call.lse[1],
            *out[1],
            group,
            d,
            has_lens,
            plan.n_splits,
            write_lse,
            *tiles,
        )  # the kernel's signature order after its 6 pointers
        grid = (cdiv(n_keys, plan.block_n), hkv, n)
        call.columns.append((is_chunk, PreparedLaunch(_column_mass_kernel, grid, tail, plan.num_warps)))
        write_lse = False
    call.device_type = dev.type
    call.native = call.device_type == "cuda"  # else require_runnable per call
    call.err = error_word(dev)
    call.kernels = (_row_lse_kernel, _column_mass_kernel)  # what the launches above hold
    return call


def _run_scores(call: _ScoresCall, q, k, lens, k_extra):
    if not call.native and _launch._STUB is None:
        require_runnable(_row_lse_kernel, q.device, "chunk_attention_scores")
    mass, extra_mass, lse = alloc_spec(call.mass), alloc_spec(call.extra_mass), alloc_spec(call.lse)
    lse_part = lse if call.lse_part is None else alloc_spec(call.lse_part)
    x = k if k_extra is None else k_extra
    lens_arg = k if lens is None else lens  # a dummy pointer when HAS_LENS is False
    aligned = not (q.data_ptr() | k.data_ptr() | x.data_ptr() | lens_arg.data_ptr()) & 15
    call.row_lse((q, k, x, lens_arg, lse_part, call.err), aligned)
    for is_chunk, launch in call.columns:
        if is_chunk:
            launch((q, k, lens_arg, lse_part, lse, mass), aligned)
        else:
            launch((q, k_extra, lens_arg, lse_part, lse, extra_mass), aligned)
    return mass, extra_mass, lse


def chunk_attention_scores_launch(q, k, lens, k_extra, sm_scale, *, block_m=None, block_n=None):
    """Pass 1 (row LSEs, split over keys per the plan) then pass 2 (column sums) on validated inputs.

    Returns ``(mass [N, Hkv, T], extra_mass [N, Hkv, E], lse [N, M, Hq])``, all fp32.
    """
    require_runnable(_row_lse_kernel, q.device, "chunk_attention_scores")
    call = _prepare_scores(q, k, lens, k_extra, sm_scale, block_m, block_n)
    if call is not None:
        return _run_scores(call, q, k, lens, k_extra)
    n, m, hq, _ = q.shape
    t, hkv = k.shape[1], k.shape[2]
    e = 0 if k_extra is None else k_extra.shape[1]
    mass = alloc((n, hkv, t), torch.float32, q.device)
    extra_mass = alloc((n, hkv, e), torch.float32, q.device)
    lse = alloc((n, m, hq), torch.float32, q.device)
    if n == 0:
        return mass, extra_mass, lse
    return mass.zero_(), extra_mass.zero_(), lse  # no scoring query: no mass anywhere


class _RowMassCall:
    """A prepared ``chunk_row_mass`` call (:func:`_prepare_row_mass`)."""

    __slots__ = ("out", "launch", "native", "err", "device_type", "kernels")


def _prepare_row_mass(q, k, lens, k_extra, sm_scale, block_m=None, block_n=None):
    """The :class:`_RowMassCall` of these inputs' metadata, or None when no kernel runs (an empty
    output, or no extra key: zeros)."""
    n, t, hq, d = q.shape
    hkv = k.shape[2]
    e = 0 if k_extra is None else k_extra.shape[1]
    if n * hkv * t == 0 or e == 0:
        return None
    block_m, block_n, block_d = attention_tiles(d, t, block_m, block_n)
    call = _RowMassCall()
    call.out = out_spec((n, hkv, t), torch.float32, q.device)
    x = k_extra
    comp = compute_dtype(_row_mass_kernel, q.dtype)
    tail = (
        t,
        e,
        float(sm_scale) * LOG2E.value,
        *q.stride()[:3],
        *k.stride()[:3],
        *x.stride()[:3],
        *call.out[1],
        hq // hkv,
        d,
        lens is not None,
        block_m,
        block_n,
        block_d,
        comp,
        _dot_prec(comp),
    )  # the kernel's signature order after its 6 pointers (triton_kernels._launch.launch)
    call.launch = PreparedLaunch(_row_mass_kernel, (cdiv(t, block_m), hkv, n), tail, 4)
    call.kernels = (_row_mass_kernel,)
    call.device_type = q.device.type
    call.native = call.device_type == "cuda"  # else require_runnable per call
    call.err = error_word(q.device)
    return call


def _run_row_mass(call: _RowMassCall, q, k, lens, k_extra):
    if not call.native and _launch._STUB is None:
        require_runnable(_row_mass_kernel, q.device, "chunk_row_mass")
    out = alloc_spec(call.out)
    lens_arg = k if lens is None else lens
    aligned = not (q.data_ptr() | k.data_ptr() | k_extra.data_ptr() | lens_arg.data_ptr()) & 15
    call.launch((q, k, k_extra, lens_arg, out, call.err), aligned)
    return out


def chunk_row_mass_launch(q, k, lens, k_extra, sm_scale, *, block_m=None, block_n=None):
    """One pass on validated inputs. Returns ``[N, Hkv, T]`` fp32."""
    require_runnable(_row_mass_kernel, q.device, "chunk_row_mass")
    call = _prepare_row_mass(q, k, lens, k_extra, sm_scale, block_m, block_n)
    if call is not None:
        return _run_row_mass(call, q, k, lens, k_extra)
    out = alloc((k.shape[0], k.shape[2], k.shape[1]), torch.float32, q.device)
    return out if out.numel() == 0 else out.zero_()  # no extra keys: no row sends them any mass


def _layout(q_tokens_are_chunk: bool) -> str:
    q = "q [N, T, Hq, D] (one query per chunk token)" if q_tokens_are_chunk else "q [N, M, Hq, D]"
    return f"{q}, k [N, T, Hkv, D], k_extra [N, E, Hkv, D] (token-major)"


def _validate(op, q, k, lens, k_extra, sm_scale, q_tokens_are_chunk: bool) -> None:
    try:
        _validate_shapes(op, q, k, lens, k_extra, q_tokens_are_chunk)
    except ValueError as err:
        raise V.with_layout(err, _layout(q_tokens_are_chunk), _sdpa_hint(q, k, k_extra, q_tokens_are_chunk)) from None
    V.check_device(op, q=q, k=k, k_extra=k_extra, lens=lens)
    V.check_last_dim_contiguous(op, q=q, k=k, k_extra=k_extra)
    V.check_scale(op, sm_scale)


def _sdpa_hint(q, k, k_extra, q_tokens_are_chunk: bool) -> str:
    """Name the tensor that looks like SDPA's [N, H, L, D] where the shapes tell (else the general note)."""
    if q.dim() == 4 and k.dim() == 4:
        if q_tokens_are_chunk and q.shape[2] == k.shape[1] and q.shape[1] != k.shape[1]:
            return f"q {tuple(q.shape)} looks like SDPA's [N, Hq, T, D]: pass q.transpose(1, 2)"
        if k_extra is not None and k_extra.dim() == 4 and k_extra.shape[1] == k.shape[2] != k_extra.shape[2]:
            return f"k_extra {tuple(k_extra.shape)} looks like SDPA's [N, Hkv, E, D]: pass k_extra.transpose(1, 2)"
    return V.SDPA_NOTE


def _validate_shapes(op, q, k, lens, k_extra, q_tokens_are_chunk: bool) -> None:
    V.check_ndim(op, "q", q, 4, "[N, T, Hq, D]" if q_tokens_are_chunk else "[N, M, Hq, D]")
    V.check_ndim(op, "k", k, 4, "[N, T, Hkv, D]")
    if k_extra is not None:
        V.check_ndim(op, "k_extra", k_extra, 4, "[N, E, Hkv, D]")
    V.check_float(op, q=q, k=k, k_extra=k_extra)
    n, mq, hq, d = q.shape
    nk, t, hkv, dk = k.shape
    if nk != n:
        raise ValueError(f"{op}: q has N={n} chunks but k has N={nk}")
    if dk != d:
        raise ValueError(f"{op}: head_dim mismatch: q has D={d} but k has D={dk}")
    V.check_head_dim_positive(op, d)
    if q_tokens_are_chunk and mq != t:
        raise ValueError(f"{op}: q must hold one query per chunk token: q has T={mq} (q.shape[1]), k has T={t}")
    V.check_gqa(op, hq, hkv)
    if k_extra is not None:
        ne, _, he, de = k_extra.shape
        if (ne, he, de) != (n, hkv, d):
            raise ValueError(f"{op}: k_extra must be [N={n}, E, Hkv={hkv}, D={d}], got shape {tuple(k_extra.shape)}")
    if lens is not None:
        V.check_index_tensor(op, "lens", lens, (n,), "[N]")


# ----------------------------------------------------------------------------- public ops
# The two ops share their signature (q, k, lens, k_extra, sm_scale, backend), their checks and
# their dispatch; they differ in the reference, the launcher and the output shapes.

_SIGNATURE = "(Tensor q, Tensor k, Tensor? lens, Tensor? k_extra, float sm_scale, str backend)"


def _register(name: str, returns: str, reference, launch, fake):
    """``(impl, op)`` for one scoring op: value checks, then the torch reference or the launcher."""

    def impl(q, k, lens, k_extra, sm_scale, backend):
        checked = check_values_enabled(q.device if backend == "triton" else None)
        if checked:  # the reference indexes by lens
            V.check_lens_values(name, lens, k.shape[1])
        if backend == "triton":
            return launch(q, k, lens, k_extra, sm_scale)
        if checked or lens is None or all(0 <= x <= k.shape[1] for x in lens.tolist()):  # the reference reads them
            return reference(q, k, lens, k_extra, sm_scale=sm_scale)
        # the kernels' guard, no host read: a chunk whose length is outside [0, T] reads nothing, its
        # outputs are NaN and the error word says why
        bad = (lens < 0) | (lens > k.shape[1])
        error_word(lens.device).bitwise_or_(bad.any().to(torch.int32) * ERR_CHUNK_LEN)
        out = reference(q, k, lens.masked_fill(bad, 0), k_extra, sm_scale=sm_scale)
        if isinstance(out, tuple):
            return tuple(o.masked_fill(bad.view(-1, *[1] * (o.dim() - 1)), float("nan")) for o in out)
        return out.masked_fill(bad.view(-1, 1, 1), float("nan"))

    def entry(q, k, lens, k_extra, sm_scale, backend):  # a direct torch.ops call gets the metadata checks too
        _validate(name, q, k, lens, k_extra, sm_scale, name == "chunk_row_mass")
        return impl(q, k, lens, k_extra, sm_scale, backend)

    op = torch.library.custom_op(f"prefilling_dllm::{name}", entry, mutates_args=(), schema=_SIGNATURE + returns)
    op.register_fake(fake)
    return impl, op


def _scores_fake(q, k, lens, k_extra, sm_scale, backend):
    n, m, hq, _ = q.shape
    t, hkv = k.shape[1], k.shape[2]
    e = 0 if k_extra is None else k_extra.shape[1]
    f32 = torch.float32
    return (
        q.new_empty((n, hkv, t), dtype=f32),
        q.new_empty((n, hkv, e), dtype=f32),
        q.new_empty((n, m, hq), dtype=f32),
    )


def _row_mass_fake(q, k, lens, k_extra, sm_scale, backend):
    return q.new_empty((k.shape[0], k.shape[2], k.shape[1]), dtype=torch.float32)


_scores_impl, _chunk_scores_op = _register(
    "chunk_attention_scores",
    " -> (Tensor, Tensor, Tensor)",
    _ref.chunk_attention_scores,
    chunk_attention_scores_launch,
    _scores_fake,
)
_row_mass_impl, _chunk_row_mass_op = _register(
    "chunk_row_mass", " -> Tensor", _ref.chunk_row_mass, chunk_row_mass_launch, _row_mass_fake
)


def _current(call) -> bool:
    """Whether the call launches the module's kernels of now (the AOT compile gate swaps in stand-ins)."""
    if type(call) is _RowMassCall:
        return call.kernels[0] is _row_mass_kernel
    return call.kernels[0] is _row_lse_kernel and call.kernels[1] is _column_mass_kernel


_PREPARE = {"chunk_attention_scores": _prepare_scores, "chunk_row_mass": _prepare_row_mass}
_RUN = {_ScoresCall: _run_scores, _RowMassCall: _run_row_mass}


def _run(op_name, op, impl, q, k, lens, k_extra, sm_scale, backend, q_tokens_are_chunk):
    backend = resolve_backend(backend, q.device) if isinstance(q, torch.Tensor) else backend
    # type(sm_scale): 1 == True == 1.0 as keys, but a bool scale must still raise
    sig = V.signature(op_name, (q, k, lens, k_extra), (sm_scale, type(sm_scale), backend, _plan.assumed_gpu()))
    call = V.recall(sig)
    if call is None or (type(call) in _RUN and not _current(call)):  # metadata checks, memoised per
        # metadata signature with the prepared call (made again when its kernels were swapped)
        _validate(op_name, q, k, lens, k_extra, sm_scale, q_tokens_are_chunk)
        if backend == "triton":  # the torch reference takes any D
            V.check_head_dim(op_name, q.shape[-1])
            if sig is not None:
                scale = 1.0 / math.sqrt(q.shape[-1]) if sm_scale is None else float(sm_scale)
                call = _PREPARE[op_name](q, k, lens, k_extra, scale)
        V.remember(sig, call)
    run = _RUN.get(type(call))
    if run is not None and eager():  # the prepared call: allocate, launch
        if values_checked(call.device_type):
            V.check_lens_values(op_name, lens, k.shape[1])
        return run(call, q, k, lens, k_extra)
    scale = 1.0 / math.sqrt(q.shape[-1]) if sm_scale is None else float(sm_scale)
    return call_op(op, impl, q, k, lens, k_extra, scale, backend)


def chunk_attention_scores(
    q: torch.Tensor,
    k: torch.Tensor,
    lens: torch.Tensor | None = None,
    k_extra: torch.Tensor | None = None,
    *,
    sm_scale: float | None = None,
    backend: str | None = None,
):
    """Attention mass each chunk key receives from the scoring queries.

    For chunk ``n`` every scoring query (``M`` tokens x ``Hq`` heads) attends
    bidirectionally over the chunk's valid keys ``k[n, :lens[n]]`` plus the extra
    keys ``k_extra[n]`` (typically the scoring tokens' own keys). The softmax
    probability each key receives is summed over the ``M`` queries and the ``G``
    query heads of its KV group.

    Args:
        q: ``[N, M, Hq, D]`` scoring queries per chunk (fp32/fp16/bf16).
        k: ``[N, T, Hkv, D]`` chunk keys, same dtype.
        lens: ``[N]`` int32/int64 valid chunk keys, each in ``0..T``; None = all T.
        k_extra: ``[N, E, Hkv, D]`` extra keys every query also sees, or None (E = 0).
        sm_scale: softmax scale, default ``1/sqrt(D)``.
        backend: ``"triton"``, ``"torch"`` or None (auto; see :mod:`triton_kernels._dispatch`).

    Returns:
        ``(mass [N, Hkv, T] fp32, extra_mass [N, Hkv, E] fp32, lse [N, M, Hq] fp32)``:
        probability mass (unitless, in ``[0, M*G]``; 0 beyond ``lens``), and each
        query row's natural-log LSE over all its keys (``-inf`` if it has none).
        ``mass.sum(-1) + extra_mass.sum(-1) == M * G`` whenever a row has keys.
        A non-finite logit (NaN/inf in a query row or a valid key, or ``q . k * sm_scale``
        beyond fp32) makes that row's ``lse`` NaN and with it the whole ``mass`` and
        ``extra_mass`` of its (chunk, KV head), on every backend (the rule of
        :mod:`triton_kernels.reference`); ``topb_gather`` then rejects those scores.

    Raises:
        TypeError: unsupported or mismatched dtypes; lens not int32/int64.
        ValueError: sm_scale NaN or infinite; bad ranks/shapes (the message states the expected
            layout and names a tensor that looks like SDPA's ``[N, H, L, D]``), ``D = 0``,
            N/D/Hkv mismatch between q, k, k_extra,
            ``Hq % Hkv != 0``, unsupported D, device mismatch, last dim not
            contiguous; lens outside ``[0, T]`` where the host value checks run (CPU, the torch
            backend, the checked mode). Where they do not (CUDA by default, any backend inside
            :func:`triton_kernels.skip_value_checks`) that chunk's outputs are NaN instead and
            :func:`triton_kernels.check_errors` raises later (no host sync per call).
        RuntimeError: ``backend="triton"`` on CPU without ``TRITON_INTERPRET=1``.

    Algorithm: Prefilling-dLLM intra-chunk scoring; FlashAttention-2 online
    softmax for the row LSEs (pass 1, split over the keys when N is small), then a
    column pass that recomputes ``Q K^T`` per key tile and sums ``exp(s - lse)`` (as
    FlashAttention's backward recomputes P). Never stores an ``[M, T]`` score matrix;
    costs two ``Q K^T``.
    """
    return _run("chunk_attention_scores", _chunk_scores_op, _scores_impl, q, k, lens, k_extra, sm_scale, backend, False)


def chunk_row_mass(
    q: torch.Tensor,
    k: torch.Tensor,
    lens: torch.Tensor | None = None,
    k_extra: torch.Tensor | None = None,
    *,
    sm_scale: float | None = None,
    backend: str | None = None,
):
    """Attention mass each chunk token sends to the extra (scoring) keys.

    Chunk row ``t < lens[n]`` attends over the valid chunk keys plus
    ``k_extra[n]``; its mass on the extra keys is ``exp(lse_extra - lse_all)``,
    summed over the ``G`` query heads of each KV head. The other direction of
    :func:`chunk_attention_scores`; add the two for a bidirectional score.

    Args:
        q: ``[N, T, Hq, D]`` the chunk tokens' own queries (fp32/fp16/bf16).
        k: ``[N, T, Hkv, D]`` chunk keys, same dtype.
        lens: ``[N]`` int32/int64 valid chunk tokens in ``0..T``; None = all T.
        k_extra: ``[N, E, Hkv, D]`` the scoring tokens' keys; None or E = 0 gives zeros.
        sm_scale: softmax scale, default ``1/sqrt(D)``.
        backend: ``"triton"``, ``"torch"`` or None (auto).

    Returns:
        ``[N, Hkv, T]`` fp32 probability mass in ``[0, G]``; 0 for rows ``t >= lens[n]``;
        NaN for a row with a non-finite logit (as :func:`chunk_attention_scores`).

    Raises:
        TypeError / ValueError / RuntimeError: as :func:`chunk_attention_scores`,
        plus ValueError when q and k disagree on T.

    Algorithm: Prefilling-dLLM intra-chunk scoring (chunk -> query direction);
    two FlashAttention-2 online-softmax LSEs per row (chunk keys, extra keys),
    combined as ``l_x 2^(m_x - m) / (l_c 2^(m_c - m) + l_x 2^(m_x - m))``.
    """
    return _run("chunk_row_mass", _chunk_row_mass_op, _row_mass_impl, q, k, lens, k_extra, sm_scale, backend, True)
