"""What was kept, from Python: ``stats.extra["selected_chunk_tokens"]`` gives each kept chunk's token span in
the context, and :func:`dllm.prefilling.chunk_char_spans` its characters, without the CLI. Checked against
the text itself: the kept chunks' token ids are the context's ids in those spans, and the characters
re-tokenised are those ids (the bundled tokenizer is character-level, so both are exact)."""

from __future__ import annotations

import functools

import torch

import dllm
from dllm.eval.tasks import make_case
from dllm.prefilling import PrefillingConfig, PromptParts, chunk_char_spans


@functools.cache
def _model():
    return dllm.load_model(device="cpu", dtype=torch.float32)


def _ask(cfg, case):
    model = _model()
    ids = dllm.encode_text(model, case.context)
    parts = PromptParts(dllm.encode_text(model, "Read this.\n", bos=True), ids, dllm.encode_text(model, case.query))
    res = dllm.generate(model, method="prefilling", prompt=parts, prefilling=cfg, gen_length=8)
    return ids, res.stats.extra


def test_kept_chunks_token_and_character_spans_from_python():
    case = make_case("passkey", 3000, 0.5, 7)
    for cfg in (PrefillingConfig(chunk_size=256, top_k=3), PrefillingConfig(chunk_size=256, top_k=3, boundary_snap=64)):
        ids, extra = _ask(cfg, case)
        tokens, kept = extra["selected_chunk_tokens"], extra["selected_chunks"]
        assert len(tokens) == len(kept) == 3 and all(a < b for a, b in tokens)
        chars = chunk_char_spans(_model(), case.context, cfg)
        assert len(chars) == extra["num_chunks"]
        covered = sorted(range(extra["num_chunks"]), key=lambda j: chars[j][0])
        assert covered == list(range(extra["num_chunks"]))  # chunks in text order, no gap, no overlap
        assert chars[0][0] == 0 and chars[-1][1] == len(case.context)
        assert all(chars[j][1] == chars[j + 1][0] for j in range(len(chars) - 1))
        for j, (a, b) in zip(kept, tokens):
            text = case.context[chars[j][0] : chars[j][1]]
            assert torch.equal(dllm.encode_text(_model(), text), ids[a:b])
        needle = case.context.index(case.answer)
        holding = [j for j in range(len(chars)) if chars[j][0] <= needle < chars[j][1]]
        assert len(holding) == 1  # the span of the chunk holding the answer is where the answer is


def test_document_answers_carry_the_same_token_spans():
    case = make_case("passkey", 3000, 0.2, 3)
    cfg = PrefillingConfig(chunk_size=256, top_k=2, boundary_snap=64)
    ids, fresh = _ask(cfg, case)
    model = _model()
    doc = dllm.encode_document(model, ids, prefilling=cfg)
    parts = PromptParts(dllm.encode_text(model, "Read this.\n", bos=True), None, dllm.encode_text(model, case.query))
    res = dllm.generate(model, method="prefilling", prompt=parts, document=doc, prefilling=cfg, gen_length=8)
    assert res.stats.extra["selected_chunks"] == fresh["selected_chunks"]
    assert res.stats.extra["selected_chunk_tokens"] == fresh["selected_chunk_tokens"]
