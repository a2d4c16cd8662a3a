"""Document caches: answers from a cached (and saved, reloaded) document equal fresh answers token for token."""

import json
import os
import sys

import pytest
import torch

import dllm
from dllm.prefilling import PrefillingConfig, PromptParts
from tests.tiny_checkpoints import LLADA_BOS, checkpoint_fixtures, load_tiny, write_dream_checkpoint

BOS = 128  # DREAM_TINY bos_token_id


dream_dir, dream = checkpoint_fixtures(write_dream_checkpoint, seed=21, folder="dream", dir_fixture="dream_dir")


@pytest.fixture(scope="module")
def llada(tmp_path_factory):
    return load_tiny(tmp_path_factory, "llada", seed=22, n_kv_heads=3)


def _parts(bos=BOS, vocab=120, n_ctx=53, seed=0):
    g = torch.Generator().manual_seed(seed)
    r = lambda n: torch.randint(0, vocab, (n,), generator=g)
    return PromptParts(torch.cat([torch.tensor([bos]), r(5)]), r(n_ctx), r(6))


def _questions(parts, n, vocab, seed=1):
    """n different queries about the same context."""
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab, (4 + i,), generator=g) for i in range(n)]


def _forward_inputs(model, fn):
    """Shapes of every model forward's input ids while ``fn()`` runs."""
    seen = []
    handle = model.register_forward_pre_hook(
        lambda mod, args, kwargs: seen.append(tuple(args[0].shape)), with_kwargs=True
    )
    try:
        out = fn()
    finally:
        handle.remove()
    return out, seen


# Every unmasking rule in both cache modes; the token budget B alternates so that each mode runs with and without it.
DREAM_ALGS = ("maskgit_plus", "topk_margin", "entropy", "origin", "confidence_threshold")
LLADA_ALGS = ("low_confidence", "random")
CASES = [
    (family, alg, mode, 3 if (i + (mode == "joint")) % 2 else None)
    for family, algs in (("dream", DREAM_ALGS), ("llada", LLADA_ALGS))
    for i, alg in enumerate(algs)
    for mode in ("independent", "joint")
]


@pytest.mark.parametrize(("family", "alg", "mode", "budget"), CASES)
def test_cached_answers_equal_fresh_ones_before_and_after_save_load(family, alg, mode, budget, dream, llada, tmp_path):
    model = dream if family == "dream" else llada
    bos, vocab = (BOS, 120) if family == "dream" else (LLADA_BOS, 90)
    parts = _parts(bos, vocab)
    cfg = PrefillingConfig(chunk_size=8, top_k=3, token_budget=budget, cache_mode=mode, pool_kernel=3)
    kw = dict(method="prefilling", prefilling=cfg, alg=alg, gen_length=8, steps=8, block_length=4, seed=5)
    kw["threshold"] = 0.05
    kw["temperature"] = 1.0 if alg in ("origin", "random") else 0.0
    doc = dllm.encode_document(model, parts.context, prefilling=cfg)
    doc.save(tmp_path / "doc.cache")
    loaded = dllm.DocumentCache.load(tmp_path / "doc.cache", model)
    for query in [parts.query, *_questions(parts, 1, vocab)]:
        fresh = dllm.generate(model, prompt=PromptParts(parts.prefix, parts.context, query), **kw)
        for d in (doc, loaded):
            cached = dllm.generate(model, prompt=PromptParts(parts.prefix, None, query), document=d, **kw)
            assert torch.equal(cached.tokens, fresh.tokens)
            ex_c, ex_f = cached.stats.extra, fresh.stats.extra
            assert ex_c["selected_chunks"] == ex_f["selected_chunks"]
            assert ex_c.get("all_chunk_scores") == ex_f.get("all_chunk_scores")
            assert ex_c["cached_tokens"] == ex_f["cached_tokens"] and ex_c["document"] is True
            assert cached.stats.nfe == fresh.stats.nfe - 1  # the one chunk batch of the fresh prefill
    assert (fresh.tokens != model.mask_token_id).all()


def test_no_chunk_is_re_encoded(dream):
    """The forwards of a run from a document are the fresh run's minus the chunk batch [N, C+1]."""
    parts = _parts(n_ctx=61)
    cfg = PrefillingConfig(chunk_size=8, top_k=2)
    doc = dllm.encode_document(dream, parts.context, prefilling=cfg)
    kw = dict(method="prefilling", prefilling=cfg, gen_length=4, steps=4)
    fresh, seen_fresh = _forward_inputs(dream, lambda: dllm.generate(dream, prompt=parts, **kw))
    cached, seen_doc = _forward_inputs(
        dream, lambda: dllm.generate(dream, prompt=PromptParts(parts.prefix, None, parts.query), document=doc, **kw)
    )
    assert seen_fresh[0] == (8, 9)  # 61 tokens / C = 8: 8 chunks of BOS + up to 8 tokens
    assert seen_doc == seen_fresh[1:]
    assert seen_doc[0] == (1, 6)  # the prefill phase encodes the prefix alone
    assert torch.equal(cached.tokens, fresh.tokens)


def test_document_shape_bytes_and_header(dream, tmp_path):
    ctx = _parts(n_ctx=37).context
    doc = dllm.encode_document(dream, ctx, chunk_size=8)
    c = dream.config
    assert doc.num_chunks == 5 and len(doc) == 37 and doc.chunk_size == 8 and doc.anchor_token_id == BOS
    kv = 2 * c.num_layers * 5 * 9 * c.num_kv_heads * c.head_dim * 4  # K and V, fp32, N x (C + 1)
    assert doc.nbytes == kv + 5 * 9 * 8 + 5 * 4 + 5 * 8  # + ids (int64), lens (int32), starts (int64)
    # the chunks hold BOS + the context, the last one padded
    assert doc.chunks.ids[:, 0].tolist() == [BOS] * 5
    assert torch.equal(torch.cat([doc.chunks.context_ids(j) for j in range(5)]), ctx)
    path = tmp_path / "doc.cache"
    doc.save(path)
    assert os.path.getsize(path) > kv
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        head = json.loads(f.metadata()["dllm_document_cache"])
    assert head["family"] == "dream" and head["dtype"] == "float32" and head["chunk_size"] == 8
    assert head["anchor_token_id"] == BOS and head["num_chunks"] == 5 and head["num_tokens"] == 37
    assert head["version"] == doc.version and len(head["model_config"]) == 16 and len(head["model_weights"]) == 32
    assert head["tokenizer"] == "none" and head["format"] == 4  # this test checkpoint has no tokenizer
    loaded = dllm.DocumentCache.load(path, dream)
    for a, b in zip(doc.chunks.k + doc.chunks.v, loaded.chunks.k + loaded.chunks.v):
        assert torch.equal(a, b)
    assert loaded.chunks.starts == doc.chunks.starts == [0, 8, 16, 24, 32]
    if sys.platform.startswith("linux"):  # read into memory the cache owns, not memory-mapped
        with open("/proc/self/maps") as maps:
            assert str(path) not in maps.read()


def test_load_names_the_mismatched_field(dream, dream_dir, llada, tmp_path):
    path = tmp_path / "doc.cache"
    dllm.encode_document(dream, _parts().context, chunk_size=8).save(path)
    other = tmp_path / "other"
    write_dream_checkpoint(str(other), seed=99)  # same architecture, other weights
    with pytest.raises(ValueError, match="model_weights mismatch"):
        dllm.DocumentCache.load(path, dllm.load_model(str(other), device="cpu", dtype=torch.float32))
    with pytest.raises(ValueError, match="dtype mismatch.*'float32'.*'bfloat16'"):
        dllm.DocumentCache.load(path, dllm.load_model(dream_dir, device="cpu", dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="family mismatch"):
        dllm.DocumentCache.load(path, llada)
    not_a_cache = tmp_path / "weights.safetensors"
    from safetensors.torch import save_file

    save_file({"x": torch.zeros(1)}, str(not_a_cache))
    with pytest.raises(ValueError, match="not a dllm document cache"):
        dllm.DocumentCache.load(not_a_cache, dream)
    with pytest.raises(FileNotFoundError):
        dllm.DocumentCache.load(tmp_path / "missing.cache", dream)


def test_generate_from_a_document_rejects_bad_combinations(dream, llada):
    parts = _parts()
    doc = dllm.encode_document(dream, parts.context, chunk_size=8)
    no_ctx = PromptParts(parts.prefix, None, parts.query)
    gen = lambda model=dream, prompt=no_ctx, **kw: dllm.generate(
        model, method="prefilling", prompt=prompt, document=doc, gen_length=4, **kw
    )
    with pytest.raises(ValueError, match="either in prompt.context or as document="):
        gen(prompt=parts, prefilling=PrefillingConfig(chunk_size=8))
    with pytest.raises(ValueError, match="chunk_size mismatch.*chunk_size=8.*16"):
        gen(prefilling=PrefillingConfig(chunk_size=16))
    other = _parts(bos=LLADA_BOS, vocab=90)
    with pytest.raises(ValueError, match="family mismatch"):
        gen(model=llada, prompt=PromptParts(other.prefix, None, other.query))
    with pytest.raises(ValueError, match=f"anchor_token_id mismatch.*anchor {BOS}.*use 5"):
        gen(prefilling=PrefillingConfig(chunk_size=8, anchor_token_id=5))
    with pytest.raises(ValueError, match="top_k=9 exceeds the 7 chunk"):
        gen(prefilling=PrefillingConfig(chunk_size=8, top_k=9))
    with pytest.raises(ValueError, match="options of method='prefilling'"):
        dllm.generate(dream, parts.full()[None], document=doc)
    with pytest.raises(ValueError, match="prompt.context is None"):
        dllm.generate(dream, method="prefilling", prompt=no_ctx, gen_length=4)
    with pytest.raises(TypeError, match="DocumentCache"):
        dllm.generate(dream, method="prefilling", prompt=no_ctx, document="doc.cache", gen_length=4)
    # without a config the document's chunk size is used
    res = gen()
    assert res.stats.extra["num_chunks"] == 7 and res.stats.extra["document"] is True


def test_encode_document_rejects_bad_context(dream):
    with pytest.raises(ValueError, match="non-empty 1-D"):
        dllm.encode_document(dream, torch.zeros(0, dtype=torch.long))
    with pytest.raises(TypeError, match="int64"):
        dllm.encode_document(dream, torch.zeros(4))
    with pytest.raises(ValueError, match="mask token"):
        dllm.encode_document(dream, torch.tensor([1, dream.mask_token_id]))
    with pytest.raises(ValueError, match="differs from prefilling.chunk_size"):
        dllm.encode_document(dream, torch.tensor([1, 2]), chunk_size=4, prefilling=PrefillingConfig(chunk_size=8))


def test_bundled_model_answers_the_pass_key_from_a_saved_document(tmp_path):
    """The demo's configuration on a 3000-token passkey case: the answer from a saved and reloaded
    document equals the fresh one and is the pass key."""
    from bench.fidelity.demo import TINY_PREFILLING
    from dllm.eval.evaluation import case_inputs
    from dllm.eval.tasks import make_case, score

    tiny = dllm.load_model(device="cpu")
    case = make_case("passkey", 3000, 0.4, 10**9 + 3)
    parts = case_inputs(tiny, case, "prefilling")["prompt"]
    dllm.encode_document(tiny, parts.context, prefilling=TINY_PREFILLING).save(tmp_path / "doc.cache")
    doc = dllm.DocumentCache.load(tmp_path / "doc.cache", tiny)
    kw = dict(method="prefilling", prefilling=TINY_PREFILLING, gen_length=8, steps=8)
    fresh = dllm.generate(tiny, prompt=parts, **kw)
    cached = dllm.generate(tiny, prompt=PromptParts(parts.prefix, None, parts.query), document=doc, **kw)
    assert torch.equal(cached.tokens, fresh.tokens)
    assert score("passkey", cached.text[0], case), (cached.text[0], case.answer)


def test_cli_encode_then_answer_several_questions_from_the_document(tmp_path, monkeypatch, capsys):
    """encode + generate --document --question x2 answer as generate --context-file does; user errors are one
    ``error:`` line and exit status 2."""
    from dllm.cli import main

    monkeypatch.chdir(tmp_path)
    (tmp_path / "doc.txt").write_text(
        "The grass is green. " * 40 + "The pass key is 42917. Remember it. " + "The sky is blue. " * 40
    )
    (tmp_path / "q.txt").write_text("Find the pass key.\n\n{context}\n\n{question}\n")
    questions = ["What is the pass key? The pass key is ", "What was the pass key? The pass key is "]
    assert main(["encode", "--context-file", "doc.txt", "--out", "doc.cache", "--chunk-size", "128"]) == 0
    assert "chunks of 128" in capsys.readouterr().out and (tmp_path / "doc.cache").is_file()
    common = ["--prompt-file", "q.txt", "--gen-length", "8", "--top-k", "2", "--stats", "json"]
    qargs = [a for q in questions for a in ("--question", q)]
    assert main(["generate", "--document", "doc.cache", *common, *qargs]) == 0
    out, err = capsys.readouterr()
    lines = out.strip("\n").split("\n")
    assert [x.split(": ")[0] for x in lines] == ["Q1", "A1", "Q2", "A2"]  # each answer labelled
    answers = [x for x in lines if x.startswith("A")]
    stats = [json.loads(line) for line in err.strip().splitlines() if line.startswith("{")]
    assert len(answers) == 2 and len(stats) == 2 and all(s["document"] is True for s in stats)
    assert [s["question"] for s in stats] == [1, 2]
    assert all(s["num_chunks"] == len(stats[0]["all_chunk_scores"]) for s in stats)
    for q, answer in zip(questions, answers):
        fresh = ["generate", "--method", "prefilling", "--context-file", "doc.txt", "--chunk-size", "128"]
        assert main([*fresh, *common, "--question", q]) == 0
        fresh_answer = capsys.readouterr().out.strip("\n").split("\n")[1]
        assert fresh_answer.split(": ", 1)[1] == answer.split(": ", 1)[1]  # A1 (one question) vs An
    for bad, message in (
        (["--chunk-size", "64"], "encoded with chunk size 128"),
        (["--context-file", "doc.txt"], "--document and --context-file"),
        (["--method", "dense"], "answers with --method prefilling"),
    ):
        assert main(["generate", "--document", "doc.cache", *common, "--question", "x", *bad]) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: ") and message in err and len(err.strip().splitlines()) == 1
    assert main(["generate", "--document", "doc.txt", "--question", "x"]) == 2
    assert "not a dllm document cache" in capsys.readouterr().err


def test_bench_writes_both_parts_with_provenance(tmp_path):
    """bench.speed.document_cache on small documents: every row carries provenance, cached tokens equal fresh ones."""
    import csv

    from bench.speed import document_cache

    argv = ["--out", str(tmp_path), "--length", "1024", "--long-length", "2048", "--long-depths", "0.2", "0.8"]
    assert document_cache.main(argv) == 0
    rows = list(csv.DictReader((tmp_path / "document_cache.csv").open()))
    assert {r["run"] for r in rows} == {"encode", "warm-up", "fresh", "cached"} and all(r["commit"] for r in rows)
    q = [r for r in rows if r["part"] == "questions" and r["run"] in ("fresh", "cached")]
    assert len(q) == 8 and all(r["equal_tokens"] == "1" for r in q)
    long = [r for r in rows if r["part"] == "long"]
    assert [(r["depth"], r["run"]) for r in long] == [
        (d, run) for d in ("0.2", "0.8") for run in ["encode"] + ["cached"] * 4
    ]
    assert int(long[0]["cache_bytes_disk"]) >= int(long[0]["cache_bytes_memory"]) > 0
    assert all(r["selected_chunks"] for r in long if r["run"] == "cached")
    md = (tmp_path / "document_cache.md").read_text()
    assert "Machine:" in md and "passkey document, 4 questions" in md
    correct = sum(int(r["correct"]) for r in long if r["run"] == "cached")
    assert f"Long documents: {correct} of 8 questions answered over 2 needle depths" in md
    assert md.count("needle at depth") == 2


def test_bench_rejects_a_depth_outside_0_1(capsys):
    from bench.speed import document_cache

    with pytest.raises(SystemExit) as e:
        document_cache.main(["--long-depths", "1.5"])
    assert e.value.code == 2 and "--long-depths must lie in 0..1" in capsys.readouterr().err


def test_split_document_prompt_cuts_at_the_slot_or_takes_all_as_query():
    from dllm.prefilling import split_document_prompt

    tiny = dllm.load_model(device="cpu")
    bos = dllm.encode_text(tiny, "", bos=True)
    parts = split_document_prompt(tiny, "Read this.\n{context}\nThe pass key is ")
    assert parts.context is None
    assert torch.equal(parts.prefix, torch.cat([bos, dllm.encode_text(tiny, "Read this.\n")]))
    assert torch.equal(parts.query, dllm.encode_text(tiny, "\nThe pass key is "))
    no_slot = split_document_prompt(tiny, "The pass key is ")
    assert torch.equal(no_slot.prefix, bos) and torch.equal(no_slot.query, dllm.encode_text(tiny, "The pass key is "))
    with pytest.raises(ValueError, match="at most one"):
        split_document_prompt(tiny, "{context}{context}q")
    with pytest.raises(ValueError, match="query .* is empty"):
        split_document_prompt(tiny, "prefix {context}")


def _rewrite(src, dst, edit_tensors=None, edit_header=None):
    """Copy the cache ``src`` to ``dst`` with its tensors and/or JSON header edited (a damaged or forged file)."""
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    from dllm.prefilling.document import HEADER_KEY

    with safe_open(str(src), framework="pt") as f:
        raw = f.metadata()[HEADER_KEY]
    tensors = {k: t.clone() for k, t in load_file(str(src)).items()}
    if edit_tensors is not None:
        edit_tensors(tensors)
    if edit_header is not None:
        head = json.loads(raw)
        raw = edit_header(head)
        raw = raw if isinstance(raw, str) else json.dumps(head if raw is None else raw)
    save_file(tensors, str(dst), metadata={HEADER_KEY: raw})


def _set(d, key, value):
    d[key] = value


def _shift_lens(t):
    t["lens"][0] -= 2
    t["lens"][1] += 2


DAMAGE = {  # what is wrong -> (tensor edit, header edit)
    "header is not JSON": (None, lambda h: "{not json"),
    "header is a list": (None, lambda h: "[1, 2]"),
    "header lacks chunk_size": (None, lambda h: h.pop("chunk_size") and None),
    "chunk_size is a string": (None, lambda h: _set(h, "chunk_size", "8")),
    "header lies about chunk_size": (None, lambda h: _set(h, "chunk_size", 16)),
    "anchor is the mask id": (None, lambda h: _set(h, "anchor_token_id", 129)),  # DREAM_TINY's mask id
    "no K of layer 1": (lambda t: t.pop("k.1"), None),
    "no starts": (lambda t: t.pop("starts"), None),
    "K of layer 0 too short": (lambda t: _set(t, "k.0", t["k.0"][:, :4].contiguous()), None),
    "V of layer 0 in float16": (lambda t: _set(t, "v.0", t["v.0"].half()), None),
    "lens are floats": (lambda t: _set(t, "lens", t["lens"].float()), None),
    "ids of 3 chunks": (lambda t: _set(t, "ids", t["ids"][:3].contiguous()), None),
    "lens moved between chunks": (_shift_lens, None),
    "starts reversed": (lambda t: _set(t, "starts", t["starts"].flip(0).contiguous()), None),
    "ids without the anchor": (lambda t: t["ids"][:, 0].fill_(7), None),
    "ids outside the vocabulary": (lambda t: t["ids"][2, 3].fill_(10**6), None),
    "a K of a layer the model lacks": (lambda t: _set(t, "k.99", t["k.0"].clone()), None),
    # checked from the numbers alone: listing 10**12 chunk spans first would take minutes and gigabytes
    "header claims 10**13 tokens": (None, lambda h: h.update(num_tokens=10**13, num_chunks=10**13 // 8)),
}


@pytest.mark.parametrize("verify", [True, False])
@pytest.mark.parametrize("damage", list(DAMAGE))
def test_load_rejects_a_damaged_or_forged_cache_with_one_value_error(damage, verify, dream, tmp_path):
    """Every inconsistency between the header, the tensors and the model is a ValueError naming the file,
    never a KeyError/SafetensorError or a silently wrong cache (also when the content hashes are not checked)."""
    good = tmp_path / "good.cache"
    dllm.encode_document(dream, _parts(n_ctx=37).context, chunk_size=8).save(good)
    bad = tmp_path / "bad.cache"
    edit_tensors, edit_header = DAMAGE[damage]
    _rewrite(good, bad, edit_tensors, edit_header)
    with pytest.raises(ValueError, match=str(bad)):
        dllm.DocumentCache.load(bad, dream, verify=verify)
    dllm.DocumentCache.load(good, dream, verify=verify)  # the untouched copy still loads


def _flip_bit(t):
    t["k.0"].view(torch.int32).view(-1)[5] ^= 1 << 3


def _nan_in_v(t):
    t["v.1"][1, 2, 0, 3] = float("nan")


def _edit_id(t):
    t["ids"][1, 4] = (t["ids"][1, 4] + 1) % 100  # still a valid, non-special id


CONTENT_EDITS = {"a bit flip in K": _flip_bit, "a NaN in V": _nan_in_v, "an edited token id": _edit_id}


@pytest.mark.parametrize("edit", list(CONTENT_EDITS))
def test_content_edits_that_keep_the_layout_are_caught_by_the_hashes(edit, dream, tmp_path):
    """Edits a layout check cannot see fail the SHA-256 check by default; verify=False skips it (documented)."""
    good, bad = tmp_path / "good.cache", tmp_path / "bad.cache"
    dllm.encode_document(dream, _parts(n_ctx=37).context, chunk_size=8).save(good)
    _rewrite(good, bad, CONTENT_EDITS[edit])
    with pytest.raises(ValueError, match=rf"{bad} is damaged: the bytes of tensor \S+ differ from the SHA-256"):
        dllm.DocumentCache.load(bad, dream)
    dllm.DocumentCache.load(bad, dream, verify=False)


def test_kv_copied_from_another_document_is_caught(dream, tmp_path):
    a, b, forged = tmp_path / "a.cache", tmp_path / "b.cache", tmp_path / "forged.cache"
    dllm.encode_document(dream, _parts(n_ctx=37, seed=1).context, chunk_size=8).save(a)
    dllm.encode_document(dream, _parts(n_ctx=37, seed=2).context, chunk_size=8).save(b)
    from safetensors.torch import load_file

    other = load_file(str(b))
    _rewrite(a, forged, lambda t: t.update({"k.1": other["k.1"], "v.1": other["v.1"]}))
    with pytest.raises(ValueError, match="bytes of tensor k.1 differ"):
        dllm.DocumentCache.load(forged, dream)


@pytest.mark.parametrize("version", [None, "", 3])
def test_a_header_without_a_version_string_is_rejected(version, dream, tmp_path):
    good, bad = tmp_path / "good.cache", tmp_path / "bad.cache"
    dllm.encode_document(dream, _parts(n_ctx=13).context, chunk_size=8).save(good)
    _rewrite(good, bad, edit_header=lambda h: _set(h, "version", version))
    with pytest.raises(ValueError, match="version=.* is not a version string"):
        dllm.DocumentCache.load(bad, dream)


def test_a_cache_of_other_weights_is_refused_whatever_weight_differs(dream_dir, tmp_path):
    """A change to any one weight (here a LoRA-like edit of q_proj / v_proj, which the old two-row
    fingerprint of four matrices missed) makes the cache a ValueError naming the weights."""
    base = dllm.load_model(dream_dir, device="cpu", dtype=torch.float32)
    path = tmp_path / "doc.cache"
    dllm.encode_document(base, _parts(n_ctx=29).context, chunk_size=8).save(path)
    for module in ("q_proj", "v_proj"):
        tuned = dllm.load_model(dream_dir, device="cpu", dtype=torch.float32)
        proj = getattr(tuned.layers[1].self_attn, module)
        with torch.no_grad():
            proj.weight[-1, -1] += 1e-3  # a rank-1 update of one element
        with pytest.raises(ValueError, match="model_weights mismatch.*model weights differ"):
            dllm.DocumentCache.load(path, tuned)
    dllm.DocumentCache.load(path, base)
    # in place on the same model object: the cached digest notices the version counter
    bias = base.layers[0].self_attn.q_proj.bias
    saved = bias.detach().clone()
    with torch.no_grad():
        bias[0] += 1.0
    with pytest.raises(ValueError, match="model weights differ"):
        dllm.DocumentCache.load(path, base)
    with torch.no_grad():
        bias.copy_(saved)
    dllm.DocumentCache.load(path, base)


def test_a_change_through_data_is_noticed(dream_dir, tmp_path):
    """``p.data += delta`` (how LoRA merges write) bumps no version counter: the digest's key still sees it."""
    model = dllm.load_model(dream_dir, device="cpu", dtype=torch.float32)
    path = tmp_path / "doc.cache"
    dllm.encode_document(model, _parts(n_ctx=29).context, chunk_size=8).save(path)
    w = model.layers[0].self_attn.v_proj.weight
    w.data[3, 4] += 0.25
    with pytest.raises(ValueError, match="model weights differ"):
        dllm.DocumentCache.load(path, model)


@pytest.mark.parametrize("kind", ["device", "fifo", "symlink to a device"])
def test_save_never_replaces_a_device_or_fifo(kind, dream, tmp_path):
    target = tmp_path / "target"
    if kind == "fifo":
        os.mkfifo(target)
        path = target
    else:
        path = tmp_path / "null"
        os.symlink("/dev/null", path) if kind == "symlink to a device" else None
        if kind == "device":
            path = "/dev/null"
    doc = dllm.encode_document(dream, _parts(n_ctx=5).context, chunk_size=8)
    with pytest.raises(FileExistsError, match="not a regular file"):
        doc.save(path)
    assert os.path.exists("/dev/null") and not os.path.isfile("/dev/null")


def test_save_through_a_symlink_writes_the_file_it_names(dream, tmp_path):
    real, link = tmp_path / "real.cache", tmp_path / "link.cache"
    real.write_bytes(b"old")
    os.symlink(real, link)
    dllm.encode_document(dream, _parts(n_ctx=5).context, chunk_size=8).save(link)
    assert os.path.islink(link) and dllm.DocumentCache.load(real, dream).num_chunks == 1


def test_header_hashes_must_name_every_tensor(dream, tmp_path):
    good, bad = tmp_path / "good.cache", tmp_path / "bad.cache"
    dllm.encode_document(dream, _parts(n_ctx=13).context, chunk_size=8).save(good)
    _rewrite(good, bad, edit_header=lambda h: _set(h, "tensor_sha256", {}))
    for verify in (True, False):
        with pytest.raises(ValueError, match="tensor_sha256 names 0 tensors"):
            dllm.DocumentCache.load(bad, dream, verify=verify)


def test_weights_digest_is_computed_once_per_model(dream, monkeypatch):
    from dllm.prefilling import fingerprint

    fingerprint.weights_digest(dream)
    calls = []
    monkeypatch.setattr(fingerprint, "tensor_sha256", lambda *a, **k: calls.append(1))
    fingerprint.weights_digest(dream)
    fingerprint.model_fingerprint(dream)
    assert calls == []
    fingerprint.weights_digest(torch.nn.Linear(2, 2))  # another model: hashed, through the patched function
    assert calls


@pytest.mark.parametrize("umask, mode", [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
def test_saved_cache_mode_follows_the_umask(umask, mode, dream, tmp_path):
    doc = dllm.encode_document(dream, _parts(n_ctx=5).context, chunk_size=8)
    old = os.umask(umask)
    try:
        doc.save(tmp_path / "doc.cache")
    finally:
        os.umask(old)
    assert os.stat(tmp_path / "doc.cache").st_mode & 0o777 == mode


def test_save_failures_are_os_errors_naming_the_path(dream, tmp_path):
    doc = dllm.encode_document(dream, _parts(n_ctx=5).context, chunk_size=8)
    with pytest.raises(FileNotFoundError) as missing:
        doc.save(tmp_path / "no-such-folder" / "doc.cache")
    assert missing.value.filename == str(tmp_path / "no-such-folder" / "doc.cache")
    with pytest.raises(IsADirectoryError):
        doc.save(tmp_path)


def test_a_one_token_document_round_trips(dream, tmp_path):
    ctx = torch.tensor([7])
    doc = dllm.encode_document(dream, ctx, chunk_size=8)
    assert doc.num_chunks == 1 and len(doc) == 1 and doc.chunks.k[0].shape[1] == 2  # anchor + the token
    doc.save(tmp_path / "one.cache")
    loaded = dllm.DocumentCache.load(tmp_path / "one.cache", dream)
    assert torch.equal(loaded.chunks.context_ids(0), ctx) and torch.equal(loaded.chunks.k[0], doc.chunks.k[0])


def test_a_document_s_own_snap_serves_a_question_without_a_config():
    """With no config, the checkpoint's defaults were taken with the document's C but the checkpoint's snap: a
    document encoded with another snap was refused, the error naming a PrefillingConfig that was never passed."""
    model = dllm.load_model()  # the bundled model: its prefilling_config.json snaps within 64 tokens
    text = "The grass is green. The sky is blue. " * 40 + "The pass key is 71432. Remember it. " + "Here we go. " * 60
    parts = dllm.PromptParts(
        dllm.encode_text(model, "A pass key is hidden below.\n\n", bos=True),
        dllm.encode_text(model, text),
        dllm.encode_text(model, "\n\nWhat is the pass key? The pass key is "),
    )
    fixed = dllm.PrefillingConfig.from_pretrained(model.model_dir, boundary_snap=0)
    doc = dllm.encode_document(model, parts.context, prefilling=fixed)
    asked = dllm.PromptParts(parts.prefix, None, parts.query)
    out = dllm.generate(model, method="prefilling", prompt=asked, document=doc, gen_length=8)
    want = dllm.generate(model, method="prefilling", prompt=parts, prefilling=fixed, gen_length=8)
    assert (
        torch.equal(out.tokens, want.tokens)
        and out.stats.extra["selected_chunks"] == want.stats.extra["selected_chunks"]
    )
