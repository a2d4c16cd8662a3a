"""dllm/model/rope.py against the definition of RoPE, and what a position shift does to a model's logits.

RoPE (Su et al., RoFormer; the rotate-half layout of Llama / Qwen2 / LLaDA) turns channel pair
``(i, i + D/2)`` of q and k by the angle ``pos * theta^(-2i/D)``. Expected values here come from that
formula, evaluated with Python's ``math`` in float64 one pair at a time, never from ``dllm.model.rope``.
The model tests then check the consequence the chunk caches rely on: attention logits depend only on
relative offsets, so moving every token by one changes nothing, while moving one token changes the
logits of exactly the tokens that attend to it.
"""

from __future__ import annotations

import math

import pytest
import torch

from dllm.model.modeling import DiffusionLM
from dllm.model.rope import apply_rope, rope_cos_sin, rotate_keys
from tests.tiny_checkpoints import small_model

POSITIONS = [0, 1, 2, 7, 100, 4095, 31999]


def _angle(pos: int, i: int, head_dim: int, theta: float) -> float:
    return pos * theta ** (-2.0 * i / head_dim)


def _rotate_by_hand(x: torch.Tensor, positions: list, theta: float) -> torch.Tensor:
    """``x [L, H, D]`` (any float) rotated per token, pair by pair, float64."""
    n, h, d = x.shape
    out = torch.empty(n, h, d, dtype=torch.float64)
    xd = x.double()
    for t, pos in enumerate(positions):
        for i in range(d // 2):
            c, s = math.cos(_angle(pos, i, d, theta)), math.sin(_angle(pos, i, d, theta))
            a, b = xd[t, :, i], xd[t, :, i + d // 2]
            out[t, :, i] = a * c - b * s
            out[t, :, i + d // 2] = a * s + b * c
    return out


@pytest.mark.parametrize("head_dim,theta", [(16, 10000.0), (64, 1e6), (128, 500000.0)])
def test_cos_sin_equal_the_angle_formula(head_dim, theta):
    pos = torch.tensor([POSITIONS, [-3, 5, 6, 8, 9, 10, 11]])  # [2, 7]: any leading shape, negative deltas
    cos, sin = rope_cos_sin(pos, head_dim, theta)
    assert cos.shape == sin.shape == (2, 7, head_dim) and cos.dtype == sin.dtype == torch.float32
    want_c = torch.empty(2, 7, head_dim, dtype=torch.float64)
    want_s = torch.empty_like(want_c)
    for r, row in enumerate(pos.tolist()):
        for t, p in enumerate(row):
            for i in range(head_dim // 2):
                for col in (i, i + head_dim // 2):  # rotate-half layout: the D/2 angles twice
                    want_c[r, t, col] = math.cos(_angle(p, i, head_dim, theta))
                    want_s[r, t, col] = math.sin(_angle(p, i, head_dim, theta))
    assert (cos.double() - want_c).abs().max().item() < 1e-6
    assert (sin.double() - want_s).abs().max().item() < 1e-6
    # position 0 is the identity; pair 0 turns by exactly one radian per position
    assert torch.all(cos[0, 0] == 1) and torch.all(sin[0, 0] == 0)
    assert abs(float(sin[0, 1, 0]) - math.sin(1.0)) < 1e-7


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_apply_rope_turns_each_channel_pair_by_its_angle(dtype):
    g = torch.Generator().manual_seed(0)
    d, theta = 32, 10000.0
    x = torch.randn(2, len(POSITIONS), 3, d, generator=g).to(dtype)  # [B, L, H, D]
    cos, sin = rope_cos_sin(torch.tensor(POSITIONS), d, theta)  # [L, D] broadcast over the batch
    got = apply_rope(x, cos, sin)
    assert got.dtype == dtype and got.shape == x.shape
    tol = 2e-6 if dtype == torch.float32 else 3e-3  # the result is rounded to the input dtype (fp16: half an ulp at 4)
    for b in range(2):
        want = _rotate_by_hand(x[b], POSITIONS, theta)
        assert (got[b].double() - want).abs().max().item() < tol
    # per-row tables [B, L, D]: each batch row at its own positions
    rows = [POSITIONS, [p + 3 for p in POSITIONS]]
    cos_b, sin_b = rope_cos_sin(torch.tensor(rows), d, theta)
    got_b = apply_rope(x, cos_b, sin_b)
    for b in range(2):
        assert (got_b[b].double() - _rotate_by_hand(x[b], rows[b], theta)).abs().max().item() < tol


def test_rotation_keeps_norms_and_logits_depend_on_the_offset_only():
    """q at p_q and k at p_k: q'.k' = sum_i (a c + b d) cos(phi_i) + (b c - a d) sin(phi_i), with
    phi_i = (p_k - p_q) theta^(-2i/D) and (a, b), (c, d) the pairs of q and k (by hand)."""
    g = torch.Generator().manual_seed(1)
    d, theta = 16, 10000.0
    q = torch.randn(1, 1, 1, d, generator=g, dtype=torch.float32)
    k = torch.randn(1, 1, 1, d, generator=g, dtype=torch.float32)

    def logit(pq, pk):
        cq, sq = rope_cos_sin(torch.tensor([pq]), d, theta)
        ck, sk = rope_cos_sin(torch.tensor([pk]), d, theta)
        qr, kr = apply_rope(q, cq, sq), apply_rope(k, ck, sk)
        assert abs(float(qr.norm() - q.norm())) < 1e-5  # a rotation
        return float((qr * kr).sum())

    def by_hand(offset):
        qq, kk = q.flatten().double(), k.flatten().double()
        total = 0.0
        for i in range(d // 2):
            a, b, c, e = float(qq[i]), float(qq[i + d // 2]), float(kk[i]), float(kk[i + d // 2])
            phi = _angle(offset, i, d, theta)
            total += (a * c + b * e) * math.cos(phi) + (b * c - a * e) * math.sin(phi)
        return total

    for pq, pk in [(0, 0), (3, 5), (5, 3), (100, 37), (4000, 4100)]:
        assert abs(logit(pq, pk) - by_hand(pk - pq)) < 1e-4
        assert abs(logit(pq + 1, pk + 1) - by_hand(pk - pq)) < 1e-4  # both moved: same offset
    assert abs(logit(3, 6) - logit(3, 5)) > 1e-2  # one moved: the offset and the logit change


@pytest.mark.parametrize("delta", [1, -2, 37, 31999])
def test_rotate_keys_moves_keys_to_the_shifted_positions(delta):
    g = torch.Generator().manual_seed(2)
    d, theta = 64, 1e6
    k = torch.randn(2, 5, 2, d, generator=g)  # [N, L, Hkv, D] at local positions 0..4
    local = list(range(5))
    cos, sin = rope_cos_sin(torch.tensor(local), d, theta)
    k_rot = apply_rope(k, cos, sin)
    moved = rotate_keys(k_rot, delta, theta)
    for n in range(2):
        want = _rotate_by_hand(k[n], [p + delta for p in local], theta)
        assert (moved[n].double() - want).abs().max().item() < 2e-6  # two fp32 rotations
    # per-chunk deltas [N, 1] (how the pipeline moves kept chunks)
    deltas = torch.tensor([[delta], [7]])
    moved_n = rotate_keys(k_rot, deltas, theta)
    for n, dn in enumerate((delta, 7)):
        want = _rotate_by_hand(k[n], [p + dn for p in local], theta)
        assert (moved_n[n].double() - want).abs().max().item() < 2e-6
    assert rotate_keys(k_rot, 0, theta) is k_rot


# ----------------------------------------------------------------------------- a model's logits


def _model(seed=0) -> DiffusionLM:
    return small_model("llada", seed, vocab_size=53, intermediate_size=80, mask_token_id=52, bos_token_id=51)


def test_logits_change_only_where_relative_offsets_change():
    """Two groups of tokens that attend only within themselves (block-diagonal mask). Moving every
    position by one, or one whole group by one, leaves all logits unchanged (RoPE is relative);
    moving one token of group B changes every logit of group B and none of group A. A single token
    that attends only to itself has the same logits at any position."""
    model = _model()
    ids = torch.tensor([[3, 17, 5, 29, 11, 8, 40, 2, 23, 31, 14]])
    a, b, solo = range(0, 5), range(5, 10), 10
    mask = torch.zeros(11, 11, dtype=torch.bool)
    mask[:5, :5] = True
    mask[5:10, 5:10] = True
    mask[solo, solo] = True
    base = torch.tensor([0, 1, 2, 3, 4, 0, 1, 2, 3, 4, 0])

    def logits(pos):
        with torch.no_grad():
            return model(ids, pos, attention_mask=mask[None]).logits[0]

    ref = logits(base)
    assert (logits(base + 1) - ref).abs().max().item() < 1e-5  # every position + 1
    moved_b = base.clone()
    moved_b[5:10] += 1
    assert (logits(moved_b) - ref).abs().max().item() < 1e-5  # group B as a whole
    one = base.clone()
    one[7] += 1  # token 7 alone: its offsets to the rest of B change
    out = logits(one)
    assert (out[list(a)] - ref[list(a)]).abs().max().item() < 1e-5
    per_token = (out[list(b)] - ref[list(b)]).abs().amax(dim=-1)
    assert (per_token > 1e-3).all(), per_token
    far = base.clone()
    far[solo] = 4321
    assert (logits(far)[solo] - ref[solo]).abs().max().item() < 1e-5
