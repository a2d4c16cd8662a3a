"""bench/kernels/decode_launches.py: the launch audit of one prefilling denoising step, on this CPU (2 layers, tiny)."""

from __future__ import annotations

import torch

from bench.kernels import decode_launches as D


def test_launch_audit_counts_the_fused_and_torch_paths():
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        r = D.run(layers=2, gen=4, chunk=8)
    finally:
        torch.set_num_threads(old)
    t, f = r["torch"], r["fused"]
    # GEMMs: 7 a layer on the torch path, 4 on the fused one (q/k/v and gate/up merged), + the LM head
    assert t["classes"]["GEMM"] == 7 * 2 + 1 and f["classes"]["GEMM"] == 4 * 2 + 1
    # the fused path's Triton kernels: two norms, RoPE, SwiGLU and split-S a layer, the final norm
    assert f["triton"]["_add_rms_norm_kernel"] == 2 * 2 + 1
    assert f["triton"]["_rope_qk_kernel"] == f["triton"]["_swiglu_kernel"] == 2
    assert f["triton"]["_split_s_partial_kernel"] == t["triton"]["_split_s_partial_kernel"] == 2
    assert "_add_rms_norm_kernel" not in t["triton"]
    # the torch path's elementwise ops (RMSNorm's pow/mean/rsqrt, RoPE's neg/cat, SiLU) are gone on the fused one
    for op in ("pow", "mean", "rsqrt", "neg", "cat", "silu"):
        assert t["ops"][op] > 0 and f["ops"][op] == 0, op
    assert f["classes"]["total"] < t["classes"]["total"]
    assert sum(t["classes"][k] for k in ("GEMM", "Triton", "other aten")) == t["classes"]["total"]
    # outside the captured forward: no host read in a step (test_sync_budget's rule), some small ops
    assert r["outside"]["reads"] == r["outside"]["max_reads"] == 0 and r["outside"]["ops"] > 0
    text = D.report(r, command="cmd", machine="m")
    assert f"| forward: GEMM launches | {7 * 2 + 1} | {4 * 2 + 1} |" in text


def test_cli_rejects_bad_sizes(capsys):
    assert D.main(["--layers", "0"]) == 2
    assert capsys.readouterr().err.startswith("error:")
