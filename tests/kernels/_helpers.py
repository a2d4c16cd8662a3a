"""Shared helpers of the kernel tests: device choice, dense attention, the tolerance rule."""

from __future__ import annotations

import pytest
import torch

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
ON_GPU = DEVICE.type == "cuda"
# Interpreter-friendly dtypes on CPU; bf16 only where it can be computed natively.
DTYPES = [torch.float32, torch.float16] + ([torch.bfloat16] if ON_GPU else [])
LOW_DTYPES = [torch.float16] + ([torch.bfloat16] if ON_GPU else [])
gpu_only = pytest.mark.skipif(not ON_GPU, reason="needs a CUDA device")

# Absolute floors of the tolerance rule (errors of a tensor whose entries are O(1)).
FLOOR = {torch.float32: 2e-5, torch.float16: 2e-4, torch.bfloat16: 2e-3}


def dtype_params():
    """fp32/fp16 everywhere; bf16 marked gpu (the interpreter cannot compute in bf16)."""
    out = [pytest.param(torch.float32, id="fp32"), pytest.param(torch.float16, id="fp16")]
    out.append(pytest.param(torch.bfloat16, id="bf16", marks=[pytest.mark.gpu, gpu_only]))
    return out


def randn(*shape, dtype=torch.float32, scale=1.0, gen=None):
    return (torch.randn(*shape, generator=gen) * scale).to(dtype=dtype, device=DEVICE)


def dense_attention(q, k, v, scale, dtype):
    """Plain attention of one row over contiguous keys, computed in ``dtype``.

    q [M, Hq, D], k/v [L, Hkv, D] -> (out [M, Hq, D] fp32, lse [M, Hq] fp32).
    In fp32 it is a second, independent reference. In fp16/bf16 it mimics what
    plain torch would compute in low precision (scores and P@V in ``dtype``,
    softmax in fp32 then rounded), which sets the error budget of the rule
    below, as in flash-attention's tests.
    """
    m, hq, d = q.shape
    if k.shape[0] == 0:
        return torch.zeros(m, hq, d, device=q.device), torch.full((m, hq), float("-inf"), device=q.device)
    g = hq // k.shape[1]
    qq = q.to(dtype)
    kk = k.to(dtype).repeat_interleave(g, dim=1)
    vv = v.to(dtype).repeat_interleave(g, dim=1)
    s = torch.einsum("mhd,lhd->hml", qq, kk) * scale  # [Hq, M, L] in dtype
    lse = torch.logsumexp(s.float(), dim=-1)
    p = torch.softmax(s.float(), dim=-1).to(dtype)
    out = torch.einsum("hml,lhd->mhd", p, vv)
    return out.float(), lse.transpose(0, 1).float()


def max_err(a, b):
    """Max abs difference treating equal infinities as equal; NaN anywhere is an infinite error."""
    a, b = a.float(), b.float()
    if torch.isnan(a).any() or torch.isnan(b).any():
        return float("inf")
    same_inf = torch.isinf(a) & torch.isinf(b) & (torch.sign(a) == torch.sign(b))
    diff = torch.where(same_inf, torch.zeros_like(a), (a - b).abs())
    return float(diff.max()) if diff.numel() else 0.0


def assert_rule(kernel_out, ref32, lowp_out, dtype, what="", floor=None):
    """flash-attention's rule: kernel error <= 2 x (torch low-precision error) + a tiny floor."""
    err = max_err(kernel_out, ref32)
    base = max_err(lowp_out, ref32)
    tol = 2 * base + (FLOOR[dtype] if floor is None else floor)
    assert err <= tol, f"{what}: kernel error {err:.3e} > 2 x torch {dtype} error {base:.3e} + floor"
