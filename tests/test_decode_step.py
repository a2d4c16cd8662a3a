"""``bench/speed/decode_step.py`` without a GPU: the kernel classification, the per-kernel and per-kind tables, the
report, and the skip of a run without CUDA (the measurement itself runs on the GPU)."""

from __future__ import annotations

import pytest

from bench.speed import decode_step as ds


@pytest.mark.parametrize(
    "name,kind",
    [
        ("_split_s_partial_kernel", "attention: split-S"),
        ("_merge_states_kernel", "attention: merge"),
        ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64", "GEMM (weights, LM head)"),
        ("nvjet_hsh_128x256_64x4_2x1_v_bz_coopA_NTN", "GEMM (weights, LM head)"),
        ("void at::native::(anonymous namespace)::vectorized_layer_norm_kernel", "norm"),
        (
            "void at::native::vectorized_elementwise_kernel<4, at::native::silu_kernel>",
            "elementwise (SwiGLU, residual, casts)",
        ),
        ("Memcpy DtoD (Device -> Device)", "copy / cat / index"),
        ("something_unheard_of", "other"),
    ],
)
def test_kernel_kind(name, kind):
    assert ds.kernel_kind(name) == kind


def test_kernel_table_per_step_and_shares():
    events = [("gemm_a", 280, 9000.0), ("_split_s_partial_kernel", 56, 600.0), ("rms_norm_kernel", 114, 400.0)]
    rows = ds.kernel_table(events, steps=2)
    assert [r["kernel"] for r in rows] == ["gemm_a", "_split_s_partial_kernel", "rms_norm_kernel"]
    assert rows[0]["us_per_step"] == 4500.0 and rows[0]["calls_per_step"] == 140
    assert rows[0]["share"] == pytest.approx(0.9) and sum(r["share"] for r in rows) == pytest.approx(1.0)
    kinds = ds.by_kind(rows + [dict(kernel="gemm_b", kind=rows[0]["kind"], calls_per_step=1, us_per_step=10, share=0)])
    assert (
        kinds[0]["kind"] == "GEMM (weights, LM head)" and kinds[0]["kernels"] == 2 and kinds[0]["us_per_step"] == 4510
    )
    with pytest.raises(ValueError):
        ds.kernel_table(events, steps=0)


def test_report_carries_the_bound_ratio_and_both_modes():
    summary = dict(layers=28, gen=32, repeats=20, weight_gb=15.23, kv_gb=0.5, bound_ms=3.17)
    summary["paths"] = {"torch": dict(eager_ms=33.0, host_ms=20.0, graph_ms=11.5)}
    rows = ds.kernel_table([("gemm", 10, 100.0)], steps=1)
    tables = {"torch: graph replay": rows, "torch: eager": []}
    text = ds.report(summary, tables, command="python -m bench.speed.decode_step", machine="m")
    assert "| torch | 33.000 | 20.000 | 11.500 | 3.170 | 3.63x | <= 1.5x |" in text
    assert "## torch: graph replay: 0.100 ms of kernel time per step, by kind" in text
    assert "## torch: eager: no kernels recorded by the profiler" in text
    assert "Fused over torch" not in text  # one path: no ratio


def test_report_puts_the_fused_path_beside_the_torch_path():
    summary = dict(layers=28, gen=32, repeats=20, weight_gb=15.23, kv_gb=0.5, bound_ms=3.17)
    summary["paths"] = {
        "torch": dict(eager_ms=33.0, host_ms=20.0, graph_ms=11.5),
        "fused": dict(eager_ms=16.5, host_ms=8.0, graph_ms=5.75),
    }
    summary["accuracy"] = dict(max_abs_diff=0.0625, max_abs_logit=12.0, argmax_agree=1.0)
    text = ds.report(summary, {}, command="c", machine="m")
    assert "| fused | 16.500 | 8.000 | 5.750 | 3.170 | 1.81x | <= 1.5x |" in text
    assert "Fused over torch, same run: eager 2.00x, host 2.50x, graph 2.00x faster." in text
    assert "max abs difference 0.0625 (largest |logit| 12), same argmax at 100.0% of the positions." in text


def test_fused_choice_names_the_paths(tmp_path):
    assert ds.PATHS["both"] == ("torch", "fused") and ds.PATHS["on"] == ("fused",) and ds.PATHS["off"] == ("torch",)
    assert ds.main(["--out", str(tmp_path), "--dry-run", "--fused", "on"]) == 0


def test_without_cuda_it_skips_and_says_why(tmp_path, capsys):
    assert ds.main(["--out", str(tmp_path), "--dry-run"]) == 0
    assert "Skipped: dry run" in (tmp_path / "decode_step.md").read_text()
    assert ds.main(["--out", str(tmp_path), "--repeats", "0"]) == 2
    assert capsys.readouterr().err.startswith("error: ")


def test_run_measures_both_paths_side_by_side(monkeypatch, one_thread):
    """``run`` on CPU with stand-ins for what needs CUDA (the 7B model, the graph, the profiler, the
    syncs): both paths are timed on the same model, the fused one really sets ``model.fused_ops``, and
    the accuracy line compares their logits (the fused ops run their torch references here)."""

    import triton_kernels as tk
    from bench.kernels import cuda_graph_check as cg
    from bench.kernels import gpu_timing as T
    from dllm.decode import policies
    from tests.tiny_checkpoints import small_model

    model = small_model(
        "dream", vocab_size=64, hidden_size=56, intermediate_size=64, num_layers=1, num_heads=7, num_kv_heads=1,
        head_dim=8, rope_theta=1e6, mask_token_id=63,
    )  # fmt: skip
    monkeypatch.setattr(cg, "dream_model", lambda layers: model)
    monkeypatch.setattr(T, "cuda_sync", lambda: None)
    monkeypatch.setattr(ds, "profile_kernels", lambda step, steps: (step(), [("gemm", steps, 10.0 * steps)])[1])
    seen = []
    plain = policies.PrefillingPolicy

    def eager_policy(*a, cuda_graph=False, **k):  # no CUDA graph on CPU: the same step, eagerly
        seen.append(model.fused_ops)
        return plain(*a, cuda_graph=False, **k)

    monkeypatch.setattr(policies, "PrefillingPolicy", eager_policy)
    for name in ("add_rms_norm", "rope_qk", "swiglu"):
        fn = getattr(tk, name)
        monkeypatch.setattr(tk, name, lambda *a, _fn=fn, backend=None, **k: _fn(*a, backend="torch", **k))
    written = []
    summary, tables = ds.run(
        layers=1, repeats=1, profile_steps=1, gen=4, on_path=lambda s, t: written.append(list(s["paths"]))
    )
    assert written == [["torch"], ["torch", "fused"]]  # after each path: a timeout keeps what was done
    assert seen == [False, False, True, True]  # eager and graph policies of each path, torch first
    assert model.fused_ops is None  # restored
    assert set(summary["paths"]) == {"torch", "fused"}
    assert all(t["eager_ms"] > 0 and t["graph_ms"] > 0 for t in summary["paths"].values())
    acc = summary["accuracy"]
    assert acc["argmax_agree"] == 1.0 and acc["max_abs_diff"] <= 1e-5 * max(1.0, acc["max_abs_logit"])
    assert set(tables) == {"torch: graph replay", "torch: eager", "fused: graph replay", "fused: eager"}
    text = ds.report(summary, tables, command="c", machine="m")
    assert "| torch |" in text and "| fused |" in text and "Fused over torch, same run" in text
