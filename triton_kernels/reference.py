"""Naive torch references of every public op, with the same signatures.

They are the specification the Triton kernels are tested against and the path
CPU tensors take. Each one computes in fp32 in the plainest way (gather the
keys, materialise the scores) so that it is easy to check by eye; none of them
shares code with the kernels. Inputs are assumed valid: the public functions in
the kernel files validate before dispatching here.

Conventions: token-major layouts ``[..., tokens, heads,
head_dim]``; GQA with ``Hq = G * Hkv`` where query head ``h`` reads KV head
``h // G``; log-sum-exp (LSE) in natural log, fp32; softmax scale defaults to
``1/sqrt(D)``.

Non-finite values, the rule every backend follows (the kernels, the CPU path, these
references): a non-finite *logit* (NaN, +inf or -inf: any NaN/inf in a query row or in a
valid key it sees, or a ``q . k * sm_scale`` beyond the fp32 range) makes that query row
NaN, ``out`` and ``lse`` alike; -inf logits are not masks (a kernel that splits the keys
could not tell a partial of -inf logits from an empty one). NaN/inf in a valid value only
makes the matching ``out`` components non-finite. A row is reported empty (``out = 0``,
``lse = -inf``) only when it has no valid key.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

NEG_INF = float("-inf")


def _scale(sm_scale: float | None, head_dim: int) -> float:
    return 1.0 / math.sqrt(head_dim) if sm_scale is None else float(sm_scale)


def _logits(q: torch.Tensor, k: torch.Tensor, scale: float, eq: str) -> torch.Tensor:
    """fp32 ``einsum(eq, q, k) * scale`` with every non-finite logit made NaN (the rule above)."""
    s = torch.einsum(eq, q.float(), k) * scale
    return s.masked_fill(torch.isinf(s), float("nan"))


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float):
    """Plain bidirectional attention of one row in fp32.

    q [M, Hq, D], k/v [L, Hkv, D] -> out [M, Hq, D] fp32, lse [M, Hq] fp32.
    With L == 0 the output is 0 and the LSE is -inf.
    """
    m, hq, d = q.shape
    hkv = k.shape[1]
    if k.shape[0] == 0:
        return q.new_zeros(m, hq, d, dtype=torch.float32), q.new_full((m, hq), NEG_INF, dtype=torch.float32)
    g = hq // hkv
    kf = k.float().repeat_interleave(g, dim=1)  # [L, Hq, D]
    vf = v.float().repeat_interleave(g, dim=1)
    s = _logits(q, kf, scale, "mhd,lhd->hml")  # [Hq, M, L]
    lse = torch.logsumexp(s, dim=-1)  # [Hq, M], NaN where a logit is
    p = torch.exp(s - lse[..., None])
    out = torch.einsum("hml,lhd->mhd", p, vf)
    return out, lse.transpose(0, 1).contiguous()


def merge_states(o: torch.Tensor, lse: torch.Tensor):
    """Reference of :func:`triton_kernels.merge_states` (see there for the contract).

    o [N, *, H, D], lse [N, *, H] -> (o [*, H, D] in o.dtype, lse [*, H] fp32).
    """
    lse = lse.float()
    if lse.shape[0] == 0:  # nothing to merge: no keys at all
        return o.new_zeros(o.shape[1:]), lse.new_full(lse.shape[1:], NEG_INF)
    zero = torch.zeros((), device=o.device)
    # +inf partials (overflowed mass) outweigh all finite ones: their plain mean, lse = +inf.
    is_inf = lse == float("inf")
    n_inf = is_inf.sum(dim=0)
    inf_mean = torch.where(is_inf[..., None], o.float(), zero).sum(dim=0) / n_inf.clamp(min=1)[..., None]
    fin = lse.masked_fill(is_inf, NEG_INF)
    m = fin.max(dim=0).values
    m_safe = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    w = torch.exp(fin - m_safe)  # exp(-inf) = 0: empty partials weigh nothing
    total = w.sum(dim=0)
    live = total > 0
    out_lse = torch.where(live, m_safe + torch.log(torch.where(live, total, torch.ones_like(total))), NEG_INF)
    # Empty partials (lse -inf) may hold anything (even NaN): select, do not multiply.
    contrib = torch.where((fin > NEG_INF)[..., None], w[..., None] * o.float(), zero)
    out = contrib.sum(dim=0) / torch.where(live, total, torch.ones_like(total))[..., None]
    out = torch.where((n_inf > 0)[..., None], inf_mean, out)
    out_lse = torch.where(n_inf > 0, float("inf"), out_lse)
    nan = torch.isnan(lse).any(dim=0)  # a NaN partial makes its row NaN, whatever else it holds
    out = out.masked_fill(nan[..., None], float("nan"))
    out_lse = out_lse.masked_fill(nan, float("nan"))
    return out.to(o.dtype), out_lse


def split_s_attention(
    q, k_pool, v_pool, seg_slots, seg_lens, k_live=None, v_live=None, *, sm_scale=None, live_lens=None
):
    """Reference of :func:`triton_kernels.split_s_attention`.

    Gathers, per batch row, the valid keys of every segment plus the row's real live keys
    into one contiguous tensor and runs plain attention over it.
    q [B, M, Hq, D]; k_pool/v_pool [P, T, Hkv, D]; seg_slots/seg_lens [B, S] int;
    k_live/v_live [B, M, Hkv, D] or None; live_lens [B] int or None (all M)
    -> out [B, M, Hq, D] (q.dtype), lse [B, M, Hq] fp32; padded query rows
    (m >= live_lens[b]) get out = 0, lse = -inf.
    """
    scale = _scale(sm_scale, q.shape[-1])
    bsz, m = q.shape[0], q.shape[1]
    outs, lses = [], []
    slots = seg_slots.tolist()
    lens = seg_lens.tolist()
    n_live = [m] * bsz if live_lens is None else live_lens.tolist()
    for b in range(bsz):
        ks, vs = [], []
        for slot, n in zip(slots[b], lens[b], strict=True):
            if slot >= 0 and n > 0:
                ks.append(k_pool[slot, :n])
                vs.append(v_pool[slot, :n])
        if k_live is not None:
            ks.append(k_live[b, : n_live[b]])
            vs.append(v_live[b, : n_live[b]])
        if ks:
            k = torch.cat(ks, dim=0)
            v = torch.cat(vs, dim=0)
        else:
            k = k_pool.new_zeros(0, k_pool.shape[2], k_pool.shape[3])
            v = k
        o, lse = _attend(q[b], k, v, scale)
        o[n_live[b] :] = 0
        lse[n_live[b] :] = NEG_INF
        outs.append(o)
        lses.append(lse)
    return torch.stack(outs).to(q.dtype), torch.stack(lses)


def chunk_attention_scores(q, k, lens=None, k_extra=None, *, sm_scale=None):
    """Reference of :func:`triton_kernels.chunk_attention_scores`.

    q [N, M, Hq, D] scoring queries; k [N, T, Hkv, D] chunk keys, valid length
    ``lens[n]`` (all T if None); k_extra [N, E, Hkv, D] or None, extra keys every
    query also sees (the scoring tokens' own keys).
    -> mass [N, Hkv, T] fp32 (0 beyond lens), extra_mass [N, Hkv, E] fp32
       (empty with E = 0), lse [N, M, Hq] fp32.
    """
    n_chunks, m, hq, d = q.shape
    t, hkv = k.shape[1], k.shape[2]
    g = hq // hkv
    e = 0 if k_extra is None else k_extra.shape[1]
    scale = _scale(sm_scale, d)
    mass = torch.zeros(n_chunks, hkv, t, dtype=torch.float32, device=q.device)
    extra_mass = torch.zeros(n_chunks, hkv, e, dtype=torch.float32, device=q.device)
    lse_all = torch.full((n_chunks, m, hq), NEG_INF, dtype=torch.float32, device=q.device)
    lens_l = [t] * n_chunks if lens is None else lens.tolist()
    for n in range(n_chunks):
        keys = [k[n, : lens_l[n]]]
        if k_extra is not None:
            keys.append(k_extra[n])
        kk = torch.cat(keys, dim=0).float().repeat_interleave(g, dim=1)  # [L, Hq, D]
        if kk.shape[0] == 0:
            continue
        s = _logits(q[n], kk, scale, "mhd,lhd->hml")  # [Hq, M, L]
        lse = torch.logsumexp(s, dim=-1)
        p = torch.exp(s - lse[..., None])  # [Hq, M, L]
        per_kv = p.sum(dim=1).view(hkv, g, -1).sum(dim=1)  # [Hkv, L]
        mass[n, :, : lens_l[n]] = per_kv[:, : lens_l[n]]
        extra_mass[n] = per_kv[:, lens_l[n] :]
        lse_all[n] = lse.transpose(0, 1)
    return mass, extra_mass, lse_all


def chunk_row_mass(q, k, lens=None, k_extra=None, *, sm_scale=None):
    """Reference of :func:`triton_kernels.chunk_row_mass`.

    q [N, T, Hq, D] the chunk tokens' own queries; k [N, T, Hkv, D] chunk keys
    (valid length ``lens[n]``); k_extra [N, E, Hkv, D] the scoring tokens' keys
    (None: no extra keys, all zeros).
    For every valid chunk row: the softmax mass it sends to the extra keys when
    it attends over (valid chunk keys + extra keys), summed over the G query
    heads of each KV head. -> [N, Hkv, T] fp32, 0 beyond lens.
    """
    n_chunks, t, hq, d = q.shape
    hkv = k.shape[2]
    g = hq // hkv
    scale = _scale(sm_scale, d)
    out = torch.zeros(n_chunks, hkv, t, dtype=torch.float32, device=q.device)
    if k_extra is None:  # no extra keys: no row sends them any mass
        return out
    lens_l = [t] * n_chunks if lens is None else lens.tolist()
    for n in range(n_chunks):
        ln = lens_l[n]
        if ln == 0:
            continue
        kk = torch.cat([k[n, :ln], k_extra[n]], dim=0).float().repeat_interleave(g, dim=1)
        s = _logits(q[n, :ln], kk, scale, "thd,lhd->htl")  # [Hq, ln, L]
        p = torch.softmax(s, dim=-1)
        to_extra = p[..., ln:].sum(dim=-1)  # [Hq, ln]
        out[n, :, :ln] = to_extra.view(hkv, g, ln).sum(dim=1)
    return out


def pool_scores(scores: torch.Tensor, lens=None, *, pool_kernel: int = 7, keep_first: bool = True):
    """Max-pool token scores along tokens and pin BOS (the selection rule of ``topb_gather``).

    scores [N, Hkv, T] -> pooled [N, Hkv, T] fp32 where invalid tokens (t >= lens)
    are -inf and, with keep_first, token 0 is +inf.
    """
    n, h, t = scores.shape
    s = scores.float().clone()
    if lens is not None:
        invalid = torch.arange(t, device=s.device)[None, :] >= lens.to(s.device).long()[:, None]  # [N, T]
        s = s.masked_fill(invalid[:, None, :], NEG_INF)
    else:
        invalid = None
    if pool_kernel > 1 and t > 0:
        s = F.max_pool1d(s.reshape(n * h, 1, t), pool_kernel, stride=1, padding=pool_kernel // 2).view(n, h, t)
    if invalid is not None:
        s = s.masked_fill(invalid[:, None, :], NEG_INF)
    if keep_first and t > 0:  # (no token 0 to pin in an empty chunk)
        if invalid is None:
            s[:, :, 0] = float("inf")
        else:
            s[:, :, 0] = torch.where(invalid[:, None, 0], s[:, :, 0], torch.full_like(s[:, :, 0], float("inf")))
    return s


def topb_gather(scores, k, v, b, *, lens=None, pool_kernel=7, keep_first=True):
    """Reference of :func:`triton_kernels.topb_gather`.

    scores [N, Hkv, T]; k/v [N, T, Hkv, D]; b int -> k_out/v_out [N, b, Hkv, D],
    idx [N, Hkv, b] int64 ascending (padded with -1 where fewer than b tokens are
    valid), kept [N] int32 = min(b, lens). Ties in the pooled score go to the
    lower token index.
    """
    n, h, t = scores.shape
    pooled = pool_scores(scores, lens, pool_kernel=pool_kernel, keep_first=keep_first)
    lens_t = torch.full((n,), t, dtype=torch.long, device=k.device) if lens is None else lens.long().to(k.device)
    kept = torch.clamp(lens_t, max=b).to(torch.int32)
    order = torch.sort(pooled, dim=-1, descending=True, stable=True).indices  # [N, H, T]
    idx = torch.full((n, h, b), -1, dtype=torch.long, device=k.device)
    k_out = k.new_zeros(n, b, h, k.shape[-1])
    v_out = v.new_zeros(n, b, h, v.shape[-1])
    for i in range(n):
        c = int(kept[i])
        if c == 0:
            continue
        # Keep only the valid ones (they sort first since invalid are -inf), in ascending order.
        sel = torch.sort(order[i, :, :c], dim=-1).values  # [H, c]
        idx[i, :, :c] = sel
        for hh in range(h):
            k_out[i, :c, hh] = k[i, sel[hh], hh]
            v_out[i, :c, hh] = v[i, sel[hh], hh]
    return k_out, v_out, idx, kept


# ----------------------------------------------------------------------------- decode-step elementwise ops
# References of the fused elementwise kernels of the model's decode step. Unlike the attention
# references above they round where the torch model rounds (dllm.model.modeling), so that the fused
# path and the torch path of the model agree to the last rounding step, not just within a tolerance.


def add_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None):
    """Reference of :func:`triton_kernels.add_rms_norm`.

    x [..., H], weight [H], residual [..., H] or None -> (y [..., H] in promote(x, weight) dtype,
    s = x + residual in x.dtype or None).
    """
    s = x + residual if residual is not None else None
    src = s if s is not None else x
    sf = src.float()
    normed = (sf * torch.rsqrt(sf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)
    return weight * normed, s


def rope_qk(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
    """Reference of :func:`triton_kernels.rope_qk`: rotate-half RoPE of q and k in fp32.

    q [B, L, Hq, D], k [B, L, Hkv, D], cos/sin [B, L, D] or [L, D] fp32 -> (q, k) rotated, same dtypes.
    """
    c = cos.unsqueeze(-2)  # broadcast over heads
    s = sin.unsqueeze(-2)

    def rot(x):
        xf = x.float()
        half = xf.shape[-1] // 2
        rotated = torch.cat([-xf[..., half:], xf[..., :half]], dim=-1)
        return (xf * c + rotated * s).to(x.dtype)

    return rot(q), rot(k)


def swiglu(gate: torch.Tensor, up: torch.Tensor | None = None) -> torch.Tensor:
    """Reference of :func:`triton_kernels.swiglu`: ``silu(gate) * up`` in the input dtype.

    gate [..., I] and up [..., I], or gate [..., 2I] (gate then up) with up None -> [..., I].
    """
    if up is None:
        gate, up = gate.chunk(2, dim=-1)
    return F.silu(gate) * up
