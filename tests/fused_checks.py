"""What the tests of the model's fused path (``model.fused_ops = True``) share: a random single-segment cache
to run a forward over, and the comparison of fused against torch outputs within fp32 rounding."""

from __future__ import annotations

import torch

from dllm.model.kv_cache import StaticKVCache


def random_cache(cfg, b: int, t: int, generator: torch.Generator) -> StaticKVCache:
    """A static cache of ``t`` random keys and values per row (``b`` rows) in every layer of ``cfg``: all the
    layers' keys drawn from ``generator`` first, then their values."""
    shape = (b, t, cfg.num_kv_heads, cfg.head_dim)
    ks = [torch.randn(*shape, generator=generator) for _ in range(cfg.num_layers)]
    vs = [torch.randn(*shape, generator=generator) for _ in range(cfg.num_layers)]
    return StaticKVCache.single_segment(ks, vs)


def assert_close_fp32(ref: torch.Tensor, got: torch.Tensor, what: str) -> None:
    """The fused path's output ``got`` within fp32 rounding (1e-5) of the largest value of the torch path's ``ref``."""
    scale = ref.abs().max().item()
    err = (ref - got).abs().max().item()
    assert err <= 1e-5 * max(scale, 1.0), f"{what}: fused vs torch path differ by {err:.3e} (max |x| {scale:.3e})"
