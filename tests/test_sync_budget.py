"""The sync budget of the denoising loop: no host read inside a denoising step.

On a GPU every read of a device value from Python (``item``, ``tolist``, ``bool``/``int`` of a tensor,
``nonzero``, boolean-mask indexing, ``.cpu()``) stalls the host until the device catches up. This CPU
test counts such reads while :func:`dllm.decode.denoise.denoise` runs inside :func:`dllm.generate`, through a
``TorchDispatchMode`` (scalar reads and data-dependent shapes: ``_local_scalar_dense``, ``nonzero``,
``masked_select``, boolean ``index``/``index_put_``, ``equal``, ``unique``...) and patched ``tolist``,
``numpy`` and ``cpu``, and attributes each to the repository line that made it. It asserts that the
only reads are the loop's documented ones (:mod:`dllm.decode.denoise`): one before the loop, one per block
(the NaN check), one after the loop, and for ``origin`` / ``confidence_threshold`` one between steps;
so 0 per step, for dense, prefix_cache and prefilling, one row and a ragged batch.

Not counted: reads inside ``triton_kernels.split_s_attention``. On CPU it runs torch's fused attention
row by row and reads the small segment table on the host; on CUDA it is one Triton launch that reads
nothing (value checks are skipped on the step path). ``bench/gpu_check.sh`` is where the device path
is checked.
"""

from __future__ import annotations

import importlib
import os
import sys

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import dllm
import triton_kernels
from dllm.prefilling import PrefillingConfig, PromptParts
from tests.tiny_checkpoints import LLADA_BOS, tiny_model_fixtures

GEN = importlib.import_module("dllm.generate")  # the module (dllm.generate is also the function)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGES = tuple(os.path.join(REPO, p) + os.sep for p in ("dllm", "triton_kernels"))
_READS = {
    "_local_scalar_dense",
    "nonzero",
    "masked_select",
    "is_nonzero",
    "equal",
    "unique",
    "_unique2",
    "unique_consecutive",
    "unique_dim",
    "item",
}


def _site() -> str:
    """``file:function: source line`` of the innermost package frame on the stack."""
    import linecache

    f = sys._getframe(2)
    while f is not None:
        if f.f_code.co_filename.startswith(PACKAGES):
            rel = os.path.relpath(f.f_code.co_filename, REPO)
            return f"{rel}:{f.f_code.co_name}: {linecache.getline(f.f_code.co_filename, f.f_lineno).strip()}"
        f = f.f_back
    return "outside the package"


class HostReads(TorchDispatchMode):
    """Records every host read (by site) while ``active``."""

    def __init__(self):
        super().__init__()
        self.active, self.sites = False, []

    def record(self):
        if self.active:
            self.sites.append(_site())

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = func.overloadpacket.__name__
        if name in _READS:
            self.record()
        elif name in ("index", "index_put", "index_put_"):
            idx = args[1] if len(args) > 1 else kwargs.get("indices", ())
            if any(t is not None and t.dtype in (torch.bool, torch.uint8) for t in idx):
                self.record()  # a boolean mask: nonzero inside
        return func(*args, **kwargs)


@pytest.fixture()
def reads(monkeypatch):
    mode = HostReads()
    for meth in ("tolist", "numpy", "cpu"):
        inner = getattr(torch.Tensor, meth)

        def patched(self, *a, _inner=inner, **k):
            mode.record()
            return _inner(self, *a, **k)

        monkeypatch.setattr(torch.Tensor, meth, patched)
    attention = triton_kernels.split_s_attention

    def opaque_attention(*a, **k):  # one kernel launch on CUDA: not counted (see the module docstring)
        was, mode.active = mode.active, False
        try:
            return attention(*a, **k)
        finally:
            mode.active = was

    monkeypatch.setattr(triton_kernels, "split_s_attention", opaque_attention)
    denoise = GEN.denoise

    def counted_denoise(*a, **k):
        mode.active = True
        try:
            return denoise(*a, **k)
        finally:
            mode.active = False

    monkeypatch.setattr(GEN, "denoise", counted_denoise)
    with mode:
        yield mode


# the loop's documented reads (dllm/decode/denoise.py), by the source text of their line
BEFORE = "if not bool((resp == mask_id).all()):"
BETWEEN = "if check_left and step > 0 and not bool(cand.any()):"
BLOCK_END = "if int(nan_step.max()) < 0:"
AFTER = "row_steps.extend(active.tolist())"


dream, llada = tiny_model_fixtures(dream_seed=51, llada_seed=52, llada_kv_heads=3)


def _inputs(model, batched, method, bos):
    g = torch.Generator().manual_seed(0)
    r = lambda n: torch.randint(0, 90, (n,), generator=g)
    if method != "prefilling":
        return {"input_ids": r(3 * 13).view(3, 13) if batched else r(13)[None]}
    rows = [
        PromptParts(torch.cat([torch.tensor([bos]), r(4)]), r(37), r(5)),
        PromptParts(torch.tensor([bos]), r(19), r(8)),
    ]
    cfg = PrefillingConfig(chunk_size=8, top_k=2)
    return {"prompt": rows if batched else rows[0], "prefilling": cfg}


def _by_site(sites):
    out = {}
    for s in sites:
        key = s.split(": ", 1)[1].split("  #")[0] if s.startswith("dllm/decode/denoise.py") else s
        out[key] = out.get(key, 0) + 1
    return out


@pytest.mark.parametrize("method", ["dense", "prefix_cache", "prefilling"])
@pytest.mark.parametrize("batched", [False, True])
@pytest.mark.parametrize(
    "family,alg,kw",
    [
        ("dream", "maskgit_plus", {}),
        ("llada", "low_confidence", {}),
        ("dream", "entropy", {"temperature": 0.7, "alg_temp": 0.5, "seed": 1}),
        ("dream", "confidence_threshold", {"threshold": 0.2}),
        ("llada", "origin", {"temperature": 1.0, "seed": 2}),
    ],
)
def test_no_host_read_inside_a_denoising_step(reads, dream, llada, method, batched, family, alg, kw):
    model = dream if family == "dream" else llada
    bos = 128 if family == "dream" else LLADA_BOS
    res = dllm.generate(
        model,
        method=method,
        gen_length=8,
        steps=8,
        block_length=4,
        alg=alg,
        **kw,
        **_inputs(model, batched, method, bos),
    )
    assert (res.tokens != model.mask_token_id).all()
    got = _by_site(reads.sites)
    between = got.pop(BETWEEN, 0)
    assert got == {BEFORE: 1, BLOCK_END: 2, AFTER: 1}, got  # nothing else: 0 reads per step
    steps = res.stats.steps
    if alg in ("origin", "confidence_threshold"):
        assert steps - 2 <= between <= steps  # one check between steps (a block's first step needs none)
    else:
        assert between == 0 and steps == 8


def test_the_counter_sees_the_reads_main_made(reads):
    """The counter is not blind: main's per-row step (boolean write-back, nonzero, .any()) is caught."""
    from dllm.decode.unmasking import UnmaskingConfig
    from tests.unmasking_reference import unmask_step

    reads.active = True
    logits, cand = torch.randn(6, 9), torch.tensor([True, False, True, True, False, True])
    tokens, reveal = unmask_step(logits, cand, UnmaskingConfig(), 0, 2)
    resp = torch.zeros(6, dtype=torch.long)
    resp[reveal] = tokens[reveal]
    _ = bool(cand.any()), cand.tolist(), resp.cpu()
    reads.active = False
    assert len(reads.sites) >= 6
