"""``merge_states``: -inf-safe log-sum-exp reduction of attention partials.

Given N partial attention states of the same rows, each a normalised output
``o_i`` over a subset of the keys and that subset's log-sum-exp ``lse_i``, the
state over the union of the key subsets is

    lse = log(sum_i exp(lse_i)),    o = sum_i exp(lse_i - lse) * o_i.

Source: the split-K reduction of flash-decoding, with the math of FlashInfer's
``merge_states`` (there in base 2; here natural log to match the rest of the
package). Associative and commutative. Special LSE values, the same on both backends:

* ``-inf`` (no keys): weight exactly 0, and its ``o_i`` is never read into the sum
  (it may hold anything, even NaN). Rows whose partials are all -inf get ``o = 0``,
  ``lse = -inf``.
* ``+inf`` (an overflowed partial: infinite mass): it outweighs every finite partial,
  so the row gets ``lse = +inf`` and ``o`` = the mean of the +inf partials' ``o_i``
  (the limit of the formula as their LSEs grow together); never NaN.
* NaN (a partial that met a non-finite logit, see :mod:`triton_kernels.reference`): the
  row gets ``o = NaN`` and ``lse = NaN``, whatever its other partials hold.

Every partial with ``lse > -inf`` enters the sum as ``w_i * o_i``, so a NaN in such a
partial's ``o_i`` reaches the output even when its weight ``w_i`` underflows to 0.

The kernel makes one pass: each step issues the loads of up to 16 partials at once
(addresses do not depend on loaded data) and folds them in with a running max.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from triton_kernels import _dispatch, _launch
from triton_kernels import _validate as V
from triton_kernels import plan as _plan
from triton_kernels import reference as _ref
from triton_kernels._constants import LN2, LOG2E
from triton_kernels._dispatch import call_op, require_runnable  # per module: tests patch these
from triton_kernels._launch import PreparedLaunch
from triton_kernels.plan import gpu_spec, plan_merge

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
    N_UNROLL: tl.constexpr,  # partials per unrolled step (== N when N <= 16: one step)
):
    pid = tl.program_id(0)
    rows = pid * BLOCK_R + tl.arange(0, BLOCK_R)  # [BLOCK_R]
    offs_d = tl.arange(0, BLOCK_D)  # [BLOCK_D]
    row_ok = rows < n_rows
    rows64 = rows.to(tl.int64)
    o_mask = row_ok[:, None] & (offs_d[None, :] < HEAD_DIM)  # [BLOCK_R, BLOCK_D]
    lse_base = lse_ptr + rows64 * stride_lr  # [BLOCK_R]
    o_base = o_ptr + rows64[:, None] * stride_or + offs_d[None, :]  # [BLOCK_R, BLOCK_D]

    m = tl.full([BLOCK_R], float("-inf"), tl.float32)  # running max of the finite base-2 LSEs
    den = tl.zeros([BLOCK_R], tl.float32)  # sum of exp2(lse2_i - m) over finite partials
    acc = tl.zeros([BLOCK_R, BLOCK_D], tl.float32)  # sum of exp2(lse2_i - m) * o_i
    n_inf = tl.zeros([BLOCK_R], tl.float32)  # +inf partials seen
    any_nan = tl.zeros([BLOCK_R], tl.int1)  # a NaN partial makes the row NaN
    acc_inf = tl.zeros([BLOCK_R, BLOCK_D], tl.float32)  # sum of their o_i
    for n0 in range(0, n_parts, N_UNROLL):
        for i in tl.static_range(N_UNROLL):
            n = n0 + i + tl.zeros([], tl.int64)
            # Masks depend on shapes only, so all loads of the step are in flight together. (A
            # [BLOCK_R] vector, not a scalar: the interpreter cannot AND a scalar into a mask.)
            ok = row_ok & (tl.zeros([BLOCK_R], tl.int64) + n < n_parts)  # [BLOCK_R]
            lse_i = tl.load(lse_base + n * stride_ln, mask=ok, other=float("-inf"))
            lse_i = lse_i.to(tl.float32) * LOG2E  # [BLOCK_R] base 2
            o_i = tl.load(o_base + n * stride_on, mask=ok[:, None] & o_mask, other=0.0).to(tl.float32)
            is_inf = lse_i == float("inf")
            fin = tl.where(is_inf, float("-inf"), lse_i)
            m_new = tl.maximum(m, fin)
            shift = tl.where(m_new == float("-inf"), 0.0, m_new)  # exp2(-inf - 0) = 0, not NaN
            scale = tl.exp2(m - shift)  # [BLOCK_R] rescales what was summed so far
            w = tl.exp2(fin - shift)  # [BLOCK_R], 0 for empty partials
            # Select, not multiply: an empty partial's o (maybe NaN) is ignored.
            acc = acc * scale[:, None] + tl.where(fin[:, None] > float("-inf"), w[:, None] * o_i, 0.0)
            den = den * scale + w
            acc_inf += tl.where(is_inf[:, None], o_i, 0.0)
            n_inf += is_inf.to(tl.float32)
            any_nan = any_nan | (lse_i != lse_i)
            m = m_new

    has_inf = n_inf > 0
    live = den > 0
    den_safe = tl.where(live, den, 1.0)
    out = tl.where(live[:, None], acc / den_safe[:, None], 0.0)  # [BLOCK_R, BLOCK_D], 0 for dead rows
    out = tl.where(has_inf[:, None], acc_inf / tl.maximum(n_inf, 1.0)[:, None], out)
    out_lse = tl.where(live, (m + tl.log2(den_safe)) * LN2, float("-inf"))  # [BLOCK_R]
    out_lse = tl.where(has_inf, float("inf"), out_lse)
    out = tl.where(any_nan[:, None], float("nan"), out)
    out_lse = tl.where(any_nan, float("nan"), out_lse)
    tl.store(
        out_ptr + rows64[:, None] * stride_outr + offs_d[None, :],
        out.to(out_ptr.dtype.element_ty),
        mask=o_mask,
    )
    tl.store(out_lse_ptr + rows64, out_lse, mask=row_ok)


# ----------------------------------------------------------------------------- launcher


def merge_prepared(n, r, d, o_stride, o_row_stride, lse_stride, lse_row_stride, plan) -> PreparedLaunch:
    """The merge kernel's launch for ``n`` partials of ``r`` rows of head dim ``d`` (strides in
    elements: between partials and between rows, of o and of lse), outputs contiguous; pointers
    ``(o, lse, out, out_lse)``. ``plan``: :func:`triton_kernels.plan.plan_merge` of these sizes."""
    tail = (
        n,
        r,
        o_stride,
        o_row_stride,
        lse_stride,
        lse_row_stride,
        d,  # out's row stride: it is allocated contiguous
        d,
        plan.block_r,
        plan.block_d,
        plan.n_unroll,
    )  # the kernel's signature order after its 4 pointers (triton_kernels._launch.launch)
    return PreparedLaunch(_merge_states_kernel, plan.grid, tail, plan.num_warps)


class _MergeCall:
    """A prepared merge (:func:`_prepare`): output specs and the launch; a call supplies the pointers."""

    __slots__ = ("out", "lse", "launch", "native", "device_type")


def _prepare(o, lse, out_dtype=None, plan=None, rows_shape=None, row_strides=None):
    """The :class:`_MergeCall` for these inputs' metadata (see :func:`merge_states_launch`), or None
    when nothing is launched (no row, or no partial)."""
    if rows_shape is None:
        n, r, d = o.shape
        out_shape, lse_shape = (r, d), (r,)
        row_strides = (o.stride(1), lse.stride(1))
    else:
        n, d, r = o.shape[0], o.shape[-1], math.prod(rows_shape)
        out_shape, lse_shape = (*rows_shape, d), tuple(rows_shape)
    if r == 0 or n == 0:
        return None
    call = _MergeCall()
    call.out = _dispatch.out_spec(out_shape, o.dtype if out_dtype is None else out_dtype, o.device)
    call.lse = _dispatch.out_spec(lse_shape, torch.float32, o.device)
    plan = plan_merge(n, r, d, gpu_spec(o.device)) if plan is None else plan
    call.launch = merge_prepared(n, r, d, o.stride(0), row_strides[0], lse.stride(0), row_strides[1], plan)
    call.device_type = o.device.type
    call.native = call.device_type == "cuda"  # else require_runnable per call
    return call


def _run(call: _MergeCall, o, lse):
    if not call.native and _launch._STUB is None:
        require_runnable(_merge_states_kernel, o.device, "merge_states")
    out, out_lse = _dispatch.alloc_spec(call.out), _dispatch.alloc_spec(call.lse)
    call.launch((o, lse, out, out_lse), not (o.data_ptr() | lse.data_ptr()) & 15)
    return out, out_lse


def merge_states_launch(
    o: torch.Tensor,
    lse: torch.Tensor,
    out_dtype: torch.dtype | None = None,
    *,
    plan=None,
    rows_shape=None,
    row_strides=None,
):
    """Run the merge kernel on validated inputs.

    o [N, R, D] (last dim contiguous), lse [N, R] -> (out [R, D] in ``out_dtype``
    (default o.dtype), lse [R] fp32). ``plan``: a :class:`triton_kernels.plan.MergePlan`
    for these shapes, else planned here.
    ``rows_shape``, ``row_strides``: o is ``[N, *rows_shape, D]`` and lse ``[N, *rows_shape]``,
    whose row dims flatten to the row strides ``(o's, lse's)``; the outputs are then
    ``[*rows_shape, D]`` and ``[*rows_shape]`` (no reshape on the way in or out).
    """
    require_runnable(_merge_states_kernel, o.device, "merge_states")
    call = _prepare(o, lse, out_dtype, plan, rows_shape, row_strides)
    if call is not None:
        return _run(call, o, lse)
    out_dtype = o.dtype if out_dtype is None else out_dtype
    if rows_shape is None:
        out_shape, lse_shape = (o.shape[1], o.shape[2]), (o.shape[1],)
    else:
        out_shape, lse_shape = (*rows_shape, o.shape[-1]), tuple(rows_shape)
    out = _dispatch.alloc(out_shape, out_dtype, o.device)
    out_lse = _dispatch.alloc(lse_shape, torch.float32, o.device)
    if out_lse.numel() == 0:
        return out, out_lse
    return out.zero_(), out_lse.fill_(float("-inf"))  # no partial: no key


def _validate(o, lse) -> None:
    op = "merge_states"
    V.check_tensors(op, o=o, lse=lse)
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


def _prepare_public(o: torch.Tensor, lse: torch.Tensor):
    """The prepared call of a public ``merge_states`` on the Triton backend, or None when its row dims
    do not flatten to one stride (a reshape copy first) or nothing is launched."""
    so, sl = _row_stride(o, 1, o.dim() - 1), _row_stride(lse, 1, lse.dim())
    if so is None or sl is None:
        return None
    return _prepare(o, lse, rows_shape=tuple(o.shape[1:-1]), row_strides=(so, sl))


def _merge_states_impl(o: torch.Tensor, lse: torch.Tensor, backend: str) -> tuple[torch.Tensor, torch.Tensor]:
    if backend == "torch":
        return _ref.merge_states(o, lse)
    n = o.shape[0]
    rest = o.shape[1:-1]
    rows = math.prod(rest)
    so, sl = _row_stride(o, 1, o.dim() - 1), _row_stride(lse, 1, lse.dim())
    if so is not None and sl is not None:  # no reshape: the row dims flatten to one stride each
        return merge_states_launch(o, lse, rows_shape=rest, row_strides=(so, sl))
    o3 = o.reshape(n, rows, o.shape[-1])  # a copy: the row dims do not flatten to one stride
    l2 = lse.reshape(n, rows)
    out, out_lse = merge_states_launch(o3, l2)
    return out.view(*rest, o.shape[-1]), out_lse.view(*rest)


def _row_stride(t: torch.Tensor, lo: int, hi: int) -> int | None:
    """The one stride of the rows when dims ``lo..hi-1`` of ``t`` flatten without a copy, else None."""
    shape, stride = t.shape, t.stride()
    dims = [i for i in range(lo, hi) if shape[i] != 1]  # size-1 dims have any stride
    for a, b in zip(dims, dims[1:]):
        if stride[a] != stride[b] * shape[b]:
            return None
    return stride[dims[-1]] if dims else 0


def _merge_states_fake(o, lse, backend):
    return o.new_empty(o.shape[1:]), lse.new_empty(lse.shape[1:], dtype=torch.float32)


# the registered op; its body runs the metadata checks first (triton_kernels._dispatch.register_op)
_merge_states_entry, _merge_states_op = _dispatch.register_op(
    "merge_states", _merge_states_impl, _validate, _merge_states_fake
)


def merge_states(o: torch.Tensor, lse: torch.Tensor, *, backend: str | None = None):
    """Merge N partial attention states of the same rows into one.

    Args:
        o: ``[N, *, H, D]`` normalised partial outputs (fp32, fp16 or bf16; last dim
            contiguous). ``*`` is any number of leading dims (e.g. ``B, M``).
        lse: ``[N, *, H]`` their log-sum-exps, natural log (fp32 recommended).
            ``-inf`` marks a partial with no keys: it weighs nothing and its ``o`` is ignored.
            ``+inf`` marks an overflowed partial: see the module docstring (never NaN).
            A NaN LSE makes its row NaN (``o`` and ``lse``), as on every backend.
        backend: ``"triton"``, ``"torch"`` or ``None`` (auto, see :mod:`triton_kernels._dispatch`).

    Returns:
        ``(o [*, H, D] in o.dtype, lse [*, H] fp32)`` with
        ``lse = log(sum_i exp(lse_i))`` and ``o = sum_i exp(lse_i - lse) * o_i``;
        rows with no live partial get ``o = 0`` and ``lse = -inf``; rows with +inf
        partials get the mean of those partials' ``o`` and ``lse = +inf``; rows with a NaN
        partial LSE get ``o = NaN`` and ``lse = NaN`` (NaN propagates; a NaN in a live
        partial's ``o`` propagates into those components of ``o``).

    Raises:
        TypeError: non-tensor input or unsupported dtype.
        ValueError: shape mismatch (``lse.shape != o.shape[:-1]``), device mismatch,
            ``o`` not contiguous in its last dim, bad ``backend``.
        RuntimeError: ``backend="triton"`` on CPU without ``TRITON_INTERPRET=1``.

    Algorithm: flash-decoding split-K reduction; FlashInfer ``merge_states`` math in
    natural log, folded in one pass with a running max (online softmax) in fp32.
    """
    backend = _dispatch.resolve_backend(backend, o.device) if isinstance(o, torch.Tensor) else backend
    sig = V.signature("merge_states", (o, lse), (backend, _plan.assumed_gpu()))
    call = V.recall(sig)
    if call is None or (type(call) is _MergeCall and call.launch.kernel is not _merge_states_kernel):
        # metadata checks, memoised per metadata signature with the prepared call (made again when the
        # kernel was swapped: the AOT compile gate's stand-in)
        _validate(o, lse)
        if backend == "triton" and sig is not None:
            call = _prepare_public(o, lse)
        V.remember(sig, call)
    if type(call) is _MergeCall and _dispatch.eager():  # the prepared call: allocate, launch
        return _run(call, o, lse)
    return call_op(_merge_states_op, _merge_states_impl, o, lse, backend)
