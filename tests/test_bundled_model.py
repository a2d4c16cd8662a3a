"""The bundled tiny model: loads through dllm.load_model and answers passkey cases (dense and prefilling)."""

import pytest
import torch

import dllm
from bench.demo import TINY_PREFILLING
from bench.selection_recall import needle_chunk_ids
from dllm.evaluation import run_case
from dllm.tasks import make_case


@pytest.fixture(scope="module")
def tiny():
    return dllm.load_model(device="cpu")


def test_loads_as_a_dream_checkpoint(tiny):
    cfg = tiny.config
    assert tiny.family == "dream" and tiny.shift_logits
    assert cfg.num_heads == 8 and cfg.num_kv_heads == 2  # GQA
    assert tiny.tokenizer is not None
    assert tiny.tokenizer.mask_token_id == tiny.mask_token_id
    assert tiny.tokenizer.decode(dllm.encode_text(tiny, "pass key 123").tolist()) == "pass key 123"
    assert tiny.dtype == torch.float32


def test_short_passkey_is_answered_exactly(tiny):
    """Dense decoding of short passkey cases at seeds 10**9+ (training draws its case seeds uniformly
    below 2**30, so each of these with probability < 1e-3 over the whole run). The model card measures
    80% exact at 512 tokens, so 3 of 4 at 400 tokens is asserted (random digits would match a 5-digit
    key with probability 1e-5)."""
    hits = 0
    answers = []
    for seed in range(4):
        case = make_case("passkey", 400, seed / 3, 10**9 + seed)
        row = run_case(tiny, case, "dense", gen_length=8, steps=8)
        hits += row.correct
        answers.append((row.answer, case.answer))
    assert hits >= 3, answers


@pytest.mark.parametrize("i", [4, 5, 6, 7])
def test_prefilling_answers_beyond_the_training_window(tiny, i):
    """Prefilling at 6000 tokens (4x the 1536-token window) with the demo's configuration keeps the chunk
    holding the pass key and answers it exactly. On this model s_I finds the needle chunk in about half
    of the cases (bench/results/demo/demo_recall.md: 10 of 20), so this pins the seeded cases where it
    does (at 6000 tokens, seeds 10**9+i with depths i/7, i = 0..7, measured once: cases 4-7 kept and
    answered, 0-3 not) as a regression check of selection + static-KV decode."""
    case = make_case("passkey", 6000, i / 7, 10**9 + i)
    cfg = TINY_PREFILLING
    row = run_case(tiny, case, "prefilling", gen_length=8, steps=8, prefilling=cfg)
    needle_chunks = needle_chunk_ids(case, cfg.chunk_size)
    kept = {int(c) for c in row.selected_chunks.split()}
    assert needle_chunks & kept, (needle_chunks, kept)
    assert row.correct, (row.answer, case.answer)
