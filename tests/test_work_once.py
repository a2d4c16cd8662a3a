"""Work done once: one RoPE table per model, one tokenization per context.

Expected values are independent of the code under test: RoPE frequencies from the formula
``theta^(-2i/D)`` evaluated with Python's ``math``; token ids from a direct call of the tokenizer made
before the counting starts; call counts by wrapping the functions that do the work.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest
import torch

import dllm.model.rope
import dllm.model.tokenization
from dllm.model.config import load_config
from dllm.model.loader import default_model_dir, load_model
from dllm.model.modeling import DiffusionLM
from dllm.model.tokenization import encode_text
from dllm.prefilling import PrefillingConfig

LONGBENCH_SAMPLE = Path(__file__).parent / "tasks" / "data" / "longbench_tiny.jsonl"


@pytest.fixture()
def rope_calls(monkeypatch):
    calls = []
    inner = dllm.model.rope.scaled_inv_frequencies

    def counted(*a, **k):
        calls.append(a)
        return inner(*a, **k)

    monkeypatch.setattr(dllm.model.rope, "scaled_inv_frequencies", counted)
    return calls


def _formula(head_dim: int, theta: float) -> torch.Tensor:
    return torch.tensor([theta ** (-2.0 * i / head_dim) for i in range(head_dim // 2)], dtype=torch.float64)


def test_one_rope_table_per_model(rope_calls):
    """Validating the config computes the frequencies; the model built from it reuses that table (no
    second computation), and it holds the formula's values. A changed config gets its own table."""
    cfg = load_config(default_model_dir())
    assert len(rope_calls) == 1
    model = DiffusionLM(cfg)
    assert len(rope_calls) == 1
    assert model.rope is cfg.rope
    torch.testing.assert_close(model.rope.inv_freq, _formula(cfg.head_dim, cfg.rope_theta), rtol=1e-15, atol=0)
    other = dataclasses.replace(cfg, rope_theta=500.0)
    assert len(rope_calls) == 2 and other.rope is not cfg.rope
    torch.testing.assert_close(DiffusionLM(other).rope.inv_freq, _formula(cfg.head_dim, 500.0), rtol=1e-15, atol=0)
    assert len(rope_calls) == 2
    # cos/sin of the shared table still follow the angle formula
    cos, sin = model.rope.cos_sin(torch.tensor([7]))
    i = 3
    assert math.isclose(float(cos[0, i]), math.cos(7 * cfg.rope_theta ** (-2.0 * i / cfg.head_dim)), rel_tol=1e-6)
    assert math.isclose(float(sin[0, i]), math.sin(7 * cfg.rope_theta ** (-2.0 * i / cfg.head_dim)), rel_tol=1e-6)


def test_load_model_computes_the_rope_table_once(rope_calls):
    load_model(None, device="cpu")
    assert len(rope_calls) == 1


@pytest.fixture()
def model():
    return load_model(None, device="cpu")


@pytest.fixture()
def tokenized(model, monkeypatch):
    """Texts the tokenizer is asked to encode (the class's ``__call__`` wrapped)."""
    texts = []
    cls = type(model.tokenizer)
    inner = cls.__call__

    def counted(self, text, *a, **k):
        texts.append(text)
        return inner(self, text, *a, **k)

    monkeypatch.setattr(cls, "__call__", counted)
    return texts


def test_a_text_is_tokenized_once(model, monkeypatch):
    """The same context twice (with and without BOS): one tokenizer call, the ids of a direct call; each
    call returns its own tensor; past the memo's size the oldest text is tokenized again."""
    tok = model.tokenizer
    ctx = "The grass is green. The sky is blue. " * 40 + "The pass key is 12345."
    want = tok(ctx, add_special_tokens=False)["input_ids"]  # before counting: the independent expectation
    texts = []
    cls, inner = type(tok), type(tok).__call__
    monkeypatch.setattr(cls, "__call__", lambda self, text, *a, **k: texts.append(text) or inner(self, text, *a, **k))
    a = encode_text(model, ctx)
    b = encode_text(model, ctx, bos=True)
    assert texts.count(ctx) <= 1  # 0 if an earlier test of this process tokenized it already
    assert a.tolist() == want and b.tolist() == [tok.bos_token_id] + want
    a[0] = -1
    assert encode_text(model, ctx).tolist() == want
    monkeypatch.setattr(dllm.model.tokenization, "MEMO_TOKENS", len(want) + 5)
    encode_text(model, "something else entirely, long enough to push the context out")
    before = texts.count(ctx)
    assert encode_text(model, ctx).tolist() == want and texts.count(ctx) == before + 1


def test_a_longbench_context_is_tokenized_once(model, tokenized):
    """What ``eval longbench`` does per case: count the context's tokens (to fit top_k), then answer it
    (prompt parts, and the CSV row's token count): the context is tokenized once, not three times."""
    from dllm.eval.evaluation import run_longbench_case
    from dllm.eval.longbench import load_longbench

    case = load_longbench(str(LONGBENCH_SAMPLE), limit=1)[0]
    case = dataclasses.replace(case, context=case.context + " (a context no other test tokenized)")
    n = len(encode_text(model, case.context))
    cfg = PrefillingConfig(chunk_size=64, top_k=None)  # every chunk: the sample's context is short
    row = run_longbench_case(model, case, "prefilling", gen_length=2, steps=2, prefilling=cfg)
    assert row.context_tokens == n
    assert tokenized.count(case.context) == 1


def test_each_question_reuses_the_context_tokens(model, tokenized, tmp_path, monkeypatch, capsys):
    """``generate --question A --question B``: the context file is tokenized once for both questions."""
    from dllm.cli import main

    ctx = "The grass is green. The sky is blue. " * 30 + "The pass key is 24680. Remember it. " + "Filler. " * 20
    (tmp_path / "doc.txt").write_text(ctx)
    (tmp_path / "prompt.txt").write_text("There is a pass key hidden in the text below.\n\n{context}\n\n{question}")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("dllm.load_model", lambda *a, **k: model)
    rc = main(
        [
            "generate",
            "--prompt-file",
            "prompt.txt",
            "--context-file",
            "doc.txt",
            "--chunk-size",
            "128",
            "--gen-length",
            "4",
            "--question",
            "What is the pass key? The pass key is ",
            "--question",
            "Which pass key is hidden? The pass key is ",
        ]
    )
    capsys.readouterr()
    assert rc == 0
    assert tokenized.count(ctx) == 1
