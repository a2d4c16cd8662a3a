"""A document cache's file: a loaded cache owns its bytes, saving keeps a file's mode, ``encode --out`` never
overwrites its own input, and a link planted by another user in a sticky folder is never followed."""

import os
import stat

import pytest
import torch

import dllm
from dllm.prefilling import PrefillingConfig, PromptParts
from tests.tiny_checkpoints import checkpoint_fixtures, write_dream_checkpoint

dream_dir, dream = checkpoint_fixtures(write_dream_checkpoint, seed=31, folder="dream", dir_fixture="dream_dir")
CFG = PrefillingConfig(chunk_size=8, top_k=2)


def _context(seed: int, n: int = 37) -> torch.Tensor:
    return torch.randint(0, 120, (n,), generator=torch.Generator().manual_seed(seed))


def _answer(model, doc):
    q = PromptParts(torch.tensor([128, 5, 6]), None, torch.tensor([7, 8, 9]))
    return dllm.generate(model, method="prefilling", prompt=q, document=doc, prefilling=CFG, gen_length=4).tokens


def test_a_loaded_cache_does_not_follow_its_file(dream, tmp_path):
    """Another process rewriting the file in place (``cp b.cache a.cache``: same inode, new bytes) or
    truncating it changes nothing in a cache already loaded, and never kills the process (SIGBUS)."""
    a, b = tmp_path / "a.cache", tmp_path / "b.cache"
    dllm.encode_document(dream, _context(1), prefilling=CFG).save(a)
    dllm.encode_document(dream, _context(2), prefilling=CFG).save(b)
    for verify in (True, False):
        loaded = dllm.DocumentCache.load(a, dream, verify=verify)
        c = loaded.chunks
        kept = [t.clone() for t in (*c.k, *c.v, c.ids, c.lens)]
        answer = _answer(dream, loaded)
        with open(a, "r+b") as f:  # what cp does to an existing target
            f.write(b.read_bytes())
            f.truncate()
        assert all(torch.equal(x, y) for x, y in zip(kept, (*c.k, *c.v, c.ids, c.lens)))
        assert torch.equal(_answer(dream, loaded), answer)
        os.truncate(a, 0)
        assert all(torch.equal(x, y) for x, y in zip(kept, (*c.k, *c.v, c.ids, c.lens)))  # every page read
        assert torch.equal(_answer(dream, loaded), answer)
        dllm.encode_document(dream, _context(1), prefilling=CFG).save(a)


def test_a_truncated_cache_is_a_value_error(dream, tmp_path):
    from dllm.prefilling.document import _SafetensorsFile

    path = tmp_path / "doc.cache"
    dllm.encode_document(dream, _context(1), prefilling=CFG).save(path)
    size = os.path.getsize(path)
    # cut after the first open (as another process might, while it is read): the read says so
    with _SafetensorsFile(path) as f:
        os.truncate(path, size - 100)
        last = max(f.keys(), key=lambda name: f.tensors[name]["data_offsets"][1])
        with pytest.raises(ValueError, match=rf"{path} is damaged: it ends inside tensor {last}"):
            f.read(last)
    with pytest.raises(ValueError, match=rf"{path} is damaged: it ends before tensor \S+ ends \(truncated\)"):
        dllm.DocumentCache.load(path, dream)


@pytest.mark.parametrize("mode", [0o600, 0o640, 0o604])
def test_saving_over_a_file_keeps_its_mode(mode, dream, tmp_path):
    doc = dllm.encode_document(dream, _context(1, 5), prefilling=CFG)
    path, link = tmp_path / "doc.cache", tmp_path / "link.cache"
    path.write_bytes(b"old")
    os.chmod(path, mode)
    os.symlink(path, link)
    old = os.umask(0o022)
    try:
        doc.save(path)
        assert stat.S_IMODE(os.stat(path).st_mode) == mode
        doc.save(link)  # through a symlink: the file it names keeps its mode
        assert stat.S_IMODE(os.stat(path).st_mode) == mode and os.path.islink(link)
        doc.save(tmp_path / "new.cache")  # a new file follows the umask
        assert stat.S_IMODE(os.stat(tmp_path / "new.cache").st_mode) == 0o644
    finally:
        os.umask(old)
    assert dllm.DocumentCache.load(path, dream).num_chunks == 1


def _encode(tmp_path, monkeypatch, *argv):
    from dllm.cli import main

    monkeypatch.chdir(tmp_path)
    return main(["encode", "--chunk-size", "64", *argv])


def test_cli_encode_keeps_the_mode_of_the_file_it_replaces(tmp_path, monkeypatch, capsys):
    (tmp_path / "doc.txt").write_text("The grass is green. " * 20)
    (tmp_path / "doc.cache").write_bytes(b"old")
    os.chmod(tmp_path / "doc.cache", 0o600)
    assert _encode(tmp_path, monkeypatch, "--context-file", "doc.txt", "--out", "doc.cache") == 0
    assert stat.S_IMODE(os.stat(tmp_path / "doc.cache").st_mode) == 0o600
    assert "wrote doc.cache" in capsys.readouterr().out


@pytest.mark.parametrize("how", ["same name", "another spelling", "symlink", "hard link"])
def test_cli_encode_refuses_to_overwrite_its_context_file(how, tmp_path, monkeypatch, capsys):
    text = "The grass is green. " * 20
    (tmp_path / "doc.txt").write_text(text)
    out = {"same name": "doc.txt", "another spelling": f"{tmp_path}/./doc.txt", "symlink": "link", "hard link": "hard"}
    if how == "symlink":
        os.symlink(tmp_path / "doc.txt", tmp_path / "link")
    if how == "hard link":
        os.link(tmp_path / "doc.txt", tmp_path / "hard")
    assert _encode(tmp_path, monkeypatch, "--context-file", "doc.txt", "--out", out[how]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and len(err.strip().splitlines()) == 1
    assert f"--out {out[how]} is the --context-file" in err
    assert (tmp_path / "doc.txt").read_text() == text


def test_a_fifo_or_a_folder_given_as_the_cache_is_an_error_at_once(dream, tmp_path):
    os.mkfifo(tmp_path / "fifo")  # opening it for reading would wait for a writer
    with pytest.raises(ValueError, match="fifo is not a dllm document cache \\(not a regular file\\)"):
        dllm.DocumentCache.load(tmp_path / "fifo", dream)
    with pytest.raises(IsADirectoryError) as e:
        dllm.DocumentCache.read_header(tmp_path)
    assert e.value.filename == str(tmp_path)


def test_torchrun_encode_refuses_a_context_file_that_is_one_of_its_shards(tmp_path, monkeypatch):
    """Under torchrun, ``--context-file y.idx.00001-of-00002.safetensors --out y.idx``
    encoded and then replaced the user's text with a shard. The sharded encode passes its shard names to the
    same check as ``--out`` (dllm/cli/distributed.py); here that check alone, with the names it passes."""
    import argparse

    from dllm.cli.errors import UserError
    from dllm.cli.files import read_document_to_encode
    from dllm.distributed.index_file import shard_path

    monkeypatch.chdir(tmp_path)
    text = "The grass is green. " * 20
    shard = shard_path("y.idx", 1, 2)
    (tmp_path / shard).write_text(text)
    args = argparse.Namespace(context_file=shard, out="y.idx")
    shards = [shard_path("y.idx", r, 2) for r in range(2)]
    with pytest.raises(UserError, match=rf"--context-file {shard} is the shard {shard} that encode writes beside"):
        read_document_to_encode(args, shards)
    assert read_document_to_encode(args) == text  # one process writes no shard: nothing to refuse
    assert (tmp_path / shard).read_text() == text


def _sticky_folder_with_a_foreign_link(tmp_path):
    """A /tmp-like folder (sticky, world-writable, owned by the caller) holding a 0600 victim file and a
    link to it owned by another uid, as a link planted by another user would be."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        pytest.skip("planting a link owned by another user needs root (lchown)")
    sticky = tmp_path / "sticky"
    sticky.mkdir()
    os.chmod(sticky, 0o1777)
    victim = tmp_path / "victim.cache"
    victim.write_bytes(b"the victim's private bytes")
    os.chmod(victim, 0o600)
    link = sticky / "doc.cache"
    os.symlink(victim, link)
    os.lchown(link, 54321, 54321)
    return sticky, victim, link


def test_a_foreign_link_in_a_sticky_folder_is_not_followed(dream, tmp_path, monkeypatch, capsys):
    """The kernel's protected_symlinks rule: ``open`` would refuse to follow that link for the caller; the
    save's resolve-then-rename followed it and replaced the victim's file. Links the caller owns, and
    links outside shared sticky folders, are still followed (the file they name is written)."""
    import dllm.distributed as dd

    sticky, victim, link = _sticky_folder_with_a_foreign_link(tmp_path)
    doc = dllm.encode_document(dream, _context(1, 5), prefilling=CFG)
    with pytest.raises(PermissionError, match="protected_symlinks") as e:
        doc.save(link)
    assert e.value.filename == str(link)
    with pytest.raises(PermissionError, match="protected_symlinks"):
        dd.encode_document(dream, _context(1, 5), prefilling=CFG).save(link)  # the sharded index writer
    (tmp_path / "doc.txt").write_text("The grass is green. " * 20)
    assert _encode(tmp_path, monkeypatch, "--context-file", "doc.txt", "--out", str(link)) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and len(err.strip().splitlines()) == 1 and "protected_symlinks" in err
    assert victim.read_bytes() == b"the victim's private bytes" and os.path.islink(link)
    os.lchown(link, os.geteuid(), os.getegid())  # the caller's own link: followed, as the README promises
    doc.save(link)
    assert os.path.islink(link) and dllm.DocumentCache.read_header(victim)["num_chunks"] == doc.num_chunks
    mine = tmp_path / "mine.cache"  # a foreign link outside a sticky folder: the user's own choice of folder
    os.symlink(victim, mine)
    os.lchown(mine, 54321, 54321)
    doc.save(mine)
    assert os.path.islink(mine)
