"""The H200 prediction of chunk-parallel encoding (part 2 of :mod:`bench.speed.distributed`): a ``tokens``-token
document on Dream-v0-7B's shape over 1-8 GPUs, one rank each, and its Markdown section.

The roofline of :mod:`bench.speed.e2e_dream_shape` (FLOPs of :mod:`bench.speed.flop_model` at
:data:`~bench.speed.e2e_dream_shape.MMA_EFFICIENCY` of the bf16 tensor peak, weights and K/V through HBM, host time
per layer) for the slowest rank's share, plus the communication: the collectives' latency, the scores
all-gathered and the K kept chunks' K/V sent to rank 0 over NVLink (:data:`NVLINK_BYTES_S`). Nothing here is
measured; the collective counts are checked against the CPU run's counter (tests/test_bench_distributed.py).
"""

from __future__ import annotations

import math

import dllm.distributed as dd
from bench.kernels.roofline import H200_PEAK
from bench.speed import flop_model
from bench.speed.e2e_dream_shape import HBM_EFFICIENCY, HOST_S_PER_LAYER, MMA_EFFICIENCY, dream7b_config, n_params

# --- the prediction's assumptions (H200 SXM, bf16) -----------------------------------------------------
GPU_TOKENS = 1 << 20  # 1M tokens: 1024 chunks of C = 1024
GPU_CHUNK, GPU_TOP_K, GPU_PREFILL_BATCH = 1024, 4, 32
GPU_QUERY, GPU_DRAFT = 48, 4  # query tokens and draft slots of a scoring row (as bench.speed.e2e_dream_shape)
SCORE_TERMS = 3  # s_I, s_P, s_C: at most three fp32 scores per chunk are all-gathered
NVLINK_BYTES_S = 450e9  # per direction: NVIDIA H200 SXM datasheet, "NVLink 900 GB/s" counts both directions
NVLINK_EFFICIENCY = 0.8  # of that, for large point-to-point NCCL sends (an assumption, not measured)
COLLECTIVE_S = 100e-6  # one object collective: pickling, a host-device copy, NCCL latency (an assumption)
# Object collectives (all_gather_object / broadcast_object_list) dllm.distributed runs: counted in its
# source and checked against the CPU run's counter (tests/test_bench_distributed.py).
ENCODE_COLLECTIVES = 3  # the arguments' check, the ids' digests, the encoding's success
# a question's: set-up, draft + its broadcast, scoring + the scores' all-gather, the chunk ids for the
# lexical term, K/V sends, decode
QUESTION_COLLECTIVES = 8


# ----------------------------------------------------------------------------- the prediction


def _forward_s(a: flop_model.Arch, weight_bytes: float, queries, keys, logits=0.0, kv_tokens=0.0, elt=2) -> float:
    """Roofline seconds of one forward on an H200 (as :func:`bench.speed.e2e_dream_shape.predict_cell_s`):
    max(FLOPs at the stated tensor efficiency, weights + K/V bytes at the stated HBM efficiency) + host."""
    flops = a.forward(queries, keys, logits)
    kv_bytes = 2 * a.layers * a.hkv * a.head * kv_tokens * elt
    compute = flops / (MMA_EFFICIENCY * H200_PEAK.mma_flops_s)
    memory = (weight_bytes + kv_bytes) / (HBM_EFFICIENCY * H200_PEAK.hbm_bytes_s)
    return max(compute, memory) + HOST_S_PER_LAYER * a.layers


def predict_h200(
    cfg,
    tokens: int,
    world: int,
    *,
    chunk: int = GPU_CHUNK,
    top_k: int = GPU_TOP_K,
    prefill_batch: int = GPU_PREFILL_BATCH,
    query: int = GPU_QUERY,
    draft: int = GPU_DRAFT,
    elt: int = 2,
) -> dict:
    """Predicted seconds and bytes of a ``tokens``-token document on ``world`` H200s (one rank each), bf16.

    Encoding: rank r encodes its ``ceil(N / W)`` chunks (the slowest rank's share, N = ceil(tokens / C))
    in forwards of ``prefill_batch`` chunks of ``C + 1`` tokens (BOS + chunk), each a roofline
    :func:`_forward_s` (FLOPs of :class:`bench.speed.flop_model.Arch`: the projections and MLP per token, 4 Hq D
    per query and key of its chunk; every forward reads the weights once and writes its chunks' K/V),
    plus :data:`ENCODE_COLLECTIVES` x :data:`COLLECTIVE_S`. Scoring one question: two passes per chunk of
    ``query + draft`` tokens over the chunk's ``C + 1`` keys and their own, logits of every row, the
    chunk's K/V read (:func:`bench.speed.e2e_dream_shape.predict_cell_s`'s count), again for the slowest share
    only. Communication: ``SCORE_TERMS`` fp32 scores per chunk all-gathered; the K kept chunks' K/V
    (:func:`dllm.distributed.kept_kv_bytes`, plus int64 ids) sent to rank 0, all of them from other ranks
    (the worst case; 1 GPU sends nothing) at :data:`NVLINK_EFFICIENCY` x :data:`NVLINK_BYTES_S`, one after
    another (rank 0 receives in rank order); plus :data:`QUESTION_COLLECTIVES` x :data:`COLLECTIVE_S`.
    Decoding on rank 0 is the same for every W and not included.

    Args:
        cfg: the model's :class:`~dllm.ModelConfig` (``hidden_size``, heads, ``head_dim``, layers, vocabulary).
        tokens: context tokens of the document.
        world: ranks (GPUs), >= 1 and at most the chunk count.
        chunk, top_k, prefill_batch, query, draft: C, K, chunks per forward, a scoring row's query and draft
            tokens.
        elt: bytes per element of weights and K/V (2: bf16).

    Returns:
        ``{"gpus", "chunks", "chunks_per_rank", "encode_flops_per_rank", "encode_s", "scoring_s",
        "scores_bytes", "kv_bytes_to_root", "comm_s", "kv_cache_gib_per_rank", "weights_gib"}`` (seconds,
        bytes, GiB; FLOPs counting a multiply-add as 2). Predicted, not measured.

    Raises:
        ValueError: ``world`` < 1 or more ranks than chunks (:func:`dllm.distributed.shard_bounds`).
    """
    a = flop_model.Arch.of(cfg)
    w_bytes = float(elt * n_params(cfg))
    n = math.ceil(tokens / chunk)
    share = max(hi - lo for lo, hi in dd.shard_bounds(n, world))
    t, m = chunk + 1, query + draft
    forwards = [min(prefill_batch, share - i) for i in range(0, share, prefill_batch)]
    encode_flops = sum(a.forward(b * t, t) for b in forwards)
    encode_s = sum(_forward_s(a, w_bytes, b * t, t, kv_tokens=b * t, elt=elt) for b in forwards)
    scoring_s = sum(2 * _forward_s(a, w_bytes, b * m, t + m, b * m, kv_tokens=b * t, elt=elt) for b in forwards)
    per_chunk = dd.kept_kv_bytes(cfg, chunk, 1, elt) + 8 * t
    kv_to_root = 0 if world == 1 else min(top_k, n) * per_chunk
    scores_bytes = SCORE_TERMS * 4 * n
    coll = 0.0 if world == 1 else COLLECTIVE_S
    comm_s = kv_to_root / (NVLINK_EFFICIENCY * NVLINK_BYTES_S) + QUESTION_COLLECTIVES * coll
    return {
        "gpus": world,
        "chunks": n,
        "chunks_per_rank": share,
        "encode_flops_per_rank": encode_flops,
        "encode_s": encode_s + ENCODE_COLLECTIVES * coll,
        "scoring_s": scoring_s,
        "scores_bytes": scores_bytes,
        "kv_bytes_to_root": kv_to_root,
        "comm_s": comm_s,
        "kv_cache_gib_per_rank": share * dd.kept_kv_bytes(cfg, chunk, 1, elt) / 2**30,
        "weights_gib": w_bytes / 2**30,
    }


def prediction_rows(tokens: int = GPU_TOKENS, max_gpus: int = 8) -> list[dict]:
    """:func:`predict_h200` of Dream-v0-7B for 1..``max_gpus`` GPUs, as CSV rows (``part`` = ``h200``)."""
    cfg = dream7b_config()
    rows = []
    for g in range(1, max_gpus + 1):
        p = predict_h200(cfg, tokens, g)
        rows.append({"part": "h200", "status": "predicted", "tokens": tokens, **p})
    one = rows[0]["encode_s"]
    for r in rows:
        r["encode_speedup"] = round(one / r["encode_s"], 3)
    return rows


def human_bytes(n: float) -> str:
    """``n`` bytes as GB, MB, kB (powers of 1000) or B, two decimals."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n:.0f} B"


def prediction_section(pred: list[dict]) -> list[str]:
    """The Markdown of the predicted H200 table and its assumptions."""
    p0 = pred[0]
    kv_s = pred[-1]["kv_bytes_to_root"] / (NVLINK_EFFICIENCY * NVLINK_BYTES_S)
    lines = [
        f"## Predicted (not measured): {p0['tokens'] >> 20}M tokens on Dream-v0-7B, 1-{len(pred)} H200s",
        "",
        "Dream-v0-Instruct-7B's shape (28 layers, d = 3584, 28/4 heads of D = 128; "
        "`tests/data/reference/dream-v0-7b`), "
        f"bf16, C = {GPU_CHUNK}, K = {GPU_TOP_K} (the paper's defaults), {p0['chunks']} chunks encoded "
        f"{GPU_PREFILL_BATCH} per forward; one rank per GPU, each encoding a contiguous share. Roofline of "
        f"`bench.speed.e2e_dream_shape` (tensor cores at {MMA_EFFICIENCY:.0%} of "
        f"{H200_PEAK.mma_flops_s / 1e12:.0f} TFLOPS "
        f"bf16, HBM at {HBM_EFFICIENCY:.0%} of {H200_PEAK.hbm_bytes_s / 1e12:.1f} TB/s, "
        f"{HOST_S_PER_LAYER * 1e6:.0f} us host per layer per forward: NVIDIA H200 datasheet peaks). "
        f"Communication: NVLink {NVLINK_BYTES_S / 1e9:.0f} GB/s per direction (NVIDIA H200 SXM datasheet: "
        f"900 GB/s NVLink, both directions) at {NVLINK_EFFICIENCY:.0%} for the K/V sends (assumed), "
        f"{COLLECTIVE_S * 1e6:.0f} us per object collective (assumed: pickling, a host-device copy, NCCL latency; "
        f"{ENCODE_COLLECTIVES} per encoding, {QUESTION_COLLECTIVES} per question, as counted on the CPU run). "
        "Scoring and communication are per question; decoding (on rank 0, the same for every W) is not included.",
        "",
        "| GPUs | chunks per rank | encode s (predicted) | speedup | scoring s / question | scores all-gathered | "
        "K/V to rank 0 (worst case) | communication s / question | K/V cache per rank |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for p in pred:
        lines.append(
            f"| {p['gpus']} | {p['chunks_per_rank']} | {p['encode_s']:.2f} | {p['encode_speedup']:.2f}x | "
            f"{p['scoring_s']:.3f} | {human_bytes(p['scores_bytes'])} | {human_bytes(p['kv_bytes_to_root'])} | "
            f"{p['comm_s'] * 1e3:.2f} ms | {p['kv_cache_gib_per_rank']:.1f} GiB |"
        )
    kv_root = human_bytes(pred[-1]["kv_bytes_to_root"])
    lines += [
        "",
        f"Encoding is {p0['encode_flops_per_rank'] / 1e15:.1f} PFLOP on one GPU, compute-bound at every W: it splits "
        f"with the chunk count (the speedup stays below W only where {p0['chunks']} chunks do not divide evenly, and "
        f"by the host time per forward). The K/V kept for the decoding rank, {kv_root} "
        f"at most, cross NVLink in {kv_s * 1e3:.2f} ms; the rest of the communication time is the collectives' "
        f"assumed latency. Memory: the weights ({p0['weights_gib']:.1f} GiB) are on every GPU; one GPU holds the whole "
        f"document's K/V ({p0['kv_cache_gib_per_rank']:.1f} GiB) beside them within an H200's 141 GB, so at 1M tokens "
        "the ranks buy time, not capacity.",
    ]
    return lines
