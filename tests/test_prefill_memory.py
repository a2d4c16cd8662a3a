"""The prefill batch derived from free memory: its size by hand, and that batching changes nothing but round-off."""

import shlex

import pytest
import torch

import dllm
from dllm.prefilling import PrefillingConfig, memory
from dllm.prefilling.chunks import encode_chunks


@pytest.fixture(scope="module")
def tiny():
    return dllm.load_model()


def test_default_batch_by_hand(tiny):
    # tiny-dream: hidden 256, SwiGLU 704, 8 query / 2 KV heads of 32, fp32; a chunk of 256 + anchor
    per_token = 4 * (4 * 256 + 2 * (8 + 2 * 2) * 32 + 8 * 32 + 3 * 704)
    per_chunk = 257 * per_token + 2 * 4 * 8 * 257 * 257
    assert memory.chunk_forward_bytes(tiny.config, 257, 4) == per_chunk == 8_503_616
    assert memory.default_prefill_batch(tiny, 257, 1000, free_bytes=1 << 30) == (1 << 28) // per_chunk == 31
    assert memory.default_prefill_batch(tiny, 257, 10, free_bytes=1 << 30) == 10  # at most N
    assert memory.default_prefill_batch(tiny, 257, 10, free_bytes=0) == 1  # at least one chunk


def test_free_memory_is_read_from_the_system(tiny):
    free = memory.free_memory_bytes(tiny.device)
    assert 0 < free < 1 << 50


def test_budgeted_batches_equal_one_forward_up_to_round_off(tiny, monkeypatch):
    ids = torch.randint(4, 90, (2000,), generator=torch.Generator().manual_seed(0))
    whole, nfe_whole = encode_chunks(tiny, ids, 256, bos_id=1, pad_id=0)
    per_chunk = memory.chunk_forward_bytes(tiny.config, 257, 4)
    monkeypatch.setattr(memory, "free_memory_bytes", lambda device: 3 * per_chunk * 4)  # 3 chunks per forward
    parts, nfe_parts = encode_chunks(tiny, ids, 256, bos_id=1, pad_id=0)
    assert (nfe_whole, nfe_parts) == (1, 3)  # 8 chunks: one forward, then 3 + 3 + 2
    for a, b in zip(whole.k + whole.v, parts.k + parts.v):
        assert a.shape == b.shape and a.is_contiguous() and b.is_contiguous()
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    assert torch.equal(whole.ids, parts.ids) and torch.equal(whole.lens, parts.lens)


def test_generate_and_eval_take_prefill_batch(tmp_path, monkeypatch, capsys):
    from dllm.cli import main

    monkeypatch.chdir(tmp_path)
    (tmp_path / "doc.txt").write_text("The grass is green. " * 40 + "The pass key is 4321. " + "The sky is blue. " * 20)
    (tmp_path / "prompt.txt").write_text("{context}\nWhat is the pass key? The pass key is ")
    base = "generate --prompt-file prompt.txt --context-file doc.txt --method prefilling --chunk-size 256"
    base += " --gen-length 6"
    outs = []
    for extra in ("", " --prefill-batch 1"):
        assert main(shlex.split(base + extra)) == 0
        outs.append(capsys.readouterr().out)
    assert outs[0] == outs[1]
    assert main(shlex.split("eval passkey --method dense --prefill-batch 2")) == 2
    assert "--prefill-batch: option(s) of --method prefilling" in capsys.readouterr().err
    cfg = PrefillingConfig(prefill_batch=2)
    assert cfg.prefill_batch == 2
