"""Block-cached decoding: a denoising step recomputes the current block only.

Without it every step recomputes the whole live block (the live prompt tokens plus all ``L_d`` response
positions), so a step costs ``O(L_d)`` and an answer ``O(L_d^2)``. With it, the K/V of every live token
(the query or prompt tail, the finished blocks, and the still-masked blocks after the current one) are kept
in a cache beside the static context cache, and a step runs the model over the current block's positions
only; they attend to the static segments, to that cache, and to their own fresh K/V. The cache is refreshed
by one forward over the whole live block:

- ``"block"`` (the default for ``gen_length > block_length``): at each block's first step; that forward's
  logits are the step's own (it is the exact step), the block's other steps read the cache.
- an int ``N``: at each block's first step and every ``N`` steps within a block.
- ``"step"``: at every step, then the step's logits come from the block-only forward over the fresh cache:
  the cached attention path computed over exact K/V, token-equal to recomputing everything (the test of
  this module, as ``cache_refresh="step"`` is the prefix cache's).

Between refreshes the cached K/V of the tokens outside the block are stale: they were computed when the
current block held more masks. That is the approximation of Fast-dLLM's DualCache (Wu et al. 2025, arXiv
2505.22618: prompt and suffix K/V reused within a block, refreshed at block boundaries; accuracy within about
a point on GSM8K/HumanEval for LLaDA and Dream) and of dKV-Cache (Ma et al. 2025, refresh every few steps);
here it sits beside a static cache of pre-encoded chunks, which neither does.

Layout: the live tokens' K/V go into extra slots of the same per-layer pools as the static segments (row b's
``M`` live columns are ``ceil(M / T)`` consecutive slots of ``T`` tokens, so one ``[B, ns*T, Hkv, D]`` view
addresses them by column), and the step's segment table names the static segments and those slots. A step
writes its own fresh K/V into its columns of that view (the forward's ``attn_hook``, before attention) and
attends to the pools only (:attr:`dllm.model.kv_cache.StaticKVCache.live_in_pool`): one
``split_s_attention`` call per layer, as before, with fixed shapes and addresses for the whole generation,
which a CUDA graph can replay. For a shifted model (Dream: position ``i`` predicts token ``i + 1``) the step
also recomputes the column before the block, whose output predicts the block's first token.
"""

from __future__ import annotations

import numbers

import torch

from dllm.model.kv_cache import StaticKVCache

BLOCK_CACHE_MODES = ("off", "block", "step")  # or an int N >= 1: refresh every N steps
LIVE_SLOT_MIN = 128  # live slots at least this long (or the whole live block), so that a short static slot
# length (a 3-token prefix cache) does not split the live block into hundreds of tiny segments


def check_block_cache(value, gen_length: int, block_length: int):
    """The block-cache mode of a generation: ``"off"``, ``"block"``, ``"step"`` or an int ``N >= 1``.

    Args:
        value: None (auto: ``"block"`` when the response has more than one block, else ``"off"``), one of
            :data:`BLOCK_CACHE_MODES`, or an int ``N >= 1`` (a numpy integer too; a bool is refused).
        gen_length, block_length: the response length and block size.

    Raises:
        TypeError: neither None, a string nor an integer.
        ValueError: an unknown word, or an int < 1.
    """
    if value is None:
        return "block" if gen_length > block_length else "off"
    if isinstance(value, str):
        if value not in BLOCK_CACHE_MODES:
            raise ValueError(f"block_cache must be one of {BLOCK_CACHE_MODES} or an int >= 1, got {value!r}")
        return value
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"block_cache must be None, one of {BLOCK_CACHE_MODES} or an int >= 1, got {value!r}")
    if int(value) < 1:
        raise ValueError(f"block_cache as a refresh interval must be >= 1 step, got {value}")
    return int(value)


class BlockCache:
    """K/V of the live block kept between denoising steps, and the block-only step that reads them.

    Args:
        model: the dLLM (layers, KV heads, head dim, dtype and device of the pools; ``shift_logits``).
        live: the policy's :class:`~dllm.decode.policies.LiveBlock` (ids, positions, RoPE tables).
        block_length: W, the tokens of one semi-autoregressive block.
        refresh: ``"block"``, ``"step"`` or an int N (see the module docstring; ``"off"`` = no BlockCache).

    Attributes:
        refreshes: refresh forwards run so far.
        width: live columns a step recomputes, ``W`` (``W + 1`` for a shifted model).
        step_cache: the :class:`StaticKVCache` a step attends to (static segments + live slots), once
            :meth:`attach` ran.

    Raises:
        ValueError: ``refresh`` not a mode of :func:`check_block_cache` (``"off"`` included).
    """

    def __init__(self, model, live, block_length: int, refresh):
        if refresh == "off" or check_block_cache(refresh, 2, 1) != refresh:
            raise ValueError(f"BlockCache needs refresh 'block', 'step' or an int >= 1, got {refresh!r}")
        self.model, self.live, self.refresh = model, live, refresh
        self.shift = bool(model.shift_logits)
        self.width = block_length + int(self.shift)
        b, dev = live.batch_size, live.ids.device
        self.cols = torch.zeros(b, self.width, dtype=torch.long, device=dev)  # the step's live columns
        self._cols_kv = None  # cols expanded to [B, W', Hkv, D] for the scatter (a view of self.cols)
        self._cols_rope = None  # cols expanded to [B, W', D] for the RoPE tables
        self.static = None  # the static cache attached (None for dense)
        self.step_cache = self.refresh_cache = None
        self._view_k = self._view_v = None  # per layer [B, ns*T, Hkv, D] views of the live slots
        self.refreshes = 0
        self._due = True

    # --- layout ---------------------------------------------------------------------
    def attach(self, static: StaticKVCache | None) -> None:
        """Lay out the pools: ``static``'s segments (copied once) plus ``ceil(M / T)`` live slots per row.

        Called by the policy before the first refresh and again whenever its static cache is a new object
        (the prefix cache rebuilds it at every block start).
        """
        cfg, live = self.model.config, self.live
        b, m = live.ids.shape
        dev, dtype = live.ids.device, self.model.dtype
        p0 = 0 if static is None else static.num_slots
        t0 = 0 if static is None else static.k[0].shape[1]
        t = m if static is None else max(t0, min(m, LIVE_SLOT_MIN))
        ns = -(-m // t)
        shape = (p0 + b * ns, t, cfg.num_kv_heads, cfg.head_dim)
        ks, vs = [], []
        for layer in range(cfg.num_layers):
            kp = torch.zeros(shape, dtype=dtype, device=dev)
            vp = torch.zeros(shape, dtype=dtype, device=dev)
            if static is not None:  # (padding past t0 is never read: the table's lengths stop at t0)
                kp[:p0, :t0] = static.k[layer]
                vp[:p0, :t0] = static.v[layer]
            ks.append(kp)
            vs.append(vp)
        self._view_k = [kp[p0:].view(b, ns * t, *shape[2:]) for kp in ks]
        self._view_v = [vp[p0:].view(b, ns * t, *shape[2:]) for vp in vs]
        real = live.live_lens.long() if live.live_lens is not None else torch.full((b,), m, device=dev)
        first = torch.arange(ns, device=dev)[None, :] * t  # [1, ns] first column of each live slot
        lens = (real[:, None] - first).clamp(0, t)  # [B, ns]
        slots = p0 + torch.arange(b, device=dev)[:, None] * ns + torch.arange(ns, device=dev)[None, :]
        slots = torch.where(lens > 0, slots, -1)
        if static is not None:
            slots = torch.cat([static.seg_slots.long(), slots], dim=1)
            lens = torch.cat([static.seg_lens.long(), lens], dim=1)
        # slots < P and lengths in [0, T] by construction: no host check
        self.step_cache = StaticKVCache(ks, vs, slots.int(), lens.int(), table_checked=True, live_in_pool=True)
        self.refresh_cache = (
            None if static is None else StaticKVCache(ks, vs, static.seg_slots, static.seg_lens, table_checked=True)
        )
        hkv, d = shape[2:]
        self._cols_kv = self.cols[:, :, None, None].expand(b, self.width, hkv, d)
        self._cols_rope = self.cols[:, :, None].expand(b, self.width, cfg.head_dim)
        self.static, self._due = static, True

    def nbytes(self) -> int:
        """Bytes of the pools this cache holds (static segments copied in and live slots; all layers, K and V)."""
        return 0 if self.step_cache is None else self.step_cache.nbytes()

    # --- schedule -------------------------------------------------------------------
    def select(self, block: slice, step: int) -> None:
        """Before step ``step`` of ``block``: point the step's columns at the block and decide whether this step
        refreshes the cache (a block's first step, every N steps, or every step)."""
        start, stop, _ = block.indices(self.live.resp_cols.shape[1])
        first = start - int(self.shift)  # a shifted model's block logits start one column earlier
        idx = torch.arange(first, stop, device=self.cols.device)
        self.cols.copy_(self.live.resp_cols[:, :1] + idx[None, :])  # resp_cols[b, 0] = H_b: row b's response
        if self.refresh == "step" or step == 0:
            self._due = True
        elif isinstance(self.refresh, int) and step % self.refresh == 0:
            self._due = True

    def _laid_out_for(self, static: StaticKVCache | None) -> bool:
        """Whether :meth:`attach` ran for this very static cache."""
        return self.step_cache is not None and static is self.static

    def due(self, static: StaticKVCache | None) -> bool:
        """Whether the next step refreshes: decided by :meth:`select`, or forced by a new static cache."""
        return self._due or not self._laid_out_for(static)

    # --- forwards -------------------------------------------------------------------
    def refresh_logits(self, forward_live, static: StaticKVCache | None):
        """Refresh: one forward over the whole live block (``forward_live(cache, attn_hook, with_logits)``, the
        policy's exact step) that also stores every live column's K/V. Returns its logits, or None in ``"step"``
        mode (then :meth:`step_logits` gives the step's logits from the fresh cache)."""
        if not self._laid_out_for(static):
            self.attach(static)
        with_logits = self.refresh != "step"
        out = forward_live(self.refresh_cache, self._store_all, with_logits)
        self.refreshes += 1
        self._due = False
        return out

    def step_logits(self) -> torch.Tensor:
        """The block-only step: ``[B, W, V]`` logits of the block's W positions from a forward over the step's
        columns (fixed buffers: what a CUDA graph captures)."""
        live = self.live
        ids = live.ids.gather(1, self.cols)
        positions = live.positions.gather(1, self.cols)
        kw = {}
        if live.cos is not None:
            kw["rope"] = (live.cos.gather(1, self._cols_rope), live.sin.gather(1, self._cols_rope))
        out = self.model(
            ids, positions, self.step_cache, logits_start=int(self.shift), attn_hook=self._store_cols, **kw
        )
        return out.logits

    def _store_all(self, layer, q, k, v) -> None:
        m = k.shape[1]
        self._view_k[layer][:, :m].copy_(k)
        self._view_v[layer][:, :m].copy_(v)

    def _store_cols(self, layer, q, k, v) -> None:
        self._view_k[layer].scatter_(1, self._cols_kv, k)
        self._view_v[layer].scatter_(1, self._cols_kv, v)
