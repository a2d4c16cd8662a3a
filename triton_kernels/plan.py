"""Launch plans: how each kernel maps a problem onto a GPU (tiles, grid, split-K).

Every plan is a pure function of the problem's shapes, the element size and a
:class:`GpuSpec` (SM count, architecture), memoised per argument tuple. So a
decode loop that calls an op 28 times a step with the same shapes plans once,
and the AOT compile gate (``bench/kernels/compile_check.py``) can plan for a 132-SM
H200 or a 108-SM A100 on a machine without a GPU (:func:`assume_gpu`), compiling
exactly the specialisations a real launch would choose. Integer arithmetic only
(no ``triton.cdiv`` on the hot path: it costs microseconds per call on Triton 3.5+).

The split-S cost model (:func:`plan_split_s`; it replaced two fixed caps on the partials). Every
partition of the keys the kernel supports (``segs_per_prog`` consecutive segments per partial, or
``n_splits`` pieces per segment, the live block folded into the last partial) gets a predicted
time (:func:`predict_split_s_us`) and the fastest is taken, ties to fewer partials:

* phase 1 is compute-bound at Dream's decode shapes (about 450 FLOP per byte of K/V, above
  the H200's ridge), so its time is the busiest SM's: the CTAs it runs (round-robin over the
  SMs) times the MMA FLOPs of the heaviest CTA (its padded BLOCK_M rows x its keys), at the
  tensor-core rate one SM reaches with one resident attention CTA (:data:`ATTN_EFF_1`) or
  with two or more overlapping each other's softmax (:data:`ATTN_EFF_2`), plus a fixed cost
  per round of resident CTAs (:data:`CTA_ROUND_US`: Q load, pipeline fill, epilogue);
  memory-bound shapes (LLaDA, G = 1) are limited by HBM, at a share that grows with the
  SMs pulling it (:func:`hbm_rate`);
* a plan with more than one partial pays the merge: one more kernel (:data:`LAUNCH_US` in a
  graph) reading the fp32 partials from L2 (they stay there while they fit in half of it);
* one launch of phase 1 (:data:`LAUNCH_US`).

The constants are assumptions for an H200 (sources beside them), so every time this model gives
is *predicted*; ``bench/results/split_s_plan_h200.md`` lists them per case, and the GPU run's
``bench_kernels`` graph times are what confirms or corrects them.
"""

from __future__ import annotations

import contextlib
import functools
from dataclasses import dataclass

import torch


def cdiv(a: int, b: int) -> int:
    """Ceiling division of non-negative ints."""
    return -(-a // b)


def next_pow2(x: int) -> int:
    """Smallest power of two >= x (1 for x <= 1)."""
    return 1 if x <= 1 else 1 << (int(x) - 1).bit_length()


def prev_pow2(x: int) -> int:
    """Largest power of two <= x (1 for x <= 1)."""
    return 1 if x <= 1 else 1 << (int(x).bit_length() - 1)


# ----------------------------------------------------------------------------- machines


@dataclass(frozen=True)
class GpuSpec:
    """What a plan needs to know about a GPU. ``arch`` is the compute capability x 10 (90 = Hopper)."""

    name: str
    arch: int
    sm_count: int
    smem_per_block: int  # bytes a CTA may opt into
    smem_per_sm: int  # bytes per SM (1 KB of it is reserved per resident CTA)
    regs_per_sm: int = 65536
    max_threads_per_sm: int = 2048
    max_ctas_per_sm: int = 32
    mma_flops_s: float = 989e12  # dense fp16/bf16 tensor-core peak (the cost model's compute rate)
    hbm_bytes_s: float = 4.8e12

    def __post_init__(self):  # the hash, once: specs key the plan memos and the ops' prepared calls
        object.__setattr__(self, "_hash", hash(tuple(getattr(self, f) for f in self.__dataclass_fields__)))

    def __hash__(self) -> int:
        return self._hash

    def __reduce__(self):  # a copy or an unpickled spec recomputes its hash (str hashes vary per process)
        return type(self), tuple(getattr(self, f) for f in self.__dataclass_fields__)


# CUDA C Programming Guide, "Technical Specifications per Compute Capability" (8.0 and 9.0);
# SM counts: NVIDIA A100 (108 SMs) and H100/H200 SXM (132 SMs) datasheets.
H200 = GpuSpec("H200", 90, 132, smem_per_block=227 * 1024, smem_per_sm=228 * 1024)
A100 = GpuSpec(
    "A100", 80, 108, smem_per_block=163 * 1024, smem_per_sm=164 * 1024, mma_flops_s=312e12, hbm_bytes_s=2.04e12
)
# Non-CUDA devices (the Triton interpreter): plan as for a small GPU.
INTERPRETER = GpuSpec("interpreter", 0, 8, smem_per_block=227 * 1024, smem_per_sm=228 * 1024)
PRESETS = {"h200": H200, "a100": A100}

_ASSUMED: GpuSpec | None = None


@contextlib.contextmanager
def assume_gpu(spec: GpuSpec):
    """Plan every launch inside this block for ``spec``, whatever the tensors' device.

    For the AOT compile gate and for tests of the plans on CPU; nothing else changes
    (kernels still need a GPU, or the interpreter, to run).
    """
    global _ASSUMED
    old = _ASSUMED
    _ASSUMED = spec
    try:
        yield spec
    finally:
        _ASSUMED = old


def assumed_gpu() -> GpuSpec | None:
    """The spec :func:`assume_gpu` set (None outside it): part of an op's prepared-call key."""
    return _ASSUMED


@functools.cache
def _cuda_spec(index: int) -> GpuSpec:
    p = torch.cuda.get_device_properties(index)
    arch = p.major * 10 + p.minor
    base = H200 if arch >= 90 else A100
    return GpuSpec(
        name=p.name,
        arch=arch,
        sm_count=p.multi_processor_count,
        smem_per_block=getattr(p, "shared_memory_per_block_optin", base.smem_per_block),
        smem_per_sm=getattr(p, "shared_memory_per_multiprocessor", base.smem_per_sm),
        regs_per_sm=getattr(p, "regs_per_multiprocessor", base.regs_per_sm),
        max_threads_per_sm=getattr(p, "max_threads_per_multi_processor", base.max_threads_per_sm),
        mma_flops_s=base.mma_flops_s,
        hbm_bytes_s=base.hbm_bytes_s,
    )


def gpu_spec(device: torch.device) -> GpuSpec:
    """The spec plans use for tensors on ``device`` (:func:`assume_gpu` overrides it)."""
    if _ASSUMED is not None:
        return _ASSUMED
    if device.type != "cuda":
        return INTERPRETER
    return _cuda_spec(device.index if device.index is not None else torch.cuda.current_device())


def ctas_per_sm(gpu: GpuSpec, num_warps: int, regs: int, smem: int) -> int:
    """Resident CTAs per SM of a compiled kernel (the CUDA occupancy calculator's rule).

    Registers are allocated per warp in units of 256; each CTA also reserves 1 KB
    of shared memory on sm_80 and newer.
    """
    threads = 32 * num_warps
    by_threads = gpu.max_threads_per_sm // threads
    regs_per_warp = cdiv(max(regs, 1) * 32, 256) * 256
    by_regs = gpu.regs_per_sm // (regs_per_warp * num_warps)
    by_smem = gpu.smem_per_sm // (smem + 1024)
    return max(0, min(by_threads, by_regs, by_smem, gpu.max_ctas_per_sm))


# CTAs per SM the planners assume, keyed by (kernel, arch, BLOCK_M, BLOCK_D, element bytes). Measured
# by the compile gate (tests/kernels/test_gpu_compile.py), which fails if a compiled kernel reaches
# fewer than the value here. Unknown configs assume 1 (fewest partials: the safe side).
# Values: the minimum over Triton 3.6.0 and 3.9.0, bf16 and fp16 (bench/results/compile_sm90.md).
CTAS_PER_SM = {
    ("split_s", 90, 64, 128, 2): 2,  # ~230 registers x 4 warps; 80 KB shared memory
    ("split_s", 90, 32, 128, 2): 3,  # 168 registers; 44 KB
    ("split_s", 80, 64, 128, 2): 2,
    ("split_s", 80, 32, 128, 2): 3,
    ("row_lse", 90, 64, 128, 2): 3,  # <= 123 registers; 64 KB
    ("row_lse", 80, 64, 128, 2): 3,
}


def assumed_ctas_per_sm(kernel: str, gpu: GpuSpec, block_m: int, block_d: int, elt: int) -> int:
    """CTAs per SM a planner may count on for ``kernel`` (``"split_s"`` | ``"row_lse"``) at this tile
    config and element size in bytes (:data:`CTAS_PER_SM`; 1 when unmeasured)."""
    return CTAS_PER_SM.get((kernel, gpu.arch, block_m, block_d, elt), 1)


# ----------------------------------------------------------------------------- attention tiles


def attention_tiles(d: int, rows: int, block_m: int | None = None, block_n: int | None = None) -> tuple[int, int, int]:
    """(BLOCK_M, BLOCK_N, BLOCK_D) for ``rows`` packed (token, head) query rows of head dim ``d``.

    BLOCK_M is 64 once there are 64 rows (one wgmma warpgroup tile on sm_90), else the
    next power of two (>= 16, the smallest ``tl.dot`` tile); BLOCK_N halves past D = 128
    to keep the K and V tiles of two pipeline stages in shared memory. A ``block_m`` or
    ``block_n`` that is not None is returned as given (the launchers' test overrides).
    """
    block_d = next_pow2(d)
    if block_m is None:
        block_m = min(64, max(16, next_pow2(rows)))
    if block_n is None:
        block_n = 64 if block_d <= 128 else 32
    return block_m, block_n, block_d


def attention_warps(block_m: int, block_d: int) -> int:
    """Warps of an attention program: 4 up to a 64 x 128 accumulator (one warpgroup), else 8."""
    return 4 if block_m * block_d <= 64 * 128 else 8


# ----------------------------------------------------------------------------- merge


MAX_MERGE_UNROLL = 16  # partials loaded per unrolled step of the merge (all loads issued at once)


@dataclass(frozen=True)
class MergePlan:
    """How ``merge_states`` maps ``n_parts`` partials of ``rows`` rows onto the GPU (see :func:`plan_merge`)."""

    n_parts: int
    rows: int
    block_r: int
    block_d: int
    n_unroll: int  # constexpr N_UNROLL: partials per unrolled step; == n_parts when n_parts <= 16
    num_warps: int
    grid: tuple[int]

    @property
    def ctas(self) -> int:
        return self.grid[0]


@functools.lru_cache(maxsize=4096)
def plan_merge(n_parts: int, rows: int, d: int, gpu: GpuSpec) -> MergePlan:
    """Rows per program so that the grid is at least one CTA per SM when there are enough rows.

    Each program holds ``N_UNROLL`` partial tiles of ``BLOCK_R x BLOCK_D`` fp32 in flight
    (capped at 16K elements, 128 registers a thread at 4 warps) and at most 2K output
    elements (enough loads in flight per CTA without starving the grid).
    """
    block_d = next_pow2(d)
    n_unroll = max(1, min(n_parts, MAX_MERGE_UNROLL))
    cap = prev_pow2(max(1, min(16384 // (block_d * n_unroll), 2048 // block_d)))
    fill = prev_pow2(max(1, rows // gpu.sm_count))  # >= sm_count programs when rows allow
    block_r = max(1, min(cap, fill))
    num_warps = max(1, min(4, block_r * block_d // 256))
    return MergePlan(n_parts, rows, block_r, block_d, n_unroll, num_warps, (cdiv(rows, block_r),))


# ----------------------------------------------------------------------------- split-S

# Cost-model constants for sm_90 (predicted, to be confirmed by bench_kernels' graph times):
ATTN_EFF_1 = 0.35  # share of it one resident FlashAttention-2-style CTA reaches (FA2 on Hopper: ~35%)
ATTN_EFF_2 = 0.50  # two or more resident CTAs overlap softmax and MMA (Triton FA on H100: ~45-55%)
CTA_ROUND_US = 1.0  # per round of resident CTAs: Q tile load, first K/V loads (~1 us HBM latency), store
LAUNCH_US = 2.0  # one kernel node of a CUDA graph: launch latency + tail
HBM_SHARE = 0.85  # reachable share of the datasheet HBM bandwidth
L2_OVER_HBM = 1.7  # L2 read bandwidth for the merge's partials, relative to HBM (about 8 TB/s on Hopper)
L2_BYTES = 50 * 2**20  # H100/H200 L2
SPLIT_S_MIN_TILES = 1  # key tiles per split-S piece at least (the model's round cost prices small pieces)


KV_IN_FLIGHT = 2 * 2 * 64 * 128 * 2  # bytes one CTA keeps in flight: 2 stages of a 64 x 128 bf16 K and V tile
HBM_LATENCY_US = 2.0  # loaded HBM latency (Little's law: in-flight bytes / latency = bandwidth)


def hbm_rate(ctas: int, gpu: GpuSpec, ctas_per_sm_: int = 1) -> float:
    """HBM bytes/s that ``ctas`` CTAs pull: Little's law on their in-flight K/V tiles, each SM at most
    three times its 1/SMs share, the whole at most :data:`HBM_SHARE` of the datasheet rate."""
    peak = HBM_SHARE * gpu.hbm_bytes_s
    resident = min(ctas, gpu.sm_count * max(1, ctas_per_sm_))
    by_latency = resident * KV_IN_FLIGHT / (HBM_LATENCY_US * 1e-6)
    by_sms = 3.0 * peak * min(ctas, gpu.sm_count) / gpu.sm_count
    return min(peak, by_latency, by_sms)


@dataclass(frozen=True)
class SplitSPlan:
    """How one ``split_s_attention`` call maps onto the GPU (see the module docstring)."""

    block_m: int
    block_n: int
    block_d: int
    num_warps: int
    num_stages: int
    m_tiles: int  # query tiles per (row, KV head)
    split_len: int  # tokens of one segment per partial (multiple of BLOCK_N)
    n_splits: int  # pieces per segment (1 when segments are grouped)
    segs_per_prog: int  # consecutive segments per partial (1 when split; 0 without segments)
    n_parts: int  # partials per (row, tile): the live block rides in the last one
    grid: tuple[int, int, int]
    kv_bytes: int  # K/V bytes at capacity (S*T + M keys per row)
    partial_bytes: int  # fp32 partial outputs + LSEs written and read back (0 with one partial)
    wave: int  # CTAs the machine holds at the assumed occupancy
    merge: MergePlan | None
    predicted_us: float = 0.0  # the cost model's time for a CUDA-graph replay (predicted, not measured)

    @property
    def ctas(self) -> int:
        return self.grid[0] * self.grid[1] * self.grid[2]


def _partitions(s: int, t: int, block_n: int):
    """Every (n_parts, split_len, n_splits, segs_per_prog) the kernel supports for S segments of T."""
    n_tok_blocks = max(1, cdiv(t, block_n))
    whole = n_tok_blocks * block_n
    seen = {}
    for spp in range(1, s + 1):  # grouped; for equal counts keep the smallest group (the most balanced)
        seen.setdefault(cdiv(s, spp), (whole, 1, spp))
    for pieces in range(2, n_tok_blocks // SPLIT_S_MIN_TILES + 1):
        split_len = cdiv(n_tok_blocks, pieces) * block_n
        n_splits = cdiv(t, split_len)
        seen.setdefault(s * n_splits, (split_len, n_splits, 1))
    return sorted((n, *rest) for n, rest in seen.items())


def predict_split_s_us(
    *, b: int, m: int, hq: int, hkv: int, d: int, s: int, t: int, has_live: bool, elt: int, gpu: GpuSpec,
    block_m: int, m_tiles: int, n_parts: int, split_len: int, segs_per_prog: int, ctas_per_sm_: int,
) -> float:  # fmt: skip
    """Predicted graph-replay microseconds of one split-S call under a partition (module docstring).

    Counts the heaviest CTA: ``segs_per_prog`` whole segments or one ``split_len`` piece, plus the
    live block's M keys in the last partial; padded BLOCK_M rows (the tensor cores compute them).
    """
    if n_parts == 0:
        return 0.0
    block_d = next_pow2(d)
    keys = (segs_per_prog * t if segs_per_prog > 1 else min(split_len, t)) + (m if has_live else 0)
    flops_cta = 4 * block_m * keys * block_d
    ctas = b * hkv * m_tiles * n_parts
    per_sm = cdiv(ctas, gpu.sm_count)  # CTAs the busiest SM runs
    resident = max(1, min(per_sm, ctas_per_sm_))
    eff = ATTN_EFF_1 if resident == 1 else ATTN_EFF_2
    compute_us = (
        1e6 * per_sm * flops_cta / (gpu.mma_flops_s / gpu.sm_count * eff) + cdiv(per_sm, ctas_per_sm_) * CTA_ROUND_US
    )
    io = b * m * hq * d * elt * 2  # q read, out written
    kv_bytes = 2 * b * hkv * d * elt * (s * t + (m if has_live else 0))  # each key once from HBM (tiles share L2)
    mem_us = 1e6 * (kv_bytes + io) / hbm_rate(ctas, gpu, ctas_per_sm_)
    total = LAUNCH_US + max(compute_us, mem_us)
    if n_parts > 1:
        part = 2 * b * m * hq * (d + 1) * 4 * n_parts  # fp32 partials written, then read by the merge
        rate = HBM_SHARE * gpu.hbm_bytes_s * (L2_OVER_HBM if part <= L2_BYTES // 2 else 1.0)
        total += LAUNCH_US + 1e6 * (part / rate) + CTA_ROUND_US
    return total


@functools.lru_cache(maxsize=4096)
def plan_split_s(
    b: int,
    m: int,
    hq: int,
    hkv: int,
    d: int,
    s: int,
    t: int,
    has_live: bool,
    elt: int,
    gpu: GpuSpec,
    block_m: int | None = None,
    block_n: int | None = None,
    split_len: int | None = None,
    segs_per_prog: int | None = None,
) -> SplitSPlan:
    """Plan a split-S call: ``q [b, m, hq, d]``, ``s`` segment columns of ``t`` tokens, ``elt`` bytes.

    Takes the partition with the smallest :func:`predict_split_s_us` (ties: fewer partials).
    ``block_m``/``block_n``/``split_len``/``segs_per_prog`` override the cost model (tests use
    them to force splits and grouped partials on small shapes).

    Raises:
        ValueError: an override that the kernel cannot run (split_len not a positive multiple
            of BLOCK_N; segs_per_prog < 1, or > 1 together with a split).
    """
    g = hq // hkv
    block_m, block_n, block_d = attention_tiles(d, m * g, block_m, block_n)
    m_tiles = cdiv(m * g, block_m)
    num_warps = attention_warps(block_m, block_d)
    cps = assumed_ctas_per_sm("split_s", gpu, block_m, block_d, elt)
    wave = gpu.sm_count * cps
    kv_bytes = 2 * b * (s * t + (m if has_live else 0)) * hkv * d * elt
    part_bytes = 2 * b * m * hq * (d + 1) * 4  # one partial, written then read back

    def predict(n_parts, split_len_, spp_):
        return predict_split_s_us(
            b=b, m=m, hq=hq, hkv=hkv, d=d, s=s, t=t, has_live=has_live, elt=elt, gpu=gpu, block_m=block_m,
            m_tiles=m_tiles, n_parts=n_parts, split_len=split_len_, segs_per_prog=spp_, ctas_per_sm_=cps,
        )  # fmt: skip

    n_tok_blocks = max(1, cdiv(t, block_n))
    if s == 0:
        n_parts, split_len, n_splits, spp = int(has_live), block_n, 1, 0
    elif split_len is not None or segs_per_prog is not None:
        spp = 1 if segs_per_prog is None else int(segs_per_prog)
        split_len = n_tok_blocks * block_n if split_len is None else int(split_len)
        if split_len <= 0 or split_len % block_n:
            raise ValueError(f"split_len must be a positive multiple of BLOCK_N={block_n}, got {split_len}")
        n_splits = cdiv(max(t, 1), split_len)
        if spp < 1 or (spp > 1 and n_splits > 1):
            raise ValueError("segs_per_prog must be >= 1, and 1 when segments are split")
        n_parts = cdiv(s, spp) * n_splits
    else:
        best = None
        for cand in _partitions(s, t, block_n):
            us = predict(cand[0], cand[1], cand[3])
            if best is None or us < best[0] - 1e-9:
                best = (us, cand)
        n_parts, split_len, n_splits, spp = best[1]
    merge = plan_merge(n_parts, b * m * hq, d, gpu) if n_parts > 1 else None
    return SplitSPlan(
        block_m=block_m,
        block_n=block_n,
        block_d=block_d,
        num_warps=num_warps,
        num_stages=2 if elt <= 2 else 1,
        m_tiles=m_tiles,
        split_len=split_len,
        n_splits=n_splits,
        segs_per_prog=spp,
        n_parts=n_parts,
        grid=(hkv * m_tiles, max(n_parts, 1), b),
        kv_bytes=kv_bytes,
        partial_bytes=part_bytes * n_parts if n_parts > 1 else 0,
        wave=wave,
        merge=merge,
        predicted_us=predict(n_parts, split_len, spp),
    )


# ----------------------------------------------------------------------------- chunk scores

MIN_SPLIT_TILES = 4  # key tiles per row-LSE split at least: the pipelined key loop needs work to overlap

MAX_KEY_SPLITS = 16  # row-LSE partials per row at most (pass 2 combines them unrolled)


@dataclass(frozen=True)
class ChunkScoresPlan:
    """Tiles of ``chunk_attention_scores`` and the key split of its row-LSE pass (:func:`plan_chunk_scores`)."""

    block_m: int
    block_n: int
    block_d: int
    num_warps: int
    m_tiles: int
    split_len: int  # chunk keys per row-LSE program (multiple of BLOCK_N)
    n_splits: int  # row-LSE programs per (chunk, tile); pass 2 merges their LSEs
    lse_grid: tuple[int, int, int]  # pass 1

    @property
    def lse_ctas(self) -> int:
        return self.lse_grid[0] * self.lse_grid[1] * self.lse_grid[2]


@functools.lru_cache(maxsize=4096)
def plan_chunk_scores(
    n: int, m: int, hq: int, hkv: int, d: int, t: int, elt: int, gpu: GpuSpec, block_m=None, block_n=None
) -> ChunkScoresPlan:
    """Pass 1 of ``chunk_attention_scores`` (row LSEs), split over the chunk keys when N is small.

    With few chunks (joint scoring: N = 1, T = 4096) one program per (chunk, query tile)
    would leave most SMs idle while it walks every key; the keys are then split so the
    grid reaches about one wave, each split keeping at least MIN_SPLIT_TILES key tiles.
    """
    g = hq // hkv
    block_m, block_n, block_d = attention_tiles(d, m * g, block_m, block_n)
    m_tiles = cdiv(m * g, block_m)
    tiles = n * hkv * m_tiles
    wave = gpu.sm_count * assumed_ctas_per_sm("row_lse", gpu, block_m, block_d, elt)
    n_tok_blocks = max(1, cdiv(t, block_n))
    pieces = max(1, min(cdiv(wave, max(tiles, 1)), n_tok_blocks // MIN_SPLIT_TILES, MAX_KEY_SPLITS))
    split_len = cdiv(n_tok_blocks, pieces) * block_n
    n_splits = cdiv(max(t, 1), split_len)
    return ChunkScoresPlan(
        block_m=block_m,
        block_n=block_n,
        block_d=block_d,
        num_warps=4,
        m_tiles=m_tiles,
        split_len=split_len,
        n_splits=n_splits,
        lse_grid=(hkv * m_tiles, n_splits, n),
    )
