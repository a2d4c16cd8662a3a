"""Dispatch rules, torch.library registration and torch.compile (fullgraph) on the public ops."""

from __future__ import annotations

import pytest
import torch

import triton_kernels as tk
from triton_kernels import _dispatch
from triton_kernels import reference as R

from ._helpers import DEVICE, ON_GPU, max_err


def _small():
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(2, 5, 4, 32, generator=gen).to(DEVICE)
    kp = torch.randn(3, 10, 2, 32, generator=gen).to(DEVICE)
    vp = torch.randn(3, 10, 2, 32, generator=gen).to(DEVICE)
    slots = torch.tensor([[0, 2], [1, -1]], dtype=torch.int32, device=DEVICE)
    lens = torch.tensor([[10, 3], [0, 4]], dtype=torch.int32, device=DEVICE)
    kl = torch.randn(2, 5, 2, 32, generator=gen).to(DEVICE)
    vl = torch.randn(2, 5, 2, 32, generator=gen).to(DEVICE)
    return q, kp, vp, slots, lens, kl, vl


def test_resolve_backend(monkeypatch):
    monkeypatch.delenv("PREFILLING_DLLM_BACKEND", raising=False)
    assert _dispatch.resolve_backend(None, torch.device("cpu")) == "torch"
    assert _dispatch.resolve_backend(None, torch.device("cuda", 0)) == "triton"
    assert _dispatch.resolve_backend("triton", torch.device("cpu")) == "triton"
    monkeypatch.setenv("PREFILLING_DLLM_BACKEND", "triton")
    assert _dispatch.resolve_backend(None, torch.device("cpu")) == "triton"
    assert _dispatch.resolve_backend("torch", torch.device("cuda", 0)) == "torch"  # keyword wins
    monkeypatch.setenv("PREFILLING_DLLM_BACKEND", "bogus")
    with pytest.raises(ValueError, match="PREFILLING_DLLM_BACKEND"):
        _dispatch.resolve_backend(None, torch.device("cpu"))


def test_env_var_routes_to_kernels(monkeypatch):
    """PREFILLING_DLLM_BACKEND=triton sends CPU tensors to the (interpreted) kernels."""
    calls = []
    real = tk.split_s._run  # where every call of the Triton backend launches (prepared or not)
    monkeypatch.setattr(tk.split_s, "_run", lambda *a, **k: calls.append(1) or real(*a, **k))
    monkeypatch.setenv("PREFILLING_DLLM_BACKEND", "triton")
    out, _ = tk.split_s_attention(*_small())
    assert calls == [1]
    monkeypatch.setenv("PREFILLING_DLLM_BACKEND", "torch")
    ref, _ = tk.split_s_attention(*_small())
    assert calls == [1] and max_err(out, ref) <= 1e-5


@pytest.mark.skipif(ON_GPU, reason="CPU-only rule")
def test_triton_on_cpu_without_interpreter_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(_dispatch, "is_interpreted", lambda kernel: False)
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET=1"):
        tk.split_s_attention(*_small(), backend="triton")
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET=1"):
        tk.merge_states(torch.randn(2, 3, 16), torch.randn(2, 3), backend="triton")


def test_value_checks_can_be_disabled(monkeypatch):
    q, kp, vp, slots, lens, kl, vl = _small()
    bad = torch.tensor([[0, 2], [1, 7]], dtype=torch.int32, device=DEVICE)  # slot 7 >= P, but lens = 0 there
    lens = torch.tensor([[10, 3], [0, 0]], dtype=torch.int32, device=DEVICE)
    with pytest.raises(ValueError, match="seg_slots out of range"):
        tk.split_s_attention(q, kp, vp, bad, lens, kl, vl)
    monkeypatch.setenv("PREFILLING_DLLM_CHECK_VALUES", "0")
    tk.split_s_attention(q, kp, vp, bad.clamp(max=2), lens, kl, vl)  # no check, valid data: runs


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_compile_fullgraph_split_s(backend):
    torch._dynamo.reset()

    def step(q, kp, vp, slots, lens, kl, vl):
        out, lse = tk.split_s_attention(q, kp, vp, slots, lens, kl, vl, backend=backend)
        return out * 2 + 1, lse.exp().sum(-1)

    args = _small()
    compiled = torch.compile(step, fullgraph=True)
    got = compiled(*args)
    want = step(*args)
    assert max_err(got[0], want[0]) <= 1e-5 and max_err(got[1], want[1]) <= 1e-4
    ref, _ = R.split_s_attention(*args)
    assert max_err(got[0], ref * 2 + 1) <= 1e-4


def test_compile_fullgraph_scoring_pipeline():
    """chunk scores -> top-b gather -> merge in one compiled graph (default dispatch)."""
    torch._dynamo.reset()
    gen = torch.Generator().manual_seed(1)
    q = torch.randn(2, 5, 4, 32, generator=gen).to(DEVICE)
    k = torch.randn(2, 12, 2, 32, generator=gen).to(DEVICE)
    lens = torch.tensor([12, 7], device=DEVICE)

    def pipeline(q, k, lens):
        mass, extra, lse = tk.chunk_attention_scores(q, k, lens, k[:, :3])
        rows = tk.chunk_row_mass(torch.cat([q, q, q[:, :2]], 1), k, lens, k[:, :3])
        k_out, v_out, idx, kept = tk.topb_gather(mass + rows, k, k, 4, lens=lens, pool_kernel=3)
        o, l2 = tk.merge_states(k_out.transpose(0, 1), lse[:, :4, :2].transpose(0, 1))
        return k_out, idx, kept, o, l2, extra

    got = torch.compile(pipeline, fullgraph=True)(q, k, lens)
    want = pipeline(q, k, lens)
    for a, b in zip(got, want, strict=True):
        assert a.shape == b.shape and max_err(a, b) <= 1e-5


def test_compile_after_eager_calls_with_numpy_scalars():
    """An eager call with numpy integers (accepted for b and pool_kernel) memoizes its metadata with them;
    compiling any op afterwards must not trace that process-wide memo (dynamo cannot hash numpy scalars:
    "unhashable type: 'numpy.ndarray'"); traced calls skip it."""
    np = pytest.importorskip("numpy")
    torch._dynamo.reset()
    gen = torch.Generator().manual_seed(2)
    scores, k = torch.randn(2, 2, 12, generator=gen).to(DEVICE), torch.randn(2, 12, 2, 32, generator=gen).to(DEVICE)
    eager = tk.topb_gather(scores, k, k, np.int64(3), pool_kernel=np.int64(3))
    assert tk.topb_gather(scores, k, k, 3, pool_kernel=3)[2].equal(eager[2])

    def step(q, kp, vp, slots, lens, kl, vl):
        return tk.split_s_attention(q, kp, vp, slots, lens, kl, vl)[0] * 2

    args = _small()
    got = torch.compile(step, fullgraph=True)(*args)
    ref, _ = R.split_s_attention(*args)
    assert max_err(got, ref * 2) <= 1e-4
    got_idx = torch.compile(lambda s, k: tk.topb_gather(s, k, k, 3, pool_kernel=3)[2], fullgraph=True)(scores, k)
    assert got_idx.equal(eager[2])


def test_eager_calls_between_compiled_calls_do_not_recompile():
    """Eager calls with new shapes add keys to the ops' metadata memo; a compiled graph stays one graph (had
    it read the memo while tracing, it would be guarded on the memo and recompile)."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()

    def inputs(n):
        gen = torch.Generator().manual_seed(n)
        return torch.randn(2, 2, n, generator=gen).to(DEVICE), torch.randn(2, n, 2, 32, generator=gen).to(DEVICE)

    compiled = torch.compile(lambda s, k: tk.topb_gather(s, k, k, 3)[2], fullgraph=True)
    scores, k = inputs(12)
    first = compiled(scores, k)
    for n in (16, 20, 24):
        s2, k2 = inputs(n)
        tk.topb_gather(s2, k2, k2, 3)
    assert compiled(scores, k).equal(first) and first.equal(tk.topb_gather(scores, k, k, 3)[2])
    assert counters["stats"]["unique_graphs"] == 1


def test_environment_changes_between_compiled_calls_do_not_recompile(monkeypatch):
    """The ops read PREFILLING_DLLM_* through os.environ's own dict; read once at trace time, so setting
    other variables between calls keeps one graph (a traced read would guard on the environment's size,
    recompile on every change and fail fullgraph after recompile_limit)."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    gen = torch.Generator().manual_seed(3)
    scores, k = torch.randn(2, 2, 12, generator=gen).to(DEVICE), torch.randn(2, 12, 2, 32, generator=gen).to(DEVICE)
    compiled = torch.compile(lambda s, k: tk.topb_gather(s, k, k, 3)[2], fullgraph=True)
    first = compiled(scores, k)
    for i in range(12):
        monkeypatch.setenv(f"PREFILLING_DLLM_TEST_UNRELATED_{i}", "1")
        assert compiled(scores, k).equal(first)
    assert counters["stats"]["unique_graphs"] == 1


def test_shape_errors_under_compile_keep_their_message():
    """A layout error raised while dynamo traces reaches the user with the op's words (dynamo wraps it; a
    message built with str += str would be lost to dynamo's 'missing sq_concat')."""
    torch._dynamo.reset()
    q, kp, vp, slots, lens, kl, vl = _small()
    bad_q = q[:, :, :3]  # Hq=3 against Hkv=2
    with pytest.raises(ValueError, match="multiple of KV heads"):
        tk.split_s_attention(bad_q, kp, vp, slots, lens, kl, vl)
    compiled = torch.compile(lambda *a: tk.split_s_attention(*a)[0], fullgraph=True)
    with pytest.raises(Exception, match="multiple of KV heads Hkv=2") as e:
        compiled(bad_q, kp, vp, slots, lens, kl, vl)
    assert "Expected layout: q [B, M, Hq, D]" in str(e.value)


def test_opcheck_registrations():
    """torch.library.opcheck: schema, fake (meta) kernels and dispatcher behaviour of each op."""
    q, kp, vp, slots, lens, kl, vl = _small()
    ops = torch.ops.prefilling_dllm
    torch.library.opcheck(ops.split_s_attention, (q, kp, vp, slots, lens, kl, vl, None, 0.2, "torch"))
    live_lens = torch.tensor([5, 2], dtype=torch.int32, device=DEVICE)  # on the inputs' device
    torch.library.opcheck(ops.split_s_attention, (q, kp, vp, slots, lens, kl, vl, live_lens, 0.2, "torch"))
    torch.library.opcheck(
        ops.merge_states, (torch.randn(3, 4, 2, 16, device=DEVICE), torch.randn(3, 4, 2, device=DEVICE), "torch")
    )
    k = torch.randn(2, 12, 2, 32, device=DEVICE)
    torch.library.opcheck(ops.chunk_attention_scores, (q, k, None, k[:, :3], 0.2, "torch"))
    rows_q = torch.randn(2, 12, 4, 32, device=DEVICE)
    torch.library.opcheck(ops.chunk_row_mass, (rows_q, k, None, k[:, :3], 0.2, "torch"))
    torch.library.opcheck(ops.topb_gather, (torch.randn(2, 2, 12, device=DEVICE), k, k, 4, None, 3, True, "torch"))


def test_registered_ops_name_the_wrong_device_argument_first():
    """The registered op with one tensor on another device says which one, before any
    value check runs a reduction that mixes the devices (on the H200: a torch.cat device error).

    The op's Python body is called directly: a meta tensor would route ``torch.ops`` to the fake kernel.
    On a GPU the same call goes through ``torch.ops`` with the table on the CPU."""
    q, kp, vp, slots, lens, kl, vl = _small()
    other = torch.device("cpu") if ON_GPU else torch.device("meta")  # any device but the inputs'
    split_s_op = torch.ops.prefilling_dllm.split_s_attention if ON_GPU else tk.split_s._split_s_entry
    topb_op = torch.ops.prefilling_dllm.topb_gather if ON_GPU else tk.topb._topb_entry
    live_lens = torch.tensor([5, 2], dtype=torch.int32, device=other)
    wrong = rf"device mismatch: .* but live_lens is on {other.type}"
    with pytest.raises(ValueError, match=wrong):
        split_s_op(q, kp, vp, slots, lens, kl, vl, live_lens, 0.2, "torch")
    with pytest.raises(ValueError, match=wrong):
        tk.check_segment_table(slots, lens, 3, 10, live_lens, 5)
    k = torch.randn(2, 12, 2, 32, device=DEVICE)
    chunk_lens = torch.tensor([12, 7], device=other)
    with pytest.raises(ValueError, match=f"but lens is on {other.type}"):
        topb_op(torch.randn(2, 2, 12, device=DEVICE), k, k, 4, chunk_lens, 3, True, "torch")


def test_poison_hook_fills_launcher_buffers():
    """The autouse fixture is active: launcher buffers start as NaN / -7, outside it as torch.empty."""
    assert torch.isnan(_dispatch.alloc((4,), torch.float32, DEVICE)).all()
    assert (_dispatch.alloc((4,), torch.int32, DEVICE) == -7).all()
    with _dispatch.poison_outputs(False):
        assert _dispatch.alloc((4,), torch.float32, DEVICE).shape == (4,)
