"""The files of a sharded document, in one process (no process group): writing never follows a planted link,
the index is read by the package's JSON reader, format fields are known integers, a directory or one shard
alone is a clear error, and ``python -m dllm generate --document INDEX`` answers without torchrun."""

import functools
import json
import os
import re
import stat

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

import dllm
import dllm.distributed as dd
from dllm.cli.parser import main
from dllm.eval.tasks import make_case
from dllm.prefilling import PrefillingConfig, PromptParts
from dllm.prefilling.document import FORMAT as DOC_FORMAT

CFG = PrefillingConfig(chunk_size=128, top_k=2, score_terms=("draft_contrast",))
CASE = make_case("passkey", 900, 0.6, 3)  # 899 tokens: 8 chunks of 128


@functools.cache
def _model():
    return dllm.load_model(device="cpu", dtype=torch.float32)


@functools.cache
def _doc():
    model = _model()
    return dd.encode_document(model, dllm.encode_text(model, CASE.context), prefilling=CFG)


@pytest.fixture
def saved(tmp_path):
    idx = tmp_path / "book.idx"
    _doc().save(idx)
    return idx


def shard_path(idx, rank, world):
    return f"{idx}.{rank:05d}-of-{world:05d}.safetensors"


def _index_text(saved) -> str:
    return saved.read_text(encoding="utf-8")


def test_save_replaces_planted_symlinks_and_never_writes_through_them(tmp_path):
    """A symlink planted at a shard's name (which the user never typed) or at the old predictable
    temporary name ``<idx>.tmp<pid>`` must not make the save overwrite the file it points to."""
    outside = tmp_path / "outside"
    outside.mkdir()
    victims = {name: outside / name for name in ("shard_victim", "tmp_victim")}
    for v in victims.values():
        v.write_text("precious")
    folder = tmp_path / "docs"
    folder.mkdir()
    idx = folder / "book.idx"
    shard = shard_path(idx, 0, 1)
    os.symlink(victims["shard_victim"], shard)
    os.symlink(victims["tmp_victim"], f"{idx}.tmp{os.getpid()}")
    _doc().save(idx)
    assert all(v.read_text() == "precious" for v in victims.values())
    assert not os.path.islink(shard) and os.path.isfile(shard) and not os.path.islink(idx)
    # no temporary file left behind: the index, its shard and the planted link only
    assert sorted(os.listdir(folder)) == sorted(["book.idx", os.path.basename(shard), f"book.idx.tmp{os.getpid()}"])
    again = dd.ShardedDocument.load(idx, _model())
    assert again.num_chunks == _doc().num_chunks and torch.equal(again.local.chunks.k[0], _doc().local.chunks.k[0])


def test_an_existing_index_keeps_its_permission_bits(saved):
    os.chmod(saved, 0o600)
    os.chmod(shard_path(saved, 0, 1), 0o640)
    _doc().save(saved)
    assert stat.S_IMODE(os.stat(saved).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(shard_path(saved, 0, 1)).st_mode) == 0o640


@pytest.mark.parametrize("case", ["deep", "long_int", "bom"])
def test_index_is_read_by_the_package_json_reader(saved, case):
    """Nesting past the recursion limit and a 5000-digit integer are one ValueError naming the file
    (not a RecursionError, not a message without the file); a UTF-8 BOM is skipped."""
    text = _index_text(saved)
    if case == "bom":
        saved.write_bytes(b"\xef\xbb\xbf" + text.encode())
        assert dd.read_index(saved) == json.loads(text)
        return
    if case == "deep":
        saved.write_text('{"kind": ' + "[" * 100_000 + "]" * 100_000 + "}")
    else:
        saved.write_text(re.sub(r'"num_tokens": \d+', '"num_tokens": ' + "9" * 5000, text, count=1))
    with pytest.raises(ValueError, match=re.escape(str(saved)) + " is not valid JSON"):
        dd.read_index(saved)


@pytest.mark.parametrize("value", [2.0, True, "2", 3])
def test_index_format_must_be_a_known_integer(saved, value):
    index = json.loads(_index_text(saved))
    assert index["format"] == 2
    index["format"] = value
    saved.write_text(json.dumps(index))
    with pytest.raises(ValueError, match="format mismatch"):
        dd.read_index(saved)


def test_document_cache_format_must_be_an_integer(tmp_path):
    """A document cache header's ``format`` must be an integer: ``format: 3.0`` was accepted (and so would a
    later ``4.0`` have been)."""
    path = tmp_path / "doc.cache"
    _doc().gather().save(path)
    with safe_open(str(path), framework="pt") as f:
        meta, tensors = f.metadata(), {k: f.get_tensor(k) for k in f.keys()}
    head = json.loads(meta["dllm_document_cache"])
    assert head["format"] == DOC_FORMAT
    head["format"] = float(DOC_FORMAT)
    save_file(tensors, str(path), metadata={"dllm_document_cache": json.dumps(head)})
    with pytest.raises(ValueError, match="format mismatch"):
        dllm.DocumentCache.read_header(path)


def test_a_directory_is_an_error_naming_it(tmp_path):
    """Loading a directory names it (it was 'No such device (os error 19)', naming no file)."""
    for read in (
        lambda: dllm.DocumentCache.load(tmp_path, _model()),
        lambda: dllm.DocumentCache.read_header(tmp_path),
        lambda: dd.load_document(tmp_path, _model()),
        lambda: dd.read_document_header(tmp_path),
    ):
        with pytest.raises(IsADirectoryError) as err:
            read()
        assert err.value.filename == str(tmp_path)


def test_one_shard_alone_is_refused_naming_its_index(saved):
    with pytest.raises(ValueError, match=r"one shard of a sharded document.*'book\.idx'"):
        dllm.DocumentCache.load(shard_path(saved, 0, 1), _model())


def test_cli_generate_from_an_index_in_one_process(saved, tmp_path, capsys, monkeypatch):
    """``generate --document book.idx`` without torchrun said 'not a safetensors file'; it now answers
    as from the same document saved as one cache file; one shard alone and a directory are one error line."""
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.chdir(tmp_path)
    model = _model()
    whole = tmp_path / "whole.cache"
    _doc().gather().save(whole)
    (tmp_path / "prompt.txt").write_text(CASE.prefix + "{context}" + CASE.query)
    answers = []
    for document in (str(saved), str(whole)):
        rc = main(["generate", "--document", document, "--prompt-file", "prompt.txt", "--gen-length", "8",
                   "--top-k", "2", "--stats", "none"])  # fmt: skip
        out, err = capsys.readouterr()
        assert rc == 0, err
        answers.append(out)
    assert answers[0] == answers[1] and answers[0].strip()
    # the same answer as the library gives from the in-memory document
    parts = PromptParts(dllm.encode_text(model, CASE.prefix, bos=True), None, dllm.encode_text(model, CASE.query))
    res = dllm.generate(
        model, method="prefilling", prompt=parts, document=_doc().gather(), prefilling=CFG, gen_length=8
    )
    assert answers[0].strip() == dllm.decode_text(model, res.tokens)[0].strip()
    for document, says in ((shard_path(saved, 0, 1), "one shard of a sharded document"), (".", "not a regular file")):
        rc = main(["generate", "--document", document, "--prompt-file", "prompt.txt", "--gen-length", "8"])
        out, err = capsys.readouterr()
        lines = err.strip().splitlines()
        assert rc == 2 and out == "" and len(lines) == 1 and lines[0].startswith("error:") and says in lines[0], err


@pytest.mark.parametrize("content", ['["kind", "dllm_sharded_document"]', "\ufeff  [1, 2]"])
def test_an_index_holding_a_json_array_says_so(tmp_path, content):
    """A JSON array at --document read as 'not a safetensors file' in one process; the index reader
    says the index must hold a JSON object, naming the file."""
    from dllm.distributed.single_process import load_document, read_document_header

    path = tmp_path / "book.idx"
    path.write_text(content, encoding="utf-8")
    for read in (read_document_header, lambda p: load_document(p, None)):
        with pytest.raises(ValueError, match=r"book\.idx must hold a JSON object, got a JSON array"):
            read(path)


def test_gathered_chunk_ids_pickle_their_own_tokens_only(monkeypatch):
    """ShardedDocument.context_ids sends each chunk's ids as a tensor of its own: a view of the [N, T] ids tensor
    pickles the whole storage, and 512 chunks of a 1M-token document sent 1 GB per question on 2 ranks."""
    import pickle
    import types

    import torch

    import dllm.distributed.sharded_document as sd

    n, t = 64, 257
    ids = torch.arange(n * t, dtype=torch.int64).reshape(n, t)
    lens = torch.full((n,), t, dtype=torch.int32)
    sent = []

    def fake_all_gather(obj, group):
        sent.append(len(pickle.dumps(obj)))
        return [obj]

    monkeypatch.setattr(sd, "all_gather", fake_all_gather)
    doc = object.__new__(sd.ShardedDocument)
    doc._all_ids, doc.group = None, None
    doc.local = types.SimpleNamespace(
        chunks=types.SimpleNamespace(num_chunks=n, context_ids=lambda j: ids[j, 1 : int(lens[j])])
    )
    got = doc.context_ids()
    assert [g.tolist() for g in got] == [ids[j, 1:].tolist() for j in range(n)]
    token_bytes = n * (t - 1) * 8
    assert sent[0] < 2 * token_bytes  # a view each would pickle n * n * t * 8 bytes: 64x this
