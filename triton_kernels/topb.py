"""``topb_gather``: keep the top-B tokens of every (chunk, KV head) and gather their K/V.

Intra-chunk sparsity of Prefilling-dLLM: after scoring (:mod:`triton_kernels.chunk_scores`)
each chunk keeps, per KV head, the ``b`` tokens with the highest max-pooled
score (pooling keeps neighbourhoods of salient tokens together, as SnapKV does),
always including token 0 (the BOS attention anchor), in their original order.

Two kernels, two launches, only the four outputs allocated (no torch op on the CUDA path):

* **Selection** (``_select_topb_kernel``, one program of one warp per (chunk, KV head), the row's
  ``T <= MAX_SELECT_T`` scores in registers): max-pool (the window's loads hit L1), pin BOS, map
  each fp32 score to an order-preserving int32 key (-0.0 folded into +0.0, which compare equal),
  find the ``kept``-th largest key by a bit-by-bit threshold search (32 counts of ``key >= c``;
  a radix select with 1-bit digits, the scheme of PyTorch's CUDA ``topk``
  (``SortingRadixSelect.cuh``) and of Alabi et al., "Fast k-selection algorithms for graphics
  processing units", JEA 2012), keep every key above it and the earliest of the keys equal to it
  (the reference's stable-sort tie rule), and compact with a prefix sum: the indices come out in
  ascending token order with no sort. On sm_90 each count compiles to bit packing + ``popc`` +
  one ``redux.sync`` (no shared memory, no barrier).
* **Gather** (``_gather_rows_kernel``): copies the selected rows of K and V into the compact pool
  ``[N, b, Hkv, D]`` in one pass (padding rows are written as zeros), reading only the selected
  rows, from any row strides (64-bit offsets); it also applies the bad-chunk rule below, which
  needs every head of a chunk.

Host path: a call whose metadata signature was seen runs its prepared call
(:class:`_TopbCall`: the output specs and both launch records, grids and non-pointer arguments
fixed), so it costs the signature, four ``torch.empty_strided`` and two direct launches. Four
allocations, not one flat buffer viewed into the outputs: on the CPU dispatcher four cost 5.8 us,
one buffer and its four views 17.7 us (each view is a dispatcher call too).

Rows longer than :data:`MAX_SELECT_T` (not a chunk size this package uses) fall back to the torch
selection :func:`select_topb` (max-pool + two stable sorts) and the same gather.

NaN scores have no rank: the host value checks reject NaN among the valid tokens' scores (and a
length outside ``[0, T]``) with a ``ValueError``; where they are off (CUDA by default, see
:mod:`triton_kernels._dispatch`) such a chunk keeps nothing -- its ``idx`` is -1, ``kept`` 0,
``k_out``/``v_out`` NaN -- and :func:`triton_kernels.check_errors` raises. A NaN is never
selected; NaN beyond ``lens`` is ignored.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from triton_kernels import _dispatch, _launch
from triton_kernels import _validate as V
from triton_kernels import reference as _ref
from triton_kernels._dispatch import ERR_TOPB, call_op, require_runnable  # per module: tests patch these
from triton_kernels._launch import PreparedLaunch, launch
from triton_kernels.plan import cdiv

# ----------------------------------------------------------------------------- kernels

_INT_MIN = tl.constexpr(-2147483648)  # int32 sign bit (a constexpr: a jit function may read it)


@triton.jit
def _select_topb_kernel(
    s_ptr,  # [N, Hkv, T] scores, any float dtype
    lens_ptr,  # [N] int32/int64 valid tokens per chunk (read only when HAS_LENS)
    idx_ptr,  # [N, Hkv, b] int64 out: selected tokens ascending, then -1
    kept_ptr,  # [N] int32 out
    err_ptr,  # [1] int32 device error word (triton_kernels.check_errors)
    T,
    n_out,  # b
    stride_sn, stride_sh, stride_st,
    stride_in, stride_ih, stride_ib,
    POOL: tl.constexpr,  # odd max-pool window
    KEEP_FIRST: tl.constexpr,
    HAS_LENS: tl.constexpr,
    BLOCK_T: tl.constexpr,  # next_pow2(T): the whole row lives in registers
):  # fmt: skip
    n = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1).to(tl.int64)
    offs = tl.arange(0, BLOCK_T)  # [BLOCK_T] token
    length = T + tl.zeros([], tl.int32)  # a tensor even when T is specialised to a constant
    bad_len = length < 0  # False, as a tensor
    if HAS_LENS:
        ln = tl.load(lens_ptr + n)  # int32 or int64: compared before any narrowing
        bad_len = (ln < 0) | (ln > T)  # bounds guard: such a chunk selects nothing
        length = tl.where(bad_len, 0, ln).to(tl.int32)
    row = s_ptr + n * stride_sn + h * stride_sh
    valid = offs < length
    x = tl.load(row + offs * stride_st, mask=valid, other=0.0).to(tl.float32)
    # Sums and scans below call tl.reduce / tl.associative_scan with Triton's own sum combine, which
    # is what tl.sum / tl.cumsum compile to; the interpreter runs those natively, while a call of the
    # jit wrappers tl.sum / tl.cumsum costs it milliseconds (36 per row here: the tests' time).
    bad = bad_len | (tl.reduce((x != x).to(tl.int32), 0, tl.standard._sum_combine) > 0)  # a valid NaN

    # Max-pool along tokens (stride 1, same length, windows clipped to the valid tokens), as
    # reference.pool_scores: invalid tokens are -inf before and after pooling.
    pooled = tl.where(valid, x, float("-inf"))
    for j in tl.static_range(POOL):
        if j != POOL // 2:
            o = offs + (j - POOL // 2)
            y = tl.load(row + o * stride_st, mask=(o >= 0) & (o < length), other=float("-inf"))
            pooled = tl.maximum(pooled, y.to(tl.float32))
    pooled = tl.where(valid, pooled, float("-inf"))
    if KEEP_FIRST:
        pooled = tl.where(valid & (offs == 0), float("inf"), pooled)
    pooled = tl.where(pooled == 0.0, 0.0, pooled)  # -0.0 and +0.0 compare equal: one key for both

    # Order-preserving int32 key of the fp32 value: flip the magnitude bits of negatives.
    bits = pooled.to(tl.int32, bitcast=True)
    key = bits ^ ((bits >> 31) & 2147483647)
    kept = tl.where(bad, 0, tl.minimum(length, n_out))  # tokens this row keeps: none in a bad row

    # Threshold search: the largest key thr with #{key >= thr} >= kept, i.e. the kept-th largest
    # key, built bit by bit from the top in the sign-flipped (unsigned-ordered) domain: 32 counts.
    u = tl.zeros([], tl.int32)
    step = tl.full([], _INT_MIN, tl.int32)
    for _ in range(32):
        cand = u | step
        cnt = tl.reduce((key >= (cand ^ _INT_MIN)).to(tl.int32), 0, tl.standard._sum_combine)
        u = tl.where(cnt >= kept, cand, u)
        step = (step >> 1) & 2147483647
    thr = u ^ _INT_MIN

    # Keep every key above thr and, of the keys equal to it, the earliest ones (ties go to the
    # lower token index, as the stable sort of the reference); then compact in token order.
    above = valid & (key > thr)
    tie = valid & (key == thr)
    n_above = tl.reduce(above.to(tl.int32), 0, tl.standard._sum_combine)
    tie_rank = tl.associative_scan(tie.to(tl.int32), 0, tl.standard._sum_combine)  # inclusive cumsum
    sel = above | (tie & (tie_rank <= kept - n_above))
    pos = tl.associative_scan(sel.to(tl.int32), 0, tl.standard._sum_combine) - 1  # output row per token
    out = idx_ptr + n * stride_in + h * stride_ih
    tl.store(out + pos.to(tl.int64) * stride_ib, offs.to(tl.int64), mask=sel)
    for j in range(tl.cdiv(n_out, BLOCK_T)):  # padding after the kept ones
        o = j * BLOCK_T + offs
        tl.store(out + o.to(tl.int64) * stride_ib, tl.full([BLOCK_T], -1, tl.int64), mask=(o >= kept) & (o < n_out))
    if h == 0:  # a NaN in another head is the gather's to see (_gather_rows_kernel)
        tl.store(kept_ptr + n, tl.where(bad_len, 0, tl.minimum(length, n_out)))
    if bad:
        tl.atomic_or(err_ptr, 16)  # ERR_TOPB of triton_kernels._dispatch


@triton.jit
def _copy_rows(src, stride_src, dst, stride_dst, tok, offs_b, offs_d, src_mask, dst_mask, bad):
    """Rows ``tok`` of one (chunk, KV head) of ``src`` to rows ``offs_b`` of ``dst``: the same copy for K and V."""
    x = tl.load(src + tok[:, None] * stride_src + offs_d[None, :], mask=src_mask, other=0.0)  # [BLOCK_B, BLOCK_D]
    x = tl.where(bad, float("nan"), x)  # a bad chunk is NaN, never plausible numbers
    tl.store(dst + offs_b[:, None] * stride_dst + offs_d[None, :], x.to(dst.dtype.element_ty), mask=dst_mask)


@triton.jit
def _gather_rows_kernel(
    idx_ptr,  # [N, Hkv, b] int64 selected token per output row, -1 = padding
    k_ptr,  # [N, T, Hkv, D]
    v_ptr,
    ko_ptr,  # [N, b, Hkv, D] out
    vo_ptr,
    lens_ptr,  # [N] valid tokens per chunk (read only when CHUNK_CHECK and HAS_LENS)
    kept_ptr,  # [N] int32 of _select_topb_kernel (reset to 0 in a bad chunk; only when CHUNK_CHECK)
    T,
    n_out,  # b
    stride_in, stride_ih, stride_ib,
    stride_kn, stride_kt, stride_kh,
    stride_vn, stride_vt, stride_vh,
    stride_kon, stride_kob, stride_koh,
    stride_von, stride_vob, stride_voh,
    HEAD_DIM: tl.constexpr,
    BLOCK_B: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_H: tl.constexpr,  # next_pow2(Hkv): the first idx of every head of the chunk in one load
    CHUNK_CHECK: tl.constexpr,  # idx comes from _select_topb_kernel: make a chunk with a bad row NaN
    HAS_LENS: tl.constexpr,
):  # fmt: skip
    pid_b = tl.program_id(0)
    h = tl.program_id(1).to(tl.int64)
    n = tl.program_id(2).to(tl.int64)  # 64-bit offsets throughout: n * stride_kn may pass 2**31
    offs_b = pid_b * BLOCK_B + tl.arange(0, BLOCK_B)  # [BLOCK_B] output rows
    offs_d = tl.arange(0, BLOCK_D)  # [BLOCK_D]
    b_ok = offs_b < n_out
    offs_b = offs_b.to(tl.int64)
    idx_row = idx_ptr + n * stride_in + h * stride_ih
    tok = tl.load(idx_row + offs_b * stride_ib, mask=b_ok, other=-1)  # [BLOCK_B]
    bad = tl.zeros([], tl.int32) != 0  # False, as a tensor
    if CHUNK_CHECK:
        # The selection kept nothing in a bad row (idx all -1); a row of a chunk with valid tokens
        # keeps >= 1. So the chunk is bad iff its length is out of range or it has valid tokens and
        # some head's first idx is -1. Reading it races with other programs' reset below, which only
        # writes -1 into a chunk that is bad: either value read gives the same verdict.
        length = T + tl.zeros([], tl.int32)
        if HAS_LENS:
            ln = tl.load(lens_ptr + n)
            bad = (ln < 0) | (ln > T)
            length = tl.where(bad, 0, ln).to(tl.int32)
        offs_h = tl.arange(0, BLOCK_H)
        first = tl.load(idx_ptr + n * stride_in + offs_h * stride_ih, mask=offs_h < tl.num_programs(1), other=0)
        bad = bad | ((length > 0) & (tl.reduce(first, 0, tl.standard._elementwise_min) < 0))
        if bad:  # the chunk keeps nothing: idx -1, kept 0 (each program resets only what it owns)
            tl.store(idx_row + offs_b * stride_ib, tl.full([BLOCK_B], -1, tl.int64), mask=b_ok)
            if (pid_b == 0) & (h == 0):
                tl.store(kept_ptr + n, 0)
    tok = tl.where(bad, -1, tok)
    sel = tok >= 0
    tok = tl.where(sel, tok, 0).to(tl.int64)
    d_ok = offs_d[None, :] < HEAD_DIM
    src_mask = sel[:, None] & d_ok  # [BLOCK_B, BLOCK_D]: padding rows read nothing...
    dst_mask = b_ok[:, None] & d_ok  # ...but are written (as zeros; NaN in a bad chunk)
    src_k, dst_k = k_ptr + n * stride_kn + h * stride_kh, ko_ptr + n * stride_kon + h * stride_koh
    _copy_rows(src_k, stride_kt, dst_k, stride_kob, tok, offs_b, offs_d, src_mask, dst_mask, bad)
    src_v, dst_v = v_ptr + n * stride_vn + h * stride_vh, vo_ptr + n * stride_von + h * stride_voh
    _copy_rows(src_v, stride_vt, dst_v, stride_vob, tok, offs_b, offs_d, src_mask, dst_mask, bad)


# ----------------------------------------------------------------------------- launcher


def select_topb(scores, b, lens, pool_kernel, keep_first):
    """Selection in torch (rows longer than :data:`MAX_SELECT_T`; also ``bench_kernels``' torch
    baseline): ``(idx [N, Hkv, b] int64 ascending, -1 padded, kept [N] int32)``.

    Vectorised over chunks and heads with no host sync: sort the pooled scores
    (stable, descending: ties to the lower index), keep the first
    ``kept = min(b, lens)`` per chunk, put them back in ascending token order.
    """
    n, h, t = scores.shape
    pooled = _ref.pool_scores(scores, lens, pool_kernel=pool_kernel, keep_first=keep_first)  # [N, H, T]
    lens_t = torch.full((n,), t, dtype=torch.long, device=scores.device) if lens is None else lens.long()
    kept = torch.clamp(lens_t, max=b)  # [N]
    width = min(b, t)
    top = torch.sort(pooled, dim=-1, descending=True, stable=True).indices[..., :width]  # [N, H, width]
    pad = torch.arange(width, device=scores.device)[None, None, :] >= kept[:, None, None]  # [N, 1, width]
    top = torch.sort(top.masked_fill(pad, t), dim=-1).values.masked_fill(pad, -1)  # padding (t) sorts last
    idx = torch.full((n, h, b), -1, dtype=torch.long, device=scores.device)
    idx[..., :width] = top
    return idx, kept.to(torch.int32)


MAX_SELECT_T = 8192  # rows up to this many tokens are selected in registers by _select_topb_kernel


def select_warps(block_t: int) -> int:
    """Warps of one selection program: 1 up to 1024 tokens (32 per thread; its 32 counts then need
    no cross-warp barrier), one more per 1024 tokens beyond, up to 8."""
    return max(1, min(8, block_t // 1024))


def _select_tail(t, b, scores_strides, h, pool_kernel, keep_first, has_lens) -> tuple:
    """The selection kernel's arguments after its 5 pointers (``idx`` contiguous ``[N, Hkv, b]``)."""
    block_t = 32 if t <= 32 else 1 << (t - 1).bit_length()  # next_pow2, at least a warp
    # the kernel's signature order (triton_kernels._launch.launch)
    return (t, b, *scores_strides, h * b, b, 1, pool_kernel, keep_first, has_lens, block_t)


def _gather_plan(n, h, b, d, idx_strides, k_strides, v_strides, t, chunk_check, has_lens) -> tuple:
    """``(grid, tail, num_warps)`` of the gather kernel: ``tail`` its arguments after its 7 pointers
    (``k_out``/``v_out`` contiguous ``[N, b, Hkv, D]``)."""
    block_d = 1 if d <= 1 else 1 << (d - 1).bit_length()  # next_pow2
    block_b = max(1, min(64, 4096 // block_d, 1 << (b - 1).bit_length()))
    tail = (
        t,
        b,
        *idx_strides,
        *k_strides[:3],
        *v_strides[:3],
        b * h * d,  # k_out, v_out: contiguous
        h * d,
        d,
        b * h * d,
        h * d,
        d,
        d,
        block_b,
        block_d,
        1 if h <= 1 else 1 << (h - 1).bit_length(),
        chunk_check,
        has_lens,
    )  # the kernel's signature order (triton_kernels._launch.launch)
    return (cdiv(b, block_b), h, n), tail, 4


def select_launch(scores, b, lens, pool_kernel, keep_first):
    """Launch ``_select_topb_kernel``: ``(idx [N, Hkv, b] int64, kept [N] int32)`` on ``scores``' device.

    ``scores [N, Hkv, T]`` (any float dtype, any strides, ``1 <= T <= MAX_SELECT_T``), ``lens [N]``
    int32/int64 or None, ``b >= 1``, odd ``pool_kernel``, ``keep_first``: as :func:`topb_gather`, whose
    checks they passed. ``idx`` holds each row's selected tokens ascending, then -1; a row with a bad
    length or a NaN valid score keeps nothing (all -1) and sets ERR_TOPB in the error word; ``kept`` is
    ``min(b, lens)`` (0 for a bad length): a NaN in one head of a chunk is left for the gather to apply
    to the chunk's other heads (:func:`gather_rows_launch` with ``kept``).
    """
    require_runnable(_select_topb_kernel, scores.device, "topb_gather")
    n, h, t = scores.shape
    dev = scores.device
    idx = _dispatch.alloc((n, h, b), torch.long, dev)
    kept = _dispatch.alloc((n,), torch.int32, dev)
    tail = _select_tail(t, b, scores.stride(), h, pool_kernel, keep_first, lens is not None)
    # lens: kept stands in when there is none (not read without lens)
    args = (scores, kept if lens is None else lens, idx, kept, _dispatch.error_word(dev), *tail)
    launch(_select_topb_kernel, (n, h), args, select_warps(tail[-1]))
    return idx, kept


class _TopbCall:
    """A prepared ``topb_gather`` call (:func:`_prepare`): the four output specs and the two launches
    (selection, gather) with every non-pointer argument fixed; a call supplies the pointers."""

    __slots__ = ("k_out", "v_out", "idx", "kept", "select", "gather", "native", "err", "device_type", "kernels")


def _prepare(scores, k, v, b, lens, pool_kernel, keep_first):
    """The :class:`_TopbCall` of these validated inputs' metadata, or None where the kernels do not
    serve the whole op (rows longer than :data:`MAX_SELECT_T`, or no (chunk, head) row)."""
    n, h, t = scores.shape
    if t > MAX_SELECT_T or n * h == 0:
        return None
    d, dev = k.shape[-1], k.device
    call = _TopbCall()
    call.k_out = _dispatch.out_spec((n, b, h, d), k.dtype, dev)
    call.v_out = _dispatch.out_spec((n, b, h, d), v.dtype, dev)
    call.idx = _dispatch.out_spec((n, h, b), torch.long, dev)
    call.kept = _dispatch.out_spec((n,), torch.int32, dev)
    has_lens = lens is not None
    tail = _select_tail(t, b, scores.stride(), h, pool_kernel, keep_first, has_lens)
    call.select = PreparedLaunch(_select_topb_kernel, (n, h), tail, select_warps(tail[-1]))
    grid, tail, warps = _gather_plan(n, h, b, d, call.idx[1], k.stride(), v.stride(), t, True, has_lens)
    call.gather = PreparedLaunch(_gather_rows_kernel, grid, tail, warps)
    call.device_type = dev.type
    call.native = call.device_type == "cuda"  # else require_runnable per call
    call.err = _dispatch.error_word(dev)
    call.kernels = (_select_topb_kernel, _gather_rows_kernel)  # what the launches above hold
    return call


def _current(call: _TopbCall) -> bool:
    """Whether the call launches the module's kernels of now (the AOT compile gate swaps in stand-ins)."""
    return call.kernels[0] is _select_topb_kernel and call.kernels[1] is _gather_rows_kernel


def _run(call: _TopbCall, scores, k, v, lens):
    """Allocate the outputs and make the two launches: the selection writes ``idx`` and ``kept``; the
    gather copies the rows and makes a chunk with a bad row keep nothing (idx -1, kept 0, K/V NaN)."""
    if not call.native and _launch._STUB is None:
        require_runnable(_select_topb_kernel, scores.device, "topb_gather")
    spec = _dispatch.alloc_spec
    k_out, v_out, idx, kept = spec(call.k_out), spec(call.v_out), spec(call.idx), spec(call.kept)
    if lens is None:  # dummy pointers in its place (not read without lens)
        aligned = not (scores.data_ptr() | k.data_ptr() | v.data_ptr()) & 15
        call.select((scores, kept, idx, kept, call.err), aligned)
        call.gather((idx, k, v, k_out, v_out, idx, kept), aligned)
    else:
        aligned = not (scores.data_ptr() | k.data_ptr() | v.data_ptr() | lens.data_ptr()) & 15
        call.select((scores, lens, idx, kept, call.err), aligned)
        call.gather((idx, k, v, k_out, v_out, lens, kept), aligned)
    return k_out, v_out, idx, kept


def topb_launch(scores, k, v, b, lens, pool_kernel, keep_first):
    """The whole op in two launches on validated inputs with ``1 <= T <= MAX_SELECT_T`` and
    ``N * Hkv > 0``: the selection writes ``idx`` and ``kept``; the gather copies the rows and makes
    a chunk with a bad row keep nothing (idx -1, kept 0, K/V NaN). Returns ``(k_out, v_out, idx,
    kept)`` as :func:`topb_gather`; allocates only them."""
    require_runnable(_select_topb_kernel, scores.device, "topb_gather")
    return _run(_prepare(scores, k, v, b, lens, pool_kernel, keep_first), scores, k, v, lens)


def gather_rows_launch(idx, k, v, kept=None, lens=None, t=0):
    """Gather ``k[n, idx[n, h, j], h]`` into ``k_out[n, j, h]`` (zeros where idx = -1); same for v.

    ``kept`` (with ``lens`` and ``t``, the chunk length): ``idx`` and ``kept`` come from
    ``_select_topb_kernel``; a chunk with a bad length or a bad row (idx all -1 although the chunk
    has valid tokens) is written as NaN and its idx / kept reset to -1 / 0. None: a plain copy.
    """
    require_runnable(_gather_rows_kernel, k.device, "topb_gather")
    n, h, b = idx.shape
    d = k.shape[-1]
    k_out = _dispatch.alloc((n, b, h, d), k.dtype, k.device)
    v_out = _dispatch.alloc((n, b, h, d), v.dtype, v.device)
    if n * h * b == 0:
        return k_out, v_out
    grid, tail, warps = _gather_plan(
        n, h, b, d, idx.stride(), k.stride(), v.stride(), t, kept is not None, lens is not None
    )
    # lens / kept: idx stands in when there is none (not read then)
    args = (idx, k, v, k_out, v_out, idx if lens is None else lens, idx if kept is None else kept, *tail)
    launch(_gather_rows_kernel, grid, args, warps)
    return k_out, v_out


TOPB_LAYOUT = (
    "scores [N, Hkv, T] (token scores last: the selection sorts along T), "
    "k/v [N, T, Hkv, D] (token-major, the KV cache's layout)"
)


def _layout_hint(scores, k) -> str:
    if scores.dim() == 3 and k.dim() == 4:
        n, a, c = scores.shape
        if k.shape[:3] == (n, a, c) and a != c:  # one of the two is in the other's axis order
            return (
                f"scores {tuple(scores.shape)} and k {tuple(k.shape)} share one axis order: scores are "
                "[N, Hkv, T] and k/v [N, T, Hkv, D]; transpose(1, 2) the one built the other way"
            )
    return V.SDPA_NOTE


def _validate(scores, k, v, b, lens, pool_kernel, keep_first) -> tuple[int, int]:
    """Metadata checks; returns ``(b, pool_kernel)`` as Python ints."""
    op = "topb_gather"
    try:
        V.check_ndim(op, "scores", scores, 3, "[N, Hkv, T]")
        V.check_ndim(op, "k", k, 4, "[N, T, Hkv, D]")
        V.check_ndim(op, "v", v, 4, "[N, T, Hkv, D]")
        if not scores.dtype.is_floating_point:
            raise TypeError(f"{op}: scores must be a floating tensor, got {scores.dtype}")
        V.check_float(op, k=k, v=v)
        n, h, t = scores.shape
        V.check_shape(op, "k", k, (n, t, h, k.shape[-1]), "[N, T, Hkv, D] matching scores [N, Hkv, T]")
        V.check_shape(op, "v", v, k.shape, "k.shape")
        if lens is not None:
            V.check_index_tensor(op, "lens", lens, (n,), "[N]")
    except ValueError as err:
        raise V.with_layout(err, TOPB_LAYOUT, _layout_hint(scores, k)) from None
    b = V.as_int(op, "b", b)
    if b < 1:
        raise ValueError(f"{op}: b (tokens kept per chunk and head) must be >= 1, got {b}")
    pool_kernel = V.as_int(op, "pool_kernel", pool_kernel)
    if pool_kernel < 1 or pool_kernel % 2 == 0:
        raise ValueError(f"{op}: pool_kernel must be odd and >= 1 (same-length pooling), got {pool_kernel}")
    if not isinstance(keep_first, bool):
        raise TypeError(f"{op}: keep_first must be a bool, got {type(keep_first).__name__}")
    V.check_device(op, scores=scores, k=k, v=v, lens=lens)
    V.check_last_dim_contiguous(op, k=k, v=v)
    return b, pool_kernel


# ----------------------------------------------------------------------------- public op


def _topb_impl(
    scores: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    b: int,
    lens: torch.Tensor | None,
    pool_kernel: int,
    keep_first: bool,
    backend: str,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    # The torch reference indexes with the values: it is always checked first (unless skipped).
    checked = _dispatch.check_values_enabled(k.device if backend == "triton" else None)
    if checked:
        V.check_scores_values("topb_gather", scores, lens)
    if backend == "torch":
        if checked:
            return _ref.topb_gather(scores, k, v, b, lens=lens, pool_kernel=pool_kernel, keep_first=keep_first)
        # unchecked: the reference runs on lengths clamped into [0, T] (it indexes with them), then the guard
        safe = None if lens is None else lens.clamp(0, scores.shape[-1])
        out = _ref.topb_gather(scores, k, v, b, lens=safe, pool_kernel=pool_kernel, keep_first=keep_first)
        _flag_bad_chunks(scores, lens, *out)
        return out
    call = _prepare(scores, k, v, b, lens, pool_kernel, keep_first)
    if call is not None:
        require_runnable(_select_topb_kernel, scores.device, "topb_gather")
        return _run(call, scores, k, v, lens)
    # Rows too long for the selection kernel's registers: torch selection, then the gather kernel.
    idx, kept = select_topb(scores, b, lens, pool_kernel, keep_first)
    k_out, v_out = gather_rows_launch(idx, k, v)
    if not checked:
        _flag_bad_chunks(scores, lens, k_out, v_out, idx, kept)
    return k_out, v_out, idx, kept


def _flag_bad_chunks(scores, lens, k_out, v_out, idx, kept) -> None:
    """Without a host check (the torch backend, rows longer than :data:`MAX_SELECT_T`): chunks with a NaN valid score or
    a length outside [0, T] get NaN ``k_out``/``v_out``, idx -1 and kept 0, as in the kernels, and
    set the error word (:func:`triton_kernels.check_errors`); no sync.

    The selection never indexes out of bounds whatever the values (indices come from a sort over
    T), so this only keeps a bad chunk from passing as plausible data.
    """
    n, _, t = scores.shape
    nan = torch.isnan(scores)  # [N, Hkv, T]
    if lens is not None:
        nan = nan & (torch.arange(t, device=scores.device) < lens[:, None])[:, None, :]
    bad = nan.flatten(1).any(1)  # [N]
    if lens is not None:
        bad = bad | (lens < 0) | (lens > t)
    if k_out.numel():
        k_out.masked_fill_(bad[:, None, None, None], float("nan"))
        v_out.masked_fill_(bad[:, None, None, None], float("nan"))
    idx.masked_fill_(bad[:, None, None], -1)
    kept.masked_fill_(bad, 0)
    word = _dispatch.error_word(scores.device)
    word.bitwise_or_(bad.any().to(torch.int32) * ERR_TOPB)


def _topb_fake(scores, k, v, b, lens, pool_kernel, keep_first, backend):
    n, h, _ = scores.shape
    d = k.shape[-1]
    return (
        k.new_empty((n, b, h, d)),
        v.new_empty((n, b, h, d)),
        k.new_empty((n, h, b), dtype=torch.long),
        k.new_empty((n,), dtype=torch.int32),
    )


# the registered op; its body runs the metadata checks first (triton_kernels._dispatch.register_op)
_topb_entry, _topb_op = _dispatch.register_op("topb_gather", _topb_impl, _validate, _topb_fake)


def topb_gather(
    scores: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    b: int,
    *,
    lens: torch.Tensor | None = None,
    pool_kernel: int = 7,
    keep_first: bool = True,
    backend: str | None = None,
):
    """Keep the top-``b`` tokens per (chunk, KV head) by max-pooled score; gather their K/V.

    Two axis orders, on purpose: ``scores`` are ``[N, Hkv, T]`` because the selection pools
    and sorts along the tokens, which must be the last (contiguous) dim, and because that is
    what :func:`chunk_attention_scores` and :func:`chunk_row_mass` return; ``k``/``v`` are
    ``[N, T, Hkv, D]``, token-major like the KV cache they come from and are written back to
    (``k_out`` is a slice of the pool's layout). A ``k`` passed as ``[N, Hkv, T, D]`` or scores
    as ``[N, T, Hkv]`` is a ValueError naming the transposed tensor (when ``T != Hkv``).

    Args:
        scores: ``[N, Hkv, T]`` token scores (any float dtype; higher = keep), e.g.
            ``mass`` of :func:`chunk_attention_scores` (+ :func:`chunk_row_mass`).
        k, v: ``[N, T, Hkv, D]`` chunk keys/values (fp32/fp16/bf16, same dtype).
        b: tokens kept per chunk and KV head, ``>= 1``: an int, a numpy integer or a 0-d integer
            tensor (bools and floats are refused).
        lens: ``[N]`` int32/int64 valid tokens per chunk in ``0..T``; None = all T.
        pool_kernel: (int, numpy integer or 0-d integer tensor) odd window of the max-pool along tokens (stride 1, same
            length, windows clipped at the chunk ends); 1 disables pooling.
        keep_first: always keep token 0 (BOS anchor) when the chunk is non-empty.
        backend: ``"triton"``, ``"torch"`` or None (auto).

    Returns:
        ``(k_out [N, b, Hkv, D], v_out [N, b, Hkv, D], idx [N, Hkv, b] int64, kept [N] int32)``:
        ``idx`` holds the selected token indices in ascending order, padded with
        ``-1`` when fewer than ``b`` tokens are valid; ``kept = min(b, lens)``;
        rows of ``k_out``/``v_out`` beyond ``kept`` are zeros. Equal pooled scores
        go to the lower token index.

    Raises:
        TypeError: non-float scores, unsupported/mismatched K/V dtypes, ``b`` /
            ``pool_kernel`` not int, ``keep_first`` not bool, lens not int32/int64.
        ValueError: bad ranks or shapes (the message names the expected layout), ``b < 1``, even or non-positive
            ``pool_kernel``, device mismatch, last dim of K/V not contiguous; lens outside
            ``[0, T]`` or NaN among the scores of valid tokens (beyond ``lens`` they are ignored)
            where the host value checks run (CPU, the torch backend, the checked mode). On CUDA
            by default such a chunk keeps nothing instead (``idx`` -1, ``kept`` 0, ``k_out`` /
            ``v_out`` NaN) and :func:`triton_kernels.check_errors` raises later (no host sync per call).
        RuntimeError: ``backend="triton"`` on CPU without ``TRITON_INTERPRET=1``.

    Algorithm: Prefilling-dLLM intra-chunk top-B with BOS kept; max-pooled
    scores as in SnapKV. Selection by a Triton radix select over the scores' bits
    with a prefix-sum compaction, gather by a second Triton kernel (see the module
    docstring); the torch backend is the naive stable-sort reference.
    """
    backend = _dispatch.resolve_backend(backend, k.device) if isinstance(k, torch.Tensor) else backend
    # MAX_SELECT_T: a record never outlives the limit it was prepared under (tests lower it)
    sig = V.signature("topb_gather", (scores, k, v, lens), (b, pool_kernel, keep_first, backend, MAX_SELECT_T))
    call = V.recall(sig)
    # 1 == True as dict keys: a seen signature still checks any b / pool_kernel / keep_first of another type
    if (
        call is None
        or type(b) is not int
        or type(pool_kernel) is not int
        or type(keep_first) is not bool
        or (type(call) is _TopbCall and not _current(call))
    ):  # metadata checks, memoised per metadata signature with the prepared call (made again when the
        # kernels were swapped: the AOT compile gate's stand-ins)
        b, pool_kernel = _validate(scores, k, v, b, lens, pool_kernel, keep_first)
        if backend == "triton" and sig is not None:
            call = _prepare(scores, k, v, b, lens, pool_kernel, keep_first)
        V.remember(sig, call)
    if type(call) is _TopbCall and _dispatch.eager():  # the prepared call: allocate, launch
        if _dispatch.values_checked(call.device_type):
            V.check_scores_values("topb_gather", scores, lens)
        return _run(call, scores, k, v, lens)
    return call_op(_topb_op, _topb_impl, scores, k, v, b, lens, pool_kernel, keep_first, backend)
