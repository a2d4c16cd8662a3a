"""``bench/kernels/launch_check.py`` (stage ``launch`` of ``bench/gpu_check.sh``): its comparisons, on CPU tensors.

The checks themselves need compiled kernels on a GPU; here the helpers they rest on are held to independent
expectations, and the script's CPU behaviour (a clean skip) is checked."""

import torch

from bench.kernel_cases import ELEMENTWISE_OPS, OPS
from bench.kernels import launch_check as lc


def test_same_bits_tells_bit_patterns_apart():
    a = torch.tensor([1.0, -0.0, float("nan")], dtype=torch.bfloat16)
    assert lc.same_bits(a, a.clone()) and lc.same_bits((a, 3, a), (a.clone(), 4, a.clone()))
    assert not lc.same_bits(a, torch.tensor([1.0, 0.0, float("nan")], dtype=torch.bfloat16))  # -0 vs +0
    assert not lc.same_bits(a, a.float()) and not lc.same_bits((a,), (a, a))
    assert lc.same_bits(torch.tensor([1, 2], dtype=torch.int32), torch.tensor([1, 2], dtype=torch.int32))


def test_misaligned_copies_sit_off_16_bytes_with_the_same_values():
    x = torch.randn(4, 8).to(torch.bfloat16)
    lse = torch.randn(3, 5)
    idx = torch.arange(4, dtype=torch.int32)
    got = lc.misaligned({"x": x, "lse": lse, "idx": idx, "b": 7})
    assert got["x"].data_ptr() % 16 != 0 and got["lse"].data_ptr() % 16 != 0
    assert torch.equal(got["x"], x) and torch.equal(got["lse"], lse) and got["x"].is_contiguous()
    assert got["idx"] is idx and got["b"] == 7  # index tensors and ints as they were


def test_one_case_per_op_and_a_clean_skip_without_cuda(capsys):
    assert sorted(c.op for c in lc.cases_to_check()) == sorted(OPS + ELEMENTWISE_OPS)
    if not torch.cuda.is_available():
        assert lc.main([]) == 0
        assert "no CUDA device" in capsys.readouterr().out
