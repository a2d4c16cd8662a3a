"""``rope_qk``: rotary position embedding of q and k in one launch, positions per token.

RoPE (Su et al. 2021, "RoFormer: Enhanced Transformer with Rotary Position Embedding") in the
rotate-half layout of Llama, Qwen2/Dream and LLaDA (and of :func:`dllm.model.rope.apply_rope`): with
``h = D/2``, channel ``i < h`` and its partner ``i + h`` of every head turn by the token's angle,

    out[i]     = x[i]     * cos[i]     - x[i + h] * sin[i]
    out[i + h] = x[i + h] * cos[i + h] + x[i]     * sin[i + h]

with ``cos``/``sin`` the token's ``[D]`` tables (the ``D/2`` angles repeated twice, a YaRN factor
already folded in), computed in fp32 and rounded once to the input dtype. In torch that is about
seven kernels per tensor (cast, two products, a negated slice, a cat, an add, a cast back), so
fourteen for q and k; here one program per token loads that token's tables once and rotates
all its query and key heads. The tables are per token (``[B, L, D]``), so cached segments, live
tokens and ragged rows at any positions are all one launch.
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

# ----------------------------------------------------------------------------- kernel


@triton.jit
def _rotate_heads(
    x_ptr,
    o_ptr,
    x_base,  # int64 offset of this token's head 0 in x
    o_base,  # int64 offset of this token's head 0 in the contiguous output
    n_heads,
    stride_xh,
    c1,
    c2,
    s1,
    s2,  # [1, BLOCK_HALF] fp32 tables of the two halves
    HALF: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
):
    heads = tl.arange(0, BLOCK_H)[:, None]  # [BLOCK_H, 1]
    offs = tl.arange(0, BLOCK_HALF)[None, :]  # [1, BLOCK_HALF]
    ok = (heads < n_heads) & (offs < HALF)
    src = x_ptr + x_base + heads.to(tl.int64) * stride_xh + offs
    x1 = tl.load(src, mask=ok, other=0.0)
    x2 = tl.load(src + HALF, mask=ok, other=0.0)
    x1f = x1.to(tl.float32)
    x2f = x2.to(tl.float32)
    out1 = x1f * c1 - x2f * s1
    out2 = x2f * c2 + x1f * s2
    dst = o_ptr + o_base + heads.to(tl.int64) * (2 * HALF) + offs
    tl.store(dst, out1.to(o_ptr.dtype.element_ty), mask=ok)
    tl.store(dst + HALF, out2.to(o_ptr.dtype.element_ty), mask=ok)


@triton.jit
def _rope_qk_kernel(
    q_ptr,  # [B, L, Hq, D], last dim contiguous
    k_ptr,  # [B, L, Hkv, D], last dim contiguous
    cos_ptr,  # [B, L, D] fp32 (stride_cb = 0 for a shared [L, D] table), last dim contiguous
    sin_ptr,  # like cos
    qo_ptr,  # [B, L, Hq, D] contiguous output
    ko_ptr,  # [B, L, Hkv, D] contiguous output
    seq_len,
    n_q_heads,
    n_k_heads,
    stride_qb,
    stride_ql,
    stride_qh,
    stride_kb,
    stride_kl,
    stride_kh,
    stride_cb,
    stride_cl,
    stride_sb,
    stride_sl,
    HALF: tl.constexpr,  # D / 2
    BLOCK_HQ: tl.constexpr,
    BLOCK_HK: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
):
    tok = tl.program_id(0).to(tl.int64)  # b * L + l
    b = tok // seq_len
    pos = tok % seq_len
    offs = tl.arange(0, BLOCK_HALF)[None, :]
    t_ok = offs < HALF
    c_row = cos_ptr + b * stride_cb + pos * stride_cl
    s_row = sin_ptr + b * stride_sb + pos * stride_sl
    c1 = tl.load(c_row + offs, mask=t_ok, other=0.0).to(tl.float32)
    c2 = tl.load(c_row + HALF + offs, mask=t_ok, other=0.0).to(tl.float32)
    s1 = tl.load(s_row + offs, mask=t_ok, other=0.0).to(tl.float32)
    s2 = tl.load(s_row + HALF + offs, mask=t_ok, other=0.0).to(tl.float32)
    _rotate_heads(
        q_ptr, qo_ptr, b * stride_qb + pos * stride_ql, tok * n_q_heads * (2 * HALF), n_q_heads, stride_qh,
        c1, c2, s1, s2, HALF, BLOCK_HQ, BLOCK_HALF,
    )  # fmt: skip
    _rotate_heads(
        k_ptr, ko_ptr, b * stride_kb + pos * stride_kl, tok * n_k_heads * (2 * HALF), n_k_heads, stride_kh,
        c1, c2, s1, s2, HALF, BLOCK_HK, BLOCK_HALF,
    )  # fmt: skip


# ----------------------------------------------------------------------------- launcher


def rope_qk_launch(q, k, cos, sin):
    """Run the kernel on validated inputs (q ``[B, L, Hq, D]``, k ``[B, L, Hkv, D]``, cos/sin fp32
    ``[B, L, D]`` or ``[L, D]``, last dims contiguous). Returns new contiguous ``(q_out, k_out)``."""
    require_runnable(_rope_qk_kernel, q.device, "rope_qk")
    b, n, hq, d = q.shape
    hkv = k.shape[2]
    q_out = alloc((b, n, hq, d), q.dtype, q.device)
    k_out = alloc((b, n, hkv, d), k.dtype, k.device)
    if b * n == 0 or d == 0:
        return q_out, k_out
    cb, cl = (cos.stride(0), cos.stride(1)) if cos.dim() == 3 else (0, cos.stride(0))
    sb, sl = (sin.stride(0), sin.stride(1)) if sin.dim() == 3 else (0, sin.stride(0))
    half = d // 2
    block_half = next_pow2(half)
    block_hq = next_pow2(hq)
    block_hk = next_pow2(hkv)
    args = (
        q,
        k,
        cos,
        sin,
        q_out,
        k_out,
        n,
        hq,
        hkv,
        q.stride(0),
        q.stride(1),
        q.stride(2),
        k.stride(0),
        k.stride(1),
        k.stride(2),
        cb,
        cl,
        sb,
        sl,
        half,
        block_hq,
        block_hk,
        block_half,
    )  # the kernel's signature order (triton_kernels._launch.launch)
    # about 8-16 fp32 values per thread per operand at Hq=28/32, D=128
    num_warps = max(1, min(8, block_hq * block_half // 512))
    launch(_rope_qk_kernel, (b * n,), args, num_warps)
    return q_out, k_out


# ----------------------------------------------------------------------------- public op


def rope_qk(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, *, backend: str | None = None):
    """Rotate q and k by per-token RoPE angles (rotate-half layout), both in one launch.

    Args:
        q: ``[B, L, Hq, D]`` queries, token-major (fp32, fp16 or bf16; last dim contiguous, any
            other strides, e.g. a view of a projection's output). D even.
        k: ``[B, L, Hkv, D]`` keys (same B, L, D, dtype and device as q; last dim contiguous).
        cos, sin: float32 ``[B, L, D]`` (per token) or ``[L, D]`` (shared by the rows) tables from
            :func:`dllm.model.rope.rope_cos_sin` (the D/2 angles repeated twice; any scaling
            factor already in them); last dim contiguous.
        backend: ``"triton"``, ``"torch"`` or ``None`` (auto, see :mod:`triton_kernels._dispatch`).

    Returns:
        ``(q_rot, k_rot)``: new contiguous tensors of q's and k's shapes and dtype,
        ``x * cos + rotate_half(x) * sin`` computed in fp32 and rounded once
        (:func:`dllm.model.rope.apply_rope`'s arithmetic).

    Raises:
        TypeError: non-tensor input; q/k dtype outside fp32/fp16/bf16 or q and k of different dtypes;
            cos/sin not float32.
        ValueError: q or k not 4-D, an odd D, k's B/L/D not q's, cos/sin not ``[B, L, D]`` or
            ``[L, D]``, tensors on different devices, a last dim that is not contiguous, bad ``backend``.
        RuntimeError: ``backend="triton"`` on CPU without ``TRITON_INTERPRET=1``.

    Algorithm: RoPE (Su et al. 2021, RoFormer), rotate-half form; one program per token rotates
    its Hq + Hkv heads with one read of the token's tables.
    """
    sig = V.signature("rope_qk", (q, k, cos, sin), ())
    if not V.passed(sig):  # metadata checks, memoised per metadata signature (a decode loop repeats one)
        _validate(q, k, cos, sin)
        V.remember(sig)
    if resolve_backend(backend, q.device) == "torch":
        return _ref.rope_qk(q, k, cos, sin)
    return rope_qk_launch(q, k, cos, sin)


def _validate(q, k, cos, sin) -> None:
    op = "rope_qk"
    V.check_ndim(op, "q", q, 4, "[B, L, Hq, D]")
    V.check_ndim(op, "k", k, 4, "[B, L, Hkv, D]")
    V.check_float(op, q=q, k=k)
    b, n, _, d = q.shape
    if d % 2:
        raise ValueError(f"{op}: RoPE needs an even head_dim, got D={d}")
    if (k.shape[0], k.shape[1], k.shape[3]) != (b, n, d):
        raise ValueError(f"{op}: k must be [B={b}, L={n}, Hkv, D={d}] like q, got {tuple(k.shape)}")
    for name, t in (("cos", cos), ("sin", sin)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{op}: {name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dtype != torch.float32:
            raise TypeError(f"{op}: {name} must be float32 (rope_cos_sin's tables), got {t.dtype}")
        if tuple(t.shape) not in ((b, n, d), (n, d)):
            raise ValueError(f"{op}: {name} must be [B, L, D] = {(b, n, d)} or [L, D] = {(n, d)}, got {tuple(t.shape)}")
    V.check_device(op, q=q, k=k, cos=cos, sin=sin)
    V.check_last_dim_contiguous(op, q=q, k=k, cos=cos, sin=sin)
