"""Chunk-parallel encoding over torch.distributed: 1 vs 2 processes on this CPU, and the H200 prediction.

    python -m bench.speed.distributed [--out DIR | --record] [--length 262144] [--rounds 3] [--world 2]
                                [--gpu-tokens 1048576] [--max-gpus 8] [--timeout-s 1800]

Part 1, measured (``cpu``): a passkey document of ``--length`` tokens (the package's InfiniteBench
filler haystack, :func:`dllm.eval.tasks.make_case`) is encoded on the bundled tiny model
(:func:`dllm.load_model`'s default, fp32) by one process (:func:`dllm.encode_document`, what a user
without torchrun runs) and by ``--world`` gloo processes (:func:`dllm.distributed.encode_document`),
each process with one torch thread (``torch.set_num_threads(1)``, ``OMP_NUM_THREADS=1``). The bench
starts the group itself (``torch.multiprocessing``: fork where the platform has it, else spawn; file
rendezvous in a temporary folder) and measures both side by side in one run: every rank warms both paths
up on a 4-chunk document first (untimed, reported apart), then ``--rounds`` rounds, each timing the
single-process encoding (on rank 0; the other ranks wait in a barrier, their CPU time during the wait is
reported to show they stayed idle) and the sharded one (wall time from one barrier to the next, i.e. the
slowest rank), in alternating order. Reported: the median of each, their ratio, every round.

Accuracy beside the speed: every chunk's K/V (valid rows, every layer) and token ids of the sharded
cache are hashed (SHA-256) and compared with the single-process cache's (bit equality, the claim of
:mod:`dllm.distributed` on the CPU); then one question is answered from both caches
(:func:`dllm.generate` over the single-process cache vs :func:`dllm.distributed.generate`): the kept
chunks, every chunk's score (rounded to 4 decimals, as ``stats.extra`` holds them) and the generated
tokens must be equal. Communication is measured where the package hands it to torch.distributed: every
``all_gather_object`` / ``broadcast_object_list`` payload (its pickled size), every ``send`` / ``recv``
tensor (its bytes), per phase (encode, question) and rank, beside the package's own count of the K/V
sent to rank 0 (``stats.extra["distributed"]["kv_bytes_to_root"]``). The absolute seconds are this
CPU's, with the tiny model: only the ratio carries over.

Part 2, predicted (``h200``): the encode time of a ``--gpu-tokens`` document (1M) on Dream-v0-7B
(``tests/data/reference/dream-v0-7b/config.json``, C = 1024, K = 4: the paper's defaults) on 1 to
``--max-gpus`` H200s, one rank each: :func:`predict_h200`, the roofline of :mod:`bench.speed.e2e_dream_shape`
(FLOPs of :mod:`bench.speed.flop_model` at :data:`~bench.speed.e2e_dream_shape.MMA_EFFICIENCY` of the bf16 tensor
peak, weights and K/V through HBM, host time per layer) for the slowest rank's share, plus the
communication: the collectives' latency, the scores all-gathered and the K kept chunks' K/V sent to rank 0
over NVLink (:data:`NVLINK_BYTES_S`). Nothing of part 2 is measured.

Writes ``distributed.csv`` (provenance columns on every row), ``distributed.md`` (the machine line, the
command, the load average and scheduling policy at the start) and ``distributed.png`` to ``runs/bench/``
(git-ignored), to ``--out DIR``, or with ``--record`` to ``bench/results/``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import hashlib
import json
import math
import os
import pickle
import statistics
import sys
import tempfile
import time
from collections import defaultdict

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import dllm
import dllm.distributed as dd
from bench.fidelity.demo import TINY_PREFILLING
from bench.outputs import output_dir, study_parser, write_report
from bench.provenance import write_csv
from bench.speed.distributed_prediction import GPU_TOKENS, human_bytes, prediction_rows, prediction_section
from dllm.eval.tasks import make_case, score

LENGTH = 262144  # 256K tokens: 1024 chunks of the bundled model's C = 256
WARM_CHUNKS = 4
GEN = dict(gen_length=8, steps=8)  # a 5-digit key and its EOS, one token per step
SEED, DEPTH = 2027, 0.5
# fork where there is one: a spawned rank imports torch afresh (seconds of CPU each); the parent has run no
# torch op before it forks, so no intra-op pool is inherited
START_METHOD = "fork" if "fork" in mp.get_all_start_methods() else "spawn"
# How the recorded figure is made: both cores free, real-time priority for the bench and its ranks
RECORD_COMMAND = "OMP_NUM_THREADS=1 chrt --fifo 50 .venv/bin/python -m bench.speed.distributed --record"
TARGET_RATIO = 1.6  # the target: 2 processes encode >= 1.6x faster than 1 on this machine, one thread each
QUIET_LOAD = 0.3  # a 1-minute load average above this at the start marks the run as made on a loaded machine
# The bundled model's configuration with a fixed prefill batch, so that one process and each rank run
# forwards of the same shape (the default batch follows the free memory, which differs between them).
# fixed chunks, as the recorded figure was measured (the sharded path snaps boundaries too: with
# snapping the chunk count, and so the shares, follow the text; the needle-chunk arithmetic below assumes C-token cuts)
CONFIG = dataclasses.replace(TINY_PREFILLING, prefill_batch=32, boundary_snap=0)

# ----------------------------------------------------------------------------- communication counter


class CommCounter:
    """Counts what this rank hands to torch.distributed while :meth:`phase` is active.

    ``all_gather_object`` / ``broadcast_object_list``: the pickled size (``pickle.dumps``) of the object this
    rank contributes (``sent``: an all-gather delivers it to each of the W-1 peers; a broadcast counts on its
    source) and of those it gets (``received``); ``send`` / ``recv``: the tensor's bytes. Torch's own framing
    (the int64 sizes an object collective exchanges first) is not counted.
    """

    def __init__(self):
        self.counts: dict = defaultdict(lambda: {"calls": 0, "sent": 0, "received": 0})
        self._phase = None

    def _add(self, kind: str, sent: int = 0, received: int = 0) -> None:
        if self._phase is not None:
            c = self.counts[(self._phase, kind)]
            c["calls"] += 1
            c["sent"] += sent
            c["received"] += received

    @contextlib.contextmanager
    def phase(self, name: str):
        """Count under ``name`` the collectives that run inside the ``with`` block."""
        orig = {k: getattr(dist, k) for k in ("all_gather_object", "broadcast_object_list", "send", "recv")}

        def all_gather_object(object_list, obj, group=None):
            out = orig["all_gather_object"](object_list, obj, group=group)
            me = len(pickle.dumps(obj))
            self._add("all_gather_object", me, sum(len(pickle.dumps(o)) for o in object_list) - me)
            return out

        def broadcast_object_list(object_list, src=None, group=None, device=None, group_src=None):
            source = group_src if group_src is not None else src
            mine = dist.get_rank(group) if group_src is not None else dist.get_rank()
            out = orig["broadcast_object_list"](object_list, src=src, group=group, device=device, group_src=group_src)
            size = sum(len(pickle.dumps(o)) for o in object_list)
            self._add("broadcast_object_list", size if mine == source else 0, 0 if mine == source else size)
            return out

        def send(tensor, *args, **kwargs):
            self._add("send", sent=tensor.numel() * tensor.element_size())
            return orig["send"](tensor, *args, **kwargs)

        def recv(tensor, *args, **kwargs):
            out = orig["recv"](tensor, *args, **kwargs)
            self._add("recv", received=tensor.numel() * tensor.element_size())
            return out

        self._phase = name
        patched = dict(
            all_gather_object=all_gather_object, broadcast_object_list=broadcast_object_list, send=send, recv=recv
        )
        for k, fn in patched.items():
            setattr(dist, k, fn)
        try:
            yield self
        finally:
            for k, fn in orig.items():
                setattr(dist, k, fn)
            self._phase = None

    def as_dict(self) -> dict:
        """``{phase: {kind: {calls, sent, received}}}`` (JSON-ready)."""
        out: dict = {}
        for (phase, kind), c in self.counts.items():
            out.setdefault(phase, {})[kind] = dict(c)
        return out


# ----------------------------------------------------------------------------- the ranks


def chunk_digests(doc) -> list[str]:
    """SHA-256 of each chunk of a :class:`~dllm.DocumentCache`: its valid K and V rows of every layer and its
    valid token ids (``lens[j]`` rows: BOS + the chunk's tokens; padding rows are never read)."""
    c = doc.chunks
    out = []
    for j, n in enumerate(c.lens.tolist()):
        h = hashlib.sha256()
        for t in (*c.k, *c.v):
            h.update(t[j, :n].contiguous().numpy().tobytes())
        h.update(c.ids[j, :n].contiguous().numpy().tobytes())
        out.append(h.hexdigest())
    return out


def _inputs(model, length: int, seed: int):
    case = make_case("passkey", length, DEPTH, seed)
    ctx = dllm.encode_text(model, case.context)
    prefix = dllm.encode_text(model, case.prefix, bos=True)
    return case, ctx, dllm.PromptParts(prefix, None, dllm.encode_text(model, case.query))


def _worker(rank: int, world: int, init_file: str, out_dir: str, length: int, rounds: int, timeout_s: float) -> None:
    """One rank of the run; writes ``rank<r>.json`` (its timings, digests, counts, and on rank 0 the answers)."""
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"file://{init_file}", rank=rank, world_size=world,
        timeout=datetime.timedelta(seconds=timeout_s),
    )  # fmt: skip
    out: dict = {"rank": rank, "threads": torch.get_num_threads()}
    try:
        _run_rank(rank, world, length, rounds, out)
    except Exception as exc:  # noqa: BLE001 - reported to the parent, which fails the run with it
        import traceback

        out["error"] = f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(out, f)
    if "error" not in out:
        dist.destroy_process_group()


def _run_rank(rank: int, world: int, length: int, rounds: int, out: dict) -> None:
    t0 = time.perf_counter()
    model = dllm.load_model(device="cpu")
    out["load_s"] = time.perf_counter() - t0
    case, ctx, parts = _inputs(model, length, SEED)
    _warm_case, warm_ctx, _ = _inputs(model, WARM_CHUNKS * CONFIG.chunk_size, SEED + 1)
    out["tokens"], out["chunks"] = ctx.numel(), math.ceil(ctx.numel() / CONFIG.chunk_size)
    # warm-up of both paths at the measured forward shape (first calls allocate and pick kernels), untimed
    dist.barrier()
    t0 = time.perf_counter()
    dllm.encode_document(model, warm_ctx, prefilling=CONFIG)
    dd.encode_document(model, warm_ctx, prefilling=CONFIG)
    dist.barrier()
    out["warmup_s"] = time.perf_counter() - t0
    counter = CommCounter()
    single_s, sharded_s, local_s, idle_cpu_s, order = [], [], [], [], []
    single = sharded = None
    for i in range(rounds):
        for which in ("single", "sharded") if i % 2 == 0 else ("sharded", "single"):
            order.append(which)
            if which == "single":  # free the previous round's cache of this path before timing it
                single = None
            else:
                sharded = None
            dist.barrier()
            t0, c0 = time.perf_counter(), time.process_time()
            if which == "single":
                if rank == 0:
                    single = dllm.encode_document(model, ctx, prefilling=CONFIG)
                dist.barrier()
                single_s.append(time.perf_counter() - t0)
                if rank != 0:  # this rank only waited: its CPU seconds show it left the core to rank 0
                    idle_cpu_s.append(time.process_time() - c0)
            else:
                with counter.phase("encode") if i == 0 else contextlib.nullcontext():
                    sharded = dd.encode_document(model, ctx, prefilling=CONFIG)
                local_s.append(time.perf_counter() - t0)
                dist.barrier()
                sharded_s.append(time.perf_counter() - t0)
    out.update(single_s=single_s, sharded_s=sharded_s, sharded_local_s=local_s, idle_cpu_s=idle_cpu_s, order=order)
    out["bounds"] = sharded.bounds
    out["digests"] = chunk_digests(sharded.local)
    out["local_nbytes"] = sharded.local.nbytes
    if rank == 0:
        out["single_digests"] = chunk_digests(single)
        out["single_nbytes"] = single.nbytes
    # one question from each cache: the single process's (rank 0 alone) and the sharded one
    dist.barrier()
    if rank == 0:
        t0 = time.perf_counter()
        res = dllm.generate(model, method="prefilling", prompt=parts, document=single, prefilling=CONFIG, **GEN)
        out["single_question_s"] = time.perf_counter() - t0
        out["single_answer"] = _answer(model, res, case)
    single = None
    dist.barrier()
    t0 = time.perf_counter()
    with counter.phase("question"):
        res = dd.generate(model, sharded, parts if rank == 0 else None, prefilling=CONFIG, **GEN)
    out["sharded_question_s"] = time.perf_counter() - t0
    if rank == 0:
        out["sharded_answer"] = _answer(model, res, case)
        out["kv_bytes_to_root"] = res.stats.extra["distributed"]["kv_bytes_to_root"]
    out["comm"] = counter.as_dict()


def _answer(model, res, case) -> dict:
    extra = res.stats.extra
    return {
        "tokens": res.tokens.tolist(),
        "text": res.text[0],
        "correct": bool(score("passkey", res.text[0], case)),
        "selected_chunks": list(extra["selected_chunks"]),
        "all_chunk_scores": list(extra.get("all_chunk_scores", [])),
        "needle_chunks": sorted(
            {case.needle_start // CONFIG.chunk_size, max(case.needle_start, case.needle_end - 1) // CONFIG.chunk_size}
        ),
    }


def run_ranks(target, world: int, args: tuple, timeout_s: float) -> tuple[list, int]:
    """Run ``target(rank, *args)`` for ranks ``0 .. world - 1`` in processes started by :data:`START_METHOD`.

    Waits ``timeout_s`` seconds for all of them together, then kills those still running.

    Returns:
        (the processes in rank order, all ended: read their ``exitcode``; how many were killed).
    """
    ctx = mp.get_context(START_METHOD)
    procs = [ctx.Process(target=target, args=(r, *args)) for r in range(world)]
    for p in procs:
        p.start()
    deadline = time.monotonic() + timeout_s
    for p in procs:
        p.join(max(0.0, deadline - time.monotonic()))
    alive = [p for p in procs if p.is_alive()]
    for p in alive:
        p.kill()
        p.join(5)
    return procs, len(alive)


def run_group(world: int, length: int, rounds: int, timeout_s: float) -> list[dict]:
    """Start ``world`` gloo ranks of :func:`_worker` (fork where available, else spawn), wait for them at most
    ``timeout_s`` seconds (then kill them), and return each rank's result.

    Raises:
        RuntimeError: a rank did not finish in time, exited without its result, or reported an error.
    """
    with tempfile.TemporaryDirectory(prefix="dllm-bench-dist-") as tmp:
        init_file = os.path.join(tmp, "init")
        procs, killed = run_ranks(_worker, world, (world, init_file, tmp, length, rounds, timeout_s), timeout_s)
        if killed:
            raise RuntimeError(f"{killed} rank(s) still running after {timeout_s:.0f} s: killed")
        results = []
        for r, p in enumerate(procs):
            path = os.path.join(tmp, f"rank{r}.json")
            if not os.path.exists(path):
                raise RuntimeError(f"rank {r} exited with status {p.exitcode} and no result")
            with open(path) as f:
                results.append(json.load(f))
        errors = [f"rank {r['rank']}: {r['error']}" for r in results if "error" in r]
        if errors:
            raise RuntimeError("\n".join(errors))
        return results


# ----------------------------------------------------------------------------- rows and report


def cpu_rows(results: list[dict]) -> list[dict]:
    """CSV rows of the measured part: one per round and path, one ``summary`` row with the checks and counts."""
    r0 = results[0]
    world = len(results)
    sharded = [max(r["sharded_s"][i] for r in results) for i in range(len(r0["sharded_s"]))]
    single = r0["single_s"]
    base = {"part": "cpu", "tokens": r0["tokens"], "chunks": r0["chunks"], "world": world, "threads_per_rank": 1}
    rows = []
    for i, (s1, s2) in enumerate(zip(single, sharded, strict=True)):
        rows.append({**base, "run": "round", "round": i, "single_s": round(s1, 4), "sharded_s": round(s2, 4),
                     "ratio": round(s1 / s2, 3)})  # fmt: skip
    digests = [d for r in results for d in r["digests"]]
    a, b = r0["single_answer"], r0["sharded_answer"]
    comm = {}
    for r in results:
        for phase, kinds in r["comm"].items():
            for kind, c in kinds.items():
                comm[f"{phase}_{kind}_r{r['rank']}_calls"] = c["calls"]
                comm[f"{phase}_{kind}_r{r['rank']}_sent"] = c["sent"]
                comm[f"{phase}_{kind}_r{r['rank']}_received"] = c["received"]
    rows.append({
        **base, "run": "summary",
        "single_s": round(statistics.median(single), 4), "sharded_s": round(statistics.median(sharded), 4),
        "ratio": round(statistics.median(single) / statistics.median(sharded), 3),
        "rounds": len(single), "warmup_s": round(max(r["warmup_s"] for r in results), 3),
        "idle_cpu_s_max": round(max((x for r in results[1:] for x in r["idle_cpu_s"]), default=0.0), 4),
        "chunks_equal": sum(x == y for x, y in zip(digests, r0["single_digests"], strict=False)),
        "chunks_compared": len(r0["single_digests"]),
        "kv_equal": int(digests == r0["single_digests"]),
        "bounds": " ".join(f"{lo}-{hi}" for lo, hi in r0["bounds"]),
        "single_nbytes": r0["single_nbytes"], "shard_nbytes": " ".join(str(r["local_nbytes"]) for r in results),
        "single_question_s": round(r0["single_question_s"], 4),
        "sharded_question_s": round(r0["sharded_question_s"], 4),
        "selected_single": " ".join(map(str, a["selected_chunks"])),
        "selected_sharded": " ".join(map(str, b["selected_chunks"])),
        "needle_chunks": " ".join(map(str, a["needle_chunks"])),
        "scores_equal": int(a["all_chunk_scores"] == b["all_chunk_scores"] and len(a["all_chunk_scores"]) > 0),
        "tokens_equal": int(a["tokens"] == b["tokens"]),
        "answer_single": a["text"], "answer_sharded": b["text"],
        "correct_single": int(a["correct"]), "correct_sharded": int(b["correct"]),
        "kv_bytes_to_root": r0["kv_bytes_to_root"], **comm,
    })  # fmt: skip
    return rows


def _kind_total(results, phase, kind, field) -> int:
    return sum(r["comm"].get(phase, {}).get(kind, {}).get(field, 0) for r in results)


def summarize(results: list[dict], pred: list[dict]) -> str:
    """The Markdown of the results: measured CPU table, the checks, communication, the predicted H200 table."""
    rows = cpu_rows(results)
    s = rows[-1]
    world = len(results)
    ok = s["kv_equal"] and s["scores_equal"] and s["tokens_equal"] and s["selected_single"] == s["selected_sharded"]
    per_round = "; ".join(f"{r['single_s']:.2f} / {r['sharded_s']:.2f} s = {r['ratio']:.2f}x" for r in rows[:-1])
    measured = [
        f"## Measured on this CPU: 1 vs {world} processes (one torch thread each, gloo)",
        "",
        f"A {s['tokens']}-token passkey document ({s['chunks']} chunks of C = {CONFIG.chunk_size}; the bundled tiny "
        f"model, fp32), encoded by one process (`dllm.encode_document`) and by {world} gloo processes "
        f"(`dllm.distributed.encode_document`, chunks {s['bounds'].replace(' ', ', ')}); median of {s['rounds']} "
        "rounds after an untimed warm-up. **Absolute seconds are this CPU's, with the tiny model: only the ratio "
        "carries over.**",
        "",
        "| processes | encode s (this CPU) | speedup |",
        "|---:|---:|---:|",
        f"| 1 | {s['single_s']:.2f} | 1.00x |",
        f"| {world} | {s['sharded_s']:.2f} | **{s['ratio']:.2f}x** |",
        "",
        f"The target is >= {TARGET_RATIO}x with 2 processes on this 2-core CPU: "
        f"**{'met' if s['ratio'] >= TARGET_RATIO else 'not met'}** in this run ({s['ratio']:.3f}x).",
        "",
        f"Every round (1 process / {world} processes): {per_round}. Untimed warm-up (both paths, "
        f"{WARM_CHUNKS} chunks): {s['warmup_s']:.2f} s. While rank 0 encoded alone, the other rank(s) used at most "
        f"{s['idle_cpu_s_max']:.3f} CPU-seconds waiting in a barrier (they left the core free).",
        "",
        f"Accuracy beside the speed: **{'all equal' if ok else 'NOT EQUAL'}**. Chunk K/V and ids (valid rows, "
        f"every layer, SHA-256 per chunk): {s['chunks_equal']}/{s['chunks_compared']} chunks bit-equal to the "
        f"single-process cache. One question (passkey at depth {DEPTH}, {GEN['gen_length']} tokens, "
        f"{GEN['steps']} steps): kept chunks {s['selected_single']} (single) vs {s['selected_sharded']} "
        f"({world} ranks; the needle lies in chunk(s) {s['needle_chunks']}); all {s['chunks']} chunk scores "
        f"{'equal' if s['scores_equal'] else 'DIFFERENT'} (4 decimals); tokens "
        f"{'equal' if s['tokens_equal'] else 'DIFFERENT'}; answers {s['answer_single']!r} / {s['answer_sharded']!r} "
        f"({'correct' if s['correct_single'] else 'wrong'}; the tiny model's answer, not the point here). "
        f"Question time from the cache: {s['single_question_s']:.2f} s in one process, "
        f"{s['sharded_question_s']:.2f} s on {world} (scoring is sharded too; decoding runs on rank 0).",
        "",
        f"Cache memory: {human_bytes(s['single_nbytes'])} in one process; per rank "
        f"{', '.join(human_bytes(int(x)) for x in s['shard_nbytes'].split())}.",
    ]
    enc_calls = max(sum(c["calls"] for c in r["comm"].get("encode", {}).values()) for r in results)
    obj_kinds = ("all_gather_object", "broadcast_object_list")
    q_obj = max(sum(r["comm"].get("question", {}).get(k, {}).get("calls", 0) for k in obj_kinds) for r in results)
    comm = [
        "## Communication (measured on the CPU run, at the torch.distributed calls)",
        "",
        "| phase | collective | calls per rank | bytes sent, all ranks | bytes received, all ranks |",
        "|---|---|---:|---:|---:|",
    ]
    for phase in ("encode", "question"):
        kinds = sorted({k for r in results for k in r["comm"].get(phase, {})})
        for kind in kinds:
            calls = max(r["comm"].get(phase, {}).get(kind, {}).get("calls", 0) for r in results)
            comm.append(
                f"| {phase} | `{kind}` | {calls} | {_kind_total(results, phase, kind, 'sent'):,} | "
                f"{_kind_total(results, phase, kind, 'received'):,} |"
            )
    comm += [
        "",
        f"Encoding exchanges {enc_calls} object collective(s) per rank (the arguments' check, the ids' SHA-256, the "
        f"encoding's success): a few hundred bytes, no tensor. A question exchanges {q_obj} object collectives per "
        "rank (the query window and the draft broadcast, the per-rank scores all-gathered: pickled fp32 tensors) "
        f"and the kept chunks' K/V sent to rank 0 by their owners: `send` above; the package counts "
        f"{s['kv_bytes_to_root']:,} bytes of K/V and ids to rank 0 (`stats.extra['distributed']['kv_bytes_to_root']`). "
        "Object payloads are counted as their pickled size; torch's framing (int64 sizes first) is not.",
    ]
    return "\n".join(measured + [""] + comm + [""] + prediction_section(pred))


def plot(results: list[dict], pred: list[dict], path) -> None:
    """Two panels: the measured CPU encode seconds (1 vs W processes, with the speedup), and the predicted
    H200 encode seconds over GPUs beside ideal 1/W scaling."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from bench.plotting import save_figure

    s = cpu_rows(results)[-1]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    ax1.bar(["1 process", f"{s['world']} processes"], [s["single_s"], s["sharded_s"]], color=["C0", "C1"])
    ax1.set_ylabel("encode seconds (this CPU, tiny model)")
    ax1.set_title(f"measured: {s['tokens'] / 1024:.0f}K tokens, {s['ratio']:.2f}x faster")
    gpus = [p["gpus"] for p in pred]
    ax2.plot(gpus, [p["encode_s"] for p in pred], "o-", label="predicted encode")
    ax2.plot(gpus, [pred[0]["encode_s"] / g for g in gpus], "k:", label="ideal 1/W")
    ax2.set_xlabel("H200 GPUs (one rank each)")
    ax2.set_ylabel("encode seconds (predicted)")
    ax2.set_title(f"predicted: {pred[0]['tokens'] >> 20}M tokens, Dream-7B shape")
    ax2.legend()
    save_figure(fig, path, title="Chunk-parallel encoding over torch.distributed")


def _scheduling() -> str:
    """The scheduling policy, priority and nice value of this process (the recording's conditions)."""
    try:
        policy = {os.SCHED_OTHER: "SCHED_OTHER", os.SCHED_FIFO: "SCHED_FIFO", os.SCHED_RR: "SCHED_RR"}.get(
            os.sched_getscheduler(0), "other"
        )
        prio = os.sched_getparam(0).sched_priority
        return f"{policy} priority {prio}, nice {os.nice(0)}"
    except (AttributeError, OSError):
        return "unknown"


def main(argv=None) -> int:
    p = study_parser(__doc__, "bench")
    p.add_argument("--length", type=int, default=LENGTH, help="tokens of the measured document (default 256K)")
    p.add_argument("--rounds", type=int, default=3, help="timed rounds of each path (median reported)")
    p.add_argument("--world", type=int, default=2, help="processes of the sharded run (2 on this 2-core CPU)")
    p.add_argument("--gpu-tokens", type=int, default=GPU_TOKENS, help="tokens of the predicted GPU document (1M)")
    p.add_argument("--max-gpus", type=int, default=8, help="the prediction's largest GPU count")
    p.add_argument("--timeout-s", type=float, default=1800.0, help="the group's wall-clock limit (then killed)")
    args = p.parse_args(argv)
    if args.rounds < 1 or args.world < 2 or args.max_gpus < 1:
        p.error("--rounds >= 1, --world >= 2 and --max-gpus >= 1 are needed")
    if math.ceil(args.length / CONFIG.chunk_size) < max(args.world, 2):
        p.error(f"--length must give at least --world chunks of {CONFIG.chunk_size} tokens")
    out = str(output_dir(args, "bench"))
    os.environ["OMP_NUM_THREADS"] = "1"  # the ranks' (forked or spawned) intra-op pools: one thread each
    torch.set_num_threads(1)
    t0 = time.perf_counter()
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    sched = _scheduling()
    pred = prediction_rows(args.gpu_tokens, args.max_gpus)
    results = run_group(args.world, args.length, args.rounds, args.timeout_s)
    rows = cpu_rows(results) + pred
    os.makedirs(out, exist_ok=True)
    write_csv(os.path.join(out, "distributed.csv"), rows, "cpu")
    plot(results, pred, os.path.join(out, "distributed.png"))
    paragraphs = []
    small = args.length < LENGTH
    # a real-time policy takes the cores from the machine's other (SCHED_OTHER) jobs, so their load does not
    # count then; a NaN load (no getloadavg) counts as loaded
    realtime = sched.startswith(("SCHED_FIFO", "SCHED_RR"))
    loaded = not (load <= QUIET_LOAD or realtime) or os.nice(0) > 0
    if small or loaded:
        why = []
        if small:
            why.append(f"a small size ({args.length} tokens, not {LENGTH})")
        if loaded:
            why.append("a loaded or de-prioritised machine (see the conditions below)")
        paragraphs.append(
            f"**Not the recorded figure: {' and '.join(why)}.** The 1-vs-{args.world} ratio needs both cores free; it "
            f"is recorded with `{RECORD_COMMAND}` on a quiet machine."
        )
    cond = (
        f"Conditions at the start: load average {load:.2f} (1 min) on {os.cpu_count()} cores, scheduling {sched}, "
        f"OMP_NUM_THREADS=1, one torch thread per process, ranks started by {START_METHOD}."
        + (" A real-time policy: the ranks took the cores ahead of the machine's other jobs." if realtime else "")
    )
    write_report(
        os.path.join(out, "distributed.md"),
        f"Chunk-parallel encoding over torch.distributed: 1 vs {args.world} processes (measured), "
        f"1-{args.max_gpus} H200s (predicted)",
        "bench.speed.distributed",
        argv,
        "cpu",
        time.perf_counter() - t0,
        [*paragraphs, cond, f"Configuration: {CONFIG}.", summarize(results, pred)],
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
