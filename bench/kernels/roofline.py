"""Roofline of every benchmarked kernel case on an H200: bytes, FLOPs, exp count and the lower bound.

    python -m bench.kernels.roofline [--out bench/results/roofline.md]

Derived numbers, not timings. For each ``gpu`` case of ``bench/kernel_cases.py`` in bf16:

* **bytes**: the HBM traffic the op cannot avoid (inputs read once, outputs written once);
* **MMA FLOPs** (tensor cores) and **SIMT FLOPs** (CUDA cores, merge only), counting a
  multiply-add as 2;
* **exp**: exponentials (one per score; the SFU's ``ex2``);
* **bound** = max(bytes / HBM bandwidth, MMA FLOPs / tensor peak, SIMT / FP32 peak,
  exp / SFU rate): no kernel can be faster (launch latency not included);
* **kernel bound**: the same for the work our kernels do (split-S: plus the fp32 partials of
  its H200 plan; chunk scores: two ``Q K^T`` passes, K read twice). ``bench_kernels`` on a
  GPU prints each latency as a percentage of the bound.

H200 figures (:data:`H200_PEAK`): HBM3e 4.8 TB/s and 989 TFLOPS dense FP16/BF16 tensor
(NVIDIA H200 Tensor Core GPU datasheet: 1,979 TFLOPS is the 2:4-sparse figure), 67 TFLOPS
FP32 on CUDA cores (same datasheet), and 3.9 T exponentials/s: FlashAttention-3 (Shah et
al., 2024, section 3.1) gives 3.9 TFLOPS of special functions on the H100 SXM5, whose
GH100 SMs and clocks the H200 shares (132 SMs x 16 SFU ops/clock).
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

from bench.kernel_cases import HEAD_DIM, Case, cases, live_lens_of
from triton_kernels.plan import H200, plan_chunk_scores, plan_split_s


@dataclass(frozen=True)
class Peak:
    name: str
    hbm_bytes_s: float
    mma_flops_s: float
    simt_flops_s: float
    exp_s: float


H200_PEAK = Peak("H200 SXM", hbm_bytes_s=4.8e12, mma_flops_s=989e12, simt_flops_s=67e12, exp_s=3.9e12)


@dataclass(frozen=True)
class Cost:
    bytes: float
    mma_flops: float
    exps: float
    simt_flops: float = 0.0
    kernel_bytes: float | None = None  # what our kernels move / compute, when more than the minimum
    kernel_mma_flops: float | None = None
    kernel_exps: float | None = None
    note: str = ""

    @property
    def intensity(self) -> float:
        return (self.mma_flops + self.simt_flops) / self.bytes if self.bytes else 0.0


def cost(case: Case, elt: int = 2) -> Cost:
    """Minimal and kernel work of one call of ``case`` with ``elt``-byte tensors (fp32 outputs stay fp32)."""
    hq, hkv = case.heads
    d = HEAD_DIM
    p = case.p
    if case.op == "split_s_attention":
        b, k, c, m = p["b"], p["k"], p["c"], p["m"]
        live = live_lens_of(case) or [m] * b
        queries = sum(live) * hq
        keys = [k * c + n for n in live]
        nbytes = 2 * queries * d * elt + queries * 4 + sum(2 * n * hkv * d * elt for n in keys)
        qk = sum(n * hq * kk for n, kk in zip(live, keys, strict=True))  # scores
        plan = plan_split_s(b, m, hq, hkv, d, k, c, True, elt, H200)
        note = f"{plan.n_parts} partials, {plan.ctas} CTAs, predicted {plan.predicted_us:.1f} us"
        return Cost(nbytes, 4 * qk * d, qk, kernel_bytes=nbytes + plan.partial_bytes, note=note)
    if case.op == "merge_states":
        n, rows = p["n"], p["rows"]
        r = rows * hq
        nbytes = (n + 1) * r * (d * elt + 4)
        return Cost(nbytes, 0.0, n * r, simt_flops=2 * n * r * d)
    if case.op == "chunk_attention_scores":
        n, t, m = p["n"], p["t"], p["m"]
        e = m
        qk = n * m * hq * (t + e)
        k_bytes = n * (t + e) * hkv * d * elt
        nbytes = n * m * hq * d * elt + k_bytes + n * hkv * (t + e) * 4 + n * m * hq * 4
        plan = plan_chunk_scores(n, m, hq, hkv, d, t, elt, H200)
        return Cost(
            nbytes, 2 * qk * d, qk,
            kernel_bytes=nbytes + k_bytes, kernel_mma_flops=4 * qk * d, kernel_exps=2 * qk,
            note=f"row-LSE pass: {plan.n_splits} key split(s), {plan.lse_ctas} CTAs",
        )  # fmt: skip
    if case.op == "chunk_row_mass":
        n, t, e = p["n"], p["t"], p["e"]
        qk = n * t * hq * (t + e)
        nbytes = n * t * hq * d * elt + n * (t + e) * hkv * d * elt + n * hkv * t * 4
        return Cost(nbytes, 2 * qk * d, qk)
    if case.op == "topb_gather":
        n, t, b = p["n"], p["t"], p["b"]
        nbytes = n * hkv * t * 4 + 4 * n * b * hkv * d * elt + n * hkv * b * 8
        return Cost(nbytes, 0.0, 0.0, note="scores read once by the selection kernel (pool window from L1)")
    raise KeyError(case.op)


def times_us(nbytes: float, mma: float, simt: float, exps: float, peak: Peak = H200_PEAK) -> dict:
    return {
        "mem": nbytes / peak.hbm_bytes_s * 1e6,
        "mma": mma / peak.mma_flops_s * 1e6,
        "simt": simt / peak.simt_flops_s * 1e6,
        "exp": exps / peak.exp_s * 1e6,
    }


def bound_us(c: Cost, peak: Peak = H200_PEAK, *, kernel: bool = False) -> tuple[float, str]:
    """``(lower bound in us, what limits it)`` of the minimal work (or of our kernels' work)."""
    if kernel:
        t = times_us(
            c.kernel_bytes or c.bytes, c.kernel_mma_flops or c.mma_flops, c.simt_flops, c.kernel_exps or c.exps, peak
        )
    else:
        t = times_us(c.bytes, c.mma_flops, c.simt_flops, c.exps, peak)
    limiter = max(t, key=t.get)
    return t[limiter], limiter


def table(peak: Peak = H200_PEAK) -> str:
    cols = [
        "op", "case", "MB", "MMA GFLOP", "M exp", "FLOP/B", "mem us", "MMA us", "exp us", "bound us", "limit",
        "kernel bound us", "H200 plan",
    ]  # fmt: skip
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for case in cases("gpu"):
        c = cost(case)
        t = times_us(c.bytes, c.mma_flops, c.simt_flops, c.exps, peak)
        b, lim = bound_us(c, peak)
        kb, _ = bound_us(c, peak, kernel=True)
        lines.append(
            "| "
            + " | ".join(
                [
                    case.op,
                    case.name,
                    f"{c.bytes / 1e6:.2f}",
                    f"{c.mma_flops / 1e9:.3f}",
                    f"{c.exps / 1e6:.2f}",
                    f"{c.intensity:.0f}",
                    f"{t['mem']:.2f}",
                    f"{t['mma']:.2f}",
                    f"{t['exp']:.2f}",
                    f"{b:.2f}",
                    lim,
                    f"{kb:.2f}",
                    c.note,
                ]
            )
            + " |"
        )
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, help="write the markdown table here")
    args = ap.parse_args(argv)
    pk = H200_PEAK
    text = "\n".join(
        [
            "# Roofline of the benchmarked kernel cases on an H200 (bf16)",
            "",
            "Derived numbers, not timings (`python -m bench.kernels.roofline --out bench/results/roofline.md`; the",
            "cases are the `gpu` cases of `bench/kernel_cases.py`). bound = max(mem, MMA, SIMT, exp) time of the",
            "minimal work; kernel bound = the same for the work our kernels do (split-S fp32 partials of the",
            "H200 plan; chunk scores' two Q K^T passes). Launch latency (a few us per kernel) is not included:",
            "at decode shapes it is of the order of the bound itself.",
            "",
            f"Assumed {pk.name} peaks: HBM {pk.hbm_bytes_s / 1e12:.1f} TB/s, tensor {pk.mma_flops_s / 1e12:.0f} TFLOPS "
            f"(dense FP16/BF16), CUDA-core FP32 {pk.simt_flops_s / 1e12:.0f} TFLOPS (NVIDIA H200 datasheet); "
            f"{pk.exp_s / 1e12:.1f} T exp/s (FlashAttention-3, Shah et al. 2024, H100 SXM5: same SMs and clocks).",
            "",
            table(pk),
            "",
        ]
    )
    if args.out:
        args.out.write_text(text)
        print(f"[roofline] wrote {args.out}")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
