"""Merged q/k/v and gate/up projections (dllm.model.merged_linear) on the fused path, both families.

A tiny checkpoint of each family (Dream: GQA 7:1 with q/k/v biases; LLaDA: OLMo names, no biases) is
written with its real tensor names, loaded on CPU, and run on the fused path (Triton interpreter) against
the torch path: the logits and live K/V equal to fp32 rounding, two GEMMs a layer fewer counted by
dispatch, the parameters views of one merged tensor (no extra bytes), the checkpoint names and values
unchanged through ``state_dict`` and ``save_checkpoint``, and the layout kept through ``.to`` and
through ``load_state_dict`` in both its modes.
"""

from __future__ import annotations

import os

import pytest
import torch
from safetensors.torch import load_file
from torch.utils._python_dispatch import TorchDispatchMode

import dllm
from dllm.model.weights import module_to_checkpoint_name, save_checkpoint
from tests.fused_checks import assert_close_fp32, random_cache
from tests.tiny_checkpoints import write_dream_checkpoint, write_llada_checkpoint
from triton_kernels._dispatch import is_interpreted
from triton_kernels.rms_norm import _add_rms_norm_kernel

needs_fused = pytest.mark.skipif(
    not torch.cuda.is_available() and not is_interpreted(_add_rms_norm_kernel),
    reason="the fused path on CPU needs the Triton interpreter",
)
WRITERS = {"dream": write_dream_checkpoint, "llada": write_llada_checkpoint}


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module", params=["dream", "llada"])
def checkpoint(request, tmp_path_factory):
    """``(folder, family)`` of a tiny random checkpoint written with the family's own tensor names."""
    d = str(tmp_path_factory.mktemp(request.param))
    WRITERS[request.param](d, seed=3)
    return d, request.param


def _load(checkpoint):
    model = dllm.load_model(checkpoint[0], device="cpu", dtype=torch.float32)
    with torch.no_grad():  # non-trivial biases, so a merged bias in the wrong rows is seen
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.copy_(0.2 * torch.randn(p.shape, generator=torch.Generator().manual_seed(len(name))))
    return model


def storage_bytes(model) -> int:
    """Bytes of the distinct storages behind the model's parameters."""
    seen = {}
    for p in model.parameters():
        seen[(p.device, p.untyped_storage().data_ptr())] = p.untyped_storage().nbytes()
    return sum(seen.values())


def param_bytes(model) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())


class GemmCount(TorchDispatchMode):
    """Counts the weight GEMMs (``addmm`` / ``mm`` / ``bmm`` of a linear) dispatched inside."""

    def __init__(self):
        super().__init__()
        self.n = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.overloadpacket.__name__ in ("addmm", "mm", "bmm", "_addmm_activation"):
            self.n += 1
        return func(*args, **(kwargs or {}))


def _run(model, fused, *args, **kw):
    model.fused_ops = fused
    try:
        with torch.no_grad(), GemmCount() as count:
            out = model(*args, **kw)
    finally:
        model.fused_ops = None
    return out, count.n


@needs_fused
def test_merged_fused_forward_equals_torch_forward(checkpoint):
    model = _load(checkpoint)
    cfg = model.config
    g = torch.Generator().manual_seed(1)
    b, t, n = 2, 12, 5
    cache = random_cache(cfg, b, t, g)
    ids = torch.randint(0, cfg.vocab_size - 3, (b, n), generator=g)
    pos = torch.arange(t, t + n)
    assert storage_bytes(model) == param_bytes(model)
    n_before = len({p.untyped_storage().data_ptr() for p in model.parameters()})
    ref, gemms_torch = _run(model, False, ids, pos, cache, logits_start=1, return_kv=True)
    got, gemms_fused = _run(model, True, ids, pos, cache, logits_start=1, return_kv=True)
    assert_close_fp32(ref.logits, got.logits, "logits")
    assert torch.equal(ref.logits.argmax(-1), got.logits.argmax(-1))
    for i in range(cfg.num_layers):
        assert_close_fp32(ref.k[i], got.k[i], f"layer {i} keys")
        assert_close_fp32(ref.v[i], got.v[i], f"layer {i} values")
        # the kept V owns its bytes: a view would hold the whole [B, L, (Hq + 2 Hkv) D] projection alive
        assert got.v[i].untyped_storage().nbytes() == got.v[i].numel() * got.v[i].element_size()
    # q, k, v -> one GEMM and gate, up -> one: 7 -> 4 a layer (the LM head is one more on both paths)
    assert gemms_torch == 7 * cfg.num_layers + 1
    assert gemms_fused == 4 * cfg.num_layers + 1
    # the merged layout: five weights (and three biases) a layer share two storages, no byte added
    n_after = len({p.untyped_storage().data_ptr() for p in model.parameters()})
    merged_away = 3 + (2 if cfg.qkv_bias else 0)  # q,k,v -> 1 and gate,up -> 1; biases q,k,v -> 1
    assert n_after == n_before - merged_away * cfg.num_layers
    assert storage_bytes(model) == param_bytes(model)
    # no cache (SDPA over the live tokens) after the parameters were replaced: merged again, still equal
    sd = {k: v.clone() for k, v in model.state_dict().items()}
    model.load_state_dict(sd, assign=True)
    assert not model.layers[0].self_attn.qkv.is_current()
    ref, _ = _run(model, False, ids, pos)
    got, _ = _run(model, True, ids, pos)
    assert_close_fp32(ref.logits, got.logits, "logits without a cache, after load_state_dict(assign=True)")
    assert model.layers[0].self_attn.qkv.is_current() and storage_bytes(model) == param_bytes(model)


def test_checkpoint_names_and_values_survive_the_merge(checkpoint, tmp_path):
    folder, family = checkpoint
    model = _load(checkpoint)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    bytes_before = storage_bytes(model)
    model.merge_projections()
    model.merge_projections()  # idempotent
    assert storage_bytes(model) == bytes_before == param_bytes(model)
    attn, mlp = model.layers[0].self_attn, model.layers[0].mlp
    assert attn.qkv.is_current() and mlp.gate_up.is_current()
    w, bias = attn.qkv.weights()
    assert torch.equal(w, torch.cat([attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight]))
    assert (bias is None) == (family == "llada")
    if bias is not None:
        assert torch.equal(bias, torch.cat([attn.q_proj.bias, attn.k_proj.bias, attn.v_proj.bias]))
    # state_dict: same names, same values
    after = model.state_dict()
    assert list(after) == list(before)
    assert all(torch.equal(before[k], after[k]) for k in before)
    # in-place loading (what load_weights_into and load_state_dict do) writes through into the merged tensor
    new = {k: v + 1 for k, v in before.items()}
    model.load_state_dict(new)
    assert attn.qkv.is_current() and torch.equal(attn.qkv.weights()[0][: attn.q_proj.out_features], new[
        "layers.0.self_attn.q_proj.weight"])  # fmt: skip
    model.load_state_dict(before)
    # save -> the family's checkpoint names, each tensor its own bytes; load again -> the same weights
    out = str(tmp_path / "saved")
    save_checkpoint(model, out, family)
    saved = load_file(os.path.join(out, "model.safetensors"))
    original = {}
    for f in sorted(os.listdir(folder)):
        if f.endswith(".safetensors"):
            original.update(load_file(os.path.join(folder, f)))
    assert set(saved) == {module_to_checkpoint_name(k, family) for k in before}
    assert set(saved) <= set(original)
    for name, t in before.items():
        assert torch.equal(saved[module_to_checkpoint_name(name, family)], t)
    # a no-op move keeps the very tensor; a cast keeps the layout (and its values)
    w0 = attn.qkv.weights()[0]
    model.to("cpu", torch.float32)
    assert attn.qkv.weights()[0] is w0
    model.to(torch.float64)
    assert attn.qkv.is_current() and mlp.gate_up.is_current() and attn.q_proj.weight.dtype == torch.float64
    assert storage_bytes(model) == param_bytes(model)
    assert torch.equal(attn.k_proj.weight, before["layers.0.self_attn.k_proj.weight"].double())


def test_load_model_merges_when_the_fused_path_is_on(checkpoint, monkeypatch):
    """On CUDA (fused path on) the loader lays the merged weights out at load, outside any graph capture;
    on CPU (torch path) it leaves the parameters as the checkpoint's separate tensors."""
    from dllm.model.modeling import DiffusionLM

    plain = dllm.load_model(checkpoint[0], device="cpu", dtype=torch.float32)
    assert not plain.layers[0].self_attn.qkv.merged
    # CUDA's auto rule, on CPU: on, unless a training forward (asked after the loader froze the weights)
    monkeypatch.setattr(
        DiffusionLM, "uses_fused_ops",
        lambda self, device=None: not any(p.requires_grad for p in self.parameters()),
    )  # fmt: skip
    model = dllm.load_model(checkpoint[0], device="cpu", dtype=torch.float32)
    assert all(layer.self_attn.qkv.is_current() and layer.mlp.gate_up.is_current() for layer in model.layers)
    assert storage_bytes(model) == param_bytes(model)
    for name, t in plain.state_dict().items():  # the same weights, loaded through the merged views
        assert torch.equal(model.state_dict()[name], t), name
