"""The direct launch path (``triton_kernels/_launch.py``) checked against ``kernel[grid]`` on a GPU, op by op.

    python -m bench.kernels.launch_check [--out DIR]

For one bf16 case of every op (:mod:`bench.kernel_cases`, the first compile-gate case of each), with the direct
path off (every launch through ``kernel[grid]``) for reference bits, then on:

1. three calls (a launch-cache miss, a hit, the op's prepared call): outputs bit-equal to the reference (the
   kernels are deterministic), and the direct-launch counter grown (else the path was never exercised);
2. the same inputs moved 2 bytes off 16-byte alignment, after the aligned ones: equal to ``kernel[grid]``'s on them
   (Triton specialises on alignment: a cached aligned kernel must not serve them);
3. the calls on a side stream: equal;
4. the calls captured in a CUDA graph and replayed: equal; new inputs copied in place and replayed again: equal to
   eager calls on the new inputs;
5. a launch hook installed (``knobs.runtime.launch_enter_hook``): the hook is called, ``kernel[grid]`` takes over
   (the direct counter does not move) and the outputs are equal.

Prints one line per failure (``FAIL op: what``) and a summary; writes ``launch_check.txt`` to ``--out``; exits 1
when anything failed, 0 otherwise. Without CUDA it says so and exits 0 (the dry run of ``bench/gpu_check.sh``):
the direct path exists only for compiled kernels.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys

import torch

from bench import kernel_cases as kc
from triton_kernels import _launch


def tensors_of(out) -> list:
    """The tensors of an op's output (a tensor, or a tuple of tensors and others), in order."""
    items = out if isinstance(out, (tuple, list)) else (out,)
    return [t for t in items if torch.is_tensor(t)]


def same_bits(a, b) -> bool:
    """Whether two op outputs hold the same tensors bit for bit (NaN payloads included)."""
    xs, ys = tensors_of(a), tensors_of(b)
    if len(xs) != len(ys):
        return False
    for x, y in zip(xs, ys):
        if x.shape != y.shape or x.dtype != y.dtype:
            return False
        if x.dtype.is_floating_point:
            x = x.contiguous().view(torch.uint8)
            y = y.contiguous().view(torch.uint8)
        if not torch.equal(x, y):
            return False
    return True


@contextlib.contextmanager
def direct_path(on: bool):
    """The direct path on or off for the calls inside (the module's switch, read at import from
    ``PREFILLING_DLLM_DIRECT_LAUNCH``), with an empty launch cache on entry."""
    old = _launch._DIRECT
    _launch._DIRECT = on and _launch.direct_launch_supported()
    _launch.clear_launch_cache()
    try:
        yield
    finally:
        _launch._DIRECT = old


def misaligned(inputs: dict) -> dict:
    """The inputs with every floating tensor copied to an address 2 bytes past a 16-byte boundary."""
    out = {}
    for name, t in inputs.items():
        if torch.is_tensor(t) and t.dtype.is_floating_point and t.element_size() <= 8:
            step = 2 // t.element_size() if t.element_size() <= 2 else 1
            buf = torch.empty(t.numel() + 16, dtype=t.dtype, device=t.device)
            view = buf[step : step + t.numel()].view(t.shape)
            view.copy_(t)
            out[name] = view
        else:
            out[name] = t
    return out


def check_case(case, device, dtype=torch.bfloat16) -> list[str]:
    """Every check of the module docstring for one case; returns the failures, one line each."""
    op, fails = case.op, []
    inputs = kc.make_inputs(case, device, dtype, seed=0)

    def run(a):
        out = kc.call(case, a)
        torch.cuda.synchronize(device)
        return out

    with direct_path(False):
        ref = run(inputs)
        ref_mis = run(misaligned(inputs))
    with direct_path(True):
        before = _launch.COUNTS["direct"]
        for i, what in enumerate(("cache miss", "cache hit", "prepared call")):
            if not same_bits(run(inputs), ref):
                fails.append(f"FAIL {op}: {what} ({i + 1}st direct call) differs from kernel[grid]")
        if _launch.COUNTS["direct"] == before:
            fails.append(f"FAIL {op}: the direct-launch counter did not grow (the path was never exercised)")
        if not same_bits(run(misaligned(inputs)), ref_mis):
            fails.append(f"FAIL {op}: misaligned inputs after aligned ones differ from kernel[grid]'s")
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):
            got = kc.call(case, inputs)
        side.synchronize()
        if not same_bits(got, ref):
            fails.append(f"FAIL {op}: calls on a side stream differ")
        fails += _graph_checks(case, inputs, ref, device, dtype)
        fails += _hook_check(case, inputs, ref, run)
    return fails


def _graph_checks(case, inputs, ref, device, dtype) -> list[str]:
    op = case.op
    try:
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):
            kc.call(case, inputs)  # warm-up: prepared call and allocator on the side stream
        torch.cuda.current_stream(device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = kc.call(case, inputs)
        graph.replay()
        torch.cuda.synchronize(device)
    except Exception as exc:  # a capture error is a finding, not a crash of the whole check
        return [f"FAIL {op}: CUDA-graph capture raised {exc!r}"]
    fails = [] if same_bits(out, ref) else [f"FAIL {op}: CUDA-graph replay differs from eager"]
    new = kc.make_inputs(case, device, dtype, seed=1)
    for name, t in inputs.items():  # new values at the captured addresses
        if torch.is_tensor(t) and t.dtype.is_floating_point:
            t.copy_(new[name])
    graph.replay()
    torch.cuda.synchronize(device)
    with direct_path(False):
        want = kc.call(case, inputs)
        torch.cuda.synchronize(device)
    if not same_bits(out, want):
        fails.append(f"FAIL {op}: replay after new inputs were copied in differs from eager calls on them")
    fresh = kc.make_inputs(case, device, dtype, seed=0)  # the original values back for the hook check
    for name, t in inputs.items():
        if torch.is_tensor(t) and t.dtype.is_floating_point:
            t.copy_(fresh[name])
    return fails


def _hook_check(case, inputs, ref, run) -> list[str]:
    from triton import knobs

    op, calls = case.op, []
    hook = lambda *a, **k: calls.append(1)  # noqa: E731
    chain = knobs.runtime.launch_enter_hook
    chain.add(hook)
    try:
        before = _launch.COUNTS["direct"]
        out = run(inputs)
        moved = _launch.COUNTS["direct"] - before
    finally:
        chain.remove(hook)
    fails = []
    if not calls:
        fails.append(f"FAIL {op}: an installed launch hook was not called")
    if moved:
        fails.append(f"FAIL {op}: {moved} direct launch(es) ran with a launch hook installed")
    if not same_bits(out, ref):
        fails.append(f"FAIL {op}: outputs with a launch hook differ")
    return fails


def cases_to_check() -> list:
    """The first compile-gate case of every op (decode shapes of the models)."""
    seen, out = set(), []
    for case in kc.cases("gate"):
        if case.op not in seen:
            seen.add(case.op)
            out.append(case)
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=None, help="folder for launch_check.txt (default: print only)")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("launch_check: no CUDA device: the direct launch path serves compiled kernels only; skipped")
        return 0
    device = torch.device("cuda", torch.cuda.current_device())
    lines = [f"launch_check on {torch.cuda.get_device_name(device)}; direct path supported: "
             f"{_launch.direct_launch_supported()}"]  # fmt: skip
    fails = []
    for case in cases_to_check():
        try:
            got = check_case(case, device)
        except Exception as exc:  # one op's crash is one failure line; the others still run
            got = [f"FAIL {case.op}: raised {exc!r}"]
        fails += got
        lines.append(f"{case.op} ({case.name}): {'ok' if not got else f'{len(got)} failure(s)'}")
    lines += fails
    lines.append(f"launch_check: {len(fails)} failure(s) over {len(cases_to_check())} ops")
    text = "\n".join(lines)
    print(text)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "launch_check.txt"), "w") as f:
            f.write(text + "\n")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
