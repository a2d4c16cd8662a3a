"""Model-specific prefilling defaults: ``prefilling_config.json`` in a checkpoint, overridden by arguments and flags."""

import json
import shutil

import pytest
import torch

import dllm
from bench.fidelity.demo import TINY_PREFILLING
from dllm.cli import main
from dllm.prefilling import PrefillingConfig, PromptParts
from dllm.prefilling.config import CONFIG_NAME

PAPER = PrefillingConfig(chunk_size=1024, top_k=4, score_terms=("self_info", "pseudo_label"))


@pytest.mark.compat
def test_bundled_file_holds_the_demo_configuration():
    assert PrefillingConfig.from_pretrained(dllm.default_model_dir()) == TINY_PREFILLING


def test_no_file_gives_the_papers_defaults(tmp_path):
    assert PrefillingConfig.from_pretrained(str(tmp_path)) == PAPER == PrefillingConfig()
    assert PrefillingConfig.from_pretrained(None) == PAPER


def test_overrides_win(tmp_path):
    (tmp_path / CONFIG_NAME).write_text(json.dumps({"chunk_size": 64, "top_k": 2, "score_terms": ["self_info"]}))
    cfg = PrefillingConfig.from_pretrained(str(tmp_path), top_k=3, token_budget=None, position_mode="reuse")
    assert (cfg.chunk_size, cfg.top_k, cfg.score_terms, cfg.position_mode) == (64, 3, ("self_info",), "reuse")
    assert cfg.token_budget is None and cfg.draft_tokens == PAPER.draft_tokens


def test_a_none_keyword_means_what_it_means_to_the_dataclass(tmp_path):
    """None keywords were ignored, so top_k=None kept the file's K (2) where PrefillingConfig(
    top_k=None) keeps every chunk; None is now the field's None, and a field that cannot be None is refused."""
    (tmp_path / CONFIG_NAME).write_text(json.dumps({"chunk_size": 64, "top_k": 2, "token_budget": 8}))
    cfg = PrefillingConfig.from_pretrained(str(tmp_path), top_k=None, token_budget=None)
    assert (cfg.chunk_size, cfg.top_k, cfg.token_budget) == (64, None, None)
    assert PrefillingConfig.from_pretrained(str(tmp_path)).top_k == 2  # a keyword left out keeps the file's
    with pytest.raises(ValueError, match=r"keyword argument\(s\) chunk_size=None over .*: chunk_size must be an int"):
        PrefillingConfig.from_pretrained(str(tmp_path), chunk_size=None)


@pytest.mark.parametrize("with_file", [True, False])
def test_a_bad_keyword_is_named_not_blamed_on_the_file(tmp_path, with_file):
    """A bad keyword is named as the keyword: for top_k=0 the error said "<dir>/prefilling_config.json: top_k (K)
    must be >= 1", blaming the file."""
    if with_file:
        (tmp_path / CONFIG_NAME).write_text(json.dumps({"chunk_size": 64, "top_k": 2}))
    with pytest.raises(ValueError) as e:
        PrefillingConfig.from_pretrained(str(tmp_path), top_k=0)
    msg = str(e.value)
    assert msg.startswith("PrefillingConfig.from_pretrained keyword argument(s) top_k=0") and "must be >= 1" in msg
    assert not msg.startswith(str(tmp_path))
    with pytest.raises(TypeError, match=r"unknown keyword argument\(s\) \['topk'\]"):
        PrefillingConfig.from_pretrained(str(tmp_path), topk=3)


@pytest.mark.parametrize(
    "content, match",
    [
        ("{not json", "not valid JSON"),
        ('["chunk_size"]', "must hold a JSON object"),
        ('{"chunk_sizes": 64}', r"unknown field\(s\) \['chunk_sizes'\]"),
        ('{"chunk_size": 0}', "chunk_size"),
        ('{"token_budget": 99, "chunk_size": 8}', "token_budget"),
    ],
)
def test_bad_files_name_the_file(tmp_path, content, match):
    (tmp_path / CONFIG_NAME).write_text(content)
    with pytest.raises(ValueError, match=match) as e:
        PrefillingConfig.from_pretrained(str(tmp_path))
    assert CONFIG_NAME in str(e.value)


@pytest.mark.parametrize(
    "content, match",
    [
        ('{"chunk_size": "256", "boundary_snap": 64}', "chunk_size"),
        ('{"chunk_size": true, "boundary_snap": 64}', "chunk_size"),
        ('{"chunk_size": 256, "boundary_snap": "64"}', "boundary_snap"),
        ('{"score_terms": {"draft_contrast": 1}}', "score_terms must be a JSON array"),
    ],
)
def test_a_bad_field_in_the_file_is_named_also_under_an_override(tmp_path, content, match):
    """With a chunk_size given, the file's snap is carried to it: a wrong-typed field in the file is still the
    file's own error (not a TypeError of the carrying arithmetic, nor a value the user never wrote)."""
    (tmp_path / CONFIG_NAME).write_text(content)
    for overrides in ({}, {"chunk_size": 128}):
        with pytest.raises(ValueError, match=match) as e:
            PrefillingConfig.from_pretrained(str(tmp_path), **overrides)
        assert CONFIG_NAME in str(e.value)


def test_the_files_snap_is_carried_to_an_overriding_chunk_size(tmp_path):
    (tmp_path / CONFIG_NAME).write_text(json.dumps({"chunk_size": 256, "boundary_snap": 64}))
    assert PrefillingConfig.from_pretrained(str(tmp_path), chunk_size=128).boundary_snap == 32  # 64/256 of 128
    assert PrefillingConfig.from_pretrained(str(tmp_path), chunk_size=128, boundary_snap=5).boundary_snap == 5


def test_save_pretrained_round_trip(tmp_path):
    cfg = PrefillingConfig(chunk_size=128, top_k=2, token_budget=64, score_terms=("draft_contrast",))
    path = cfg.save_pretrained(str(tmp_path))
    assert json.loads(open(path).read()) == {
        "chunk_size": 128,
        "top_k": 2,
        "token_budget": 64,
        "score_terms": ["draft_contrast"],
    }
    assert PrefillingConfig.from_pretrained(str(tmp_path)) == cfg


def _context_parts(model, n_ctx, seed=0):
    g = torch.Generator().manual_seed(seed)
    rnd = lambda n: torch.randint(5, 99, (n,), generator=g)
    return PromptParts(torch.tensor([1]), rnd(n_ctx), rnd(6))


@pytest.mark.compat
def test_generate_without_prefilling_uses_the_checkpoints_file(tmp_path):
    """The bundled model needs no prefilling arguments: C=256 and K=4 come from its file. A copy without
    the file falls back to the paper's C=1024."""
    tiny = dllm.load_model(device="cpu")
    parts = _context_parts(tiny, 1100)
    res = dllm.generate(tiny, method="prefilling", prompt=parts, gen_length=4, steps=2)
    assert res.stats.extra["num_chunks"] == 5 and len(res.stats.extra["selected_chunks"]) == 4  # ceil(1100/256)
    bare = tmp_path / "bare"
    shutil.copytree(dllm.default_model_dir(), bare)
    (bare / CONFIG_NAME).unlink()
    plain = dllm.load_model(str(bare), device="cpu")
    res = dllm.generate(plain, method="prefilling", prompt=parts, prefilling=PrefillingConfig(top_k=1), gen_length=2)
    assert res.stats.extra["num_chunks"] == 2  # ceil(1100/1024)


def test_cli_flags_override_the_file(tmp_path, capsys):
    prompt, context = tmp_path / "p.txt", tmp_path / "c.txt"
    prompt.write_text("Find the key.\n\n{context}\n\nThe key is ")
    context.write_text("x" * 1100)
    base = ["generate", "--prompt-file", str(prompt), "--context-file", str(context), "--method", "prefilling"]
    base += ["--gen-length", "4", "--steps", "2", "--stats", "json"]
    assert main(base) == 0
    stats = json.loads(capsys.readouterr().err.strip().splitlines()[-1])
    assert stats["num_chunks"] == 5 and len(stats["selected_chunks"]) == 4  # the bundled file: C=256, K=4
    assert main([*base, "--chunk-size", "512", "--top-k", "1"]) == 0
    stats = json.loads(capsys.readouterr().err.strip().splitlines()[-1])
    assert stats["num_chunks"] == 3 and len(stats["selected_chunks"]) == 1


@pytest.mark.parametrize(
    "field, value",
    [("top_k", 2.5), ("draft_tokens", 1.5), ("token_budget", 2.5), ("chunk_size", True), ("chunk_size", 8.0),
     ("pool_kernel", 3.0), ("prefill_batch", False), ("query_window", "4"), ("anchor_token_id", 1.0),
     ("draft_threshold", True)],
)  # fmt: skip
def test_integer_fields_must_be_real_ints(field, value, tmp_path):
    with pytest.raises(ValueError, match=field):
        PrefillingConfig(**{field: value})
    (tmp_path / "prefilling_config.json").write_text(json.dumps({field: value}))
    with pytest.raises(ValueError, match=f"prefilling_config.json.*{field}"):
        PrefillingConfig.from_pretrained(str(tmp_path))


def test_numpy_integers_are_accepted_as_ints():
    import numpy as np

    cfg = PrefillingConfig(chunk_size=np.int64(16), top_k=np.int32(2), draft_threshold=np.float32(0.5))
    assert cfg.chunk_size == 16 and type(cfg.chunk_size) is int and type(cfg.top_k) is int
    assert type(cfg.draft_threshold) is float and cfg.draft_threshold == 0.5


def test_a_chunk_beyond_the_trained_positions_is_a_library_error():
    import dllm

    tiny = dllm.load_model()  # 1536 trained positions
    ids = dllm.encode_text(tiny, "x" * 40)
    with pytest.raises(ValueError, match="chunk_size=1536: a chunk and its BOS anchor take 1537 positions"):
        dllm.encode_document(tiny, ids, prefilling=PrefillingConfig(chunk_size=1536))
    parts = dllm.PromptParts(ids[:1], ids, ids[:3])
    with pytest.raises(ValueError, match="more than the model's 1536 trained positions"):
        dllm.generate(tiny, method="prefilling", prompt=parts, prefilling=PrefillingConfig(chunk_size=2000, top_k=None),
                      gen_length=4, steps=4)  # fmt: skip
    dllm.encode_document(tiny, ids, prefilling=PrefillingConfig(chunk_size=1535))  # fits exactly


def test_a_chunk_size_override_keeps_the_files_snap_as_the_same_share_of_the_chunk():
    """The bundled file snaps within 64 of 256 tokens (a quarter): another C keeps a quarter, so a small C
    (64, below the file's tolerance) is still valid; an explicit boundary_snap wins."""
    d = dllm.default_model_dir()
    assert PrefillingConfig.from_pretrained(d).boundary_snap == 64
    assert PrefillingConfig.from_pretrained(d, chunk_size=64).boundary_snap == 16
    assert PrefillingConfig.from_pretrained(d, chunk_size=1024).boundary_snap == 256
    assert PrefillingConfig.from_pretrained(d, chunk_size=64, boundary_snap=0).boundary_snap == 0
    assert PrefillingConfig.from_pretrained(None, chunk_size=64).boundary_snap == 0  # the paper: no snap


def test_a_score_term_named_twice_is_refused_everywhere(tmp_path):
    """The CLI and the harness refused it; the dataclass and prefilling_config.json counted the term twice."""
    with pytest.raises(ValueError, match="names self_info more than once"):
        PrefillingConfig(score_terms=("self_info", "pseudo_label", "self_info"))
    (tmp_path / "prefilling_config.json").write_text('{"score_terms": ["draft_contrast", "draft_contrast"]}')
    with pytest.raises(ValueError, match="draft_contrast more than once"):
        PrefillingConfig.from_pretrained(str(tmp_path))
