"""The three cache policies of the decode loop, side by side: how a denoising step computes its logits.

Every policy recomputes a *live block* each step (some fixed tokens, then the response) and lets
it attend to a static KV cache; they differ only in what is live and what is cached:

=================  ==============================  ==========================================
policy             live block                      static cache
=================  ==============================  ==========================================
``dense``          the whole prompt + response     none (the transformers baseline)
``prefix_cache``   last ``live_window`` prompt     the rest of the prompt, rebuilt at every
                   tokens + response               block start (Fast-dLLM v1) or every step
``prefilling``     the query + response            prefix + kept chunks, built once before the
                                                   loop (:mod:`dllm.prefilling`, arXiv 2606.10537)
=================  ==============================  ==========================================

With a block cache (:meth:`LiveBlockPolicy.use_block_cache`, :mod:`dllm.decode.block_cache`; ``generate``'s default
when the response has several blocks) any of the three recomputes its whole live block only at each block start
and, in between, the current block's tokens only, over cached K/V of the rest.

The protocol (:class:`DecodePolicy`) is what :func:`dllm.decode.denoise.denoise` calls. A step's inputs
live in a :class:`LiveBlock` allocated once per generation: the response is copied into the same
buffer every step and the positions (and their RoPE tables) never change, so a step is one model
forward over fixed addresses, :func:`live_block_logits`. The prefilling policy, whose cache is fixed
for the whole generation, can replay that forward from a CUDA graph (:mod:`dllm.decode.step_graph`; on by
default where supported). A batch of requests of different lengths is one live block padded to the
longest row (``live_lens``), each row with its response at its own columns.
"""

from __future__ import annotations

from typing import Protocol

import torch

import triton_kernels
from dllm.decode.block_cache import BlockCache
from dllm.decode.step_graph import GraphedStep
from dllm.decode.timer import PhaseTimer
from dllm.model.kv_cache import StaticKVCache


class DecodePolicy(Protocol):
    """How the denoising loop gets the response logits of a step.

    Attributes:
        nfe: model forwards run so far (cache builds included).
        batch_size: rows B of the response.
    """

    nfe: int
    batch_size: int

    def prepare(self, resp: torch.Tensor, block: slice, step: int) -> None:
        """Called before step ``step`` of ``block``, outside the timed ``decode`` phase: a policy
        that rebuilds its cache does it here (and times it as ``prefill``)."""

    def logits(self, resp: torch.Tensor) -> torch.Tensor:
        """Logits ``[B, L_d, V]`` (model dtype) of every response position given ``resp [B, L_d]`` int64,
        or ``[B, W, V]`` of only the W positions of the block of the last :meth:`prepare` (a policy may
        skip the LM head elsewhere; :func:`dllm.decode.denoise.denoise` tells the two apart by the width)."""


class LiveBlock:
    """The tokens a step recomputes, in buffers allocated once per generation.

    Row b of the block is ``head_b`` (fixed live tokens: the prompt, its tail or the query), then
    the L_d response slots, then padding up to the longest row. Rows of one length (a plain batch)
    have no padding; rows of different lengths (a ragged batch of requests) are padded on the right
    and ``live_lens`` tells the model where each row ends.

    Args:
        head: ``[B, H]`` int64 (every row H fixed tokens), or a list of B 1-D int64 tensors
            (ragged rows; same device).
        start: RoPE position of each row's first head token: an int for all rows, or a list of B ints.
        gen_length: response tokens L_d.
        pad_id: token id written into padding slots (never attended to, never read).

    Attributes:
        ids: ``[B, M]`` int64, ``M = max_b H_b + L_d``: head, response slots (rewritten by
            :meth:`write`), padding.
        positions: ``[B, M]`` int64 RoPE positions (``start_b + column``), constant over the generation.
        resp_cols: ``[B, L_d]`` int64, the column of response token j in row b (``H_b + j``); the
            model's ``logits_at`` for ragged rows (rows of one length pass ``logits_start = H``).
        live_lens: ``[B]`` int32 real tokens per row (``H_b + L_d``), or None when no row is padded.
        head_lens: the B head lengths H_b.
        cos, sin: ``[B, M, D]`` float32 RoPE tables of ``positions``, once :meth:`precompute_rope`
            ran (the decode policies do it), else None.
        block_cols: ``[B, W]`` int64 columns of the current semi-autoregressive block's W response
            tokens (:meth:`select_block`), the only ones whose logits a step computes; None while the
            block is the whole response (then all ``L_d`` are computed).

    Raises:
        ValueError: no row, an empty head list, heads on different devices, or a ``start`` list of
            another length than the heads.
    """

    def __init__(self, head, start, gen_length: int, *, pad_id: int = 0):
        heads = list(head) if not torch.is_tensor(head) else list(head.unbind(0))
        if not heads:
            raise ValueError("a live block needs at least one row")
        starts = [int(start)] * len(heads) if isinstance(start, int) else [int(s) for s in start]
        if len(starts) != len(heads):
            raise ValueError(f"{len(heads)} rows but {len(starts)} start positions")
        dev = heads[0].device
        if any(h.device != dev for h in heads):
            raise ValueError("every head of a live block must be on one device")
        self.head_lens = [int(h.numel()) for h in heads]
        b, m = len(heads), max(self.head_lens) + gen_length
        self.ids = torch.full((b, m), int(pad_id), dtype=torch.long, device=dev)
        for row, h in enumerate(heads):
            self.ids[row, : h.numel()] = h
        cols = torch.arange(m, device=dev)
        self.positions = torch.tensor(starts, device=dev)[:, None] + cols[None, :]
        lens = torch.tensor(self.head_lens, device=dev)
        self.resp_cols = lens[:, None] + torch.arange(gen_length, device=dev)[None, :]
        ragged = any(n != self.head_lens[0] for n in self.head_lens)
        self.live_lens = (lens + gen_length).to(torch.int32) if ragged else None
        self.cos = self.sin = None
        self.block_cols = None
        self._block = None  # (start, stop) of the block block_cols holds
        # uniform rows write the response with one slice copy, ragged rows with a scatter
        self._resp_slice = None if ragged else slice(self.head_lens[0], self.head_lens[0] + gen_length)

    @property
    def batch_size(self) -> int:
        return self.ids.shape[0]

    def precompute_rope(self, rope) -> None:
        """Build ``cos``/``sin`` for ``positions`` once (``rope``: the model's
        :class:`~dllm.model.rope.RotaryEmbedding`), so that no step recomputes them."""
        self.cos, self.sin = rope.cos_sin(self.positions)

    def select_block(self, block: slice) -> None:
        """Compute logits only for the response positions of ``block`` (a slice of ``0..L_d``) from now on.

        The LM head streams its whole weight matrix whatever the row count, but past about 200 rows it
        is bound by FLOPs and the logits it writes grow with the rows: a semi-autoregressive schedule
        (LLaDA: 256 tokens in blocks of 32) would compute 8x the rows it uses. The columns go into one
        static ``[B, W]`` buffer, refilled in place when the block changes (no host sync; a CUDA graph
        captured with it reads the new block). A block that covers the whole response changes nothing.

        Raises:
            ValueError: a block outside the response, or of another width than an earlier block (the
                blocks of one generation have one width).
        """
        n = self.resp_cols.shape[1]
        start, stop, _ = block.indices(n)
        if block.step not in (None, 1) or not 0 <= start < stop <= n:
            raise ValueError(f"block {block} is not a non-empty contiguous part of the {n} response positions")
        if (start, stop) == self._block or (self.block_cols is None and (start, stop) == (0, n)):
            return
        cols = self.resp_cols[:, start:stop]
        if self.block_cols is None:
            self.block_cols = cols.clone()
        elif self.block_cols.shape != cols.shape:
            raise ValueError(f"block {block} has width {stop - start}, earlier blocks {self.block_cols.shape[1]}")
        else:
            self.block_cols.copy_(cols)
        self._block = (start, stop)

    def move(self, starts: list, rope=None) -> None:
        """Give row b's head the RoPE position ``starts[b]`` (its other columns follow), rewriting ``positions`` and,
        when ``rope`` is given, the RoPE tables in place (same buffers: a captured graph reads the new values)."""
        start = torch.tensor([int(s) for s in starts], device=self.positions.device)
        self.positions.copy_(start[:, None] + torch.arange(self.positions.shape[1], device=start.device)[None, :])
        if rope is not None and self.cos is not None:
            cos, sin = rope.cos_sin(self.positions)
            self.cos.copy_(cos)
            self.sin.copy_(sin)

    def write(self, resp: torch.Tensor) -> torch.Tensor:
        """Copy ``resp [B, L_d]`` into the response slots (same storage every step); returns ``ids``."""
        if self._resp_slice is not None:
            self.ids[:, self._resp_slice].copy_(resp)
        else:
            self.ids.scatter_(1, self.resp_cols, resp)
        return self.ids


def live_block_logits(
    model, live: LiveBlock, cache: StaticKVCache | None, attn_hook=None, with_logits: bool = True
) -> torch.Tensor | None:
    """The pure step: one forward over the live block's static buffers; what a CUDA graph captures.

    Reads only fixed addresses (``live.ids`` after :meth:`LiveBlock.write`, the positions, the
    precomputed RoPE tables, for ragged rows ``live_lens`` and ``resp_cols``, and the cache's pools and segment
    table) and makes no host-device synchronisation (the cache's and the live block's tables were
    range-checked when they were built, so the kernels' per-call value checks are skipped).

    Args:
        model: the dLLM.
        live: the live block (``precompute_rope`` done).
        cache: the static KV it attends to, or None.
        attn_hook: passed to the model's forward (the block cache stores the live K/V with it).
        with_logits: False skips the LM head (a block-cache refresh whose logits are not used).

    Returns:
        ``[B, L_d, V]`` response logits in the model dtype, or ``[B, W, V]`` of the current block's W
        positions once :meth:`LiveBlock.select_block` chose a block narrower than the response; None
        without logits.
    """
    kw = {} if live.cos is None else {"rope": (live.cos, live.sin)}
    if live.live_lens is not None:
        kw["live_lens"] = live.live_lens
    if attn_hook is not None:
        kw["attn_hook"] = attn_hook
    if not with_logits:
        kw["logits_start"] = live.ids.shape[1]
    elif live.block_cols is not None:  # a semi-autoregressive block: the LM head on its positions only
        kw["logits_at"] = live.block_cols
    elif live.live_lens is None:  # rows of one length: the response starts at one column
        kw["logits_start"] = live.head_lens[0]
    else:
        kw["logits_at"] = live.resp_cols
    with triton_kernels.skip_value_checks():
        out = model(live.ids, live.positions, cache, **kw)
    return out.logits


class LiveBlockPolicy:
    """Shared step of the three policies: write the response, one forward over live block + cache.

    Args:
        model: the dLLM.
        live: the step's live block (its RoPE tables are computed here, once).
        cache: static KV the live block attends to (None = none, or built later by ``prepare``).
        nfe: forwards already spent (e.g. building the cache).
        cuda_graph: capture the step's forward in a CUDA graph and replay it
            (:class:`dllm.decode.step_graph.GraphedStep`); only for a cache fixed for the whole
            generation, and only where :func:`dllm.decode.step_graph.cuda_graph_support` says so.
            ``"auto"``: the same, but a failed capture warns and falls back to eager steps. With a block
            cache the graph holds the block-only step; the refreshes run eagerly.

    Attributes:
        block_cache: the :class:`~dllm.decode.block_cache.BlockCache` once :meth:`use_block_cache` ran, else
            None (every step recomputes the whole live block).
    """

    def __init__(self, model, live: LiveBlock, cache: StaticKVCache | None = None, nfe: int = 0, *, cuda_graph=False):
        self.model, self.live, self.cache, self.nfe = model, live, cache, nfe
        self.block_cache = None
        if getattr(model, "rope", None) is not None:  # (a stand-in model without RoPE tables computes its own)
            live.precompute_rope(model.rope)
        self.graph = (
            GraphedStep(self._graphed, fallback=cuda_graph == "auto", device=model.device) if cuda_graph else None
        )

    def use_block_cache(self, block_length: int, refresh) -> None:
        """From now on a step recomputes only the current block over cached K/V of the rest of the live block
        (:mod:`dllm.decode.block_cache`; ``refresh``: ``"block"``, ``"step"`` or an int N; ``"off"`` = not).

        Raises:
            RuntimeError: after a step ran (the CUDA graph, if any, holds the other step).
        """
        if getattr(self.graph, "captures", 0):
            raise RuntimeError("use_block_cache must be called before the first step")
        self.block_cache = None if refresh == "off" else BlockCache(self.model, self.live, block_length, refresh)

    @property
    def batch_size(self) -> int:
        return self.live.batch_size

    def prepare(self, resp: torch.Tensor, block: slice, step: int) -> None:
        """Before each step: the LM head computes the logits of ``block``'s positions only
        (:meth:`LiveBlock.select_block`); with a block cache, its columns and refresh schedule."""
        self.live.select_block(block)
        if self.block_cache is not None:
            self.block_cache.select(block, step)

    def _forward(self, cache: StaticKVCache | None, attn_hook=None, with_logits=True) -> torch.Tensor | None:
        return live_block_logits(self.model, self.live, cache, attn_hook, with_logits)

    def _graphed(self) -> torch.Tensor:
        return self._forward(self.cache) if self.block_cache is None else self.block_cache.step_logits()

    def logits(self, resp: torch.Tensor) -> torch.Tensor:
        """``[B, L_d, V]`` response logits for ``resp`` (``[B, W, V]``, the current block's, after a
        :meth:`prepare` of a block narrower than the response). Under a CUDA graph the tensor is the
        graph's output buffer, overwritten by the next step: clone it to keep it."""
        self.live.write(resp)
        out, bc = None, self.block_cache
        if bc is not None and bc.due(self.cache):  # the exact step over the whole live block, K/V stored
            out = bc.refresh_logits(self._forward, self.cache)
            if out is None:  # "step" mode: the step's logits come from the cached path below
                self.nfe += 1
        if out is None:
            out = self.graph() if self.graph is not None else self._graphed()
        self.nfe += 1
        return out


class DensePolicy(LiveBlockPolicy):
    """Recompute prompt + response every step (no cache).

    Args:
        model: the dLLM.
        prompt: ``[B, L_p]`` int64 token ids.
        gen_length: L_d.
    """

    def __init__(self, model, prompt: torch.Tensor, gen_length: int):
        super().__init__(model, LiveBlock(prompt, 0, gen_length))


REFRESH_MODES = ("block", "step")  # PrefixCachePolicy(refresh=): generate(cache_refresh=)
CACHE_SCOPES = ("sequence", "prompt")  # PrefixCachePolicy(scope=): generate(cache_scope=)


class PrefixCachePolicy(LiveBlockPolicy):
    """Prompt K/V cached once per block (or per step); the live block is recomputed each step.

    Args:
        model: the dLLM.
        prompt: ``[B, L_p]`` int64 token ids.
        gen_length: L_d.
        timer: the generation's timer (cache builds are its ``prefill`` phase).
        live_window: prompt tokens kept live (>= 1: a shifted model predicts the first
            response token from the last prompt position, which must be recomputed).
        refresh: ``"block"`` (Fast-dLLM: rebuild at each block start) or ``"step"`` (rebuild
            every step; exact w.r.t. ``dense``, used to test the cached attention path).
        scope: ``"sequence"`` encodes prompt + current response to build the cache (Fast-dLLM);
            ``"prompt"`` encodes the cached prompt part alone (reusable across questions).

    Raises:
        ValueError: unknown ``refresh`` or ``scope``; ``live_window`` outside ``[1, L_p]``.
    """

    def __init__(
        self, model, prompt, gen_length: int, timer: PhaseTimer, *, live_window=1, refresh="block", scope="sequence"
    ):
        if refresh not in REFRESH_MODES:
            raise ValueError(f"refresh must be 'block' or 'step', got {refresh!r}")
        if scope not in CACHE_SCOPES:
            raise ValueError(f"scope must be 'sequence' or 'prompt', got {scope!r}")
        lp = prompt.shape[1]
        if not 1 <= live_window <= lp:
            raise ValueError(f"live_window must be in [1, prompt length {lp}], got {live_window}")
        self.n_cached = lp - live_window
        super().__init__(model, LiveBlock(prompt[:, self.n_cached :], self.n_cached, gen_length))
        self.prompt, self.timer, self.refresh, self.scope = prompt, timer, refresh, scope

    def prepare(self, resp, block, step):
        super().prepare(resp, block, step)
        if step == 0 or self.refresh == "step":
            self._build(resp)

    def _build(self, resp):
        if self.n_cached == 0:
            self.cache = None
            return
        x = torch.cat([self.prompt, resp], dim=1) if self.scope == "sequence" else self.prompt[:, : self.n_cached]
        with self.timer.phase("prefill"):
            out = self.model(x, torch.arange(x.shape[1], device=x.device), logits_start=x.shape[1], return_kv=True)
            self.nfe += 1
            ks = [k[:, : self.n_cached] for k in out.k]
            vs = [v[:, : self.n_cached] for v in out.v]
            self.cache = StaticKVCache.single_segment(ks, vs)


class PrefillingPolicy(LiveBlockPolicy):
    """Decode over a static cache built before the loop; the live block is ``query + response``.

    Args:
        model: the dLLM.
        query: ``[B, L_q]`` int64 query token ids, or a list of B 1-D query tensors (a ragged batch:
            padded to the longest, see :class:`LiveBlock`).
        query_start: RoPE position of the first query token: an int, or one per row.
        cache: the static segments (prefix, kept chunks), one row per batch row.
        gen_length: L_d.
        nfe: forwards already spent building the cache (prefill, draft, scoring).
        cuda_graph: replay the step's forward from a CUDA graph (see :class:`LiveBlockPolicy`).
    """

    def __init__(self, model, query, query_start, cache: StaticKVCache, gen_length: int, nfe: int, *, cuda_graph=False):
        live = LiveBlock(query, query_start, gen_length, pad_id=model.mask_token_id)
        super().__init__(model, live, cache, nfe, cuda_graph=cuda_graph)
        self.reselector = None  # set by dllm.generate(reselect=N): a Reselector (dllm.prefilling.reselect)

    def prepare(self, resp: torch.Tensor, block: slice, step: int) -> None:
        """Before each step; at a due block start, the chunks re-selected first (the static cache replaced, the
        live block moved to the new query position; the block cache then refreshes over them)."""
        rs = self.reselector
        if rs is not None and step == 0 and rs.due(block):
            before = rs.nfe
            got = rs(resp, block.start)
            self.nfe += rs.nfe - before
            if got is not None:
                self.cache, starts = got
                if starts != self.live.positions[:, 0].tolist():
                    self.live.move(starts, getattr(self.model, "rope", None))
        super().prepare(resp, block, step)
