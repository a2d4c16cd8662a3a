"""FLOP model of each decoding method, for predictions beside measured times.

Counts multiply-adds x 2 of the transformer for one generation:

- per token and layer, the projections and MLP: ``lin = 2 (d Hq D + 2 d Hkv D + Hq D d + 3 d I)``;
- per query, key and layer, attention (QK^T and PV): ``4 Hq D``;
- per logit position, the LM head: ``2 d V``.

``dense``: T steps x a forward over ``L_p + L_d`` tokens.
``prefix_cache``: per block one forward over ``L_p + L_d``; per step a live forward of
``w + L_d`` queries over ``L_p + L_d`` keys.
``prefilling``: prefill of N chunks of ``C + 1`` tokens (+ prefix), draft pass, two scoring
passes of ``M`` tokens per chunk, then T steps of ``L_q + L_d`` queries over the static
``P + K (B or C) + L_q + L_d`` keys.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Arch:
    d: int
    hq: int
    hkv: int
    head: int
    inter: int
    layers: int
    vocab: int

    @classmethod
    def of(cls, cfg) -> Arch:
        return cls(
            cfg.hidden_size,
            cfg.num_heads,
            cfg.num_kv_heads,
            cfg.head_dim,
            cfg.intermediate_size,
            cfg.num_layers,
            cfg.vocab_size,
        )

    def lin(self) -> float:
        a = self
        return 2.0 * (a.d * a.hq * a.head + 2 * a.d * a.hkv * a.head + a.hq * a.head * a.d + 3 * a.d * a.inter)

    def forward(self, queries: float, keys: float, logits: float = 0.0) -> float:
        """FLOPs of one forward with ``queries`` live tokens attending to ``keys`` keys each."""
        return (
            self.layers * (queries * self.lin() + 4.0 * self.hq * self.head * queries * keys)
            + 2.0 * self.d * self.vocab * logits
        )


def dense_flops(a: Arch, lp: int, ld: int, steps: int) -> dict:
    n = lp + ld
    return {"prefill": 0.0, "scoring": 0.0, "decode": steps * a.forward(n, n, ld)}


def prefix_cache_flops(a: Arch, lp: int, ld: int, steps: int, blocks: int = 1, live_window: int = 1) -> dict:
    n = lp + ld
    live = live_window + ld
    return {"prefill": blocks * a.forward(n, n), "scoring": 0.0, "decode": steps * a.forward(live, n, ld)}


def prefilling_flops(
    a: Arch,
    prefix: int,
    ctx: int,
    lq: int,
    ld: int,
    steps: int,
    chunk: int,
    top_k: int,
    budget: int | None = None,
    draft: int = 4,
) -> dict:
    n_chunks = math.ceil(ctx / chunk)
    t = chunk + 1
    prefill = n_chunks * a.forward(t, t) + a.forward(prefix, prefix)
    m = lq + draft
    scoring = a.forward(prefix + lq + draft, prefix + lq + draft, draft) + 2 * n_chunks * a.forward(m, t + m, m)
    kept = top_k * ((budget + 1) if budget else t)
    live = lq + ld
    decode = steps * a.forward(live, prefix + kept + live, ld)
    return {"prefill": prefill, "scoring": scoring, "decode": decode}


def block_cached_decode_flops(
    a: Arch, static: int, lq: int, ld: int, steps: int, block: int, shift: bool = True
) -> float:
    """Decode FLOPs with a block cache (:mod:`dllm.decode.block_cache`) refreshed at each block start: per block
    one forward over the live block (``lq + ld`` queries over ``static`` + live keys, the block's logits), then
    every other step of the block a forward over the block's ``block`` tokens (+ 1 for a shifted model) over the
    same keys. Without the cache every step is the refresh forward: ``steps * a.forward(lq + ld, static + lq + ld,
    block)``."""
    blocks = ld // block
    keys = static + lq + ld
    refresh = a.forward(lq + ld, keys, block)
    step = a.forward(block + int(shift), keys, block)
    return blocks * refresh + (steps - blocks) * step


def total(flops: dict) -> float:
    return sum(flops.values())
