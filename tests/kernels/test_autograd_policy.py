"""One autograd policy on every path: the ops are inference kernels with no backward formula, so an
input that requires grad while autograd records is refused with the same error on the torch path,
the Triton path (interpreter) and under ``torch.compile``; under ``torch.no_grad()`` or
``torch.inference_mode()``, or with detached inputs, the same call runs and matches the reference."""

from __future__ import annotations

import pytest
import torch

import triton_kernels as tk
from triton_kernels import reference as R

from ._helpers import DEVICE, max_err


def _calls():
    g = torch.Generator().manual_seed(0)

    def rnd(*shape):
        return torch.randn(*shape, generator=g).to(DEVICE)

    q, kp, vp = rnd(1, 4, 4, 16), rnd(2, 16, 2, 16), rnd(2, 16, 2, 16)
    slots = torch.tensor([[0, 1]], dtype=torch.int32, device=DEVICE)
    lens = torch.tensor([[16, 5]], dtype=torch.int32, device=DEVICE)
    ck, cx = rnd(2, 16, 2, 16), rnd(2, 3, 2, 16)
    clens = torch.tensor([16, 9], dtype=torch.int32, device=DEVICE)
    x, w = rnd(3, 32), rnd(32)
    cos, sin = rnd(1, 4, 16), rnd(1, 4, 16)
    # (name, op, reference, inputs, index of the input that will require grad)
    return [
        ("split_s_attention", tk.split_s_attention, R.split_s_attention, (q, kp, vp, slots, lens), 0),
        ("merge_states", tk.merge_states, R.merge_states, (rnd(3, 4, 2, 16), rnd(3, 4, 2)), 0),
        (
            "chunk_attention_scores",
            tk.chunk_attention_scores,
            R.chunk_attention_scores,
            (rnd(2, 3, 4, 16), ck, clens, cx),
            1,
        ),  # fmt: skip
        ("chunk_row_mass", tk.chunk_row_mass, R.chunk_row_mass, (rnd(2, 16, 4, 16), ck, clens, cx), 3),
        ("topb_gather", lambda *a: tk.topb_gather(*a, 4), lambda *a: R.topb_gather(*a, 4), (rnd(2, 2, 16), ck, ck), 0),
        ("add_rms_norm", tk.add_rms_norm, R.add_rms_norm, (x, w, 1e-6), 1),
        ("rope_qk", tk.rope_qk, R.rope_qk, (q, rnd(1, 4, 2, 16), cos, sin), 2),
        ("swiglu", tk.swiglu, R.swiglu, (rnd(3, 8), rnd(3, 8)), 1),
    ]


def _with_grad(args, i):
    args = list(args)
    args[i] = args[i].clone().requires_grad_(True)
    return args


def _flat(out):
    return [t for t in (out if isinstance(out, tuple) else (out,)) if t is not None and t.is_floating_point()]


@pytest.mark.parametrize("backend", ["torch", "triton"])
@pytest.mark.parametrize("case", range(8), ids=[c[0] for c in _calls()])
def test_an_input_that_requires_grad_is_refused(case, backend):
    name, op, ref, args, i = _calls()[case]
    grad_args = _with_grad(args, i)
    kwargs = {} if name == "topb_gather" else {"backend": backend}
    run = (lambda *a: tk.topb_gather(*a, 4, backend=backend)) if name == "topb_gather" else op
    refused = rf"{name}: an input requires grad, but the triton_kernels ops are inference-only"
    with pytest.raises(RuntimeError, match=refused):
        run(*grad_args, **kwargs)
    for context in (torch.no_grad, torch.inference_mode):
        with context():
            got = run(*grad_args, **kwargs)
        want = ref(*args)
        for a, b in zip(_flat(got), _flat(want), strict=True):
            assert a.shape == b.shape and max_err(a, b) <= 1e-4, name
    run(*[a.detach() if isinstance(a, torch.Tensor) else a for a in grad_args], **kwargs)  # detached: runs


def test_compiled_call_refuses_too():
    """Before: under torch.compile the error came at backward ('no autograd formula'), while the eager
    torch path was differentiable and the Triton path silently detached its output."""
    torch._dynamo.reset()
    name, op, ref, args, i = _calls()[0]
    compiled = torch.compile(lambda *a: op(*a)[0].sum(), backend="eager")
    with pytest.raises(Exception, match="an input requires grad"):
        compiled(*_with_grad(args, i))
    with torch.no_grad():
        assert max_err(compiled(*_with_grad(args, i)), ref(*args)[0].sum()) <= 1e-4
