"""One cached launch path for every kernel of the package: compiled kernels launched directly.

``kernel[grid](...)`` spends 6-13 us of host time per call before the launch itself: it binds
the arguments to the signature, computes Triton's specialisation of each one, hashes that into
a cache key and looks the compiled kernel up (``JITFunction.run``). At decode shapes that is
as long as the kernel. :func:`launch` does that work once per specialisation: the first call
with a new key goes through ``kernel[grid]`` (Triton compiles and caches as usual) and keeps
the compiled kernel it returns; later calls make the very call ``JITFunction.run`` ends with,
``compiled.run(grid_x, grid_y, grid_z, stream, compiled.function, compiled.packed_metadata,
launch_metadata, enter_hook, exit_hook, *args)`` (read in the source of Triton 3.6.0 and 3.9.0,
``runtime/jit.py``; the same in both), on the current device's current stream, as Triton does.

The key holds everything Triton specialises a launch on, or more: the current device, the type
of every argument (a kernel's cached entries are kept per tuple of argument types, so ``True`` and
``1``, an int and a float, ``None`` and a tensor never share one), every non-float argument's value
and every constexpr's (ints: so their divisibility by 16 and equality to 1 are covered), each
tensor's dtype and whether its address is 16-byte aligned, num_warps and num_stages. Non-constexpr
floats are not specialised by Triton and are left out. Launches that differ in the key never share
a compiled kernel; a key seen once more costs a dict lookup. An argument of any other kind (a TMA
descriptor, a tensor-like object that is not a ``torch.Tensor``) sends every launch of that
signature through ``kernel[grid]``: it is neither hashed nor kept alive by the cache. Each entry
checks that the launcher passes as many arguments as the kernel takes (Triton 3.9's launcher does
not). The cache is bounded: :data:`MAX_KEYS` compiled kernels per entry and :data:`MAX_ENTRIES`
entries, the oldest forgotten first.

It falls back to ``kernel[grid]`` whenever it cannot be sure the direct call is Triton's own:
the interpreter (``TRITON_INTERPRET=1``), any object that is not exactly a ``JITFunction``
(e.g. the AOT compile gate's stand-in), a Triton version whose launch code was not read
(:data:`DIRECT_LAUNCH_VERSIONS`), a backend other than CUDA (ROCm specialises tensors on their
storage size too, which the key does not hold), a launch hook installed (profilers such as
Proton), or ``PREFILLING_DLLM_DIRECT_LAUNCH=0`` (read on every launch; ``1/true/yes`` or
``0/false/no``, any other word is a ValueError). Triton debug knobs changed after a kernel's first launch
are not seen by its cached entry; :func:`clear_launch_cache` forgets every entry (the
:class:`PreparedLaunch` records too). A launch hook counts as installed when either hook chain
(``knobs.runtime.launch_enter_hook`` / ``launch_exit_hook``, a ``HookChain`` in Triton 3.6 and 3.9,
never None) holds a hook, or when one was replaced by another callable; the direct call then
passes None for both hooks and for the launch metadata, which the launchers of both versions
read as "no hook" (``if (hook != Py_None)``), as ``JITFunction.run`` with empty chains amounts to.

:class:`PreparedLaunch` goes one step further for the ops' hot path: one launch whose grid, warps
and non-pointer arguments are fixed (an op prepares it once per metadata signature), so a call
only supplies the pointers.

Source of the idea: the cached-launcher pattern of inference engines (e.g. vLLM's
``triton_utils``), which bypass the JIT dispatcher on the hot path.
"""

from __future__ import annotations

import contextlib
import operator

import torch
import triton

from triton_kernels._env import env_switch

try:  # the launch contract below is Triton >= 3.3's; older Triton has no knobs module
    from triton import knobs
    from triton.runtime.jit import JITFunction
except ImportError:  # pragma: no cover - an old Triton: always kernel[grid]
    knobs = None
    JITFunction = None
try:
    from triton.knobs import HookChain
except ImportError:  # pragma: no cover - hooks are then plain attributes, None when unset
    HookChain = None

# Triton versions whose JITFunction.run / CompiledKernel.run were read for this module.
DIRECT_LAUNCH_VERSIONS = ((3, 6), (3, 9))


def _version() -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in triton.__version__.split(".")[:2])
    except ValueError:  # a local build such as '3.6.0+git...' keeps its numbers; anything else is unknown
        return ()


DIRECT_LAUNCH_ENV = "PREFILLING_DLLM_DIRECT_LAUNCH"
MAX_KEYS = 1024  # compiled kernels kept per entry (one per specialisation key)
MAX_ENTRIES = 512  # entries kept (one per kernel and tuple of argument types)

try:
    from triton.language import dtype as _TritonDtype
except ImportError:  # pragma: no cover
    _TritonDtype = bool
# argument kinds a key may hold besides tensors: hashable values that keep nothing alive
_KEYED_KINDS = frozenset((int, bool, float, str, type(None), _TritonDtype))


def _version_supported() -> bool:
    return knobs is not None and _version() in DIRECT_LAUNCH_VERSIONS


def direct_launch_supported() -> bool:
    """True when :func:`launch` may call compiled kernels directly (see the module docstring).

    Raises:
        ValueError: ``PREFILLING_DLLM_DIRECT_LAUNCH`` holds a word other than 1/true/yes, 0/false/no.
    """
    switch = env_switch(DIRECT_LAUNCH_ENV, True)
    return _version_supported() and switch


class _Entry:
    """Cached compiled kernels of one JITFunction for one tuple of argument types, keyed per specialisation."""

    __slots__ = ("kernel", "tensors", "others", "compiled", "cacheable")

    def __init__(self, kernel, kinds: tuple):
        names = getattr(kernel, "arg_names", None)
        if names is not None and len(names) != len(kinds):  # a launcher out of step with its kernel
            raise TypeError(f"{kernel_name(kernel)} takes {len(names)} arguments, the launcher passed {len(kinds)}")
        self.kernel = kernel  # keeps id(kernel) from being reused while cached
        constexprs = frozenset(getattr(kernel, "constexprs", ()))
        is_tensor = [issubclass(k, torch.Tensor) for k in kinds]
        self.cacheable = all(t or k in _KEYED_KINDS for t, k in zip(is_tensor, kinds))
        t_pos = [i for i, t in enumerate(is_tensor) if t]
        o_pos = [i for i, k in enumerate(kinds) if not is_tensor[i] and (k is not float or i in constexprs)]
        # itemgetter of one index returns the item, not a 1-tuple: pad so both always return tuples
        self.tensors = operator.itemgetter(*t_pos, *t_pos[:1]) if t_pos else (lambda a: ())
        self.others = operator.itemgetter(*o_pos, *o_pos[:1]) if o_pos else (lambda a: ())
        self.compiled: dict = {}


def _entry(kernel, kinds: tuple) -> _Entry:
    if len(_ENTRIES) >= MAX_ENTRIES:
        del _ENTRIES[next(iter(_ENTRIES))]
    entry = _ENTRIES[(id(kernel), kinds)] = _Entry(kernel, kinds)
    return entry


_ENTRIES: dict[tuple, _Entry] = {}  # (id(kernel), argument types) -> entry
_CURRENT: list = []  # [get_current_device, get_current_stream] of Triton's active driver, bound once
_STUB: list | None = None  # inside stub_launches: the record list
COUNTS = {"direct": 0, "jit": 0}  # launches per path since import (tests and bench/kernels/host_time.py read them)


_GENERATION = [0]  # bumped by clear_launch_cache: PreparedLaunch records drop their kernel


def cached_specialisations(kernel) -> int:
    """How many compiled kernels of ``kernel`` the cache holds (all its entries together)."""
    return sum(len(e.compiled) for (k, _), e in _ENTRIES.items() if k == id(kernel))


def clear_launch_cache() -> None:
    """Forget every cached compiled kernel (the next launch of each goes through ``kernel[grid]``)."""
    _ENTRIES.clear()
    _GENERATION[0] += 1


def launch(kernel, grid: tuple, args: tuple, num_warps: int, num_stages: int | None = None):
    """Launch ``kernel`` over ``grid`` (1 to 3 ints) with ``args``: every parameter, constexprs
    included, in the kernel's signature order (positional, as ``JITFunction.run`` binds them).

    Returns the compiled kernel when the direct path served (or cached) this launch, so that a
    :class:`PreparedLaunch` can keep it; None when the launch went through ``kernel[grid]`` only.
    Raises whatever ``kernel[grid]`` raises (compile errors, a pointer Triton cannot access).
    """
    stub = _STUB is not None
    if not stub and (
        type(kernel) is not JITFunction
        or not _DIRECT
        or not env_switch(DIRECT_LAUNCH_ENV, True)
        or _hooked()
        or kernel.pre_run_hooks
    ):
        _jit_launch(kernel, grid, args, num_warps, num_stages)
        return None
    if not stub and not _CURRENT and not _bind_current():
        _jit_launch(kernel, grid, args, num_warps, num_stages)
        return None
    device = _CURRENT[0]() if not stub else -1  # -1: no real device, so stub entries never serve a launch
    kinds = tuple(map(type, args))
    entry = _ENTRIES.get((id(kernel), kinds))
    if entry is None:
        entry = _entry(kernel, kinds)
    if not entry.cacheable:  # an argument the key cannot hold: Triton's own path, nothing kept
        if stub:
            _STUB.append((kernel_name(kernel), _grid3(grid)))
            return None
        _jit_launch(kernel, grid, args, num_warps, num_stages)
        return None
    tensors = entry.tensors(args)
    key = (
        device,
        num_warps,
        num_stages,
        entry.others(args),
        tuple([t.dtype for t in tensors]),
        tuple([t.data_ptr() & 15 == 0 for t in tensors]),
    )
    compiled = entry.compiled.get(key)
    if compiled is None:
        if len(entry.compiled) >= MAX_KEYS:
            del entry.compiled[next(iter(entry.compiled))]
        if stub:
            compiled = entry.compiled[key] = _StubCompiled(kernel)
        else:
            compiled = _jit_launch(kernel, grid, args, num_warps, num_stages)
            if getattr(compiled, "function", None) is not None and not hasattr(compiled, "result"):
                entry.compiled[key] = compiled
                return compiled
            return None
    gx, gy, gz = _grid3(grid)
    stream = _CURRENT[1](device) if not stub else 0
    COUNTS["direct"] += 1
    # JITFunction.run's last call; launch_metadata is None whenever no enter hook is set (checked above)
    compiled.run(gx, gy, gz, stream, compiled.function, compiled.packed_metadata, None, None, None, *args)
    return compiled


def _grid3(grid) -> tuple:
    return (grid[0], grid[1] if len(grid) > 1 else 1, grid[2] if len(grid) > 2 else 1)


def _bind_current() -> bool:
    """Bind the active driver's current device and stream getters; False (and the direct path off
    for good) when the active backend is not CUDA."""
    global _DIRECT
    active = triton.runtime.driver.active
    try:
        backend = active.get_current_target().backend
    except Exception:  # a driver without targets: not one whose launcher was read
        backend = None
    if backend != "cuda":
        _DIRECT = False
        return False
    _CURRENT[:] = [active.get_current_device, active.get_current_stream]
    return True


def _jit_launch(kernel, grid, args, num_warps, num_stages):
    COUNTS["jit"] += 1
    if num_stages is None:
        return kernel[grid](*args, num_warps=num_warps)
    return kernel[grid](*args, num_warps=num_warps, num_stages=num_stages)


def _no_hook(hook) -> bool:
    return hook is None or (HookChain is not None and type(hook) is HookChain and not hook.calls)


def _hooked() -> bool:
    """True when a launch hook is installed (Triton 3.6/3.9 hold empty ``HookChain``s, never None, by default)."""
    runtime = knobs.runtime
    return not (_no_hook(runtime.launch_enter_hook) and _no_hook(runtime.launch_exit_hook))


_DIRECT = _version_supported()  # the switch itself is read on every launch


def kernel_name(kernel) -> str:
    return getattr(getattr(kernel, "fn", kernel), "__name__", type(kernel).__name__)


class PreparedLaunch:
    """One launch of ``kernel`` with a fixed grid, warps, stages and non-pointer arguments (``tail``).

    An op builds it once per metadata signature of its inputs (shapes, strides, dtypes, device), so a
    call only passes its pointers: ``prepared(pointers, aligned)`` launches ``kernel`` with
    ``(*pointers, *tail)`` (``pointers``: tensors, as many at every call). The compiled kernel is kept
    after the first launch and called directly (as :func:`launch` does) while every pointer is 16-byte
    aligned (``aligned``: the specialisation Triton compiled it for), the pointer count, the device and
    the direct-launch conditions are those it was kept under, and :func:`clear_launch_cache` was not
    called since; otherwise the launch goes through
    :func:`launch` (its own cache, keyed on each pointer's alignment).
    """

    __slots__ = (
        "kernel", "grid", "tail", "num_warps", "num_stages", "compiled", "stub", "device", "generation", "n_pointers",
    )  # fmt: skip

    def __init__(self, kernel, grid: tuple, tail: tuple, num_warps: int, num_stages: int | None = None):
        self.kernel = kernel
        self.grid = _grid3(grid)
        self.tail = tail
        self.num_warps = num_warps
        self.num_stages = num_stages
        self.compiled = None
        self.stub = False
        self.device = None
        self.generation = -1
        self.n_pointers = -1

    def __call__(self, pointers: tuple, aligned: bool) -> None:
        compiled = self.compiled
        if (
            compiled is not None
            and aligned
            and self.generation == _GENERATION[0]
            and len(pointers) == self.n_pointers  # the arity the kept kernel was launched with
        ):
            if self.stub:
                if _STUB is not None:
                    COUNTS["direct"] += 1
                    _STUB.append((compiled.name, self.grid))
                    return
            elif (
                _STUB is None
                and _DIRECT
                and env_switch(DIRECT_LAUNCH_ENV, True)
                and not _hooked()
                and not self.kernel.pre_run_hooks
            ):
                device = _CURRENT[0]()
                if device == self.device:
                    gx, gy, gz = self.grid
                    COUNTS["direct"] += 1
                    compiled.run(
                        gx, gy, gz, _CURRENT[1](device), compiled.function, compiled.packed_metadata,
                        None, None, None, *pointers, *self.tail,
                    )  # fmt: skip
                    return
        compiled = launch(self.kernel, self.grid, (*pointers, *self.tail), self.num_warps, self.num_stages)
        if compiled is not None and aligned:
            self.compiled, self.generation, self.n_pointers = compiled, _GENERATION[0], len(pointers)
            self.stub = _STUB is not None
            self.device = _CURRENT[0]() if not self.stub else -1


class _StubCompiled:
    """Stands in for a CompiledKernel inside :func:`stub_launches`: ``run`` records, launches nothing."""

    function = packed_metadata = None

    def __init__(self, kernel):
        self.name = kernel_name(kernel)

    def run(self, gx, gy, gz, *rest):
        if _STUB is not None:
            _STUB.append((self.name, (gx, gy, gz)))


@contextlib.contextmanager
def stub_launches():
    """Test/benchmark hook: inside, :func:`launch` takes its direct path for every kernel, on any
    device, but the compiled kernel is a stand-in that records ``(kernel name, (gx, gy, gz))`` and
    runs nothing. So the Python path of an op's CUDA branch (key, cache, allocation) can be timed
    and audited on a machine without a GPU. Yields the record list."""
    global _STUB
    old = _STUB
    _STUB = record = []
    try:
        yield record
    finally:
        _STUB = old
