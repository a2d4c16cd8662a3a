"""``topb_gather``: keep the top-B tokens of every (chunk, KV head) and gather their K/V.

Intra-chunk sparsity of Prefilling-dLLM: after scoring (:mod:`triton_kernels.chunk_scores`)
each chunk keeps, per KV head, the ``b`` tokens with the highest max-pooled
score (pooling keeps neighbourhoods of salient tokens together, as SnapKV does),
always including token 0 (the BOS attention anchor), in their original order.

Split of the work, and why:

* **Selection in torch** (``pool_scores`` of the reference + one stable
  descending sort + one ascending sort). It runs once per chunk at prefill time,
  never in the decode loop, on ``[N, Hkv, T]`` with T ~ 1K: a few microseconds
  of sort kernels. The stable sort gives exactly the documented tie rule (equal
  pooled scores go to the lower index) and is deterministic. A Triton top-k on
  Triton 3.6 would need ``tl.sort``'s bitonic network on power-of-two rows with
  the token index packed into the sort key for stability; not worth it here.
* **Gather in Triton** (``_gather_rows_kernel``): copies the selected rows of
  K and V into the compact pool ``[N, b, Hkv, D]`` in one pass (padding rows are
  written as zeros), reading only the selected rows, from any row strides
  (64-bit offsets).

NaN scores have no rank (a sort would place them arbitrarily): the host value checks
reject NaN among the valid tokens' scores with a ``ValueError``; where they are off (CUDA by
default, see :mod:`triton_kernels._dispatch`; either backend) such a chunk's ``k_out``/``v_out`` are
NaN, its ``idx`` -1 and its ``kept`` -1, and :func:`triton_kernels.check_errors` raises.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from triton_kernels import _validate as V
from triton_kernels import reference as _ref
from triton_kernels._dispatch import (
    ERR_TOPB,
    alloc,
    call_op,
    check_values_enabled,
    error_word,
    require_runnable,
    resolve_backend,
)
from triton_kernels._launch import launch
from triton_kernels.plan import cdiv, next_pow2

# ----------------------------------------------------------------------------- kernel


@triton.jit
def _copy_rows(src, stride_src, dst, stride_dst, tok, offs_b, offs_d, src_mask, dst_mask):
    """Rows ``tok`` of one (chunk, KV head) of ``src`` to rows ``offs_b`` of ``dst``: the same copy for K and V."""
    x = tl.load(src + tok[:, None] * stride_src + offs_d[None, :], mask=src_mask, other=0.0)  # [BLOCK_B, BLOCK_D]
    tl.store(dst + offs_b[:, None] * stride_dst + offs_d[None, :], x, mask=dst_mask)


@triton.jit
def _gather_rows_kernel(
    idx_ptr,  # [N, Hkv, b] int64 selected token per output row, -1 = padding
    k_ptr,  # [N, T, Hkv, D]
    v_ptr,
    ko_ptr,  # [N, b, Hkv, D] out
    vo_ptr,
    n_out,  # b
    stride_in, stride_ih, stride_ib,
    stride_kn, stride_kt, stride_kh,
    stride_vn, stride_vt, stride_vh,
    stride_kon, stride_kob, stride_koh,
    stride_von, stride_vob, stride_voh,
    HEAD_DIM: tl.constexpr,
    BLOCK_B: tl.constexpr,
    BLOCK_D: tl.constexpr,
):  # fmt: skip
    pid_b = tl.program_id(0)
    h = tl.program_id(1).to(tl.int64)
    n = tl.program_id(2).to(tl.int64)  # 64-bit offsets throughout: n * stride_kn may pass 2**31
    offs_b = pid_b * BLOCK_B + tl.arange(0, BLOCK_B)  # [BLOCK_B] output rows
    offs_d = tl.arange(0, BLOCK_D)  # [BLOCK_D]
    b_ok = offs_b < n_out
    offs_b = offs_b.to(tl.int64)
    tok = tl.load(idx_ptr + n * stride_in + h * stride_ih + offs_b * stride_ib, mask=b_ok, other=-1)  # [BLOCK_B]
    sel = tok >= 0
    tok = tl.where(sel, tok, 0).to(tl.int64)
    d_ok = offs_d[None, :] < HEAD_DIM
    src_mask = sel[:, None] & d_ok  # [BLOCK_B, BLOCK_D]: padding rows read nothing...
    dst_mask = b_ok[:, None] & d_ok  # ...but are written (as zeros)
    src_k, dst_k = k_ptr + n * stride_kn + h * stride_kh, ko_ptr + n * stride_kon + h * stride_koh
    _copy_rows(src_k, stride_kt, dst_k, stride_kob, tok, offs_b, offs_d, src_mask, dst_mask)
    src_v, dst_v = v_ptr + n * stride_vn + h * stride_vh, vo_ptr + n * stride_von + h * stride_voh
    _copy_rows(src_v, stride_vt, dst_v, stride_vob, tok, offs_b, offs_d, src_mask, dst_mask)


# ----------------------------------------------------------------------------- launcher


def select_topb(scores, b, lens, pool_kernel, keep_first):
    """Selection (torch): ``(idx [N, Hkv, b] int64 ascending, -1 padded, kept [N] int32)``.

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


def gather_rows_launch(idx, k, v):
    """Gather ``k[n, idx[n, h, j], h]`` into ``k_out[n, j, h]`` (zeros where idx = -1); same for v."""
    require_runnable(_gather_rows_kernel, k.device, "topb_gather")
    n, h, b = idx.shape
    d = k.shape[-1]
    k_out = alloc((n, b, h, d), k.dtype, k.device)
    v_out = alloc((n, b, h, d), v.dtype, v.device)
    if k_out.numel() == 0:
        return k_out, v_out
    block_d = next_pow2(d)
    block_b = max(1, min(64, 4096 // block_d, next_pow2(b)))
    args = (
        idx,
        k,
        v,
        k_out,
        v_out,
        b,
        *idx.stride(),
        *k.stride()[:3],
        *v.stride()[:3],
        *k_out.stride()[:3],
        *v_out.stride()[:3],
        d,
        block_b,
        block_d,
    )  # the kernel's signature order (triton_kernels._launch.launch)
    launch(_gather_rows_kernel, (cdiv(b, block_b), h, n), args, 4)
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
    checked = check_values_enabled(k.device if backend == "triton" else None)
    if checked:
        V.check_scores_values("topb_gather", scores, lens)
    if backend == "torch":
        if checked:
            return _ref.topb_gather(scores, k, v, b, lens=lens, pool_kernel=pool_kernel, keep_first=keep_first)
        # unchecked: the reference runs on lengths clamped into [0, T] (it indexes with them), then the guard
        safe = None if lens is None else lens.clamp(0, scores.shape[-1])
        out = _ref.topb_gather(scores, k, v, b, lens=safe, pool_kernel=pool_kernel, keep_first=keep_first)
        return _flag_bad_chunks(scores, lens, *out)
    idx, kept = select_topb(scores, b, lens, pool_kernel, keep_first)
    k_out, v_out = gather_rows_launch(idx, k, v)
    if not checked:
        return _flag_bad_chunks(scores, lens, k_out, v_out, idx, kept)
    return k_out, v_out, idx, kept


BAD_CHUNK_KEPT = -1  # kept[n] of a chunk flagged bad without a host check (a valid chunk keeps >= 0)


def _flag_bad_chunks(scores, lens, k_out, v_out, idx, kept):
    """Without a host check: a chunk with a NaN valid score or a length outside [0, T] gets NaN
    ``k_out``/``v_out``, ``idx`` -1 everywhere and ``kept`` :data:`BAD_CHUNK_KEPT` (-1), and sets the
    error word (:func:`triton_kernels.check_errors`); no sync. Returns the four outputs (changed in place).

    The selection never indexes out of bounds whatever the values (indices come from a sort over
    T), so this only keeps a bad chunk from passing as plausible data (indices or a count included).
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
    kept.masked_fill_(bad, BAD_CHUNK_KEPT)
    word = error_word(scores.device)
    word.bitwise_or_(bad.any().to(torch.int32) * ERR_TOPB)
    return k_out, v_out, idx, kept


def _topb_entry(
    scores: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    b: int,
    lens: torch.Tensor | None,
    pool_kernel: int,
    keep_first: bool,
    backend: str,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The registered op: metadata checks first (a direct ``torch.ops`` call skips the public function's)."""
    _validate(scores, k, v, b, lens, pool_kernel, keep_first)
    return _topb_impl(scores, k, v, b, lens, pool_kernel, keep_first, backend)


_topb_op = torch.library.custom_op("prefilling_dllm::topb_gather", _topb_entry, mutates_args=())


@_topb_op.register_fake
def _(scores, k, v, b, lens, pool_kernel, keep_first, backend):
    n, h, _ = scores.shape
    d = k.shape[-1]
    return (
        k.new_empty((n, b, h, d)),
        v.new_empty((n, b, h, d)),
        k.new_empty((n, h, b), dtype=torch.long),
        k.new_empty((n,), dtype=torch.int32),
    )


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
            by default, and with either backend inside :func:`skip_value_checks`, such a chunk's
            ``k_out``/``v_out`` are NaN instead, its ``idx`` -1 everywhere and its ``kept`` -1
            (:data:`BAD_CHUNK_KEPT`, a count no valid chunk has), and :func:`triton_kernels.check_errors`
            raises later (no host sync per call).
        RuntimeError: ``backend="triton"`` on CPU without ``TRITON_INTERPRET=1``.

    Algorithm: Prefilling-dLLM intra-chunk top-B with BOS kept; max-pooled
    scores as in SnapKV. Selection by torch stable sort (see module docstring
    for why), gather by a Triton kernel.
    """
    sig = V.signature("topb_gather", (scores, k, v, lens), (b, pool_kernel, keep_first))
    if not V.passed(sig) or type(b) is not int or type(pool_kernel) is not int:  # memoised metadata checks
        b, pool_kernel = _validate(scores, k, v, b, lens, pool_kernel, keep_first)
        V.remember(sig)
    args = (scores, k, v, b, lens, pool_kernel, keep_first, resolve_backend(backend, k.device))
    return call_op(_topb_op, _topb_impl, *args)
