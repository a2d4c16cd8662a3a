"""The benchmark registry, the roofline arithmetic and bench_kernels' ranking (no timing measured here)."""

from __future__ import annotations

import torch

from bench import bench_kernels as bk
from bench import roofline
from bench.kernel_cases import CASES, OPS, Case, cases, make_inputs


def test_registry_names_every_op_for_gpu_cpu_and_gate():
    for op in OPS:
        for where in ("gpu", "cpu"):
            assert any(where in c.where for c in CASES[op]), (op, where)
    names = [(c.op, c.name) for op in OPS for c in CASES[op]]
    assert len(names) == len(set(names))
    gate = {c.op for c in cases("gate")}
    assert gate == set(OPS)
    assert any(c.p.get("ragged") for c in cases("gate"))


def test_make_inputs_shapes():
    case = next(c for c in CASES["split_s_attention"] if c.p.get("ragged"))
    a = make_inputs(case, "cpu", torch.float16, empty=True)
    p = case.p
    assert a["q"].shape == (p["b"], p["m"], 28, 128) and a["k_pool"].shape == (p["b"] * p["k"], p["c"], 4, 128)
    assert a["live_lens"].tolist() == [64, 48, 32, 16] and a["seg_slots"].shape == (p["b"], p["k"])
    assert a["seg_slots"].unique().numel() == p["b"] * p["k"]  # every row its own chunks


def test_roofline_of_the_issue_shape():
    """Dream-7B K=4, C=1024 + 64 live tokens, bf16: 9.4 MB, 3.8 GFLOP, 7.5 M exp2, ~400 FLOP/B (issue 16)."""
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
        bk.Method("ours", lambda: "ours", ours=True, check="exact"),
        bk.Method("fast_but_wrong", lambda: "fast_but_wrong", check="FAIL"),
        bk.Method("good", lambda: "good", check="exact"),
        bk.Method("slow", lambda: "slow", check="exact"),
    ]
    case = next(c for c in CASES["topb_gather"] if "cpu" in c.where)
    got = bk.run_case(case, bk.Bench(methods, None, None), torch.float32, torch.device("cpu"))
    rows = {r["method"]: r for r in got}
    assert rows["ours"]["speedup_vs_best"] == "1.50" and rows["ours"]["best_baseline"] == "good"
    assert rows["slow"]["time_over_ours"] == "2.00" and "speedup_vs_best" not in rows["good"]


def test_rule_checks_in_bench_catch_a_wrong_method():
    """The accuracy check uses the shared rule: a perturbed output fails, the exact one passes."""
    case = next(c for c in CASES["merge_states"] if "cpu" in c.where)
    bench = bk.merge_bench(case, torch.float32, torch.device("cpu"))
    ok, _, _ = bk.check_rule(bench.methods[0].fn()[0], bench.ref, bench.lowp, torch.float32)
    bad, _, _ = bk.check_rule(bench.methods[0].fn()[0] + 1e-3, bench.ref, bench.lowp, torch.float32)
    assert ok and not bad
