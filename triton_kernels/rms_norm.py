"""``add_rms_norm``: the residual add and the RMSNorm of a pre-norm transformer block in one launch.

A Llama/Qwen2-style block computes, between its sublayers,

    s = x + residual                                  (the new residual stream, in x's dtype)
    y = weight * (s * rsqrt(mean(s^2) + eps))         (RMSNorm, Zhang & Sennrich 2019)

In torch that is one add plus about eight elementwise/reduction kernels (cast, square, mean,
add eps, rsqrt, scale, cast back, weight product), each reading and writing the whole
``[rows, hidden]`` activation. Here one program per row loads ``x`` and ``residual`` once,
writes ``s`` and ``y`` once. The same idea as the fused ``add_rms_norm`` kernels of vLLM
and FlashInfer (``fused_add_rmsnorm``); the arithmetic follows this package's torch model
(:class:`dllm.model.modeling.RMSNorm`, the Qwen2/LLaDA convention) rounding for rounding:
the sum is rounded to x's dtype, the normalisation runs in fp32 on that rounded sum, is
rounded to x's dtype, then multiplied by the weight in the result dtype.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from triton_kernels import _validate as V
from triton_kernels import reference as _ref
from triton_kernels._dispatch import alloc, require_runnable, resolve_backend
from triton_kernels._launch import launch
from triton_kernels.plan import next_pow2  # plain Python: triton.next_power_of_2 costs us of host time

# ----------------------------------------------------------------------------- kernel


@triton.jit
def _add_rms_norm_kernel(
    x_ptr,  # [R, H] input rows, last dim contiguous
    res_ptr,  # [R, H] residual rows (ignored when not HAS_RESIDUAL)
    w_ptr,  # [H] weight
    y_ptr,  # [R, H] normalised output (its dtype decides the store cast), contiguous
    s_ptr,  # [R, H] x + residual in x's dtype, contiguous (ignored when not HAS_RESIDUAL)
    n_cols,
    stride_xr,
    stride_rr,
    eps,
    HAS_RESIDUAL: tl.constexpr,
    BLOCK_H: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_H)
    ok = cols < n_cols
    x = tl.load(x_ptr + row * stride_xr + cols, mask=ok, other=0.0)
    if HAS_RESIDUAL:
        r = tl.load(res_ptr + row * stride_rr + cols, mask=ok, other=0.0)
        # torch rounds x + residual to x's dtype: so does the residual stream here
        s = (x.to(tl.float32) + r.to(tl.float32)).to(x_ptr.dtype.element_ty)
        tl.store(s_ptr + row * n_cols + cols, s, mask=ok)
    else:
        s = x
    sf = s.to(tl.float32)
    ms = tl.sum(sf * sf, axis=0) / n_cols  # masked lanes hold 0
    normed = (sf * tl.math.rsqrt(ms + eps)).to(x_ptr.dtype.element_ty)  # rounded to x's dtype as torch does
    w = tl.load(w_ptr + cols, mask=ok, other=0.0)
    y = normed.to(tl.float32) * w.to(tl.float32)
    tl.store(y_ptr + row * n_cols + cols, y.to(y_ptr.dtype.element_ty), mask=ok)


# ----------------------------------------------------------------------------- launcher


def _num_warps(block_h: int) -> int:
    # about 16 fp32 values per thread per operand: H=3584 (BLOCK 4096) -> 8 warps, no spill
    return max(1, min(16, block_h // 512))


def add_rms_norm_launch(x2, w, eps: float, res2=None):
    """Run the kernel on validated 2-D inputs: ``x2 [R, H]`` (last dim contiguous), ``res2`` like it
    or None, ``w [H]`` contiguous. Returns ``(y [R, H], s [R, H] or None)`` contiguous."""
    require_runnable(_add_rms_norm_kernel, x2.device, "add_rms_norm")
    r, h = x2.shape
    y = alloc((r, h), torch.promote_types(x2.dtype, w.dtype), x2.device)
    s = alloc((r, h), x2.dtype, x2.device) if res2 is not None else None
    if r == 0 or h == 0:
        return y, s
    block_h = next_pow2(h)
    args = (
        x2,
        res2 if res2 is not None else x2,
        w,
        y,
        s if s is not None else y,
        h,
        x2.stride(0),
        res2.stride(0) if res2 is not None else 0,
        float(eps),
        res2 is not None,
        block_h,
    )  # the kernel's signature order (triton_kernels._launch.launch)
    launch(_add_rms_norm_kernel, (r,), args, _num_warps(block_h))
    return y, s


def _rows(t: torch.Tensor) -> torch.Tensor:
    """``t`` as ``[R, H]`` without a copy when its leading dims flatten to one stride (else a copy).
    ``R`` is spelt out: ``reshape(-1, 0)`` is ambiguous for a hidden size of 0 (an empty result, as torch's)."""
    return t.reshape(math.prod(t.shape[:-1]), t.shape[-1])


# ----------------------------------------------------------------------------- public op


def add_rms_norm(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    residual: torch.Tensor | None = None,
    *,
    backend: str | None = None,
):
    """RMSNorm of ``x + residual`` (or of ``x``), returning the normalised rows and the new residual stream.

    Args:
        x: ``[..., H]`` activations (fp32, fp16 or bf16; last dim contiguous).
        weight: ``[H]`` RMSNorm weight (fp32, fp16 or bf16; same device).
        eps: the epsilon added to the mean square (a finite float >= 0).
        residual: optional ``[..., H]`` like ``x`` (same shape, dtype and device; last dim contiguous).
        backend: ``"triton"``, ``"torch"`` or ``None`` (auto, see :mod:`triton_kernels._dispatch`).

    Returns:
        ``(y, s)``. ``s = x + residual`` rounded to ``x.dtype`` (None when ``residual`` is None);
        ``y [..., H]`` in ``promote_types(x.dtype, weight.dtype)``:
        ``weight * (sf * rsqrt(mean(sf^2, -1) + eps)).to(x.dtype)`` with ``sf`` the fp32 value of ``s``
        (of ``x`` without a residual), the rounding of :class:`dllm.model.modeling.RMSNorm`.
        Both outputs are new contiguous tensors. A row of zeros gives zeros (``eps > 0``); NaN/inf in
        a row make that row's ``y`` non-finite, as in torch. ``H = 0`` (or no row) gives empty outputs
        of that shape on both backends.

    Raises:
        TypeError: non-tensor input or a dtype outside fp32/fp16/bf16; ``residual`` of another dtype.
        ValueError: ``weight`` not ``[H]``; ``residual`` of another shape; tensors on different
            devices; a last dim that is not contiguous; ``eps`` negative or not finite; bad ``backend``.
        RuntimeError: ``backend="triton"`` on CPU without ``TRITON_INTERPRET=1``.

    Algorithm: fused residual add + RMSNorm (Zhang & Sennrich 2019, "Root Mean Square Layer
    Normalization"; the fusion as in vLLM's / FlashInfer's ``fused_add_rmsnorm``), one program per row,
    the sum of squares in fp32.
    """
    sig = V.signature("add_rms_norm", (x, weight, residual), (eps, type(eps)))  # True == 1 as keys
    if not V.passed(sig):  # metadata checks, memoised per metadata signature (a decode loop repeats one)
        _validate(x, weight, eps, residual)
        V.remember(sig)
    if resolve_backend(backend, x.device) == "torch":
        return _ref.add_rms_norm(x, weight, eps, residual)
    x2 = _rows(x)
    res2 = _rows(residual) if residual is not None else None
    y, s = add_rms_norm_launch(x2, weight.contiguous(), eps, res2)
    shape = tuple(x.shape)
    return y.view(shape), (s.view(shape) if s is not None else None)


def _validate(x, weight, eps, residual) -> None:
    op = "add_rms_norm"
    V.check_tensors(op, x=x, weight=weight)
    if x.dim() < 1:
        raise ValueError(f"{op}: x must be [..., H], got a 0-d tensor")
    V.check_float(op, x=x, residual=residual)
    V.check_float(op, weight=weight)
    V.check_shape(op, "weight", weight, (x.shape[-1],), "[H] (x's last dim)")
    if residual is not None:
        V.check_shape(op, "residual", residual, tuple(x.shape), "x's shape")
    V.check_device(op, x=x, weight=weight, residual=residual)
    V.check_last_dim_contiguous(op, x=x, residual=residual)
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not (0.0 <= float(eps) < float("inf")):
        raise ValueError(f"{op}: eps must be a finite float >= 0, got {eps!r}")
