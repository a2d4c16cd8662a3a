"""Text helpers, the essay split, and generation speed."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dllm.eval.tasks import make_case
from dllm.eval.tasks.text import count_tokens, normalize_text, split_sentences, stable_seed


def test_normalize_text():
    raw = (
        "\u201cQuote\u201d \u2018it\u2019s\u2019 a\u2014b c\u2013d e\u2026 caf\u00e9\u00a0ok"
        "\ttab\r\nline \x97 \x92 \U0001f600 \x00end"
    )
    out = normalize_text(raw)
    assert out == "\"Quote\" 'it's' a--b c-d e... cafe ok tab\nline -- '  end"
    assert all(32 <= ord(c) < 127 or c == "\n" for c in out)
    assert normalize_text("plain ASCII\nstays") == "plain ASCII\nstays"


def test_count_tokens_char_level():
    assert count_tokens("hello world") == 11
    assert count_tokens("") == 0


def test_count_tokens_qwen(qwen_tokenizer):
    # no BOS/EOS counted; digits are single tokens in Qwen2
    assert count_tokens("12345", qwen_tokenizer) == 5
    assert count_tokens("", qwen_tokenizer) == 0


def test_stable_seed_is_stable_across_processes():
    here = stable_seed("passkey", 3, 1000, 0.5)
    code = "from dllm.eval.tasks.text import stable_seed; print(stable_seed('passkey', 3, 1000, 0.5))"
    other = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONHASHSEED": "123"},
        cwd=Path(__file__).resolve().parents[2],
    )
    assert int(other.stdout) == here
    assert stable_seed("passkey", 3, 1000, 0.5) != stable_seed("passkey", 4, 1000, 0.5)


def test_split_sentences():
    text = 'He left. "Why?" she asked.  It was 5 p.m. Then (quietly) he came\nback! 3 days later. done'
    assert split_sentences(text) == [
        "He left.",
        '"Why?" she asked.',
        "It was 5 p.m.",
        "Then (quietly) he came back!",
        "3 days later. done",
    ]


def test_essay_split_is_fixed_and_disjoint(essays_available):
    from dllm.eval.tasks.essays import EVAL_ESSAYS, essay_names, load_essays

    ev, tr = essay_names("eval"), essay_names("train")
    assert set(ev) == set(EVAL_ESSAYS) and len(ev) == 9
    assert len(tr) == 40 and not set(ev) & set(tr)
    all_names = sorted(ev + tr)
    assert list(ev) == all_names[4::5]  # every fifth file name
    ev_text = {t for _, t in load_essays("eval")}
    tr_text = {t for _, t in load_essays("train")}
    assert not ev_text & tr_text
    for _, t in load_essays("eval"):
        assert "Y Combinator." not in t[:60] and "[1]" not in t and "\n" not in t
        assert t.isascii()


def test_char_level_generation_is_fast(essays_available):
    for task in ("passkey", "number_string", "kv_retrieval", "needle"):
        make_case(task, 1000, 0.5, 0)  # warm caches (essay loading)
        t = time.perf_counter()
        for seed in range(10):
            make_case(task, 32768, 0.5, seed)
        per_case = (time.perf_counter() - t) / 10
        assert per_case < 0.1, (task, per_case)


@pytest.mark.parametrize("task", ["passkey", "needle"])
def test_qwen_generation_speed(task, qwen_tokenizer, essays_available):
    t = time.perf_counter()
    case = make_case(task, 32768, 0.5, 0, tokenizer=qwen_tokenizer)
    elapsed = time.perf_counter() - t
    assert 32768 - 400 < case.context_tokens <= 32768
    assert elapsed < 4.0  # typically ~0.2-0.4 s on 2 cores; generous for a loaded CI box
