"""The GPU run's training text (bench/tiny/sources.py, corpus.py, corpus_tasks.py): whole sources held out.

The held-out guarantees are checked on content (12-word runs of held-out text never in the training
stream), with a planted leak that the check must catch, not only on which functions were called.
"""

import json
import random

import numpy as np
import pytest

from bench.tiny import corpus, gpu_run, sources
from bench.tiny.corpus_tasks import CorpusSamples
from bench.tiny.tokenizer import CHARS

HELD_TEXT = (
    "Abnormal, adj. Not conforming to standard. In matters of thought and conduct, to be independent is "
    "to be abnormal, to be abnormal is to be detested."
)


def text(ids):
    return "".join(CHARS[i - 4] if i >= 4 else f"<{i}>" for i in ids)


def fake_sources(monkeypatch, train_docs, held_docs):
    """Replace the registry with one training and one held-out source of the given documents."""
    reg = {
        "fake-train": sources.Source("fake-train", "test text", False, lambda: iter(train_docs), "test"),
        "fake-held": sources.Source("fake-held", "test book", True, lambda: iter(held_docs), "test"),
    }
    monkeypatch.setattr(sources, "SOURCES", reg)
    monkeypatch.setattr(sources, "HELD_OUT_SOURCES", ("fake-held",))
    monkeypatch.setattr(sources, "TRAINING_SOURCES", ("fake-train",))


def test_every_source_is_declared_and_the_evaluation_haystacks_are_held_out_whole():
    assert set(sources.HELD_OUT_SOURCES) | set(sources.TRAINING_SOURCES) == set(sources.SOURCES)
    assert not set(sources.HELD_OUT_SOURCES) & set(sources.TRAINING_SOURCES)
    assert {"essays", "pydoc", "devil", "debian-changelog"} <= set(sources.HELD_OUT_SOURCES)
    with pytest.raises(KeyError, match="unknown source 'nope'"):
        next(sources.documents("nope"))
    with pytest.raises(ValueError, match="'essays' is not a training source"):
        corpus.build("/nonexistent", names=("essays",))


def test_to_charset_and_troff_text():
    assert sources.to_charset("Caf\u00e9\tbar \u2014 x  \n\n\n\ny\u00a0") == "Cafe    bar  x\n\ny"
    page = (
        '.\\" a comment\n.TH LS 1\n.SH NAME\nls \\- list directory contents\n.SH SYNOPSIS\n.B ls\n[\\fIOPTION\\fR]...'
    )
    assert sources.troff_text(page).split() == "NAME ls list directory contents SYNOPSIS ls [OPTION]...".split()


def test_build_drops_a_training_document_that_quotes_a_held_out_source(monkeypatch, tmp_path):
    quoting = "A fortune file. " + HELD_TEXT[:140] + " -- A. Bierce"  # 20+ words of the held-out book
    clean = "Manual page text: the ls command lists directory contents, one name per line, sorted."
    fake_sources(monkeypatch, [("q", quoting), ("c", clean)], [("book", HELD_TEXT)])
    m = corpus.build(str(tmp_path), {"fake-train": 10**6})
    assert m["sources"] == [
        {
            "name": "fake-train",
            "kind": "test text",
            "package": "test",
            "docs": 1,
            "chars": len(clean),
            "dropped_as_held_out_text": 1,
        }
    ]
    assert m["held_out"] == ["fake-held"]
    c = corpus.Corpus(str(tmp_path))
    assert text(c.tokens.tolist()) == clean and c.docs.tolist() == [[0, len(clean), 0]]
    assert json.loads((tmp_path / "manifest.json").read_text())["tokens"] == len(clean)


def test_corpus_facts_hold_their_answer_in_the_kept_chunks(monkeypatch, tmp_path):
    docs = [(f"d{i}", " ".join(f"word{i}x{j} 12.{j} 2024-01-{j % 28 + 1:02d}" for j in range(150))) for i in range(6)]
    fake_sources(monkeypatch, docs, [])
    corpus.build(str(tmp_path), {"fake-train": 10**6})
    cs = CorpusSamples(corpus.Corpus(str(tmp_path)))
    rng = random.Random(0)
    for _ in range(30):
        s = cs.dense(rng, 500)
        ans = text([t for t, r in zip(s.ids, s.role) if r == "a"]).split("<2>")[0]
        assert len(s.ids) <= 500 and ans and ans in text([t for t, r in zip(s.ids, s.role) if r == "p"])
        c = cs.chunked(rng, 700)
        ans = text([t for t, r in zip(c.ids, c.role) if r == "a"]).split("<2>")[0]
        static = text([t for t, g in zip(c.ids, c.segment) if g > 0])
        assert ans in static.replace("<1>", "")  # the needle chunk(s) kept, in document order
        q = cs.chunked(rng, 700, needle=False, answer=False)
        assert "a" not in q.role and q.role[-1] == "q"


@pytest.fixture(scope="module")
def real_held_runs():
    return sources.held_out_runs(("essays", "pydoc"))


def _runs_of_batches(batches):
    runs = set()
    for b in batches:
        for row, seg in zip(b["targets"], b["segments"]):
            runs |= sources.word_runs(text(row[seg >= 0].tolist()).replace("<1>", " ").replace("<2>", " "))
    return runs


def test_no_held_out_text_reaches_the_training_stream(monkeypatch, tmp_path, real_held_runs):
    """Batches of both stages of the GPU recipe, every sample kind, hold no 12-word run of the evaluation's
    essays or pydoc topics; the same check finds the runs of a case drawn in the essays haystack (the
    phases of bench.tiny.train used its training split), so it can fail."""
    docs = [(f"d{i}", f"Section {i}. " + " ".join(f"alpha{j} beta{i} 3.{j}" for j in range(300))) for i in range(5)]
    fake_sources(monkeypatch, docs, [])
    corpus.build(str(tmp_path), {"fake-train": 10**6})
    gpu_run.init_worker(str(tmp_path))
    batches = [gpu_run.make_step_batch(0, s, 100, 3000, 1536) for s in (0, 1, 2, 50, 51, 52, 53)]
    kinds = {k for st in gpu_run.STAGES for _, k in st.mix}
    assert len(real_held_runs) > 100_000
    assert real_held_runs.isdisjoint(_runs_of_batches(batches))
    from dllm.eval.tasks import make_case

    leak = make_case("passkey", 600, 0.5, 1, split="train", haystack="essays", phrasing="random")
    assert not real_held_runs.isdisjoint(sources.word_runs(leak.context))  # the check sees essay text
    assert {"lm", "corpus_dense", "corpus_chunked", "query_needle", "task_dense", "copy"} <= kinds


def test_mask_batch_masks_eligible_tokens_and_the_device_mask_is_train_make_batchs():
    import torch

    from bench.tiny import data
    from bench.tiny.train import make_batch

    rng = random.Random(1)
    samples = [data.chunked_sample(rng, 400, "passkey", answer=False), data.copy_sample(rng, 300)]
    modes = ["query", "answer"]
    b = gpu_run.mask_batch(samples, modes, 512, np.random.default_rng(0))
    for i, (s, mode) in enumerate(zip(samples, modes)):
        n = len(s.ids)
        want = np.array([r == {"query": "q", "answer": "a"}[mode] for r in s.role])
        masked = b["inputs"][i, :n] == data.MASK
        assert masked.any() and not (masked & ~want).any()
        assert b["weights"][i].sum() == pytest.approx(1.0) and (b["weights"][i, :n][masked] > 0).all()
        assert b["targets"][i, :n].tolist() == s.ids and (b["segments"][i, n:] == -1).all()
    _, _, _, _, attn = make_batch(samples, modes, torch.Generator().manual_seed(0), 512)
    assert torch.equal(gpu_run.to_device(b, torch.device("cpu"))[4], attn)
