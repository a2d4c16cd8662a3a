"""CUDA-graph replay of a denoising step's forward.

A prefilling denoising step is one model forward over fixed addresses: the live block's ids,
positions, RoPE tables and live lengths (:class:`dllm.decode.policies.LiveBlock`, allocated once per
generation) and a static KV cache built before the loop. Eagerly, each step pays the host cost of
launching about 40 kernels per layer (for Dream-7B, estimated at 12-15 ms of host time against
about 3.5 ms of GPU work per step; predicted, not measured). A CUDA graph
records those launches once and replays them with one call (the technique of gpt-fast's
``torch.compile(mode="reduce-overhead")`` and of vLLM's decode graphs, done here with
``torch.cuda.CUDAGraph`` directly).

:class:`GraphedStep` is a thin wrapper: it takes the pure step function (a function of the static
buffers only, :func:`dllm.decode.policies.live_block_logits`), runs it once on a side stream (Triton
compiles its kernels, cuBLAS picks its workspaces), captures one call and replays it. The same
function runs eagerly where graphs are not available (CPU, the Triton interpreter, the torch
reference backend), so the CPU tests run exactly the code a graph captures.

Rules a captured step keeps (and the step function guarantees): no host-device synchronisation
(value checks are done once when the cache and the live block are built), no allocation outside
the graph's memory pool, no tensor whose address changes between steps. A graph is bound to the
shapes and addresses it was captured with: one graph per generation (per live-block shape), and
the static cache stays alive as long as the policy that holds both. The capture runs on the model's
device (``GraphedStep(device=model.device)``), so a model on ``cuda:1`` is captured there while the
current device is 0; tested with a stand-in for the CUDA API (``tests/test_step_graph.py``), not yet on
a machine with two GPUs (the GPU check's machine has one).
"""

from __future__ import annotations

import warnings

import torch

from triton_kernels._dispatch import is_interpreted, resolve_backend


def cuda_graph_support(device) -> tuple[bool, str]:
    """Whether a denoising step on ``device`` can be captured in a CUDA graph, and why not.

    Returns:
        ``(True, "")``, or ``(False, reason)`` with reason one of: not a CUDA device, CUDA not
        available, no ``torch.cuda.CUDAGraph`` in this torch build, Triton running through its
        interpreter (``TRITON_INTERPRET=1``: the kernels run on the host), or the torch reference
        backend forced by ``PREFILLING_DLLM_BACKEND`` (it reads the segment table on the host).
    """
    device = torch.device(device)
    if device.type != "cuda":
        return False, f"the model is on {device.type}; CUDA graphs need a CUDA device"
    if not torch.cuda.is_available():
        return False, "CUDA is not available"
    if not hasattr(torch.cuda, "CUDAGraph"):
        return False, "this torch build has no torch.cuda.CUDAGraph"
    from triton_kernels.split_s import _split_s_partial_kernel

    if is_interpreted(_split_s_partial_kernel):
        return False, "the Triton kernels run through the interpreter (TRITON_INTERPRET=1)"
    if resolve_backend(None, device) != "triton":
        return False, "PREFILLING_DLLM_BACKEND selects the torch reference kernels, which sync with the host"
    return True, ""


class GraphedStep:
    """Capture ``fn()`` in a CUDA graph on the first call, replay it on every call.

    Args:
        fn: a function of fixed buffers only, returning one tensor (e.g. the step's logits); it
            must not synchronise with the host or allocate outside the capture.
        warmup: eager calls on a side stream before the capture (compilation, lazy initialisation).
        fallback: when the capture fails, warn and call ``fn`` eagerly from then on (what
            ``generate(cuda_graph=None)`` asks for) instead of raising.
        device: the CUDA device ``fn`` runs on (the model's, e.g. ``cuda:1``): the side stream, the
            warm-up and the capture run there whatever the current device is. None = the current one.

    Attributes:
        captures: graphs captured so far (1 after the first call).
        warmup_calls: eager warm-up calls run so far.
        failed: why the capture failed (``repr`` of the error) when it fell back, else None.

    Calling it returns the graph's output tensor: the same storage every call, overwritten by the
    next replay (clone it to keep a step's result).

    Raises:
        RuntimeError: on the first call, when :func:`cuda_graph_support` says no for ``device``
            (the message gives the reason), or the capture's own error, unless ``fallback``.
    """

    def __init__(self, fn, *, warmup: int = 1, fallback: bool = False, device=None):
        self.fn, self.warmup, self.fallback = fn, int(warmup), bool(fallback)
        self.device = None if device is None else torch.device(device)
        self.captures = self.warmup_calls = 0
        self.failed = None
        self._graph = None
        self._out = None

    @property
    def replaying(self) -> bool:
        """True once a graph is captured and replayed (False before the first call and after a fallback)."""
        return self._graph is not None

    def __call__(self) -> torch.Tensor:
        if self.failed is not None:
            return self.fn()
        if self._graph is None:
            try:
                self._capture()
            except Exception as exc:  # a capture error: an op that cannot be captured, a host sync...
                if not self.fallback:
                    raise
                self.failed, self._graph, self._out = repr(exc), None, None
                warnings.warn(
                    f"CUDA-graph capture of the denoising step failed, running it eagerly: {exc!r}", stacklevel=3
                )
                return self.fn()
        self._graph.replay()
        return self._out

    def _capture(self) -> None:
        device = self.device
        if device is None:
            device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else "cpu"
        elif device.type == "cuda" and device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        ok, why = cuda_graph_support(device)
        if not ok:
            raise RuntimeError(f"cannot capture the denoising step in a CUDA graph: {why}")
        with torch.cuda.device(device):  # streams, pool and graph on the model's device, not the current one
            self._capture_on_current()

    def _capture_on_current(self) -> None:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(self.warmup):
                self.fn()
                self.warmup_calls += 1
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            self._out = self.fn()
        self._graph = graph
        self.captures += 1
