"""Named kernel cases per op: one registry for ``bench_kernels``, ``roofline`` and ``compile_check``.

A case is an op, a model's head layout (Dream-7B: 28 query / 4 KV heads; LLaDA-8B:
32 / 32; D = 128 for both) and the op's shape parameters. ``where`` says who uses it:
``gpu`` (the GPU benchmark, in priority order: a time budget cuts from the end),
``cpu`` (the CPU benchmark at small fp32 shapes) and ``gate`` (the AOT compile gate,
which compiles every launch of the case for sm_90 and sm_80 in bf16 and fp16). The decode
step's fused elementwise ops (:data:`ELEMENTWISE_OPS`: residual add + RMSNorm, RoPE of q and k,
SwiGLU) have ``gate`` cases only, at the models' decode shapes; their GPU timing is the decode
step's (``bench/speed/decode_step.py --fused both``).

:func:`make_inputs` builds the op's arguments for a case (random, or uninitialised
with ``empty=True`` for the compile gate, which never launches); :func:`call` runs
the public op on them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

MODELS = {"dream7b": (28, 4), "llada8b": (32, 32)}  # (Hq, Hkv)
HEAD_DIM = 128
INTERMEDIATE = {"dream7b": 18944, "llada8b": 12288}  # SwiGLU width I (hidden = Hq * HEAD_DIM)
OPS = ("split_s_attention", "merge_states", "chunk_attention_scores", "chunk_row_mass", "topb_gather")
ELEMENTWISE_OPS = ("add_rms_norm", "rope_qk", "swiglu")


@dataclass(frozen=True)
class Case:
    op: str
    model: str
    params: tuple  # ((key, value), ...): hashable; see ``p``
    where: frozenset = field(default_factory=frozenset)

    @property
    def p(self) -> dict:
        return dict(self.params)

    @property
    def heads(self) -> tuple[int, int]:
        return MODELS[self.model]

    @property
    def name(self) -> str:
        return f"{self.model}/" + "-".join(k if k == "ragged" else f"{k}{v}" for k, v in self.params)


def _case(op, model, where, **params):
    return Case(op, model, tuple(params.items()), frozenset(where.split(",")))


G, C, GATE = "gpu", "cpu", "gate"
GPU_GATE = f"{G},{GATE}"

# Split-S decode: K segments of C tokens (kept chunks), M live tokens, B rows (ragged: live_lens).
_SPLIT = [
    ("dream7b", GPU_GATE, dict(b=1, k=16, c=1024, m=32)),
    ("dream7b", GPU_GATE, dict(b=1, k=64, c=1024, m=32)),
    ("dream7b", GPU_GATE, dict(b=1, k=4, c=1024, m=64)),
    ("dream7b", GPU_GATE, dict(b=1, k=4, c=1024, m=96)),
    ("dream7b", GPU_GATE, dict(b=1, k=4, c=256, m=64)),
    ("dream7b", GPU_GATE, dict(b=1, k=4, c=256, m=96)),
    ("dream7b", G, dict(b=1, k=16, c=1024, m=288)),
    ("dream7b", G, dict(b=1, k=64, c=256, m=64)),
    ("dream7b", GATE, dict(b=4, k=4, c=1024, m=64, ragged=1)),
    ("llada8b", GPU_GATE, dict(b=1, k=16, c=1024, m=32)),
    ("llada8b", GPU_GATE, dict(b=1, k=64, c=1024, m=32)),
    ("llada8b", GPU_GATE, dict(b=1, k=4, c=1024, m=64)),
    ("llada8b", G, dict(b=1, k=64, c=1024, m=288)),
    ("llada8b", GATE, dict(b=4, k=4, c=1024, m=64, ragged=1)),
    ("dream7b", C, dict(b=1, k=4, c=256, m=32)),
    ("dream7b", C, dict(b=1, k=16, c=256, m=32)),
    ("dream7b", C, dict(b=1, k=64, c=256, m=32)),
    ("dream7b", C, dict(b=1, k=4, c=256, m=64)),
    ("dream7b", C, dict(b=1, k=4, c=256, m=288)),
    ("llada8b", C, dict(b=1, k=4, c=256, m=32)),
]
# merge_states: N partials of ``rows`` (= B*M) query rows x Hq heads, as split-S phase 2 makes them.
_MERGE = [
    ("dream7b", GPU_GATE, dict(n=4, rows=64)),
    ("dream7b", G, dict(n=16, rows=32)),  # the gate compiles these merges inside split-S already
    ("llada8b", G, dict(n=8, rows=64)),
    ("dream7b", C, dict(n=4, rows=64)),
    ("dream7b", C, dict(n=16, rows=32)),
]
# Chunk scoring: N chunks of T keys, M scoring tokens whose own keys are the E = M extra keys.
_SCORES = [
    ("dream7b", GPU_GATE, dict(n=16, t=1024, m=64)),  # scoring batch of 16 chunks
    ("dream7b", GPU_GATE, dict(n=1, t=4096, m=64)),  # joint scoring over the kept context
    ("llada8b", GPU_GATE, dict(n=16, t=1024, m=64)),
    ("llada8b", GPU_GATE, dict(n=1, t=4096, m=64)),
    ("dream7b", C, dict(n=4, t=256, m=32)),
]
_ROW_MASS = [
    ("dream7b", GPU_GATE, dict(n=16, t=1024, e=64)),
    ("dream7b", GPU_GATE, dict(n=1, t=4096, e=64)),
    ("llada8b", GPU_GATE, dict(n=16, t=1024, e=64)),
    ("dream7b", C, dict(n=4, t=256, e=32)),
]
_TOPB = [
    ("dream7b", GPU_GATE, dict(n=64, t=1024, b=256)),
    ("llada8b", GPU_GATE, dict(n=64, t=1024, b=256)),
    ("dream7b", C, dict(n=16, t=1024, b=256)),
]


# The decode step's elementwise ops at the live block of a step: 40 query + 32 response tokens (rows).
_NORM = [
    ("dream7b", GATE, dict(rows=72, residual=1)),  # the two norms of a layer (the residual add fused)
    ("dream7b", GATE, dict(rows=72, residual=0)),  # the first layer's input norm
    ("llada8b", GATE, dict(rows=72, residual=1)),
]
_ROPE = [
    ("dream7b", GATE, dict(b=1, l=72)),
    ("dream7b", GATE, dict(b=4, l=72)),  # a batch of rows
    ("llada8b", GATE, dict(b=1, l=72)),
]
_SWIGLU = [
    ("dream7b", GATE, dict(rows=72)),
    ("llada8b", GATE, dict(rows=72)),
]


def _build(op: str, rows) -> list[Case]:
    """Cases in list order; a shape listed twice (e.g. for the GPU and the CPU) is one case used by both."""
    out: dict = {}
    for model, where, params in rows:
        c = _case(op, model, where, **params)
        key = (c.model, c.params)
        out[key] = Case(op, c.model, c.params, out[key].where | c.where) if key in out else c
    return list(out.values())


CASES: dict[str, list[Case]] = {
    "split_s_attention": _build("split_s_attention", _SPLIT),
    "merge_states": _build("merge_states", _MERGE),
    "chunk_attention_scores": _build("chunk_attention_scores", _SCORES),
    "chunk_row_mass": _build("chunk_row_mass", _ROW_MASS),
    "topb_gather": _build("topb_gather", _TOPB),
    "add_rms_norm": _build("add_rms_norm", _NORM),
    "rope_qk": _build("rope_qk", _ROPE),
    "swiglu": _build("swiglu", _SWIGLU),
}


def cases(where: str) -> list[Case]:
    """Every case used by ``where`` (``gpu``, ``cpu`` or ``gate``), ops interleaved in priority order."""
    per_op = [[c for c in CASES[op] if where in c.where] for op in OPS + ELEMENTWISE_OPS]
    out = []
    for i in range(max(len(x) for x in per_op)):
        out += [x[i] for x in per_op if i < len(x)]
    return out


def live_lens_of(case: Case) -> list[int] | None:
    """Ragged split-S cases: rows of M, 3M/4, M/2 and 1 live tokens."""
    p = case.p
    if not p.get("ragged"):
        return None
    m = p["m"]
    return [max(1, m * (4 - i) // 4) for i in range(p["b"])]


def make_inputs(case: Case, device, dtype, *, empty: bool = False, seed: int = 0) -> dict:
    """Keyword arguments of the public op for ``case`` (float tensors uninitialised with ``empty``)."""
    gen = torch.Generator().manual_seed(seed)
    hq, hkv = case.heads
    d = HEAD_DIM
    p = case.p

    def f(*shape, scale=1.0):
        if empty:
            return torch.empty(*shape, dtype=dtype, device=device)
        return (torch.randn(*shape, generator=gen) * scale).to(device=device, dtype=dtype)

    def i32(x):
        return torch.as_tensor(x, dtype=torch.int32).to(device)

    if case.op == "split_s_attention":
        b, k, c, m = p["b"], p["k"], p["c"], p["m"]
        slots = torch.randperm(k * b, generator=gen).view(b, k)  # each row its own chunks, in any slot order
        live = live_lens_of(case)
        return dict(
            q=f(b, m, hq, d),
            k_pool=f(k * b, c, hkv, d),
            v_pool=f(k * b, c, hkv, d),
            seg_slots=i32(slots),
            seg_lens=i32(torch.full((b, k), c)),
            k_live=f(b, m, hkv, d),
            v_live=f(b, m, hkv, d),
            live_lens=None if live is None else i32(live),
        )
    if case.op == "merge_states":  # partial outputs in the case dtype, LSEs in fp32
        n, rows = p["n"], p["rows"]
        return dict(o=f(n, rows, hq, d), lse=torch.randn(n, rows, hq, generator=gen).to(device) * 3)
    if case.op == "chunk_attention_scores":
        n, t, m = p["n"], p["t"], p["m"]
        return dict(q=f(n, m, hq, d), k=f(n, t, hkv, d), lens=i32(torch.full((n,), t)), k_extra=f(n, m, hkv, d))
    if case.op == "chunk_row_mass":
        n, t, e = p["n"], p["t"], p["e"]
        return dict(q=f(n, t, hq, d), k=f(n, t, hkv, d), lens=i32(torch.full((n,), t)), k_extra=f(n, e, hkv, d))
    if case.op == "topb_gather":
        n, t, b = p["n"], p["t"], p["b"]
        scores = torch.rand(n, hkv, t, generator=gen).to(device)
        lens = i32(torch.full((n,), t))  # the pipeline passes lens: the variant it runs
        return dict(scores=scores, k=f(n, t, hkv, d), v=f(n, t, hkv, d), b=b, lens=lens)
    if case.op == "add_rms_norm":
        rows, hidden = p["rows"], hq * d
        return dict(x=f(rows, hidden), weight=f(hidden), residual=f(rows, hidden) if p["residual"] else None)
    if case.op == "rope_qk":
        b, n = p["b"], p["l"]
        cos = torch.randn(b, n, d, generator=gen).to(device)
        return dict(q=f(b, n, hq, d), k=f(b, n, hkv, d), cos=cos, sin=torch.randn(b, n, d, generator=gen).to(device))
    if case.op == "swiglu":
        rows, i = p["rows"], INTERMEDIATE[case.model]
        return dict(gate=f(rows, i), up=f(rows, i))
    raise KeyError(case.op)


def call(case: Case, inputs: dict, backend: str | None = None):
    """Run the public op of ``case`` on :func:`make_inputs` output."""
    import triton_kernels as tk

    a = inputs
    if case.op == "split_s_attention":
        return tk.split_s_attention(
            a["q"], a["k_pool"], a["v_pool"], a["seg_slots"], a["seg_lens"], a["k_live"], a["v_live"],
            live_lens=a["live_lens"], backend=backend,
        )  # fmt: skip
    if case.op == "merge_states":
        return tk.merge_states(a["o"], a["lse"], backend=backend)
    if case.op == "chunk_attention_scores":
        return tk.chunk_attention_scores(a["q"], a["k"], a["lens"], a["k_extra"], backend=backend)
    if case.op == "chunk_row_mass":
        return tk.chunk_row_mass(a["q"], a["k"], a["lens"], a["k_extra"], backend=backend)
    if case.op == "topb_gather":
        return tk.topb_gather(a["scores"], a["k"], a["v"], a["b"], lens=a["lens"], backend=backend)
    if case.op == "add_rms_norm":
        return tk.add_rms_norm(a["x"], a["weight"], 1e-6, a["residual"], backend=backend)
    if case.op == "rope_qk":
        return tk.rope_qk(a["q"], a["k"], a["cos"], a["sin"], backend=backend)
    if case.op == "swiglu":
        return tk.swiglu(a["gate"], a["up"], backend=backend)
    raise KeyError(case.op)
