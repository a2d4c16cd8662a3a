"""The ops' CUDA branch, audited on the CPU with the kernel launch stubbed:
no host read of any tensor value, at most two launches, no allocation but the outputs, and
compiled kernels reused per specialisation by the direct launch path."""

from __future__ import annotations

import pytest
import torch
import triton
from torch.utils._python_dispatch import TorchDispatchMode

import triton_kernels as tk
from triton_kernels import _dispatch, _launch, chunk_scores, merge, split_s, topb
from triton_kernels.plan import H200, assume_gpu

HOST_READS = {"aten._local_scalar_dense.default", "aten.item.default", "aten.is_nonzero.default"}
ALLOCS = {"aten.empty.memory_format", "aten.empty_strided.default", "aten.zeros.default", "aten.full.default"}


class _Audit(TorchDispatchMode):
    """Records every aten op; copies to the host count as host reads."""

    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = str(func)
        if name.startswith(("aten._to_copy", "aten.copy_")) and str(kwargs.get("device", "")) == "cpu":
            name = "host copy"
        self.ops.append(name)
        return func(*args, **kwargs)


@pytest.fixture
def cuda_branch(monkeypatch):
    """CPU tensors through the CUDA branch: launches stubbed, CUDA's check policy, H200 plans, the ops'
    bodies called directly (a dispatch mode would otherwise hide them behind the registered op), and
    every host read of a tensor value counted (on CPU ``tolist`` / ``bool`` do not dispatch)."""
    reads = []
    for name in ("tolist", "item", "__bool__", "__int__", "__float__", "numpy", "cpu"):
        real = getattr(torch.Tensor, name)

        def spy(self, *a, _real=real, _name=name, **k):
            reads.append(_name)
            return _real(self, *a, **k)

        monkeypatch.setattr(torch.Tensor, name, spy)
    for mod in (split_s, merge, chunk_scores, topb):
        monkeypatch.setattr(mod, "call_op", lambda op, impl, *args: impl(*args))
    monkeypatch.delenv("PREFILLING_DLLM_CHECK_VALUES", raising=False)
    with _launch.stub_launches() as record, _dispatch.cuda_check_policy_on("cpu"), assume_gpu(H200):
        with _dispatch.poison_outputs(False):
            yield record, reads


def _inputs(bad=False):
    g = torch.Generator().manual_seed(0)
    q, kp, vp = (
        torch.randn(2, 8, 4, 32, generator=g),
        torch.randn(5, 64, 2, 32, generator=g),
        torch.randn(5, 64, 2, 32, generator=g),
    )
    kl, vl = torch.randn(2, 8, 2, 32, generator=g), torch.randn(2, 8, 2, 32, generator=g)
    slots = torch.tensor([[0, 7 if bad else 1], [2, -1]], dtype=torch.int32)  # 7 >= P: only the kernel sees it
    lens = torch.tensor([[64, 9], [30, 0]], dtype=torch.int32)
    ck, cx = torch.randn(3, 64, 2, 32, generator=g), torch.randn(3, 4, 2, 32, generator=g)
    clens = torch.tensor([64, 99 if bad else 10, 1], dtype=torch.int32)
    return dict(
        split_s=lambda: tk.split_s_attention(q, kp, vp, slots, lens, kl, vl, backend="triton"),
        split_s_merged=lambda: split_s.split_s_launch(q, kp, vp, slots, lens, kl, vl, 0.2, segs_per_prog=1),
        merge=lambda: tk.merge_states(torch.randn(3, 2, 8, 4, 32), torch.randn(3, 2, 8, 4), backend="triton"),
        scores=lambda: tk.chunk_attention_scores(torch.randn(3, 6, 4, 32), ck, clens, cx, backend="triton"),
        row_mass=lambda: tk.chunk_row_mass(torch.randn(3, 64, 4, 32), ck, clens, cx, backend="triton"),
        topb=lambda: tk.topb_gather(torch.randn(3, 2, 64), ck, ck, 8, lens=clens, backend="triton"),
    )


@pytest.mark.parametrize("bad", [False, True], ids=["valid", "bad-index"])
def test_cuda_branch_reads_no_value_on_the_host(cuda_branch, bad):
    """No call makes a device-to-host read unless value checks are asked for (on the code
    before the fix, every split_s / topb / chunk-score call read its tables with ``tolist``)."""
    _, reads = cuda_branch
    for name, call in _inputs(bad).items():
        with _Audit() as audit:
            call()
        assert reads == [], (name, reads)
        assert not HOST_READS & set(audit.ops) and "host copy" not in audit.ops, (name, audit.ops)


def test_checked_mode_reads_on_the_host_and_raises(cuda_branch):
    _, reads = cuda_branch
    with tk.eager_value_checks(), pytest.raises(ValueError, match="seg_slots out of range"):
        _inputs(bad=True)["split_s"]()
    assert reads  # the checked mode is the one that syncs


@pytest.mark.parametrize(
    "name,launches,allocs",
    [
        ("split_s", 1, 2),
        ("split_s_merged", 2, 4),
        ("merge", 1, 2),
        ("scores", 3, 3),
        ("row_mass", 1, 1),
        ("topb", 2, 4),  # selection + gather; k_out, v_out, idx, kept
    ],
)
def test_launches_and_allocations_per_call(cuda_branch, name, launches, allocs):
    """split_s at most 2 launches (phase 1 + merge), the others as planned; the only
    allocations are the outputs (split_s_merged: + its two fp32 partial buffers, the merge's input)."""
    record, _ = cuda_branch
    call = _inputs()[name]
    call()  # warm: plans, the launch cache, the error word
    record.clear()
    with _Audit() as audit:
        call()
    if name == "split_s":
        launches = len(record)
        assert launches in (1, 2) and record[0][0] == "_split_s_partial_kernel"
        allocs = 2 * launches  # the outputs, + the two partial buffers when the plan merges
    assert len(record) == launches, record
    if allocs is not None:
        assert sum(op in ALLOCS for op in audit.ops) == allocs, audit.ops


def test_topb_cuda_branch_runs_no_torch_op_but_its_outputs(cuda_branch):
    """The top-B selection runs in a kernel, so the CUDA branch of topb_gather makes no
    torch call but the allocation of its four outputs (before: a torch selection of about 15 ops)."""
    call = _inputs()["topb"]
    call()
    with _Audit() as audit:
        call()
    ops = [op for op in audit.ops if op != "aten.randn.default"]  # the scores the lambda builds
    assert len(ops) == 4 and set(ops) <= ALLOCS, audit.ops


def test_direct_launch_keys_on_every_specialisation(cuda_branch):
    """One compiled kernel per (dtypes, alignment, ints, constexprs, warps): a repeat hits the cache,
    a misaligned tensor or another shape does not."""
    record, _ = cuda_branch
    q, kp, vp = torch.randn(1, 4, 2, 16), torch.randn(2, 16, 2, 16), torch.randn(2, 16, 2, 16)
    slots, lens = torch.tensor([[0, 1]], dtype=torch.int32), torch.tensor([[16, 3]], dtype=torch.int32)
    tk.split_s_attention(q, kp, vp, slots, lens, backend="triton")
    n0 = _launch.cached_specialisations(split_s._split_s_partial_kernel)
    tk.split_s_attention(q, kp, vp, slots, lens, backend="triton")
    assert _launch.cached_specialisations(split_s._split_s_partial_kernel) == n0
    shifted = torch.empty(q.numel() + 1)[1:].view(q.shape).copy_(q)  # 4-byte aligned, not 16
    tk.split_s_attention(shifted, kp, vp, slots, lens, backend="triton")
    assert _launch.cached_specialisations(split_s._split_s_partial_kernel) == n0 + 1
    tk.split_s_attention(q[:, :3], kp, vp, slots, lens, backend="triton")
    assert _launch.cached_specialisations(split_s._split_s_partial_kernel) == n0 + 2
    assert sum(name == "_split_s_partial_kernel" for name, _ in record) == 4


def test_direct_launch_only_where_verified(monkeypatch):
    """The direct path is taken only on the Triton versions whose launch code was read, never under
    PREFILLING_DLLM_DIRECT_LAUNCH=0, and never for the interpreter or a stand-in (kernel[grid] then)."""
    monkeypatch.setattr(triton, "__version__", "3.6.0")
    assert _launch.direct_launch_supported()
    monkeypatch.setenv("PREFILLING_DLLM_DIRECT_LAUNCH", "0")
    assert not _launch.direct_launch_supported()
    monkeypatch.delenv("PREFILLING_DLLM_DIRECT_LAUNCH")
    for version in ("3.7.0", "4.0.0", "unknown"):
        monkeypatch.setattr(triton, "__version__", version)
        assert not _launch.direct_launch_supported()
    calls = []

    class StandIn:  # e.g. the AOT compile gate's recorder: always launched through kernel[grid]
        def __getitem__(self, grid):
            return lambda *args, **kw: calls.append((grid, len(args), kw))

    _launch.launch(StandIn(), (2, 1), (1, 2, 3), 4, 3)
    assert calls == [((2, 1), 3, {"num_warps": 4, "num_stages": 3})]


def test_launcher_arity_is_checked():
    class K:
        arg_names = ["a", "b"]

    with _launch.stub_launches(), pytest.raises(TypeError, match="takes 2 arguments, the launcher passed 3"):
        _launch.launch(K(), (1,), (1, 2, 3), 4)
