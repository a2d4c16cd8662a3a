"""Rotary position embedding (RoPE) and rotation of cached keys by a position delta.

RoPE (Su et al., RoFormer) rotates each pair of channels ``(i, i + D/2)`` of q and
k by the angle ``position * theta^(-2i/D)`` (the "rotate half" layout used by
Qwen2/Dream, Llama and LLaDA). Attention logits then depend only on the
relative position, so a chunk encoded alone at local positions can be moved to
any position by one more rotation: ``R(p + delta) = R(delta) R(p)``
(DESIGN section 4, "Positions").

Angles are computed in float64 and cast to float32: at 32K positions an fp32
product ``position * inv_freq`` is off by ~1e-3 rad, which would make
"rotate by delta" and "encode at p + delta" disagree more than they must.
"""

from __future__ import annotations

import torch


def inv_frequencies(head_dim: int, theta: float, device=None) -> torch.Tensor:
    """Inverse frequencies ``theta^(-2i/D)``, i = 0..D/2-1, float64 ``[D/2]``.

    Raises:
        ValueError: odd head_dim.
    """
    if head_dim % 2:
        raise ValueError(f"RoPE needs an even head_dim, got {head_dim}")
    exponent = torch.arange(0, head_dim, 2, dtype=torch.float64, device=device) / head_dim
    return 1.0 / (theta**exponent)


def rope_cos_sin(positions: torch.Tensor, head_dim: int, theta: float):
    """cos/sin tables for integer positions.

    Args:
        positions: int tensor ``[..., L]`` (any leading shape; negative allowed, used for deltas).
        head_dim: D (even).
        theta: RoPE base.

    Returns:
        (cos, sin), each float32 ``[..., L, D]`` in the rotate-half layout
        (the D/2 angles repeated twice).
    """
    inv = inv_frequencies(head_dim, theta, device=positions.device)
    ang = positions.to(torch.float64)[..., None] * inv  # [..., L, D/2]
    ang = torch.cat([ang, ang], dim=-1)
    return torch.cos(ang).to(torch.float32), torch.sin(ang).to(torch.float32)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x [B, L, H, D]`` by per-token angles.

    Args:
        x: q or k, token-major ``[B, L, H, D]`` (any float dtype).
        cos, sin: ``[B, L, D]`` or ``[L, D]`` float32 from :func:`rope_cos_sin`.

    Returns:
        Tensor like ``x`` (same dtype); computed in fp32.
    """
    c = cos.unsqueeze(-2)  # broadcast over heads
    s = sin.unsqueeze(-2)
    xf = x.float()
    return (xf * c + _rotate_half(xf) * s).to(x.dtype)


def rotate_keys(k: torch.Tensor, delta: torch.Tensor | int, theta: float) -> torch.Tensor:
    """Move RoPE'd keys by ``delta`` positions: ``R(delta) k``.

    Args:
        k: keys ``[..., L, H, D]`` already rotated at some positions p.
        delta: int, or int tensor broadcastable to ``k.shape[:-2]`` (per token).
        theta: RoPE base of the model.

    Returns:
        Keys as if they had been encoded at ``p + delta`` (same dtype as k).
    """
    d = k.shape[-1]
    if not torch.is_tensor(delta):
        if delta == 0:
            return k
        delta = torch.tensor(delta, device=k.device)
    delta = delta.to(k.device).expand(k.shape[:-2])
    cos, sin = rope_cos_sin(delta, d, theta)  # [..., L, D]
    return apply_rope(k, cos, sin)
