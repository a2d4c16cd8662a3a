"""The benchmark registry, the roofline arithmetic and bench_kernels' ranking (no timing measured here)."""

from __future__ import annotations

import pytest
import torch

from bench.kernel_cases import CASES, ELEMENTWISE_OPS, OPS, Case, cases, make_inputs
from bench.kernels import bench_kernels as bk
from bench.kernels import gpu_timing as T
from bench.kernels import roofline


def test_registry_names_every_op_for_gpu_cpu_and_gate():
    for op in OPS:
        for where in ("gpu", "cpu"):
            assert any(where in c.where for c in CASES[op]), (op, where)
    names = [(c.op, c.name) for op in OPS for c in CASES[op]]
    assert len(names) == len(set(names))
    gate = {c.op for c in cases("gate")}
    assert gate == set(OPS) | set(ELEMENTWISE_OPS)
    assert any(c.p.get("ragged") for c in cases("gate"))


def test_make_inputs_shapes():
    case = next(c for c in CASES["split_s_attention"] if c.p.get("ragged"))
    a = make_inputs(case, "cpu", torch.float16, empty=True)
    p = case.p
    assert a["q"].shape == (p["b"], p["m"], 28, 128) and a["k_pool"].shape == (p["b"] * p["k"], p["c"], 4, 128)
    assert a["live_lens"].tolist() == [64, 48, 32, 16] and a["seg_slots"].shape == (p["b"], p["k"])
    assert a["seg_slots"].unique().numel() == p["b"] * p["k"]  # every row its own chunks


def test_roofline_of_the_dream7b_k4_decode_shape():
    """Dream-7B K=4, C=1024 + 64 live tokens, bf16: 9.4 MB, 3.8 GFLOP, 7.5 M exp2, ~400 FLOP/B."""
    case = Case("split_s_attention", "dream7b", (("b", 1), ("k", 4), ("c", 1024), ("m", 64)))
    c = roofline.cost(case)
    keys = 4 * 1024 + 64
    assert c.bytes == 2 * 64 * 28 * 128 * 2 + 64 * 28 * 4 + 2 * keys * 4 * 128 * 2  # q + o, lse, K + V
    assert c.mma_flops == 4 * 64 * 28 * keys * 128 and c.exps == 64 * 28 * keys
    assert round(c.bytes / 1e6, 1) == 9.4 and round(c.mma_flops / 1e9, 1) == 3.8 and round(c.exps / 1e6, 1) == 7.5
    us, limit = roofline.bound_us(c)
    assert limit == "mma" and abs(us - c.mma_flops / 989e12 * 1e6) < 1e-9
    assert roofline.bound_us(c, kernel=True)[0] >= us
    assert "| split_s_attention | dream7b/b1-k4-c1024-m64 | 9.44 |" in roofline.table()


def test_speedup_is_against_the_fastest_passing_baseline(monkeypatch):
    medians = {"ours": 2.0, "fast_but_wrong": 1.0, "good": 3.0, "slow": 4.0}
    monkeypatch.setattr(bk, "time_fn", lambda fn, device: {"median_ms": medians[fn()], "p20_ms": 0, "p80_ms": 0})
    methods = [
        bk.Method("ours", lambda a: "ours", ours=True, check="exact"),
        bk.Method("fast_but_wrong", lambda a: "fast_but_wrong", check="FAIL"),
        bk.Method("good", lambda a: "good", check="exact"),
        bk.Method("slow", lambda a: "slow", check="exact"),
    ]
    case = next(c for c in CASES["topb_gather"] if "cpu" in c.where)
    got = bk.run_case(case, bk.Bench(methods, None, None), torch.float32, torch.device("cpu"))
    rows = {r["method"]: r for r in got}
    assert rows["ours"]["speedup_vs_best"] == "1.50" and rows["ours"]["best_baseline"] == "good"
    assert rows["slow"]["time_over_ours"] == "2.00" and "speedup_vs_best" not in rows["good"]
    assert rows["ours"]["eager_us"] == "2000.00"


def test_gpu_ranking_is_graph_time_against_graph_time(monkeypatch):
    """On a GPU the eager numbers are reported but the ranking and the % of bound use the graph time."""
    times = {"ours": (250.0, 10.0), "flex": (180.0, 20.0), "sdpa": (60.0, 40.0)}  # (eager, graph) us

    def fake_gpu(method, inputs, device):
        eager, graph = times[method.name]
        return {"eager_us": eager, "graph_us": graph, "host_us": eager / 2, "copies": 3, "cold_l2": 1}

    monkeypatch.setattr(bk, "time_gpu", fake_gpu)
    methods = [bk.Method(n, lambda a: None, ours=(n == "ours"), check="exact") for n in times]
    case = next(c for c in CASES["split_s_attention"] if c.name == "dream7b/b1-k4-c1024-m64")
    rows = {
        r["method"]: r for r in bk.run_case(case, bk.Bench(methods, None, None), torch.bfloat16, torch.device("cuda"))
    }
    assert rows["ours"]["speedup_vs_best"] == "2.00" and rows["ours"]["best_baseline"] == "flex"
    assert rows["sdpa"]["time_over_ours"] == "4.00" and rows["ours"]["eager_us"] == "250.00"
    bound = roofline.bound_us(roofline.cost(case))[0]
    assert rows["ours"]["pct_of_h200_bound"] == f"{100 * bound / 10.0:.1f}"


def test_cold_l2_rotation_count():
    """Enough copies that the others move >= 2 L2s between two uses of one; one copy when it alone does."""
    l2 = 60 * 10**6
    assert T.rotation_count(10 * 10**6, l2) == 13  # 12 others x 10 MB = 120 MB = 2 L2
    assert T.is_cold(13, 10 * 10**6, l2) and not T.is_cold(12, 10 * 10**6, l2)
    assert T.rotation_count(120 * 10**6, l2) == 1 and T.is_cold(1, 120 * 10**6, l2)
    assert T.rotation_count(1, l2) == T.MAX_COPIES  # tiny inputs: capped
    assert T.rotation_count(10**9, l2, mem_budget=10**9 - 1) == 1  # never below one copy
    assert T.rotation_count(50 * 10**6, l2, mem_budget=10**8) == 2  # memory cap: not cold
    assert not T.is_cold(2, 50 * 10**6, l2)
    with pytest.raises(ValueError):
        T.rotation_count(0, l2)


def test_graph_arithmetic():
    assert T.calls_per_graph(3) == 9 and T.calls_per_graph(13) == 13 and T.calls_per_graph(1) == 8
    assert T.per_call_us(2.0, replays=10, calls=8) == 25.0
    with pytest.raises(ValueError):
        T.per_call_us(1.0, 0, 1)
    with pytest.raises(ValueError):
        T.calls_per_graph(0)


def test_host_and_eager_timers_with_a_fake_clock():
    """Host time: n calls between two clock reads, syncs outside them; eager: a sync on each side of each call."""
    now = [0.0]
    log = []

    def clock():
        return now[0]

    def fn():
        log.append("call")
        now[0] += 5e-6  # 5 us of host work per call

    def sync():
        log.append("sync")
        now[0] += 1e-3  # a sync waits for 1 ms of GPU work

    assert T.host_time_us(fn, 4, sync=sync, clock=clock) == pytest.approx(5.0)
    assert log == ["sync"] + ["call"] * 4 + ["sync"]
    log.clear()
    assert T.eager_us(fn, 3, sync=sync, clock=clock) == pytest.approx(1005.0)
    assert log == ["sync", "call", "sync"] * 3


def test_rotation_copies_only_what_a_method_reads():
    a = {"q": torch.zeros(4, 4), "k": torch.zeros(16, 4), "b": 7}
    a["kt"] = a["k"].t()  # a view: its storage is counted once
    assert T.tensor_bytes(a) == (16 + 64) * 4
    c = T.clone_inputs({k: a[k] for k in ("kt", "b")})
    assert c["kt"].stride() == a["kt"].stride() and c["kt"].data_ptr() != a["kt"].data_ptr() and c["b"] == 7


def test_rule_checks_in_bench_catch_a_wrong_method():
    """The accuracy check uses the shared rule: a perturbed output fails, the exact one passes."""
    case = next(c for c in CASES["merge_states"] if "cpu" in c.where)
    bench = bk.merge_bench(case, torch.float32, torch.device("cpu"))
    out = bench.methods[0].fn(bench.inputs)[0]
    ok, _, _ = bk.check_rule(out, bench.ref, bench.lowp, torch.float32)
    bad, _, _ = bk.check_rule(out + 1e-3, bench.ref, bench.lowp, torch.float32)
    assert ok and not bad


def test_unranked_variants_are_timed_but_never_the_best_baseline(monkeypatch):
    times = {"ours": (50.0, 10.0), "variant": (40.0, 5.0), "rival": (60.0, 20.0)}

    def fake_gpu(method, inputs, device):
        eager, graph = times[method.name]
        return {"eager_us": eager, "graph_us": graph, "host_us": 1.0, "copies": 1, "cold_l2": 1}

    monkeypatch.setattr(bk, "time_gpu", fake_gpu)
    methods = [
        bk.Method("ours", lambda a: None, ours=True, check="exact"),
        bk.Method("variant", lambda a: None, check="exact", rank=False),
        bk.Method("rival", lambda a: None, check="exact"),
    ]
    case = next(c for c in CASES["topb_gather"] if "gpu" in c.where)
    rows = {
        r["method"]: r for r in bk.run_case(case, bk.Bench(methods, None, None), torch.bfloat16, torch.device("cuda"))
    }
    assert rows["ours"]["best_baseline"] == "rival" and rows["ours"]["speedup_vs_best"] == "2.00"
    assert rows["variant"]["graph_us"] == "5.00" and "time_over_ours" not in rows["variant"]


def test_torch_gather_baseline_matches_the_reference_rows():
    """The copy-only top-B baseline (torch.gather from the same indices) gives the reference rows, zero padding."""
    from triton_kernels import reference as R

    gen = torch.Generator().manual_seed(3)
    scores, k, v = (
        torch.rand(3, 2, 40, generator=gen),
        torch.randn(3, 40, 2, 8, generator=gen),
        torch.randn(3, 40, 2, 8),
    )
    lens = torch.tensor([40, 5, 17])
    k_out, v_out, idx, _ = R.topb_gather(scores, k, v, 12, lens=lens)
    assert (idx < 0).any()  # padding rows present (chunk 1 keeps 5 of 12)
    got_k, got_v = bk.torch_gather_rows(idx, k, v)
    assert torch.equal(got_k, k_out) and torch.equal(got_v, v_out)


def test_time_gpu_rotates_only_the_methods_inputs(monkeypatch):
    """The graph gets one call per copy; copies clone what the method reads and share the rest."""
    seen = []
    monkeypatch.setattr(T, "eager_us", lambda fn, n, sync: (fn(), 7.0)[1])
    monkeypatch.setattr(T, "host_time_us", lambda fn, n, sync: 3.0)
    monkeypatch.setattr(T, "device_l2_bytes", lambda device: 60 * 10**6)
    monkeypatch.setattr(T, "graph_time_us", lambda fns: ([f() for f in fns], 2.0)[1])
    inputs = {"q": torch.zeros(10**6, dtype=torch.uint8), "big": torch.zeros(10, dtype=torch.uint8)}
    m = bk.Method("m", lambda a: seen.append((a["q"].data_ptr(), a["big"].data_ptr())), reads=("q",))
    row = bk.time_gpu(m, inputs, torch.device("cpu"))
    assert row == {"eager_us": 7.0, "host_us": 3.0, "graph_us": 2.0, "copies": 121, "cold_l2": 1}
    graph_calls = seen[-121:]
    assert len({q for q, _ in graph_calls}) == 121 and len({b for _, b in graph_calls}) == 1


def test_flex_pad8_takes_the_first_kernel_options_that_compile():
    """FlexAttention's decoding kernel defaults to BLOCK_M = next_pow2(M * 8) = 512 at M = 64, which no 128-query
    block-mask block divides (the H200 run's NoValidChoicesError); the baseline tries explicit BLOCK_Ms in order."""
    assert all(128 % o["BLOCK_M"] == 0 for o in bk.FLEX_PAD8_OPTIONS)
    m, hq, hkv, g = 4, 14, 2, 7
    tried = []

    def fake_flex(q, k, v, block_mask, scale, enable_gqa, kernel_options):
        tried.append(kernel_options["BLOCK_M"])
        if kernel_options["BLOCK_M"] == 64:
            raise RuntimeError("NoValidChoicesError")
        return q  # [1, Hkv * 8, M, D]: the padded query itself

    a = {"q": torch.randn(1, m, hq, 128), "kf": None, "vf": None}
    meth = bk._flex_pad8(fake_flex, a, None, m, hq, hkv, g, 8, 1.0)
    assert tried == [64, 32] and meth.note == "kernel_options={'BLOCK_M': 32}"
    assert torch.equal(meth.fn(a), a["q"])  # padding then un-padding gives back the real heads

    def never(*args, **kwargs):
        raise RuntimeError("no")

    failed = bk._flex_pad8(never, a, None, m, hq, hkv, g, 8, 1.0)
    with pytest.raises(RuntimeError, match="no FlexAttention decoding config compiled"):
        failed.fn(a)
