"""The Triton kernels of :mod:`triton_kernels.chunk_scores` (that module launches them and holds the ops).

* ``_row_lse_kernel`` (pass 1 of ``chunk_attention_scores``): every scoring query row's LSE over its
  keys (valid chunk keys + extra keys) with an online max/sum, over one split of the keys.
* ``_column_mass_kernel`` (pass 2): combines the split LSEs, recomputes ``Q K^T`` one key tile at a
  time and sums ``exp(s - lse_row)`` down the columns.
* ``_row_mass_kernel`` (``chunk_row_mass``): for every chunk row, the mass it sends to the extra keys,
  ``exp(lse_extra - lse_all)`` from two LSEs per row, summed over the G heads.

The helpers below are what the three share: the program's place in the grid, the chunk's valid
length and its bounds guard, the GQA-packed rows of a query tile (row ``r`` = token ``r // G``,
head ``h * G + r % G``, as in :mod:`triton_kernels.split_s`), the load of a tile of head-dim rows
and the online LSE over a range of keys. Base-2 logits throughout (``qk_scale = sm_scale * log2(e)``).
"""

from __future__ import annotations

import triton
import triton.language as tl

from triton_kernels._constants import LN2, LOG2E
from triton_kernels._dispatch import ERR_CHUNK_LEN

ERR_LEN = tl.constexpr(ERR_CHUNK_LEN)


@triton.jit
def _chunk_len(lens_ptr, n, L, HAS_LENS: tl.constexpr):
    """``(n_valid, bad)``: the valid keys of chunk ``n`` (all ``L`` without lens) and whether its length
    is outside ``[0, L]``; the bounds guard: a bad length reads no key (``n_valid`` 0)."""
    n_valid = L
    bad = tl.zeros([], tl.int1)
    if HAS_LENS:
        n_valid = tl.load(lens_ptr + n).to(tl.int32)
        bad = (n_valid < 0) | (n_valid > L)
        n_valid = tl.where(bad, 0, n_valid)
    return n_valid, bad


@triton.jit
def _tile_head_chunk():
    """This program's ``(tile, KV head, chunk)``: grid axes 0, 1 and 2 (the head and the chunk in int64, as
    ``chunk * stride`` may pass 2**31)."""
    return tl.program_id(0), tl.program_id(1).to(tl.int64), tl.program_id(2).to(tl.int64)


@triton.jit
def _packed_rows(r0, M, h, GROUP: tl.constexpr, BLOCK_M: tl.constexpr):
    """``(row_ok, m_idx, hq)`` of the ``BLOCK_M`` packed (token, head) rows from ``r0`` of KV head ``h``:
    which rows exist, their query token (int64) and their query head."""
    rows = r0 + tl.arange(0, BLOCK_M)  # [BLOCK_M]
    row_ok = rows < M * GROUP
    m_idx = (rows // GROUP).to(tl.int64)
    hq = h * GROUP + rows % GROUP
    return row_ok, m_idx, hq


@triton.jit
def _load_rows(row_ptrs, row_ok, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, COMPUTE: tl.constexpr):
    """The ``[len(row_ptrs), BLOCK_D]`` tile of the head-dim rows that start at ``row_ptrs``, in COMPUTE;
    zeros in the rows not ``row_ok`` and past ``HEAD_DIM``."""
    offs_d = tl.arange(0, BLOCK_D)  # [BLOCK_D]
    mask = row_ok[:, None] & (offs_d[None, :] < HEAD_DIM)
    return tl.load(row_ptrs[:, None] + offs_d[None, :], mask=mask, other=0.0).to(COMPUTE)


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
    BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,  # the key tile
    COMPUTE: tl.constexpr, DOT_PREC: tl.constexpr,  # the tiles' dtype, tl.dot's input precision
):  # fmt: skip
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
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, HAS_LENS: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,  # the tile
    COMPUTE: tl.constexpr, DOT_PREC: tl.constexpr,  # the tiles' dtype, tl.dot's input precision
):  # fmt: skip
    pid_mh = tl.program_id(0)
    split = tl.program_id(1)
    n = tl.program_id(2).to(tl.int64)
    n_mtiles = tl.cdiv(M * GROUP, BLOCK_M)
    h = (pid_mh // n_mtiles).to(tl.int64)
    row_ok, m_idx, hq = _packed_rows((pid_mh % n_mtiles) * BLOCK_M, M, h, GROUP, BLOCK_M)
    q = _load_rows(q_ptr + n * stride_qn + m_idx * stride_qm + hq * stride_qh, row_ok, HEAD_DIM, BLOCK_D, COMPUTE)

    n_chunk, bad = _chunk_len(lens_ptr, n, T, HAS_LENS)
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
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, HAS_LENS: tl.constexpr,
    KEY_SPLITS: tl.constexpr,  # LSE splits of pass 1
    WRITE_LSE: tl.constexpr,  # programs of key tile 0 store the combined LSEs (once per row)
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,  # the tile
    COMPUTE: tl.constexpr, DOT_PREC: tl.constexpr,  # the tiles' dtype, tl.dot's input precision
):  # fmt: skip
    pid_t, h, n = _tile_head_chunk()
    n_valid, bad = _chunk_len(lens_ptr, n, L, HAS_LENS)  # a bad length: pass 1 set the error word
    offs_n = pid_t * BLOCK_N + tl.arange(0, BLOCK_N)  # [BLOCK_N] key positions of this tile
    col_ok = offs_n < n_valid
    mass = tl.zeros([BLOCK_N], tl.float32)  # [BLOCK_N]

    if WRITE_LSE:
        if pid_t == 0:
            for r0 in range(0, M * GROUP, BLOCK_M):
                row_ok, m_idx, hq = _packed_rows(r0, M, h, GROUP, BLOCK_M)
                lse2 = _row_lse2(
                    lse_ptr, stride_ls, n * stride_ln + m_idx * stride_lm + hq * stride_lh, row_ok, KEY_SPLITS
                )
                tl.store(lse_out_ptr + n * stride_yn + m_idx * stride_ym + hq * stride_yh, lse2 * LN2, mask=row_ok)

    if pid_t * BLOCK_N < n_valid:  # tiles past the valid length only write zeros
        tok = offs_n.to(tl.int64)
        k = _load_rows(k_ptr + n * stride_kn + h * stride_kh + tok * stride_kt, col_ok, HEAD_DIM, BLOCK_D, COMPUTE)
        # Every row of every query tile: p = exp2(s - lse2), summed down the columns.
        for r0 in tl.range(0, M * GROUP, BLOCK_M):
            row_ok, m_idx, hq = _packed_rows(r0, M, h, GROUP, BLOCK_M)
            q_rows = q_ptr + n * stride_qn + m_idx * stride_qm + hq * stride_qh
            q = _load_rows(q_rows, row_ok, HEAD_DIM, BLOCK_D, COMPUTE)  # [BLOCK_M, BLOCK_D]
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
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, HAS_LENS: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,  # the tile
    COMPUTE: tl.constexpr, DOT_PREC: tl.constexpr,  # the tiles' dtype, tl.dot's input precision
):  # fmt: skip
    pid_t, h, n = _tile_head_chunk()
    n_valid, bad = _chunk_len(lens_ptr, n, T, HAS_LENS)
    if bad:
        tl.atomic_or(err_ptr, ERR_LEN)
    rows = pid_t * BLOCK_M + tl.arange(0, BLOCK_M)  # [BLOCK_M] chunk tokens (one head at a time)
    row_ok = rows < n_valid
    rows64 = rows.to(tl.int64)
    k_base = k_ptr + n * stride_kn + h * stride_kh
    x_base = x_ptr + n * stride_xn + h * stride_xh
    total = tl.zeros([BLOCK_M], tl.float32)  # [BLOCK_M]

    if pid_t * BLOCK_M < n_valid:
        # Rows here are tokens, not (token, head) pairs: the per-token sum over the G
        # heads then stays in registers (G = 7 would not reshape into a tile).
        for g in range(GROUP):
            hq = h * GROUP + g
            q_rows = q_ptr + n * stride_qn + rows64 * stride_qt + hq * stride_qh
            q = _load_rows(q_rows, row_ok, HEAD_DIM, BLOCK_D, COMPUTE)  # [BLOCK_M, BLOCK_D]
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
