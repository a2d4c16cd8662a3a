"""K is fitted against the real chunk count (the snapped one with ``boundary_snap``), by one
rule in the library (:meth:`PrefillingConfig.for_chunks`) that the CLI, ``dllm eval`` and the harness use.

The bundled tokenizer is one token per character, so the snapped chunk count is computed from the text alone
(:func:`tests.tiny_checkpoints.snapped_starts`), independently of the library's cutter.
"""

import json

import pytest
import torch

import dllm
from dllm.cli import main
from dllm.model.tokenization import encode_text
from dllm.prefilling import PrefillingConfig, PromptParts
from dllm.prefilling.chunks import count_chunks
from dllm.prefilling.config import TopKError
from tests.tiny_checkpoints import snapped_starts

FILLER = "The grass is green. The sky is blue. "
DOC = FILLER * 50 + "The pass key is 12345. Remember it. " + FILLER * 30  # 2996 characters
PROMPT = "There is a pass key hidden in the text below.\n\n{context}\n\nWhat is the pass key? The pass key is "


@pytest.fixture(scope="module")
def model():
    return dllm.load_model(device="cpu")


def test_for_chunks_rule():
    cfg = PrefillingConfig(chunk_size=100, top_k=4, boundary_snap=20)
    assert cfg.for_chunks(4) is cfg and cfg.for_chunks(4, explicit=True) is cfg
    assert cfg.for_chunks(3).top_k is None  # a default K above N keeps every chunk
    with pytest.raises(TopKError, match=r"top_k=4 exceeds the 3 chunk\(s\).*boundaries snapped"):
        cfg.for_chunks(3, explicit=True)
    assert PrefillingConfig(top_k=None).for_chunks(1, explicit=True).top_k is None
    for bad in (0, True, 2.0):
        with pytest.raises(ValueError, match="num_chunks"):
            cfg.for_chunks(bad)


def test_count_chunks_is_the_snapped_count(model):
    cfg = PrefillingConfig.from_pretrained(model.model_dir)
    assert cfg.boundary_snap > 0  # the bundled defaults snap
    ids = encode_text(model, DOC)
    assert ids.numel() == len(DOC)
    want = len(snapped_starts(DOC, cfg.chunk_size, cfg.boundary_snap))
    assert want != -(-len(DOC) // cfg.chunk_size)  # the case the fixed count got wrong: 13 snapped, 12 fixed
    assert count_chunks(model, ids, cfg) == want


def test_cli_accepts_a_top_k_up_to_the_snapped_chunks(model, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "doc.txt").write_text(DOC)
    (tmp_path / "prompt.txt").write_text(PROMPT)
    n = len(snapped_starts(DOC, 256, 64))
    base = ["generate", "--prompt-file", "prompt.txt", "--context-file", "doc.txt", "--method", "prefilling"]
    base += ["--chunk-size", "256", "--gen-length", "2", "--steps", "1", "--stats", "json", "--adaptive-k", "off"]
    rc = main([*base, "--top-k", str(n)])  # was "--top-k 13 exceeds the 12 chunk(s)"
    _out, err = capsys.readouterr()
    stats = json.loads(err.strip().splitlines()[-1])
    assert rc == 0 and stats["num_chunks"] == n and stats["selected_chunks"] == list(range(n))
    rc = main([*base, "--top-k", str(n + 1)])
    _out, err = capsys.readouterr()
    assert rc == 2 and f"--top-k {n + 1} exceeds the {n} chunk(s)" in err and "--boundary-snap 64" in err


def test_library_default_k_is_fitted_and_an_explicit_one_checked(model):
    text = FILLER * 20  # 740 characters: 3 fixed chunks of 256, 4 snapped ones
    n = len(snapped_starts(text, 256, 64))
    assert n == 4
    parts = PromptParts(torch.tensor([model.config.bos_token_id]), encode_text(model, text), encode_text(model, "Q?"))
    kw = dict(method="prefilling", prompt=parts, gen_length=2, steps=1)
    res = dllm.generate(model, **kw)  # the checkpoint's ceiling K=4 of 4 snapped chunks (adaptive K under it)
    assert res.stats.extra["num_chunks"] == 4 and 1 <= len(res.stats.extra["selected_chunks"]) <= 4
    fixed = PrefillingConfig.from_pretrained(model.model_dir, adaptive_k=None)  # the checkpoint's K=4, fixed
    res = dllm.generate(model, prefilling=fixed, **kw)
    assert res.stats.extra["num_chunks"] == 4 and len(res.stats.extra["selected_chunks"]) == 4
    cfg = PrefillingConfig.from_pretrained(model.model_dir, top_k=5)
    with pytest.raises(TopKError, match=r"top_k=5 exceeds the 4 chunk\(s\) of this 740-token context"):
        dllm.generate(model, prefilling=cfg, **kw)
    short = PromptParts(parts.prefix, parts.context[:300], parts.query)  # 2 chunks: the default K keeps both
    res = dllm.generate(model, method="prefilling", prompt=short, gen_length=2, steps=1)
    assert res.stats.extra["selected_chunks"] == [0, 1]


def test_eval_checks_k_against_the_snapped_chunks(model, capsys):
    from dllm.eval.tasks import make_cases

    case = make_cases("passkey", [1024], [0.5], 1, 0, tokenizer=model.tokenizer)[0]
    n = len(snapped_starts(case.context, 256, 64))
    assert n != -(-len(case.context) // 256)  # fixed and snapped counts differ here
    rc = main(["eval", "passkey", "--lengths", "1024", "--depths", "0.5", "--samples", "1", "--top-k", str(n + 1)])
    _out, err = capsys.readouterr()
    assert rc == 2 and f"--top-k {n + 1} exceeds the {n} chunk(s)" in err


def test_batched_rows_name_the_row_whose_chunks_are_fewer_than_k(model):
    """In a batch, a row with fewer chunks than an explicit K was a TypeError from
    rebuilding the TopKError with one argument; it is the same TopKError, naming the row."""
    long = PromptParts(
        torch.tensor([model.config.bos_token_id]), encode_text(model, FILLER * 20), encode_text(model, "Q?")
    )
    short = PromptParts(long.prefix, encode_text(model, "The pass key is 12345."), long.query)  # one chunk
    cfg = PrefillingConfig.from_pretrained(model.model_dir, top_k=2)
    with pytest.raises(TopKError, match=r"^prompt\[1\]: top_k=2 exceeds the 1 chunk\(s\)") as err:
        dllm.generate(model, method="prefilling", prompt=[long, short], prefilling=cfg, gen_length=2, steps=1)
    assert err.value.top_k == 2 and err.value.num_chunks == 1
