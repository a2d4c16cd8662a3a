"""``merge_states``: -inf-safe log-sum-exp reduction of attention partials.

Given N partial attention states of the same rows, each a normalised output
``o_i`` over a subset of the keys and that subset's log-sum-exp ``lse_i``, the
state over the union of the key subsets is

    lse = log(sum_i exp(lse_i)),    o = sum_i exp(lse_i - lse) * o_i.

Source: the split-K reduction of flash-decoding, with the math of FlashInfer's
``merge_states`` (there in base 2; here natural log to match the rest of the
package). Associative and commutative; a partial with ``lse_i = -inf`` (no keys)
has weight exactly 0 and its ``o_i`` is never read into the sum (so it may hold
anything, even NaN). Rows whose partials are all -inf get ``o = 0``, ``lse = -inf``.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from triton_kernels import _validate as V
from triton_kernels import reference as _ref
from triton_kernels._dispatch import LN2_C as LN2
from triton_kernels._dispatch import LOG2E_C as LOG2E
from triton_kernels._dispatch import alloc, next_pow2, require_runnable, resolve_backend

# ----------------------------------------------------------------------------- kernel


@triton.jit
def _merge_states_kernel(
    o_ptr,  # [N, R, D] partial outputs, any float dtype, last dim contiguous
    lse_ptr,  # [N, R] partial LSEs (natural log)
    out_ptr,  # [R, D] merged output (its dtype decides the store cast)
    out_lse_ptr,  # [R] merged LSE, fp32
    n_parts,
    n_rows,
    stride_on,
    stride_or,
    stride_ln,
    stride_lr,
    stride_outr,
    HEAD_DIM: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    pid = tl.program_id(0)
    rows = pid * BLOCK_R + tl.arange(0, BLOCK_R)  # [BLOCK_R]
    offs_d = tl.arange(0, BLOCK_D)  # [BLOCK_D]
    row_ok = rows < n_rows
    rows64 = rows.to(tl.int64)

    # Pass 1: row max of the partial LSEs (base 2), so every weight below is <= 1.
    # Pointers advance by the partial stride each step (64-bit pointer math, no int32 overflow).
    m = tl.full([BLOCK_R], float("-inf"), tl.float32)  # [BLOCK_R]
    lse_ptrs = lse_ptr + rows64 * stride_lr  # [BLOCK_R]
    for _ in range(n_parts):
        lse_i = tl.load(lse_ptrs, mask=row_ok, other=float("-inf"))
        m = tl.maximum(m, lse_i.to(tl.float32) * LOG2E)
        lse_ptrs += stride_ln
    # All partials empty -> m = -inf; use 0 as the shift so exp2(-inf - 0) = 0 instead of NaN.
    m_safe = tl.where(m == float("-inf"), 0.0, m)  # [BLOCK_R]

    # Pass 2: weighted sum. Select (not multiply) so a zero-weight partial's o (maybe NaN) is ignored.
    acc = tl.zeros([BLOCK_R, BLOCK_D], tl.float32)  # [BLOCK_R, BLOCK_D]
    den = tl.zeros([BLOCK_R], tl.float32)  # [BLOCK_R]
    o_mask = row_ok[:, None] & (offs_d[None, :] < HEAD_DIM)  # [BLOCK_R, BLOCK_D]
    lse_ptrs = lse_ptr + rows64 * stride_lr  # [BLOCK_R]
    o_ptrs = o_ptr + rows64[:, None] * stride_or + offs_d[None, :]  # [BLOCK_R, BLOCK_D]
    for _ in range(n_parts):
        lse_i = tl.load(lse_ptrs, mask=row_ok, other=float("-inf"))
        w = tl.exp2(lse_i.to(tl.float32) * LOG2E - m_safe)  # [BLOCK_R], 0 for empty partials
        # Skip the read of dead partials entirely (empty segments are common in split-S).
        o_i = tl.load(o_ptrs, mask=o_mask & (w[:, None] > 0), other=0.0).to(tl.float32)  # [BLOCK_R, BLOCK_D]
        acc += tl.where(w[:, None] > 0, w[:, None] * o_i, 0.0)
        den += w
        lse_ptrs += stride_ln
        o_ptrs += stride_on

    live = den > 0
    den_safe = tl.where(live, den, 1.0)
    out = acc / den_safe[:, None]  # [BLOCK_R, BLOCK_D], exactly 0 for dead rows
    out_lse = tl.where(live, (m_safe + tl.log2(den_safe)) * LN2, float("-inf"))  # [BLOCK_R]
    tl.store(
        out_ptr + rows64[:, None] * stride_outr + offs_d[None, :],
        out.to(out_ptr.dtype.element_ty),
        mask=o_mask,
    )
    tl.store(out_lse_ptr + rows64, out_lse, mask=row_ok)


# ----------------------------------------------------------------------------- launcher


def merge_states_launch(o: torch.Tensor, lse: torch.Tensor, out_dtype: torch.dtype | None = None):
    """Run the merge kernel on validated inputs.

    o [N, R, D] (last dim contiguous), lse [N, R] -> (out [R, D] in ``out_dtype``
    (default o.dtype), lse [R] fp32). Used by ``split_s_attention`` for its phase 2.
    """
    require_runnable(_merge_states_kernel, o.device, "merge_states")
    n, r, d = o.shape
    out_dtype = o.dtype if out_dtype is None else out_dtype
    out = alloc((r, d), out_dtype, o.device)
    out_lse = alloc((r,), torch.float32, o.device)
    if r == 0:
        return out, out_lse
    if n == 0:
        out.zero_()
        out_lse.fill_(float("-inf"))
        return out, out_lse
    block_d = next_pow2(d)
    block_r = max(1, min(64, 2048 // block_d))  # ~2K elements per program: enough loads in flight
    grid = (triton.cdiv(r, block_r),)
    _merge_states_kernel[grid](
        o, lse, out, out_lse,
        n, r,
        o.stride(0), o.stride(1), lse.stride(0), lse.stride(1), out.stride(0),
        HEAD_DIM=d, BLOCK_R=block_r, BLOCK_D=block_d,
        num_warps=4,
    )  # fmt: skip
    return out, out_lse


def _validate(o, lse) -> None:
    op = "merge_states"
    for name, t in (("o", o), ("lse", lse)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{op}: {name} must be a torch.Tensor, got {type(t).__name__}")
    if o.dim() < 3:
        raise ValueError(f"{op}: o must be [N, *, H, D] (at least 3-D), got shape {tuple(o.shape)}")
    V.check_shape(op, "lse", lse, tuple(o.shape[:-1]), "o.shape[:-1] = [N, *, H]")
    if o.dtype not in V.FLOAT_DTYPES:
        raise TypeError(f"{op}: o has dtype {o.dtype}; supported: float32, float16, bfloat16")
    if lse.dtype not in V.FLOAT_DTYPES:
        raise TypeError(f"{op}: lse has dtype {lse.dtype}; supported: float32 (recommended), float16, bfloat16")
    V.check_device(op, o=o, lse=lse)
    V.check_last_dim_contiguous(op, o=o)


# ----------------------------------------------------------------------------- public op


@torch.library.custom_op("prefilling_dllm::merge_states", mutates_args=())
def _merge_states_op(o: torch.Tensor, lse: torch.Tensor, backend: str) -> tuple[torch.Tensor, torch.Tensor]:
    if backend == "torch":
        return _ref.merge_states(o, lse)
    n = o.shape[0]
    rest = o.shape[1:-1]
    rows = math.prod(rest)
    o3 = o.reshape(n, rows, o.shape[-1])  # a view when the leading dims allow it, else a copy
    l2 = lse.reshape(n, rows)
    out, out_lse = merge_states_launch(o3, l2)
    return out.view(*rest, o.shape[-1]), out_lse.view(*rest)


@_merge_states_op.register_fake
def _(o, lse, backend):
    return o.new_empty(o.shape[1:]), lse.new_empty(lse.shape[1:], dtype=torch.float32)


def merge_states(o: torch.Tensor, lse: torch.Tensor, *, backend: str | None = None):
    """Merge N partial attention states of the same rows into one.

    Args:
        o: ``[N, *, H, D]`` normalised partial outputs (fp32, fp16 or bf16; last dim
            contiguous). ``*`` is any number of leading dims (e.g. ``B, M``).
        lse: ``[N, *, H]`` their log-sum-exps, natural log (fp32 recommended).
            ``-inf`` marks a partial with no keys: it weighs nothing and its ``o`` is ignored.
        backend: ``"triton"``, ``"torch"`` or ``None`` (auto, see :mod:`triton_kernels._dispatch`).

    Returns:
        ``(o [*, H, D] in o.dtype, lse [*, H] fp32)`` with
        ``lse = log(sum_i exp(lse_i))`` and ``o = sum_i exp(lse_i - lse) * o_i``;
        rows with no live partial get ``o = 0`` and ``lse = -inf`` (never NaN).

    Raises:
        TypeError: non-tensor input or unsupported dtype.
        ValueError: shape mismatch (``lse.shape != o.shape[:-1]``), device mismatch,
            ``o`` not contiguous in its last dim, bad ``backend``.
        RuntimeError: ``backend="triton"`` on CPU without ``TRITON_INTERPRET=1``.

    Algorithm: flash-decoding split-K reduction; FlashInfer ``merge_states`` math in
    natural log. The kernel reads the LSEs twice (max, then weights) and each
    partial output once, computing in fp32.
    """
    _validate(o, lse)
    return _merge_states_op(o, lse, resolve_backend(backend, o.device))
