"""Regressions for odd inputs: each input below was a traceback naming nothing, an error the docs promised and
did not raise, or a crash one backend had and the other not."""

import pytest
import torch

import dllm
import triton_kernels as tk
from dllm.harness.args import ModelArgsError, parse_model_args
from dllm.prefilling import PrefillingConfig, PromptParts
from dllm.prefilling.selection import adaptive_top_k, select_chunks
from triton_kernels import reference as R

HUGE = 10**400  # an int past float's range


@pytest.fixture(scope="module")
def model():
    return dllm.load_model()


def _ids(model, text):
    return dllm.encode_text(model, text)


@pytest.mark.parametrize(
    "method, option",
    [("dense", {"cache_refresh": "step"}), ("dense", {"cache_scope": "prompt"}), ("prefilling", {"live_window": 5})],
)
def test_prefix_cache_options_with_another_method_are_refused(model, method, option):
    """generate's docstring promises a ValueError for options of another method; these three ran silently."""
    ids = _ids(model, "The pass key is 71432. What is the pass key?")
    with pytest.raises(ValueError, match=f"{next(iter(option))}=.*options of method='prefix_cache'"):
        dllm.generate(model, ids, method=method, gen_length=4, steps=4, **option)


def test_prefix_cache_options_still_reach_prefix_cache(model):
    ids = _ids(model, "The pass key is 71432. What is the pass key?")
    out = dllm.generate(model, ids, method="prefix_cache", gen_length=4, steps=4, cache_refresh="step", live_window=2)
    assert out.tokens.shape[-1] == 4


@pytest.mark.parametrize("name", ["temperature", "eps", "threshold"])
def test_a_none_for_a_value_without_off_names_it(model, name):
    ids = _ids(model, "The pass key is 71432.")
    with pytest.raises(TypeError, match=f"{name} must be a real number"):
        dllm.generate(model, ids, method="dense", gen_length=4, steps=4, **{name: None})


def test_prompt_parts_refuse_a_missing_prefix_or_query():
    ctx = torch.arange(10)
    with pytest.raises(TypeError, match="PromptParts.prefix must be"):
        PromptParts(None, ctx, torch.arange(3))
    with pytest.raises(TypeError, match="PromptParts.query must be"):
        PromptParts(torch.arange(0), ctx, None)
    assert PromptParts(torch.arange(0), None, torch.arange(3)).context is None  # an empty prefix stays valid


def test_huge_integers_are_value_errors_naming_the_setting():
    with pytest.raises(ValueError, match="adaptive_k must be a finite real number"):
        PrefillingConfig(adaptive_k=HUGE)
    with pytest.raises(ValueError, match="finite margin"):
        adaptive_top_k(torch.tensor([3.0, 1.0, 0.0]), 1, 2, HUGE)
    for key in ("adaptive_k", "temperature", "redundancy_threshold"):
        with pytest.raises(ModelArgsError, match=key):
            parse_model_args({key: HUGE})  # lm-eval types a long digit string as an int
    with pytest.raises(ModelArgsError, match="chunk_size"):
        parse_model_args({"chunk_size": "9" * 5000})  # past Python's int-conversion digit limit


def test_select_chunks_refuses_a_matrix_of_scores():
    with pytest.raises(ValueError, match=r"scores must be a \[N\] tensor"):
        select_chunks(torch.zeros(2, 3), 2)


def test_topb_gather_torch_backend_takes_transposed_scores_and_empty_chunks():
    """The layout error tells users to transpose(1, 2); the CPU (torch) path then raised a view error."""
    g = torch.Generator().manual_seed(0)
    s = torch.randn(2, 16, 4, generator=g)
    k = torch.randn(2, 16, 4, 8, generator=g)
    got = tk.topb_gather(s.transpose(1, 2), k, k, 3)
    want = R.topb_gather(s.transpose(1, 2).contiguous(), k, k, 3)
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    # independent check of the selection: BOS + the 2 best max-pooled scores of head 0, chunk 0, ascending
    pooled = torch.nn.functional.max_pool1d(s.transpose(1, 2)[0:1, 0:1], 7, stride=1, padding=3)[0, 0]
    best = sorted([0] + [i for i in torch.argsort(pooled[1:], descending=True, stable=True)[:2].add(1).tolist()])
    assert got[2][0, 0].tolist() == best
    # T = 0: nothing to keep (the torch path raised IndexError; the Triton path returns the same)
    k_out, v_out, idx, kept = tk.topb_gather(torch.randn(2, 4, 0), torch.randn(2, 0, 4, 8), torch.randn(2, 0, 4, 8), 3)
    assert kept.tolist() == [0, 0] and (idx == -1).all() and (k_out == 0).all()
