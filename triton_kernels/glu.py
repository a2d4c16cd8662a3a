"""``swiglu``: the gated activation of a SwiGLU MLP, ``silu(gate) * up``, in one launch.

A SwiGLU MLP (Shazeer 2020, "GLU Variants Improve Transformer"; Llama, Qwen2/Dream, LLaDA) computes
``down(silu(gate(x)) * up(x))``. In torch the middle is two kernels (``silu``, then the product),
the first writing and the second re-reading the ``[rows, I]`` intermediate; here one kernel reads
gate and up once and writes the product once. It takes the two projections as the model stores
them: two tensors (separate ``gate_proj`` / ``up_proj``), or one ``[..., 2I]`` tensor holding gate
then up (a fused gate-up projection, as vLLM's ``SiluAndMul`` takes it). The rounding is torch's:
``silu`` in fp32, rounded to the input dtype, then the product in fp32, rounded.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from triton_kernels import _validate as V
from triton_kernels import reference as _ref
from triton_kernels._dispatch import alloc, require_runnable, resolve_backend
from triton_kernels._launch import launch
from triton_kernels.plan import next_pow2  # plain Python: triton.next_power_of_2 costs us of host time

BLOCK_I = 1024  # columns per program: I = 18944 (Dream-7B) -> 19 column blocks per row

# ----------------------------------------------------------------------------- kernel


@triton.jit
def _swiglu_kernel(
    g_ptr,  # [R, I] gate rows, last dim contiguous
    u_ptr,  # [R, I] up rows, last dim contiguous
    o_ptr,  # [R, I] contiguous output
    n_cols,
    stride_gr,
    stride_ur,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = cols < n_cols
    g = tl.load(g_ptr + row * stride_gr + cols, mask=ok, other=0.0).to(tl.float32)
    u = tl.load(u_ptr + row * stride_ur + cols, mask=ok, other=0.0).to(tl.float32)
    act = (g / (1.0 + tl.exp(-g))).to(o_ptr.dtype.element_ty)  # silu, rounded as torch's F.silu output
    out = act.to(tl.float32) * u
    tl.store(o_ptr + row * n_cols + cols, out.to(o_ptr.dtype.element_ty), mask=ok)


# ----------------------------------------------------------------------------- launcher


def swiglu_launch(g2, u2):
    """Run the kernel on validated ``[R, I]`` gate and up (last dims contiguous; any row strides,
    e.g. the two halves of one fused projection). Returns a new contiguous ``[R, I]``."""
    require_runnable(_swiglu_kernel, g2.device, "swiglu")
    r, i = g2.shape
    out = alloc((r, i), g2.dtype, g2.device)
    if r == 0 or i == 0:
        return out
    block = min(BLOCK_I, next_pow2(i))
    args = (g2, u2, out, i, g2.stride(0), u2.stride(0), block)  # the kernel's signature order
    launch(_swiglu_kernel, (r, (i + block - 1) // block), args, 4)
    return out


def _rows(t: torch.Tensor) -> torch.Tensor:
    """``t [..., I]`` as ``[R, I]``: a view when the leading dims flatten to one row stride, else a copy."""
    return t.reshape(-1, t.shape[-1]) if t.dim() != 2 else t


# ----------------------------------------------------------------------------- public op


def swiglu(gate: torch.Tensor, up: torch.Tensor | None = None, *, backend: str | None = None) -> torch.Tensor:
    """``silu(gate) * up``, the SwiGLU activation, in one kernel.

    Args:
        gate: ``[..., I]`` gate projection (fp32, fp16 or bf16; last dim contiguous), or, with
            ``up=None``, ``[..., 2I]`` holding gate in its first I columns and up in its last I.
        up: ``[..., I]`` up projection (gate's shape, dtype and device; last dim contiguous) or None.
        backend: ``"triton"``, ``"torch"`` or ``None`` (auto, see :mod:`triton_kernels._dispatch`).

    Returns:
        ``[..., I]`` in the input dtype, a new contiguous tensor: ``F.silu(gate) * up`` with torch's
        rounding (silu computed in fp32 and rounded to the dtype, then the product rounded).

    Raises:
        TypeError: non-tensor input or a dtype outside fp32/fp16/bf16; gate and up of different dtypes.
        ValueError: a 0-d gate; ``up`` of another shape; an odd last dim for a fused gate-up
            tensor; tensors on different devices; a last dim that is not contiguous; bad ``backend``.
        RuntimeError: ``backend="triton"`` on CPU without ``TRITON_INTERPRET=1``.

    Algorithm: SwiGLU (Shazeer 2020), elementwise, fp32 arithmetic.
    """
    sig = V.signature("swiglu", (gate, up), ())
    if not V.passed(sig):  # metadata checks, memoised per metadata signature (a decode loop repeats one)
        _validate(gate, up)
        V.remember(sig)
    if resolve_backend(backend, gate.device) == "torch":
        return _ref.swiglu(gate, up)
    if up is None:
        i = gate.shape[-1] // 2
        g2 = _rows(gate)
        out = swiglu_launch(g2[:, :i], g2[:, i:])
    else:
        i = gate.shape[-1]
        out = swiglu_launch(_rows(gate), _rows(up))
    return out.view(*gate.shape[:-1], i)


def _validate(gate, up) -> None:
    op = "swiglu"
    V.check_tensors(op, gate=gate)
    if gate.dim() < 1:
        raise ValueError(f"{op}: gate must be [..., I] (or [..., 2I] with up=None), got a 0-d tensor")
    V.check_float(op, gate=gate, up=up)
    if up is not None:
        V.check_shape(op, "up", up, tuple(gate.shape), "gate's shape")
    elif gate.shape[-1] % 2:
        raise ValueError(f"{op}: a fused gate-up tensor needs an even last dim (gate then up), got {gate.shape[-1]}")
    V.check_device(op, gate=gate, up=up)
    V.check_last_dim_contiguous(op, gate=gate, up=up)
