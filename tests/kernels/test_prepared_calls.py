"""The ops' prepared calls: a call whose metadata signature was seen reuses the
output specs, plan and launch arguments prepared for it. A changed shape, stride, dtype or scalar
must never reuse a stale record (results against the naive references after alternating inputs),
the validation and the value-check policy stay intact, and the direct launch of a kept compiled
kernel makes the very call ``JITFunction.run`` makes (checked with a stand-in compiled kernel)."""

from __future__ import annotations

import sys

import pytest
import torch
from triton.runtime.jit import JITFunction

import triton_kernels as tk
from triton_kernels import _dispatch, _launch, merge, split_s, topb
from triton_kernels import reference as R
from triton_kernels.plan import H200, assume_gpu

from ._helpers import DEVICE, max_err

I32 = dict(dtype=torch.int32, device=DEVICE)


def _split_s_inputs(m, dtype, gen, kv_transposed=False):
    q = torch.randn(2, m, 4, 16, generator=gen).to(dtype=dtype, device=DEVICE)
    if kv_transposed:  # the same pool values in another memory order: strides (T*H*D, D, T*D, 1)
        kp = torch.randn(3, 2, 20, 16, generator=gen).to(dtype=dtype, device=DEVICE).transpose(1, 2)
        vp = torch.randn(3, 2, 20, 16, generator=gen).to(dtype=dtype, device=DEVICE).transpose(1, 2)
    else:
        kp = torch.randn(3, 20, 2, 16, generator=gen).to(dtype=dtype, device=DEVICE)
        vp = torch.randn(3, 20, 2, 16, generator=gen).to(dtype=dtype, device=DEVICE)
    kl = torch.randn(2, m, 2, 16, generator=gen).to(dtype=dtype, device=DEVICE)
    vl = torch.randn(2, m, 2, 16, generator=gen).to(dtype=dtype, device=DEVICE)
    slots = torch.tensor([[2, 0], [1, -1]], **I32)
    lens = torch.tensor([[20, 7], [13, 0]], **I32)
    return q, kp, vp, slots, lens, kl, vl


def test_split_s_alternating_metadata_never_reuses_a_stale_record():
    """Shapes (M), strides (a transposed pool), dtypes and the scale alternate; every call agrees with
    the naive reference, and a repeat of the first signature still does (its record is reused)."""
    gen = torch.Generator().manual_seed(0)
    variants = [
        (dict(m=3, dtype=torch.float32), None),
        (dict(m=5, dtype=torch.float32), None),
        (dict(m=3, dtype=torch.float32, kv_transposed=True), None),
        (dict(m=3, dtype=torch.float16), None),
        (dict(m=3, dtype=torch.float32), 0.5),
        (dict(m=3, dtype=torch.float32), None),
    ]
    for kw, scale in variants:
        args = _split_s_inputs(gen=gen, **kw)
        out, lse = tk.split_s_attention(*args, sm_scale=scale, backend="triton")
        want, want_lse = R.split_s_attention(*(a.float() if a.is_floating_point() else a for a in args), sm_scale=scale)
        assert out.dtype == args[0].dtype and out.shape == args[0].shape, kw
        tol = 5e-3 if kw["dtype"] == torch.float16 else 1e-5  # fp16: the output's rounding
        assert max_err(out.float(), want) <= tol and max_err(lse, want_lse) <= tol, (kw, scale)


def test_split_s_merged_plan_alternating_with_a_single_partial():
    """A plan with a merge (partial buffers, 2 launches) and one without, in turn, on two pool sizes."""
    gen = torch.Generator().manual_seed(1)
    for t, plan in ((64, dict(split_len=16)), (64, dict(segs_per_prog=2)), (32, dict(split_len=16)), (64, {})):
        q = torch.randn(1, 2, 2, 16, generator=gen).to(DEVICE)
        kp, vp = (torch.randn(2, t, 1, 16, generator=gen).to(DEVICE) for _ in range(2))
        slots, lens = torch.tensor([[0, 1]], **I32), torch.tensor([[t, t - 3]], **I32)
        out, lse = split_s.split_s_launch(q, kp, vp, slots, lens, None, None, 0.25, block_n=16, **plan)
        want, want_lse = R.split_s_attention(q, kp, vp, slots, lens, sm_scale=0.25)
        assert max_err(out, want) <= 1e-5 and max_err(lse, want_lse) <= 1e-5, (t, plan)


def test_merge_alternating_rows_and_strides():
    gen = torch.Generator().manual_seed(2)
    base = torch.randn(3, 4, 6, 16, generator=gen).to(DEVICE)
    cases = [
        base,  # [N, B, H, D]
        torch.randn(2, 5, 16, generator=gen).to(DEVICE),  # other N and rows
        base[:, :, ::2],  # strided rows (they flatten to one stride: no copy)
        base,
    ]
    for o in cases:
        lse = torch.randn(o.shape[:-1], generator=gen).to(DEVICE)
        out, out_lse = tk.merge_states(o, lse, backend="triton")
        want, want_lse = R.merge_states(o, lse)
        assert max_err(out, want) <= 1e-5 and max_err(out_lse, want_lse) <= 1e-5, tuple(o.shape)


def test_chunk_scores_alternating_shapes_and_extra_keys():
    gen = torch.Generator().manual_seed(3)
    for n, m, t, e in ((2, 3, 16, 4), (3, 2, 24, 0), (2, 3, 16, 4), (2, 3, 16, 5)):
        q = torch.randn(n, m, 4, 16, generator=gen).to(DEVICE)
        k = torch.randn(n, t, 2, 16, generator=gen).to(DEVICE)
        x = torch.randn(n, e, 2, 16, generator=gen).to(DEVICE) if e else None
        lens = torch.tensor([t, t // 2, 1][:n], **I32)
        got = tk.chunk_attention_scores(q, k, lens, x, backend="triton")
        want = R.chunk_attention_scores(q, k, lens, x)
        for g, w in zip(got, want):
            assert g.shape == w.shape and max_err(g, w) <= 1e-5, (n, m, t, e)
        qr = torch.randn(n, t, 4, 16, generator=gen).to(DEVICE)
        got = tk.chunk_row_mass(qr, k, lens, x, backend="triton")
        assert max_err(got, R.chunk_row_mass(qr, k, lens, x)) <= 1e-5, (n, t, e)


def test_topb_alternating_metadata_never_reuses_a_stale_record():
    """T, b, lens (none / int32 / int64), the pool, keep_first, the scores' strides and K/V dtype
    alternate; every call equals the naive reference exactly, a repeated signature too."""
    gen = torch.Generator().manual_seed(9)
    variants = [
        dict(t=24, b=5),
        dict(t=24, b=7),
        dict(t=20, b=5, lens=torch.int32),
        dict(t=24, b=5, lens=torch.int64),
        dict(t=24, b=5, pool=3, keep_first=False),
        dict(t=24, b=5, strided=True),
        dict(t=24, b=5, dtype=torch.float16),
        dict(t=24, b=5),
    ]
    for kw in variants:
        t, b, dtype = kw["t"], kw["b"], kw.get("dtype", torch.float32)
        scores = torch.randn(2, 2, 2 * t if kw.get("strided") else t, generator=gen).to(DEVICE)
        scores = scores[..., ::2] if kw.get("strided") else scores
        k, v = (torch.randn(2, t, 2, 8, generator=gen).to(dtype=dtype, device=DEVICE) for _ in range(2))
        lens = torch.tensor([t, t // 3], dtype=kw["lens"], device=DEVICE) if "lens" in kw else None
        opts = dict(lens=lens, pool_kernel=kw.get("pool", 7), keep_first=kw.get("keep_first", True))
        got = tk.topb_gather(scores, k, v, b, backend="triton", **opts)
        want = R.topb_gather(scores, k, v, b, **opts)
        for name, x, y in zip(("k_out", "v_out", "idx", "kept"), got, want, strict=True):
            assert x.dtype == y.dtype and x.shape == y.shape and torch.equal(x, y), (kw, name)


def test_topb_seen_signature_still_checks_the_scalars_types():
    """1 == True as dict keys: the memo let ``keep_first=1`` through after ``keep_first=True``."""
    scores, k = torch.randn(2, 2, 8), torch.randn(2, 8, 2, 4)
    tk.topb_gather(scores, k, k, 3, keep_first=True, backend="torch")
    with pytest.raises(TypeError, match="keep_first must be a bool"):
        tk.topb_gather(scores, k, k, 3, keep_first=1, backend="torch")
    with pytest.raises(TypeError, match="b must be"):
        tk.topb_gather(scores, k, k, True, backend="torch")


def test_seen_signature_still_raises_for_a_bool_scale():
    """1 == True as dict keys: the memo once let ``sm_scale=True`` through after ``sm_scale=1``."""
    args = _split_s_inputs(3, torch.float32, torch.Generator().manual_seed(4))
    tk.split_s_attention(*args, sm_scale=1, backend="torch")
    with pytest.raises(TypeError, match="sm_scale must be a float"):
        tk.split_s_attention(*args, sm_scale=True, backend="torch")
    q, k = torch.randn(2, 3, 4, 16), torch.randn(2, 8, 2, 16)
    tk.chunk_row_mass(torch.randn(2, 8, 4, 16), k, sm_scale=1, backend="torch")
    with pytest.raises(TypeError, match="sm_scale must be a float"):
        tk.chunk_row_mass(torch.randn(2, 8, 4, 16), k, sm_scale=True, backend="torch")
    tk.chunk_attention_scores(q, k, sm_scale=1, backend="torch")
    with pytest.raises(TypeError, match="sm_scale must be a float"):
        tk.chunk_attention_scores(q, k, sm_scale=True, backend="torch")


def test_a_prepared_signature_keeps_every_check():
    """After a record exists: another device still raises, and the checked mode still reads the
    table values (the record skips only the metadata checks of the very same metadata)."""
    q, kp, vp, slots, lens, kl, vl = _split_s_inputs(3, torch.float32, torch.Generator().manual_seed(5))
    tk.split_s_attention(q, kp, vp, slots, lens, kl, vl, backend="triton")
    with pytest.raises(ValueError, match="device mismatch"):
        tk.split_s_attention(q, kp.to("meta"), vp, slots, lens, kl, vl, backend="triton")
    bad = torch.tensor([[2, 9], [1, -1]], **I32)
    with tk.eager_value_checks(), pytest.raises(ValueError, match="seg_slots out of range"):
        tk.split_s_attention(q, kp, vp, bad, lens, kl, vl, backend="triton")


@pytest.fixture
def stubbed(monkeypatch):
    """The CUDA branch on CPU tensors, launches stubbed (as tests/kernels/test_host_path.py)."""
    monkeypatch.delenv("PREFILLING_DLLM_CHECK_VALUES", raising=False)
    with _launch.stub_launches() as record, _dispatch.cuda_check_policy_on("cpu"), assume_gpu(H200):
        with _dispatch.poison_outputs(False):
            yield record


def test_prepared_path_allocates_only_the_outputs_and_follows_the_policy(stubbed, monkeypatch):
    """The prepared path (no dispatch mode active) allocates the two outputs and launches once; the
    value-check policy is read on every call: the env variable and the checked mode take effect on a
    signature already prepared."""
    allocs = []
    for name in ("empty", "empty_strided", "zeros", "full", "empty_like", "zeros_like"):
        real = getattr(torch, name)
        monkeypatch.setattr(torch, name, lambda *a, _real=real, _n=name, **k: allocs.append(_n) or _real(*a, **k))
    args = list(_split_s_inputs(4, torch.float32, torch.Generator().manual_seed(6)))
    tk.split_s_attention(*args, backend="triton")  # prepares
    stubbed.clear(), allocs.clear()
    tk.split_s_attention(*args, backend="triton")
    assert len(allocs) == 2 and [name for name, _ in stubbed] == ["_split_s_partial_kernel"]
    args[3] = torch.tensor([[2, 9], [1, -1]], dtype=torch.int32)  # slot 9 >= P: only the kernel sees it
    tk.split_s_attention(*args, backend="triton")  # the CUDA policy: no host read, no error here
    monkeypatch.setenv("PREFILLING_DLLM_CHECK_VALUES", "1")
    with pytest.raises(ValueError, match="seg_slots out of range"):
        tk.split_s_attention(*args, backend="triton")
    monkeypatch.setenv("PREFILLING_DLLM_CHECK_VALUES", "0")
    tk.split_s_attention(*args, backend="triton")
    monkeypatch.delenv("PREFILLING_DLLM_CHECK_VALUES")
    with tk.eager_value_checks(), pytest.raises(ValueError, match="seg_slots out of range"):
        tk.split_s_attention(*args, backend="triton")
    with tk.eager_value_checks(), tk.skip_value_checks():
        tk.split_s_attention(*args, backend="triton")


@pytest.mark.parametrize("op,outputs,launches", [("merge", 2, 1), ("scores", 3, 3), ("row_mass", 1, 1), ("topb", 4, 2)])
def test_prepared_path_of_the_other_ops_allocates_only_the_outputs(stubbed, monkeypatch, op, outputs, launches):
    gen = torch.Generator().manual_seed(8)
    k, x = torch.randn(3, 64, 2, 32, generator=gen), torch.randn(3, 4, 2, 32, generator=gen)
    lens = torch.tensor([64, 10, 1], dtype=torch.int32)
    o, lse, q, qr = (
        torch.randn(3, 2, 8, 4, 32),
        torch.randn(3, 2, 8, 4),
        torch.randn(3, 6, 4, 32),
        torch.randn(3, 64, 4, 32),
    )
    scores = torch.randn(3, 2, 64, generator=gen)
    call = {
        "merge": lambda: tk.merge_states(o, lse, backend="triton"),
        "scores": lambda: tk.chunk_attention_scores(q, k, lens, x, backend="triton"),
        "row_mass": lambda: tk.chunk_row_mass(qr, k, lens, x, backend="triton"),
        "topb": lambda: tk.topb_gather(scores, k, k, 8, lens=lens, backend="triton"),
    }[op]
    call()  # prepares
    allocs = []
    for name in ("empty", "empty_strided", "zeros", "full", "empty_like", "zeros_like"):
        real = getattr(torch, name)
        monkeypatch.setattr(torch, name, lambda *a, _real=real, _n=name, **kw: allocs.append(_n) or _real(*a, **kw))
    stubbed.clear()
    call()
    assert len(allocs) == outputs and len(stubbed) == launches, (allocs, stubbed)


def test_topb_prepared_call_skips_the_generic_launch_path(stubbed, monkeypatch):
    """A seen ``topb_gather`` signature launches its two kept records directly: no
    ``launch`` (per-launch key of every argument), no metadata check, no registered-op dispatch, and a
    short Python path (the old code went through both launchers and ``launch`` on every call: 35.9 us
    of host time in ``bench/results/host_time_cpu.md``, 13 us with the prepared call). Under
    ``PREFILLING_DLLM_CHECK_VALUES=1`` the prepared signature still reads the values and raises."""
    gen = torch.Generator().manual_seed(10)
    scores, k = torch.randn(3, 2, 64, generator=gen), torch.randn(3, 64, 2, 32, generator=gen)
    lens = torch.tensor([64, 10, 1], dtype=torch.int32)
    call = lambda: tk.topb_gather(scores, k, k, 8, lens=lens, backend="triton")  # noqa: E731
    call()  # prepares
    generic = []
    for mod in (_launch, topb):
        real = mod.launch
        monkeypatch.setattr(mod, "launch", lambda *a, _real=real, **kw: generic.append(a[0]) or _real(*a, **kw))
    monkeypatch.setattr(topb, "_validate", lambda *a: pytest.fail("metadata checks on a seen signature"))
    monkeypatch.setattr(topb, "call_op", lambda *a: pytest.fail("the registered-op path in eager mode"))
    stubbed.clear()
    frames = []
    sys.setprofile(lambda frame, event, arg: frames.append(frame.f_code.co_name) if event == "call" else None)
    try:
        call()
    finally:
        sys.setprofile(None)
    assert generic == [] and [name for name, _ in stubbed] == ["_select_topb_kernel", "_gather_rows_kernel"]
    # the public op, backend, signature, memo, policy, _run, 4 output specs, 2 launch records, ...; 22, not
    # 20, since the signature's is_compiling check (2 frames: traced calls keep off the memo, test_dispatch)
    assert len(frames) <= 22, frames
    scores[1, 0, 3] = float("nan")
    monkeypatch.setenv("PREFILLING_DLLM_CHECK_VALUES", "1")
    with pytest.raises(ValueError, match="NaN"):
        call()


def test_env_reads_what_os_environ_holds(monkeypatch):
    """The cheap environment read sees a variable set, changed or removed at run time."""
    monkeypatch.delenv("PREFILLING_DLLM_BACKEND", raising=False)
    assert _dispatch.env("PREFILLING_DLLM_BACKEND", "auto") == "auto"
    for value in ("torch", "Triton ", "tritón"):
        monkeypatch.setenv("PREFILLING_DLLM_BACKEND", value)
        assert _dispatch.env("PREFILLING_DLLM_BACKEND", "auto") == value
    monkeypatch.setenv("PREFILLING_DLLM_SOME_NEW_NAME", "1")
    assert _dispatch.env("PREFILLING_DLLM_SOME_NEW_NAME", "0") == "1"


def test_prepared_launch_grid_follows_the_shapes(stubbed):
    """Alternating row counts through merge_states: each call's grid is its own plan's."""
    grids = []
    for rows in (4, 300, 4, 300):
        stubbed.clear()
        tk.merge_states(torch.randn(2, rows, 16), torch.randn(2, rows), backend="triton")
        grids.append(stubbed[0][1])
    assert grids[0] == grids[2] and grids[1] == grids[3] and grids[0] != grids[1]
    want = merge.plan_merge(2, 300, 16, H200).grid[0]
    assert grids[1] == (want, 1, 1)


@pytest.fixture
def fake_triton(fake_launcher):
    """A real JITFunction (never compiled), the direct path on, a fake device/stream, and a kernel[grid]
    that returns a recording stand-in for the compiled kernel (conftest.py)."""

    def body(x_ptr, n, BLOCK: int):  # the kernel is never run: only its JITFunction wrapper is used
        pass

    compiled, jit_calls = fake_launcher
    return JITFunction(body), compiled, jit_calls


def test_prepared_launch_calls_the_compiled_kernel_as_jit_run_does(fake_triton, monkeypatch):
    """The first launch goes through kernel[grid]; then ``compiled.run(gx, gy, gz, stream, function,
    packed_metadata, None, None, None, *args)`` (JITFunction.run's call in Triton 3.6 and 3.9, with no
    launch hook); a misaligned pointer, another current device, an installed hook or a cleared
    launch cache go through :func:`launch` again."""
    kernel, compiled, jit_calls = fake_triton
    x = torch.zeros(8)
    prepared = _launch.PreparedLaunch(kernel, (3, 2), (8, 16), 4)
    prepared((x,), True)
    assert len(jit_calls) == 1 and jit_calls[0] == ((3, 2, 1), (x, 8, 16)) and compiled.calls == []
    prepared((x,), True)
    assert compiled.calls == [(3, 2, 1, 1000, 7, ("packed",), None, None, None, x, 8, 16)]
    prepared((x[1:],), False)  # misaligned: launch() keys on alignment (its own cache, kernel[grid] once)
    assert len(jit_calls) == 2
    monkeypatch.setattr(_launch, "_CURRENT", [lambda: 1, lambda device: 1000 + device])
    prepared((x,), True)  # another current device: not the kept kernel's
    assert len(jit_calls) == 3
    monkeypatch.setattr(_launch, "_CURRENT", [lambda: 0, lambda device: 1000 + device])
    hook = lambda metadata: None  # noqa: E731
    _launch.knobs.runtime.launch_enter_hook.add(hook)
    try:
        assert _launch._hooked()
        prepared((x,), True)  # a profiler's hook: kernel[grid], which calls it
        assert len(jit_calls) == 4
    finally:
        _launch.knobs.runtime.launch_enter_hook.remove(hook)
    n_direct = len(compiled.calls)
    prepared((x,), True)
    assert len(compiled.calls) == n_direct + 1
    _launch.clear_launch_cache()
    prepared((x,), True)
    assert len(jit_calls) == 5


def test_no_launch_hook_by_default():
    """Triton 3.6 and 3.9 hold empty HookChains, never None: the old ``is not None`` test saw a hook
    on every launch, so the direct path was never taken on a GPU."""
    assert not _launch._hooked()


def test_a_swapped_kernel_is_launched_not_the_prepared_one(monkeypatch):
    """The AOT compile gate swaps the modules' kernels for stand-ins: a signature prepared before must
    launch the stand-in while it is in place, and the real kernel again afterwards."""
    args = _split_s_inputs(3, torch.float32, torch.Generator().manual_seed(7))
    want, _ = R.split_s_attention(*args)
    out, _ = tk.split_s_attention(*args, backend="triton")  # prepares with the real kernel
    assert max_err(out, want) <= 1e-5
    launched = []

    class StandIn:
        def __getitem__(self, grid):
            return lambda *a, **k: launched.append(grid)

    with monkeypatch.context() as patch:
        patch.setattr(split_s, "_split_s_partial_kernel", StandIn())
        patch.setattr(split_s, "require_runnable", lambda *a, **k: None)
        tk.split_s_attention(*args, backend="triton")
        assert len(launched) == 1
    out, _ = tk.split_s_attention(*args, backend="triton")
    assert len(launched) == 1 and max_err(out, want) <= 1e-5
