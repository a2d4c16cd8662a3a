"""The direct launch path's cache (``triton_kernels._launch``): what its key holds and what it refuses.

A real ``JITFunction`` wraps each kernel below (never compiled); ``kernel[grid]`` is replaced by a
recorder that returns a stand-in compiled kernel, so a launch that the cache serves shows up as a
``run`` call on that stand-in and a miss as a ``kernel[grid]`` call. Triton's own rule is the
reference: it specialises on constexpr values of every type (floats included), on the Python type of
each argument (``True`` is an ``i1``, ``1`` an ``i32``, ``None`` a constant, a tensor a pointer), and
never on a non-constexpr float."""

from __future__ import annotations

import gc
import weakref

import pytest
import torch
import triton
import triton.language as tl
from triton.runtime.jit import JITFunction

from triton_kernels import _launch


def _scaled(x_ptr, n, SCALE: tl.constexpr):  # never run: its JITFunction wrapper is what is cached
    pass


def _plain(x_ptr, n):
    pass


def test_float_constexprs_are_keyed_plain_floats_are_not(fake_launcher):
    compiled, jit_calls = fake_launcher
    scaled, plain = JITFunction(_scaled), JITFunction(_plain)
    x = torch.zeros(4)
    _launch.launch(scaled, (1,), (x, 4, 0.5), 4)
    _launch.launch(scaled, (1,), (x, 4, 0.25), 4)  # another constexpr value: Triton compiles anew
    assert len(jit_calls) == 2 and compiled.calls == []
    _launch.launch(scaled, (1,), (x, 4, 0.5), 4)
    assert len(jit_calls) == 2 and len(compiled.calls) == 1 and compiled.calls[0][-1] == 0.5
    _launch.launch(plain, (1,), (x, 0.5), 4)
    _launch.launch(plain, (1,), (x, 0.25), 4)  # a runtime float: the same compiled kernel, value passed
    assert len(jit_calls) == 3 and compiled.calls[-1][-1] == 0.25


def test_argument_types_never_share_a_compiled_kernel(fake_launcher):
    """``True`` and ``1`` are equal and hash alike, an int and a float too; Triton keeps them apart."""
    compiled, jit_calls = fake_launcher
    plain = JITFunction(_plain)
    x = torch.zeros(4)
    for n in (1, True, 1.0):
        _launch.launch(plain, (1,), (x, n), 4)
    assert len(jit_calls) == 3 and compiled.calls == []
    _launch.launch(plain, (1,), (x, True), 4)
    assert len(jit_calls) == 3 and compiled.calls[-1][-1] is True


def test_none_where_a_tensor_was_and_back(fake_launcher):
    compiled, jit_calls = fake_launcher
    plain = JITFunction(_plain)
    x = torch.zeros(4)
    _launch.launch(plain, (1,), (x, 4), 4)
    _launch.launch(plain, (1,), (None, 4), 4)  # before: AttributeError ('NoneType' has no dtype)
    assert len(jit_calls) == 2
    _launch.launch(plain, (1,), (None, 4), 4)
    assert compiled.calls[-1][-2:] == (None, 4)
    y = torch.zeros(4)
    probe = weakref.ref(y)
    _launch.launch(plain, (1,), (y, 4), 4)  # a tensor where None was: a pointer, not a key value
    compiled.calls.clear()  # the recorders' own references
    jit_calls.clear()
    del y
    gc.collect()
    assert probe() is None  # the cache keeps no tensor alive


class _DescriptorLike:
    """An argument the key cannot hold (Triton's TMA descriptors are unhashable; this one also looks
    like a tensor to a careless cache)."""

    __hash__ = None

    def data_ptr(self):
        return 0


def test_unknown_argument_kinds_go_through_kernel_grid_every_time(fake_launcher):
    compiled, jit_calls = fake_launcher
    plain = JITFunction(_plain)
    desc = _DescriptorLike()
    probe = weakref.ref(desc)
    for _ in range(3):
        assert _launch.launch(plain, (1,), (desc, 4), 4) is None
    assert len(jit_calls) == 3 and compiled.calls == []
    jit_calls.clear()
    del desc
    gc.collect()
    assert probe() is None


def test_every_entry_checks_its_arity(fake_launcher):
    compiled, jit_calls = fake_launcher
    plain = JITFunction(_plain)
    x = torch.zeros(4)
    _launch.launch(plain, (1,), (x, 4), 4)
    with pytest.raises(TypeError, match="takes 2 arguments, the launcher passed 1"):
        _launch.launch(plain, (1,), (x,), 4)
    with pytest.raises(TypeError, match="takes 2 arguments, the launcher passed 3"):
        _launch.launch(plain, (1,), (x, 4, 5), 4)
    prepared = _launch.PreparedLaunch(plain, (1,), (4,), 4)
    prepared((x,), True)
    prepared((x,), True)
    assert len(compiled.calls) == 2  # the kept kernel
    with pytest.raises(TypeError, match="takes 2 arguments"):
        prepared((x, x), True)  # not the kept kernel's arity: through launch(), which refuses it


def test_the_cache_is_bounded(fake_launcher, monkeypatch):
    compiled, jit_calls = fake_launcher
    monkeypatch.setattr(_launch, "MAX_KEYS", 3)
    monkeypatch.setattr(_launch, "MAX_ENTRIES", 2)
    plain = JITFunction(_plain)
    x = torch.zeros(4)
    for n in range(10):  # one key per length, as a growing context passes
        _launch.launch(plain, (1,), (x, n + 2), 4)
    assert _launch.cached_specialisations(plain) == 3
    _launch.launch(plain, (1,), (x, 11), 4)  # among the newest three: served directly
    assert len(compiled.calls) == 1
    _launch.launch(plain, (1,), (x, 2), 4)  # the oldest, forgotten: kernel[grid] again
    assert len(jit_calls) == 11
    for kind in (0.5, True, None):  # three more argument-type tuples: two entries kept at most
        _launch.launch(plain, (1,), (x, kind), 4)
    assert len(_launch._ENTRIES) == 2


def test_direct_launch_switch_is_read_on_every_launch(fake_launcher, monkeypatch):
    compiled, jit_calls = fake_launcher
    plain = JITFunction(_plain)
    x = torch.zeros(4)
    _launch.launch(plain, (1,), (x, 4), 4)
    monkeypatch.setenv("PREFILLING_DLLM_DIRECT_LAUNCH", "0")
    _launch.launch(plain, (1,), (x, 4), 4)
    prepared = _launch.PreparedLaunch(plain, (1,), (4,), 4)
    prepared((x,), True)
    assert len(jit_calls) == 3 and compiled.calls == []
    monkeypatch.setenv("PREFILLING_DLLM_DIRECT_LAUNCH", "yes")
    _launch.launch(plain, (1,), (x, 4), 4)
    assert len(compiled.calls) == 1
    monkeypatch.setenv("PREFILLING_DLLM_DIRECT_LAUNCH", "on")
    with pytest.raises(ValueError, match="PREFILLING_DLLM_DIRECT_LAUNCH must be 1/true/yes or 0/false/no"):
        _launch.launch(plain, (1,), (x, 4), 4)
    with pytest.raises(ValueError, match="PREFILLING_DLLM_DIRECT_LAUNCH"):
        _launch.direct_launch_supported()


class _Target:
    def __init__(self, backend):
        self.backend = backend


class _Driver:
    def __init__(self, backend):
        self.target = _Target(backend)

    def get_current_target(self):
        return self.target

    def get_current_device(self):
        return 0

    def get_current_stream(self, device):
        return 1000


@pytest.mark.parametrize("backend, direct", [("hip", False), ("cuda", True)])
def test_direct_path_on_the_cuda_backend_only(fake_launcher, monkeypatch, backend, direct):
    """ROCm specialises a tensor on its storage size (32-bit buffer offsets), which the key does not hold."""
    compiled, jit_calls = fake_launcher
    monkeypatch.setattr(_launch, "_CURRENT", [])
    monkeypatch.setattr(triton.runtime.driver, "_active", _Driver(backend), raising=False)
    monkeypatch.setattr(type(triton.runtime.driver), "active", property(lambda self: self._active))
    plain = JITFunction(_plain)
    x = torch.zeros(4)
    for _ in range(3):
        _launch.launch(plain, (1,), (x, 4), 4)
    assert len(compiled.calls) == (2 if direct else 0)
    assert _launch._DIRECT is direct
