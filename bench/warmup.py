"""Honest timing of the demo and the benchmarks: one untimed warm-up case first, start-up reported apart.

The first generation of a process pays one-off costs that no later case pays: lazy imports and
library initialisation, the allocator growing to its working set, CPU kernel (oneDNN / MKL) set-up,
and on a GPU Triton's compilation. Timed first, they land on whichever case runs first (once 5.7 s
against 0.5 s for the next four, which reversed a speedup order). So every timed grid here first
decodes one case per method, untimed, at its first context length, and reports that time beside the
model's load time; :func:`first_case_ratios` then shows whether any row's first case still stands out.
"""

from __future__ import annotations

import statistics
import time
from collections import defaultdict

from dllm.eval.evaluation import run_case
from dllm.eval.tasks import make_case

WARMUP_SEED = 10**8  # outside the seeds of every grid in bench/ (their cases are never the warm-up case)


def warm_up(model, methods, length: int, *, prefilling=None, task: str = "passkey", **gen_kwargs) -> dict:
    """Decode one seeded ``task`` case of ``length`` tokens (character level) with each method, untimed.

    Args:
        model: the loaded dLLM.
        methods: method names (dense / prefix_cache / prefilling).
        length: context length in tokens (use the grid's first, so the same shapes come first).
        prefilling: the grid's :class:`~dllm.prefilling.PrefillingConfig` (for ``prefilling``).
        task: the task of the warm-up case (a seed no grid uses, depth 0.5).
        gen_kwargs: forwarded to :func:`dllm.eval.evaluation.run_case` (gen_length, steps, ...).

    Returns:
        ``{method: seconds}`` of wall-clock time per warm-up decode.
    """
    case = make_case(task, length, 0.5, WARMUP_SEED, tokenizer=None)
    seconds = {}
    for method in methods:
        kw = {"prefilling": prefilling} if method == "prefilling" else {}
        t0 = time.perf_counter()
        run_case(model, case, method, **kw, **gen_kwargs)
        seconds[method] = time.perf_counter() - t0
    return seconds


def startup_line(load_s: float, warmup_s: dict, length: int, per: str = "method") -> str:
    """One line for the results files: model load and warm-up seconds (``{method: s}``), which the tables
    leave out; ``per`` says what got one warm-up case each."""
    warm = ", ".join(f"{m} {s:.2f} s" for m, s in warmup_s.items())
    return (
        f"Start-up, not in the table: model load {load_s:.2f} s; one untimed warm-up case of {length} tokens "
        f"per {per}: {warm}."
    )


def first_case_ratios(rows, key=("method", "length"), seconds: str = "seconds") -> dict:
    """Per row of the table (rows grouped by ``key``, in run order), the first case's seconds over the
    row's median seconds. Rows are dicts or objects with those attributes; rows of one case are left out."""
    groups = defaultdict(list)
    for r in rows:
        get = r.get if isinstance(r, dict) else lambda k, r=r: getattr(r, k)
        groups[tuple(get(k) for k in key)].append(float(get(seconds)))
    return {k: v[0] / statistics.median(v) for k, v in groups.items() if len(v) > 1 and statistics.median(v) > 0}


def first_case_line(ratios: dict) -> str:
    """ "First case / row median: 0.97-1.10x (highest: prefilling @ 8192)", or a note when no row has two cases."""
    if not ratios:
        return "First case / row median: no row has two cases."
    worst = max(ratios, key=ratios.get)
    return (
        f"First case / row median: {min(ratios.values()):.2f}-{ratios[worst]:.2f}x "
        f"(highest: {' @ '.join(map(str, worst))})."
    )
