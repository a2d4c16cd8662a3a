"""The model's fused elementwise path (Triton add_rms_norm / rope_qk / swiglu) against its torch path.

On CPU the fused path is forced (``model.fused_ops = True``) and runs through the Triton interpreter at a
tiny Dream-family shape (GQA 7:1, q/k/v bias, shifted logits), over a static cache (split-S attention)
and without one, with ``logits_start`` and with ``logits_at``: the logits and the live K/V must match
the torch path to fp32 rounding, and the greedy tokens exactly. The auto rule (CUDA only, env switch)
is checked without a GPU.
"""

from __future__ import annotations

import pytest
import torch

from dllm.model.modeling import FUSED_ENV
from tests.fused_checks import assert_close_fp32, random_cache
from tests.tiny_checkpoints import small_model
from triton_kernels._dispatch import is_interpreted
from triton_kernels.rms_norm import _add_rms_norm_kernel

pytestmark = [
    pytest.mark.skipif(
        not torch.cuda.is_available() and not is_interpreted(_add_rms_norm_kernel),
        reason="the fused path on CPU needs the Triton interpreter",
    ),
    pytest.mark.usefixtures("one_thread"),
]


@pytest.fixture(scope="module")
def model():
    # Dream's family at two layers (the second takes the first's MLP output as its pending residual);
    # the interpreter runs a program per token: seconds per forward
    m = small_model(
        "dream", vocab_size=256, hidden_size=112, intermediate_size=160, num_layers=2, num_heads=7, num_kv_heads=1,
        head_dim=16, rope_theta=1e6, mask_token_id=255,
    )  # fmt: skip
    with torch.no_grad():  # non-trivial norm weights and biases, so a kernel that drops one is seen
        for name, p in m.named_parameters():
            if "norm" in name:
                p.copy_(1 + 0.3 * torch.randn_like(p))
            elif name.endswith("bias"):
                p.copy_(0.1 * torch.randn_like(p))
    return m


def _both(model, *args, **kw):
    outs = []
    for fused in (False, True):
        model.fused_ops = fused
        with torch.no_grad():
            outs.append(model(*args, **kw))
    model.fused_ops = None
    return outs


def test_fused_path_equals_torch_path_over_a_cache(model):
    cfg = model.config
    g = torch.Generator().manual_seed(1)
    b, t, n = 2, 20, 6
    cache = random_cache(cfg, b, t, g)
    ids = torch.randint(0, 250, (b, n), generator=g)
    pos = torch.arange(t, t + n)
    ref, got = _both(model, ids, pos, cache, logits_start=2, return_kv=True)
    assert got.logits.shape == ref.logits.shape == (b, n - 2, cfg.vocab_size)
    assert_close_fp32(ref.logits, got.logits, "logits")
    assert torch.equal(ref.logits.argmax(-1), got.logits.argmax(-1))
    for i in range(cfg.num_layers):
        assert_close_fp32(ref.k[i], got.k[i], f"layer {i} keys (RoPE)")
        assert_close_fp32(ref.v[i], got.v[i], f"layer {i} values")
    # ragged rows: live_lens + logits_at (the gather path of the LM head)
    at = torch.tensor([[2, 4, 5], [1, 2, 3]])
    lens = torch.tensor([6, 4], dtype=torch.int32)
    ref, got = _both(model, ids, pos, cache, live_lens=lens, logits_at=at)
    assert got.logits.shape == (b, 3, cfg.vocab_size)
    assert_close_fp32(ref.logits, got.logits, "logits_at")


def test_fused_path_without_cache_runs_the_fused_kernels(model, monkeypatch):
    """Attention over the live tokens only (SDPA), every position's logits; and a guard: the three kernels
    ran (a silently unfused path would pass the equality too)."""
    import triton_kernels as tk

    calls = []
    for name in ("add_rms_norm", "rope_qk", "swiglu"):
        fn = getattr(tk, name)
        monkeypatch.setattr(tk, name, lambda *a, _fn=fn, _n=name, **k: (calls.append(_n), _fn(*a, **k))[1])
    ids = torch.randint(0, 250, (1, 5), generator=torch.Generator().manual_seed(2))
    ref, got = _both(model, ids, torch.arange(5) * 3)  # spread positions
    assert_close_fp32(ref.logits, got.logits, "logits")
    assert torch.equal(ref.logits.argmax(-1), got.logits.argmax(-1))
    n_layers = model.config.num_layers
    # per layer: two norms (the second with the residual add), one RoPE, one SwiGLU; then the final norm
    assert calls.count("add_rms_norm") == 2 * n_layers + 1
    assert calls.count("rope_qk") == calls.count("swiglu") == n_layers


@torch.no_grad()  # an inference forward (a training one stays on the torch path: the next test)
def test_auto_rule(model, monkeypatch):
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    monkeypatch.delenv(FUSED_ENV, raising=False)
    monkeypatch.delenv("PREFILLING_DLLM_BACKEND", raising=False)
    assert model.fused_ops is None
    assert not model.uses_fused_ops(cpu)  # CPU keeps the torch path
    assert model.uses_fused_ops(cuda)
    monkeypatch.setenv(FUSED_ENV, "0")
    assert not model.uses_fused_ops(cuda)
    monkeypatch.setenv(FUSED_ENV, "1")
    monkeypatch.setenv("PREFILLING_DLLM_BACKEND", "torch")  # the torch references: no fused kernels either
    assert not model.uses_fused_ops(cuda)
    model.fused_ops = True
    try:
        assert model.uses_fused_ops(cpu)
    finally:
        model.fused_ops = None


def test_auto_rule_keeps_training_on_the_torch_path(model, monkeypatch):
    """The Triton kernels have no backward: a training forward (gradients on, trainable weights) on CUDA must
    take the torch path, or every norm's output would cut the graph and only the LM head would learn."""
    cuda = torch.device("cuda")
    monkeypatch.delenv(FUSED_ENV, raising=False)
    monkeypatch.delenv("PREFILLING_DLLM_BACKEND", raising=False)
    assert all(p.requires_grad for p in model.parameters())  # the fixture is a fresh nn.Module
    assert torch.is_grad_enabled() and not model.uses_fused_ops(cuda)
    with torch.no_grad():
        assert model.uses_fused_ops(cuda)
    model.requires_grad_(False)  # a loaded model (dllm.load_model freezes it): fused with gradients on too
    try:
        assert model.uses_fused_ops(cuda)
    finally:
        model.requires_grad_(True)


class _LoRA(torch.nn.Module):
    """What peft puts around a projection: the base layer plus a low-rank update (here a non-trivial one)."""

    def __init__(self, base: torch.nn.Linear, rank: int = 2):
        super().__init__()
        self.base = base
        g = torch.Generator().manual_seed(5)
        self.a = torch.nn.Parameter(0.5 * torch.randn(rank, base.in_features, generator=g))
        self.b = torch.nn.Parameter(0.5 * torch.randn(base.out_features, rank, generator=g))

    def forward(self, x):
        return self.base(x) + x @ self.a.T @ self.b.T


@pytest.mark.parametrize("change", ["lora_on_q", "hook_on_up", "swapped_k", "global_hook"])
def test_fused_path_follows_modules_changed_after_loading(model, change):
    """The merged GEMMs used to keep the Linear objects they saw: a wrapper, a swapped layer or a hook put on
    afterwards was silently bypassed on the fused path (logits off by ~3 against the torch path)."""
    ids = torch.randint(0, 250, (1, 6), generator=torch.Generator().manual_seed(3))
    pos = torch.arange(6)
    model.fused_ops = True
    with torch.no_grad():
        model(ids, pos)  # merged before the change, as after load_model
        before = model(ids, pos).logits
    layer = model.layers[0]
    undo = []
    if change == "lora_on_q":
        base = layer.self_attn.q_proj
        layer.self_attn.q_proj = _LoRA(base)
        undo.append(lambda: setattr(layer.self_attn, "q_proj", base))
    elif change == "swapped_k":
        base = layer.self_attn.k_proj
        new = torch.nn.Linear(base.in_features, base.out_features, bias=True)
        layer.self_attn.k_proj = new
        undo.append(lambda: setattr(layer.self_attn, "k_proj", base))
    elif change == "hook_on_up":
        undo.append(layer.mlp.up_proj.register_forward_hook(lambda m, a, out: 3 * out).remove)
    else:
        undo.append(torch.nn.modules.module.register_module_forward_hook(
            lambda m, a, out: 3 * out if isinstance(m, torch.nn.Linear) and m.out_features == 160 else out
        ).remove)  # fmt: skip
    try:
        ref, got = _both(model, ids, pos)
        assert_close_fp32(ref.logits, got.logits, change)
        assert (got.logits - before).abs().max().item() > 1e-2  # the change is seen, not only matched
    finally:
        for fn in undo:
            fn()
    ref, got = _both(model, ids, pos)  # and once undone, the merged GEMMs again
    assert_close_fp32(before, got.logits, "undone")
