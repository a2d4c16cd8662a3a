"""bench.speed.distributed: a tiny 2-process run writes its files with every check passing; the H200 prediction
by hand."""

import csv
import math
import time

import pytest

import bench.speed.distributed as bd
import bench.speed.distributed_prediction as bp
from bench.speed.e2e_dream_shape import dream7b_config

# Dream-v0-Instruct-7B (tests/data/reference/dream-v0-7b/config.json), written out here so that the hand
# computation below does not go through the model's config classes
D, HQ, HKV, HD, INTER, LAYERS, VOCAB = 3584, 28, 4, 128, 18944, 28, 152064
TENSOR, HOST = 0.5 * 989e12, 100e-6 * LAYERS  # FLOP/s reached, host seconds per forward (bench.speed.e2e_dream_shape)
COLL = 100e-6  # seconds per object collective (the bench's assumption)


def _lin() -> int:
    """FLOPs per token and layer of the projections and the SwiGLU MLP (a multiply-add = 2)."""
    return 2 * (D * HQ * HD + 2 * D * HKV * HD + HQ * HD * D + 3 * D * INTER)


def test_prediction_equals_a_hand_computation():
    cfg = dream7b_config()
    t, m = 1025, 52  # BOS + C = 1024; 48 query tokens + 4 draft slots
    chunk_flops = LAYERS * (t * _lin() + 4 * HQ * HD * t * t)
    for world, share in ((1, 1024), (3, 342), (8, 128)):
        p = bp.predict_h200(cfg, 1 << 20, world)
        forwards = math.ceil(share / 32)
        assert p["chunks"] == 1024 and p["chunks_per_rank"] == share
        assert p["encode_flops_per_rank"] == pytest.approx(share * chunk_flops, rel=1e-12)
        coll = 0 if world == 1 else 3 * COLL
        # compute-bound: the forwards' FLOPs at the reached tensor rate, plus host time and the collectives
        assert p["encode_s"] == pytest.approx(share * chunk_flops / TENSOR + forwards * HOST + coll, rel=1e-9)
        # two scoring passes per chunk: m queries over t + m keys, logits of the m rows
        score_flops = 2 * share * (LAYERS * (m * _lin() + 4 * HQ * HD * m * (t + m)) + 2 * D * VOCAB * m)
        assert p["scoring_s"] == pytest.approx(score_flops / TENSOR + 2 * forwards * HOST, rel=1e-9)
        kv_chunk = 2 * LAYERS * t * HKV * HD * 2  # K and V, every layer, bf16
        assert p["kv_cache_gib_per_rank"] == pytest.approx(share * kv_chunk / 2**30)
        sent = 0 if world == 1 else 4 * (kv_chunk + 8 * t)  # K = 4 chunks and their int64 ids, all remote
        assert p["kv_bytes_to_root"] == sent
        assert p["comm_s"] == pytest.approx(sent / (0.8 * 450e9) + (0 if world == 1 else 8 * COLL), rel=1e-12)
        assert p["scores_bytes"] == 3 * 4 * 1024
    one = bp.predict_h200(cfg, 1 << 20, 1)
    assert 1.3e16 < one["encode_flops_per_rank"] < 1.5e16  # the expected "~15 PFLOP of prefill" at 1M tokens
    rows = bp.prediction_rows(1 << 20, 8)
    assert [r["gpus"] for r in rows] == list(range(1, 9)) and rows[0]["encode_speedup"] == 1.0
    assert 7.9 < rows[-1]["encode_speedup"] <= 8.0  # 128 chunks each: almost W, the host time is shared too


def test_prediction_refuses_more_ranks_than_chunks():
    with pytest.raises(ValueError, match="cannot be shared by 9 ranks"):
        bp.predict_h200(dream7b_config(), 8 * 1024, 9)


def test_tiny_two_process_run_is_equal_and_writes_its_files(tmp_path):
    """8 chunks on 2 gloo ranks, one round: the sharded cache, scores and tokens equal one process's."""
    t0 = time.monotonic()
    assert bd.main(["--out", str(tmp_path), "--length", "2048", "--rounds", "1", "--timeout-s", "300"]) == 0
    assert time.monotonic() - t0 < 300
    assert sorted(p.name for p in tmp_path.iterdir()) == ["distributed.csv", "distributed.md", "distributed.png"]
    rows = list(csv.DictReader((tmp_path / "distributed.csv").open()))
    assert all(r["commit"] and r["device_name"] for r in rows)  # provenance on every row
    summary = next(r for r in rows if r["run"] == "summary")
    assert summary["chunks"] == "8" and summary["bounds"] == "0-4 4-8"
    assert summary["chunks_equal"] == summary["chunks_compared"] == "8" and summary["kv_equal"] == "1"
    assert summary["scores_equal"] == "1" and summary["tokens_equal"] == "1"
    # the bundled K: adaptive under a ceiling of 4, chosen alike on both sides
    assert summary["selected_single"] == summary["selected_sharded"]
    assert 1 <= len(summary["selected_single"].split()) <= 4
    assert summary["answer_single"] == summary["answer_sharded"]
    assert float(summary["single_s"]) > 0 and float(summary["sharded_s"]) > 0
    assert float(summary["ratio"]) == pytest.approx(float(summary["single_s"]) / float(summary["sharded_s"]), rel=0.01)
    # the waiting rank left the core to rank 0 (a barrier that blocks, not spins)
    assert float(summary["idle_cpu_s_max"]) < 0.5 * float(summary["single_s"])
    # the collectives the prediction counts, as the CPU run made them
    for r in ("r0", "r1"):
        assert int(summary[f"encode_all_gather_object_{r}_calls"]) == bp.ENCODE_COLLECTIVES
        kinds = ("all_gather_object", "broadcast_object_list")
        assert sum(int(summary[f"question_{k}_{r}_calls"]) for k in kinds) == bp.QUESTION_COLLECTIVES
    # the kept chunks of rank 1 went to rank 0: K and V of 4 layers, 257 rows, 2 KV heads of 32, fp32, and int64 ids
    remote = sum(1 for j in summary["selected_sharded"].split() if int(j) >= 4)
    per_chunk = 2 * 4 * 257 * 2 * 32 * 4 + 257 * 8
    assert int(summary["kv_bytes_to_root"]) == remote * per_chunk
    if remote:
        assert int(summary["question_send_r1_sent"]) == remote * per_chunk
        assert int(summary["question_recv_r0_received"]) == remote * per_chunk
    md = (tmp_path / "distributed.md").read_text()
    assert "Accuracy beside the speed: **all equal**" in md and "8/8 chunks bit-equal" in md
    assert "## Predicted (not measured)" in md and "| 8 | 128 |" in md
    assert "Absolute seconds are this CPU's" in md


def test_make_bench_runs_it_in_a_process_of_its_own(tmp_path, monkeypatch):
    import bench.run_all

    calls = []
    monkeypatch.setattr(bench.run_all.torch, "set_num_threads", lambda n: None)
    real_run = bench.run_all.subprocess.run  # the module is shared: git (provenance) still runs

    def run(cmd, **kw):
        if "bench.speed.distributed" not in cmd:
            return real_run(cmd, **kw)
        calls.append((cmd, kw))

    monkeypatch.setattr(bench.run_all.subprocess, "run", run)
    assert bench.run_all.main(["--out", str(tmp_path), "--only", "distributed", "--scale", "0.1"]) == 0
    ((cmd, kw),) = calls
    assert cmd[1:3] == ["-m", "bench.speed.distributed"] and cmd[cmd.index("--out") + 1] == str(tmp_path)
    assert cmd[cmd.index("--length") + 1] == str(int(bd.LENGTH * 0.1)) and cmd[-2:] == ["--rounds", "1"]
    assert kw["env"]["OMP_NUM_THREADS"] == "1"
    assert "## distributed.md" in (tmp_path / "SUMMARY.md").read_text()
