"""Selection that follows the answer: the chunks re-scored at block starts against the query plus the answer so far.

The selection of :mod:`dllm.prefilling.pipeline` is made once, from the question alone; the chunks a long answer's
later sentences need need not be the ones its first sentence needed. At the start of every ``every``-th block
(blocks 1, 2, ... of the response; block 0 is the question's own selection) each row's chunks are scored again,
with that row's answer so far (up to its first end-of-text token) appended to its query: the same draft, scoring
passes, lexical term, K rule and first-stage candidates as the first selection
(:func:`~dllm.prefilling.pipeline.score_and_select_rows`), over the chunk K/V already encoded (the prefill's, or
the :class:`~dllm.prefilling.document.DocumentCache`'s): no chunk is re-encoded. The kept chunks' keys are
rotated to their decode positions again, the static cache rebuilt, and, when the kept chunks' total length
moved the query's RoPE position (continuous positions), the live block's positions and RoPE tables are
rewritten in place. A row whose answer already ended keeps its chunks.

The idea of re-selecting the attended context at each new block is Sparse-dLLM's and MAGE's (MAGE: at the
block's first all-mask step); doing it over a static cache of independently pre-encoded chunks is ours.
Independent cache mode only (joint mode would re-encode the kept chunks).
"""

from __future__ import annotations

import torch

from dllm.model.kv_cache import StaticKVCache
from dllm.prefilling.config import PrefillingConfig
from dllm.prefilling.pipeline import build_cache, score_and_select_rows
from dllm.prefilling.prompt import PromptParts


def check_reselect(value, method: str, cfg: PrefillingConfig | None = None) -> int | None:
    """``generate(reselect=)``: None or 0 (off) or an int N >= 1 (every N blocks).

    Raises:
        TypeError: not None or an integer (a bool is refused).
        ValueError: negative; given for another method than ``prefilling``; with ``cache_mode="joint"``.
    """
    if value is None or (isinstance(value, int) and not isinstance(value, bool) and value == 0):
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"reselect must be None or an integer (every N blocks), got {value!r}")
    if value < 0:
        raise ValueError(f"reselect must be >= 0 blocks (0 or None: off), got {value}")
    if method != "prefilling":
        raise ValueError(f"reselect= is an option of method='prefilling', not of method={method!r}")
    if cfg is not None and cfg.cache_mode != "independent":
        raise ValueError("reselect= needs cache_mode='independent' (joint mode would re-encode the kept chunks)")
    return value


class Reselector:
    """Re-scores the rows' chunks at block starts (see the module docstring).

    Args:
        model: the dLLM.
        rows: the setup's :class:`~dllm.prefilling.pipeline.RowSetup` per batch row (parts, prefill, selection,
            static segments).
        cfg: the generation's :class:`PrefillingConfig`.
        every: re-select at every ``every``-th block start.
        gen_length: the response length (for the rebuilt rows).
        timer: the generation's timer (re-selections are its ``scoring`` phase).

    Attributes:
        count: re-selections run (one per due block start, whatever the number of rows).
        history: per row, a list of ``[response position, kept chunks]`` for every re-selection of that row.
        nfe: model forwards spent re-selecting.
    """

    def __init__(self, model, rows: list, cfg: PrefillingConfig, every: int, gen_length: int, timer):
        self.model, self.rows, self.cfg, self.every = model, rows, cfg, int(every)
        self.gen_length, self.timer = gen_length, timer
        self.count = self.nfe = 0
        self.history = [[] for _ in rows]
        self.segments = [rs.row.segments for rs in rows]  # each row's static segments now
        self.query_starts = [rs.row.query_start for rs in rows]
        stops = (model.config.eos_token_id, getattr(model.config, "pad_token_id", None))
        self._stops = [i for i in stops if i is not None]

    def due(self, block: slice) -> bool:
        """Whether ``block`` (a slice of the response) starts a re-selection: block index >= 1, every N blocks."""
        width = block.stop - block.start
        index = block.start // width
        return index > 0 and index % self.every == 0

    def _answer(self, row: torch.Tensor) -> torch.Tensor | None:
        """The answer so far (``row [n]``, the finished blocks), or None when it already ended."""
        for stop in self._stops:
            if bool((row == stop).any()):
                return None
        return row

    def __call__(self, resp: torch.Tensor, start: int):
        """Re-select before the block starting at response position ``start``.

        Returns:
            ``(cache, query_starts)``: the new static cache (one segment-table row per batch row) and the B
            query RoPE positions, or None when no row was re-scored.
        """
        due, parts = [], []
        for b, rs in enumerate(self.rows):
            answer = self._answer(resp[b, :start])
            if answer is None:
                continue
            due.append(b)
            p = rs.parts
            parts.append(PromptParts(p.prefix, p.context, torch.cat([p.query, answer.to(p.query.device)])))
        if not due:
            return None
        with self.timer.phase("scoring"):
            pres = [self.rows[b].prefill for b in due]
            sels, nfe = score_and_select_rows(
                self.model, parts, [p.chunks for p in pres], self.cfg, candidates=[p.candidates for p in pres]
            )
            for b, sel, pre in zip(due, sels, pres):
                row = build_cache(self.model, self.rows[b].parts, pre, sel, self.cfg, self.gen_length)
                self.segments[b], self.query_starts[b] = row.segments, row.query_start
                self.history[b].append([start, list(sel.kept)])
            cache = StaticKVCache.from_rows(self.segments)
        self.nfe += nfe
        self.count += 1
        return cache, list(self.query_starts)
