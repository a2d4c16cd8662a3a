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

The protocol (:class:`DecodePolicy`) is what :func:`dllm.denoise.denoise` calls. A step's inputs
live in a :class:`LiveBlock` allocated once per generation: the response is copied into the same
buffer every step and the positions never change, so a step is one model forward over fixed
addresses (what a captured CUDA graph replays; :meth:`LiveBlockPolicy.logits` is the one call
such a graph would capture).
"""

from __future__ import annotations

from typing import Protocol

import torch

from dllm.kv_cache import StaticKVCache
from dllm.timer import PhaseTimer


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
        """Logits ``[B, L_d, V]`` (model dtype) of every response position given ``resp [B, L_d]`` int64."""


class LiveBlock:
    """The tokens a step recomputes, in buffers allocated once per generation.

    Args:
        head: ``[B, H]`` int64 fixed live tokens before the response (the prompt, its tail or the query).
        start: RoPE position of the first head token.
        gen_length: response tokens L_d.

    Attributes:
        ids: ``[B, H + L_d]`` int64: the head, then the response slots (rewritten by :meth:`write`).
        positions: ``[H + L_d]`` int64 RoPE positions, constant over the generation.
        head_len: H; the model's ``logits_start`` (only response positions reach the LM head).
    """

    def __init__(self, head: torch.Tensor, start: int, gen_length: int):
        b, h = head.shape
        self.ids = torch.empty(b, h + gen_length, dtype=torch.long, device=head.device)
        self.ids[:, :h] = head
        self.positions = torch.arange(start, start + h + gen_length, device=head.device)
        self.head_len = h

    def write(self, resp: torch.Tensor) -> torch.Tensor:
        """Copy ``resp [B, L_d]`` into the response slots (same storage every step); returns ``ids``."""
        self.ids[:, self.head_len :].copy_(resp)
        return self.ids


class LiveBlockPolicy:
    """Shared step of the three policies: write the response, one forward over live block + cache.

    Args:
        model: the dLLM.
        live: the step's live block.
        cache: static KV the live block attends to (None = none, or built later by ``prepare``).
        nfe: forwards already spent (e.g. building the cache).
    """

    def __init__(self, model, live: LiveBlock, cache: StaticKVCache | None = None, nfe: int = 0):
        self.model, self.live, self.cache, self.nfe = model, live, cache, nfe

    @property
    def batch_size(self) -> int:
        return self.live.ids.shape[0]

    def prepare(self, resp: torch.Tensor, block: slice, step: int) -> None:
        pass

    def logits(self, resp: torch.Tensor) -> torch.Tensor:
        out = self.model(self.live.write(resp), self.live.positions, self.cache, logits_start=self.live.head_len)
        self.nfe += 1
        return out.logits


class DensePolicy(LiveBlockPolicy):
    """Recompute prompt + response every step (no cache).

    Args:
        model: the dLLM.
        prompt: ``[B, L_p]`` int64 token ids.
        gen_length: L_d.
    """

    def __init__(self, model, prompt: torch.Tensor, gen_length: int):
        super().__init__(model, LiveBlock(prompt, 0, gen_length))


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
        if refresh not in ("block", "step"):
            raise ValueError(f"refresh must be 'block' or 'step', got {refresh!r}")
        if scope not in ("sequence", "prompt"):
            raise ValueError(f"scope must be 'sequence' or 'prompt', got {scope!r}")
        lp = prompt.shape[1]
        if not 1 <= live_window <= lp:
            raise ValueError(f"live_window must be in [1, prompt length {lp}], got {live_window}")
        self.n_cached = lp - live_window
        super().__init__(model, LiveBlock(prompt[:, self.n_cached :], self.n_cached, gen_length))
        self.prompt, self.timer, self.refresh, self.scope = prompt, timer, refresh, scope

    def prepare(self, resp, block, step):
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
        query: ``[B, L_q]`` int64 query token ids.
        query_start: RoPE position of the first query token.
        cache: the static segments (prefix, kept chunks), one row per batch row.
        gen_length: L_d.
        nfe: forwards already spent building the cache (prefill, draft, scoring).
    """

    def __init__(self, model, query: torch.Tensor, query_start: int, cache: StaticKVCache, gen_length: int, nfe: int):
        super().__init__(model, LiveBlock(query, query_start, gen_length), cache, nfe)
        self.query_start = query_start
