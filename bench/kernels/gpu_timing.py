"""Timing primitives that tell host time from GPU time.

Three numbers per call, each answering a different question:

* **eager latency** (:func:`eager_us`): synchronise, call, synchronise; the median wall time.
  What a caller that waits for the result sees, host work, launches and any hidden
  device-to-host sync included.
* **graph time** (:func:`graph_time_us`): the calls captured once in a CUDA graph and replayed;
  CUDA events around the replays, divided by the calls replayed. No Python, no launch cost:
  the GPU's own time. With a *cold L2*: the graph cycles through enough copies of the inputs
  (:func:`rotation_count`) that each call finds its inputs evicted from L2 by the copies used
  since, as FlashInfer's ``bench_gpu_time(cold_l2_cache=True)`` does with rotating buffers.
* **host time** (:func:`host_time_us`): N calls back to back with no synchronisation, the wall
  time divided by N. The GPU queue absorbs the work, so this is what one call costs the CPU
  (Python, argument checks, launches), unless the call itself synchronises.

The pure arithmetic (how many copies, how many calls per graph, per-call time from event
times) is separate from the CUDA calls so it is tested on a CPU
(``tests/kernels/test_bench_cases.py``); the CUDA parts run only on a GPU.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable

import torch

# L2 size the cold-L2 rotation must beat when the device does not say: the figure for
# the H200 (the H100/H200 die has 50 MB of L2; 60 MB leaves a margin).
L2_BYTES_DEFAULT = 60 * 10**6
COLD_L2_FACTOR = 2  # bytes touched between two uses of one copy >= this many L2s: LRU keeps none of it
MAX_COPIES = 256  # a graph of 256 small calls still captures in well under a second
MIN_GRAPH_CALLS = 8  # calls per captured graph at least: one replay's launch cost is spread thin


def rotation_count(bytes_per_copy: int, l2_bytes: int = L2_BYTES_DEFAULT, *, mem_budget: int = 8 * 2**30) -> int:
    """Copies of the inputs to cycle through so that no call finds its inputs in L2.

    Between two uses of one copy the other ``copies - 1`` copies are read; they must move at
    least ``COLD_L2_FACTOR * l2_bytes``. One copy suffices when it alone is that large. Capped
    by :data:`MAX_COPIES` and by ``mem_budget`` bytes for all copies together (at least 1).

    Raises:
        ValueError: ``bytes_per_copy`` < 1 or ``l2_bytes`` < 0.
    """
    if bytes_per_copy < 1 or l2_bytes < 0:
        raise ValueError(
            f"rotation_count: need bytes_per_copy >= 1 and l2_bytes >= 0, got {bytes_per_copy}, {l2_bytes}"
        )
    need = COLD_L2_FACTOR * l2_bytes
    copies = 1 if bytes_per_copy >= need else 1 + math.ceil(need / bytes_per_copy)
    return max(1, min(copies, MAX_COPIES, mem_budget // bytes_per_copy))


def is_cold(copies: int, bytes_per_copy: int, l2_bytes: int = L2_BYTES_DEFAULT) -> bool:
    """Whether ``copies`` copies of ``bytes_per_copy`` keep every call's inputs out of L2 (the rule above)."""
    return bytes_per_copy >= COLD_L2_FACTOR * l2_bytes or (copies - 1) * bytes_per_copy >= COLD_L2_FACTOR * l2_bytes


def calls_per_graph(copies: int, min_calls: int = MIN_GRAPH_CALLS) -> int:
    """Calls captured in one graph: whole rounds of the ``copies`` copies, at least ``min_calls``."""
    if copies < 1:
        raise ValueError(f"calls_per_graph: copies must be >= 1, got {copies}")
    return copies * max(1, math.ceil(min_calls / copies))


def per_call_us(elapsed_ms: float, replays: int, calls: int) -> float:
    """Microseconds per call from the event time of ``replays`` replays of a graph of ``calls`` calls."""
    if replays < 1 or calls < 1:
        raise ValueError(f"per_call_us: replays and calls must be >= 1, got {replays}, {calls}")
    return 1e3 * elapsed_ms / (replays * calls)


def tensor_bytes(obj) -> int:
    """Bytes of the distinct storages of the tensors in ``obj`` (a tensor, or a dict / list / tuple of them)."""
    seen: dict = {}

    def walk(x):
        if isinstance(x, torch.Tensor):
            seen[(x.untyped_storage().data_ptr(), x.device)] = x.untyped_storage().nbytes()
        elif isinstance(x, dict):
            for v in x.values():
                walk(v)
        elif isinstance(x, (list, tuple)):
            for v in x:
                walk(v)

    walk(obj)
    return sum(seen.values())


def clone_inputs(inputs: dict) -> dict:
    """A copy of ``inputs`` with every tensor cloned (same strides), other values shared."""
    return {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}


def host_time_us(
    fn: Callable[[], object], n: int = 100, *, sync: Callable[[], None] = lambda: None, clock=time.perf_counter
) -> float:
    """Host microseconds per call: ``n`` calls of ``fn`` back to back without synchronising, wall time / n.

    ``sync`` runs before the clock starts and after it stops (so the queue is empty at the start
    and the work is finished before the next measurement).
    """
    if n < 1:
        raise ValueError(f"host_time_us: n must be >= 1, got {n}")
    sync()
    t0 = clock()
    for _ in range(n):
        fn()
    t1 = clock()
    sync()
    return 1e6 * (t1 - t0) / n


def eager_us(
    fn: Callable[[], object], n: int = 30, *, sync: Callable[[], None] = lambda: None, clock=time.perf_counter
) -> float:
    """Median microseconds of ``sync(); fn(); sync()`` over ``n`` calls: the latency a waiting caller sees."""
    if n < 1:
        raise ValueError(f"eager_us: n must be >= 1, got {n}")
    times = []
    for _ in range(n):
        sync()
        t0 = clock()
        fn()
        sync()
        times.append(1e6 * (clock() - t0))
    return statistics.median(times)


def cuda_sync() -> None:
    torch.cuda.synchronize()


def graph_time_us(fns: list[Callable[[], object]], *, replays: int = 10, samples: int = 5) -> float:
    """GPU microseconds per call: ``fns`` (one per input copy) captured in a CUDA graph, replayed.

    Every function is warmed up on a side stream first (compilation, allocator), then
    :func:`calls_per_graph` calls (cycling through ``fns``) are captured; the median over
    ``samples`` of ``replays`` replays between CUDA events gives the time per call. CUDA only.

    Raises:
        RuntimeError: from the capture when a function cannot be captured (e.g. it synchronises).
    """
    calls = calls_per_graph(len(fns))
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for f in fns:
            f()
            f()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(calls):
            fns[i % len(fns)]()
    graph.replay()  # first replay uploads the graph
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    out = []
    for _ in range(samples):
        start.record()
        for _ in range(replays):
            graph.replay()
        end.record()
        end.synchronize()
        out.append(per_call_us(start.elapsed_time(end), replays, calls))
    del graph
    return statistics.median(out)


def device_l2_bytes(device: torch.device) -> int:
    """The device's L2 size when torch reports it (never below :data:`L2_BYTES_DEFAULT`)."""
    if device.type != "cuda":
        return L2_BYTES_DEFAULT
    size = getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 0) or 0
    return max(int(size), L2_BYTES_DEFAULT)
