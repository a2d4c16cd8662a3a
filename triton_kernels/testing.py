"""Accuracy oracle shared by the kernel tests and ``bench/kernels/bench_kernels.py``.

One definition of "close enough", flash-attention's test rule: a kernel's error
against an fp32 reference may be at most twice the error that plain torch makes
when it computes the same thing in the same low precision, plus a small floor
(:data:`FLOOR`, for outputs whose entries are O(1)). The low-precision torch
computation is :func:`lowp_attention` (scores and ``P @ V`` in the low dtype,
softmax in fp32 then rounded), as flash-attention's tests do.

Public so that users who wrap or re-tune the kernels can hold them to the same rule.
"""

from __future__ import annotations

import torch

# Absolute floors of the rule (errors of a tensor whose entries are O(1)).
FLOOR = {torch.float32: 2e-5, torch.float16: 2e-4, torch.bfloat16: 2e-3}


def max_err(a: torch.Tensor, b: torch.Tensor) -> float:
    """Max abs difference; equal infinities count as equal, NaN anywhere is an infinite error."""
    a, b = a.float(), b.float()
    if torch.isnan(a).any() or torch.isnan(b).any():
        return float("inf")
    same_inf = torch.isinf(a) & torch.isinf(b) & (torch.sign(a) == torch.sign(b))
    diff = torch.where(same_inf, torch.zeros_like(a), (a - b).abs())
    return float(diff.max()) if diff.numel() else 0.0


def tolerance(dtype: torch.dtype, lowp_err: float, floor: float | None = None) -> float:
    """The rule's bound: ``2 * lowp_err + floor`` (floor defaults to :data:`FLOOR` of ``dtype``)."""
    return 2 * lowp_err + (FLOOR[dtype] if floor is None else floor)


def check_rule(kernel_out, ref32, lowp_out, dtype, floor=None) -> tuple[bool, float, float]:
    """``(passes, kernel error, tolerance)`` of the rule for one output tensor."""
    err = max_err(kernel_out, ref32)
    tol = tolerance(dtype, max_err(lowp_out, ref32), floor)
    return err <= tol, err, tol


def assert_rule(kernel_out, ref32, lowp_out, dtype, what: str = "", floor=None) -> None:
    """Assert :func:`check_rule` with a message naming both errors."""
    ok, err, tol = check_rule(kernel_out, ref32, lowp_out, dtype, floor)
    assert ok, f"{what}: kernel error {err:.3e} > tolerance {tol:.3e} (2 x torch {dtype} error + floor)"


def lowp_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, dtype: torch.dtype):
    """Plain attention of one row over contiguous keys, computed in ``dtype``.

    q ``[M, Hq, D]``, k/v ``[L, Hkv, D]`` (GQA: query head h reads KV head h // G)
    -> ``(out [M, Hq, D] fp32, lse [M, Hq] fp32)``; with L = 0: zeros and -inf. In fp32
    it is an independent reference; in fp16/bf16 it is the error budget of the rule.
    """
    m, hq, d = q.shape
    if k.shape[0] == 0:
        return q.new_zeros(m, hq, d, dtype=torch.float32), q.new_full((m, hq), float("-inf"), dtype=torch.float32)
    g = hq // k.shape[1]
    kk = k.to(dtype).repeat_interleave(g, dim=1)
    vv = v.to(dtype).repeat_interleave(g, dim=1)
    s = torch.einsum("mhd,lhd->hml", q.to(dtype), kk) * scale  # [Hq, M, L] in dtype
    lse = torch.logsumexp(s.float(), dim=-1)
    p = torch.softmax(s.float(), dim=-1).to(dtype)
    out = torch.einsum("hml,lhd->mhd", p, vv)
    return out.float(), lse.transpose(0, 1).float()


def split_s_dense(q, k_pool, v_pool, seg_slots, seg_lens, k_live, v_live, scale, dtype, live_lens=None):
    """Split-S attention as dense attention over ``torch.cat`` of each row's valid keys, in ``dtype``.

    Shapes as :func:`triton_kernels.split_s_attention`; padded query rows (``m >=
    live_lens[b]``) get 0 / -inf. -> ``(out [B, M, Hq, D] fp32, lse [B, M, Hq] fp32)``.
    """
    outs, lses = [], []
    m = q.shape[1]
    for b in range(q.shape[0]):
        n_live = m if live_lens is None else int(live_lens[b])
        ks, vs = [], []
        for s, n in zip(seg_slots[b].tolist(), seg_lens[b].tolist(), strict=True):
            if s >= 0:
                ks.append(k_pool[s, :n])
                vs.append(v_pool[s, :n])
        if k_live is not None:
            ks.append(k_live[b, :n_live])
            vs.append(v_live[b, :n_live])
        k = torch.cat(ks) if ks else k_pool[0, :0]
        v = torch.cat(vs) if vs else v_pool[0, :0]
        o, lse = lowp_attention(q[b], k, v, scale, dtype)
        o[n_live:] = 0
        lse[n_live:] = float("-inf")
        outs.append(o)
        lses.append(lse)
    return torch.stack(outs), torch.stack(lses)
