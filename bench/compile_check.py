"""Compile every Triton kernel for a GPU target without a GPU (no launch).

The kernels' CPU tests run through the Triton interpreter, which accepts some
programs the real compiler rejects (type mismatches across ``if`` branches,
``tl.dot`` shapes, constexpr specialisation of ints equal to 1, ...). This tool
drives the real launchers on small CPU tensors, but intercepts every
``kernel[grid](...)`` launch and instead compiles that exact specialisation with
``triton.compile`` down to a cubin for the requested ``sm_XX`` (ptxas ships with
the Triton wheel). It proves the kernels *compile* for that target with the
installed Triton; it does not run them.

    python -m bench.compile_check [--arch 90] [--quick]

Must run with TRITON_INTERPRET unset (the jitted objects must be JITFunctions).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time

if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
    sys.exit("compile_check: unset TRITON_INTERPRET (it makes @triton.jit build interpreter objects)")

import torch  # noqa: E402
import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource, make_backend  # noqa: E402
from triton.runtime.jit import create_function_from_signature  # noqa: E402

from triton_kernels import chunk_scores, merge, split_s, topb  # noqa: E402

KERNEL_SITES = [
    (merge, "_merge_states_kernel"),
    (split_s, "_split_s_partial_kernel"),
    (chunk_scores, "_row_lse_kernel"),
    (chunk_scores, "_column_mass_kernel"),
    (chunk_scores, "_row_mass_kernel"),
    (topb, "_gather_rows_kernel"),
]


class _CompileOnly:
    """Stands in for a JITFunction: ``k[grid](*args, **kw)`` compiles instead of launching."""

    def __init__(self, fn, target, log):
        self.fn, self.target, self.log = fn, target, log
        self.backend = make_backend(target)
        self.binder = create_function_from_signature(fn.signature, fn.params, self.backend)

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            bound, spec, options = self.binder(*args, **kwargs)
            options, signature, constexprs, attrs = self.fn._pack_args(self.backend, kwargs, bound, spec, options)
            key = (
                self.fn.fn.__name__,
                str(signature),
                str(sorted((str(k), str(v)) for k, v in constexprs.items())),
            )
            if key in self.log:
                return
            t0 = time.time()
            src = ASTSource(self.fn, signature, constexprs, attrs)
            compiled = triton.compile(src, target=self.target, options=options.__dict__)
            shown = {self.fn.arg_names[k[0]]: v for k, v in constexprs.items() if self.fn.arg_names[k[0]].isupper()}
            self.log[key] = (time.time() - t0, compiled.metadata.shared, shown)
            name, smem = self.fn.fn.__name__, compiled.metadata.shared
            print(f"  ok {name:26s} {time.time() - t0:5.1f}s smem={smem:6d} {shown}", flush=True)

        return launch


@contextlib.contextmanager
def compile_only(arch: int):
    target = GPUTarget("cuda", arch, 32)
    log: dict = {}
    saved = []
    for mod, name in KERNEL_SITES:
        fn = getattr(mod, name)
        saved.append((mod, name, fn))
        setattr(mod, name, _CompileOnly(fn, target, log))
    for mod in {m for m, _ in KERNEL_SITES}:
        saved.append((mod, "require_runnable", mod.require_runnable))
        mod.require_runnable = lambda *a, **k: None  # CPU tensors are fine: nothing is launched
    try:
        yield log
    finally:
        for mod, name, fn in saved:
            setattr(mod, name, fn)


def _drive(dtype: torch.dtype, d: int, g: int, quick: bool) -> None:
    """Call every launcher once per code path (split / multi-segment / single partial)."""
    hkv, m, p_slots, t = 2, 17, 4, 70
    q = torch.randn(2, m, g * hkv, d, dtype=dtype)
    kp = torch.randn(p_slots, t, hkv, d, dtype=dtype)
    kl = torch.randn(2, m, hkv, d, dtype=dtype)
    slots = torch.tensor([[0, 1, -1], [2, 3, 0]], dtype=torch.int32)
    lens = torch.tensor([[70, 1, 0], [5, 64, 3]], dtype=torch.int32)
    scale = d**-0.5
    split_s.split_s_launch(q, kp, kp, slots, lens, kl, kl, scale)
    if not quick:
        split_s.split_s_launch(q, kp, kp, slots, lens, kl, kl, scale, split_len=64)
        split_s.split_s_launch(q, kp, kp, slots, lens, kl, kl, scale, segs_per_prog=2)
        split_s.split_s_launch(q[:, :1], kp, kp, slots[:, :1], lens[:, :1], None, None, scale)  # M=1, 1 partial
    n, e = 3, 5
    qs = torch.randn(n, m, g * hkv, d, dtype=dtype)
    kc = torch.randn(n, t, hkv, d, dtype=dtype)
    xe = torch.randn(n, e, hkv, d, dtype=dtype)
    cl = torch.tensor([70, 0, 33], dtype=torch.int32)
    chunk_scores.chunk_attention_scores_launch(qs, kc, cl, xe, scale)
    chunk_scores.chunk_row_mass_launch(torch.randn(n, t, g * hkv, d, dtype=dtype), kc, cl, xe, scale)
    if not quick:
        chunk_scores.chunk_attention_scores_launch(qs, kc, None, None, scale)
        chunk_scores.chunk_attention_scores_launch(qs, kc, cl.long(), xe, scale)
        chunk_scores.chunk_row_mass_launch(torch.randn(n, t, g * hkv, d, dtype=dtype), kc, None, xe, scale)
    idx = torch.tensor([[[0, 3, -1]] * hkv] * n, dtype=torch.long)
    topb.gather_rows_launch(idx, kc, kc)
    merge.merge_states_launch(torch.randn(3, 10, d, dtype=dtype), torch.randn(3, 10))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", type=int, default=90, help="CUDA compute capability x10 (90 = H100/H200)")
    ap.add_argument("--quick", action="store_true", help="one dtype/D/G combination only")
    args = ap.parse_args(argv)
    combos = [(torch.float16, 128, 7)]
    if not args.quick:
        combos += [
            (torch.bfloat16, 128, 7),
            (torch.float32, 64, 1),
            (torch.float16, 64, 4),
            (torch.bfloat16, 256, 1),
        ]
    t0 = time.time()
    with compile_only(args.arch) as log:
        for dtype, d, g in combos:
            print(f"[compile_check] sm_{args.arch} dtype={dtype} D={d} G={g}", flush=True)
            _drive(dtype, d, g, args.quick)
    print(f"[compile_check] {len(log)} kernel variants compiled for sm_{args.arch} in {time.time() - t0:.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
