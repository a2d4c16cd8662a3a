"""A document cache's identity (weights and tokenizer) and the Python API around it, on the bundled model.

The passkey document of the README: a cache accepted by a model whose weights or tokenizer differ from
those that encoded it answers '17432' where a fresh run answers '71432'.
"""

import json
import shutil

import pytest
import torch

import dllm
from dllm import PromptParts, encode_text
from dllm.model.loader import default_model_dir
from dllm.prefilling import PrefillingConfig

NOISE = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. "
DOCUMENT = NOISE * 4 + "The pass key is 71432. Remember it. 71432 is the pass key. " + NOISE * 4


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """The bundled model's cache of :data:`DOCUMENT`, saved once: its path."""
    path = tmp_path_factory.mktemp("identity") / "doc.cache"
    model = dllm.load_model(device="cpu")
    dllm.encode_document(model, encode_text(model, DOCUMENT)).save(path)
    return path


def _ids(model, text):
    (i,) = encode_text(model, text).tolist()
    return i


def test_rows_swapped_in_place_are_other_weights(saved):
    """Swapping the embedding rows of '7' and '1' keeps every per-tensor sum of bits: the cached digest
    must still notice (through the parameter, and through ``.data``, which bumps no version counter)."""
    model = dllm.load_model(device="cpu")
    dllm.DocumentCache.load(saved, model)  # the digest is now cached on the model
    w = model.embed_tokens.weight
    a, b = _ids(model, "7"), _ids(model, "1")
    with torch.no_grad():
        row = w[a].clone()
        w[a] = w[b]
        w[b] = row
    with pytest.raises(ValueError, match="model_weights mismatch.*model weights differ"):
        dllm.DocumentCache.load(saved, model)
    with torch.no_grad():  # swapped back: the same weights, the cache loads again
        row = w[a].clone()
        w[a] = w[b]
        w[b] = row
    dllm.DocumentCache.load(saved, model)
    q = model.layers[0].self_attn.q_proj.weight
    before = q._version
    q.data[[0, 1], 2] = q.data[[1, 0], 2]  # two elements of one column swapped, no version bump
    assert q._version == before
    with pytest.raises(ValueError, match="model_weights mismatch"):
        dllm.DocumentCache.load(saved, model)


def test_the_digest_of_a_model_loaded_in_inference_mode(saved):
    """Inference tensors track no version counter: the digest's key must not need one."""
    with torch.inference_mode():
        model = dllm.load_model(device="cpu")
        assert model.embed_tokens.weight.is_inference()
        dllm.DocumentCache.load(saved, model)
        w = model.embed_tokens.weight
        a, b = _ids(model, "7"), _ids(model, "1")
        w[[a, b]] = w[[b, a]]
        with pytest.raises(ValueError, match="model_weights mismatch"):
            dllm.DocumentCache.load(saved, model)


def _swapped_tokenizer(folder, a: str, b: str):
    """A copy of the bundled tokenizer with the ids of tokens ``a`` and ``b`` swapped (same weights, config)."""
    folder.mkdir()
    src = default_model_dir()
    shutil.copy(f"{src}/tokenizer_config.json", folder)
    tok = json.load(open(f"{src}/tokenizer.json", encoding="utf-8"))
    vocab = tok["model"]["vocab"]
    vocab[a], vocab[b] = vocab[b], vocab[a]
    json.dump(tok, open(folder / "tokenizer.json", "w", encoding="utf-8"))
    return folder


def test_a_cache_of_another_tokenizer_is_refused(saved, tmp_path):
    alt = _swapped_tokenizer(tmp_path / "alt", "7", "1")
    swapped = dllm.load_model(device="cpu", tokenizer_path=str(alt))
    assert encode_text(swapped, "7").tolist() == encode_text(dllm.load_model(device="cpu"), "1").tolist()
    with pytest.raises(ValueError, match="tokenizer mismatch: .*the model's tokenizer differs"):
        dllm.DocumentCache.load(saved, swapped)
    # the identity is the tokenizer's content, not where it was loaded from
    same = tmp_path / "same"
    same.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(f"{default_model_dir()}/{name}", same)
    doc = dllm.DocumentCache.load(saved, dllm.load_model(device="cpu", tokenizer_path=str(same)))
    # a cache loaded with the right model refuses to answer once the model's tokenizer is replaced
    model = dllm.load_model(device="cpu")
    doc = dllm.DocumentCache.load(saved, model)
    model.tokenizer = swapped.tokenizer
    query = PromptParts(encode_text(model, "Text:\n", bos=True), None, encode_text(model, "The pass key is "))
    with pytest.raises(ValueError, match="tokenizer mismatch"):
        dllm.generate(model, method="prefilling", prompt=query, document=doc, gen_length=8)


def test_a_tokenizer_changed_in_place_is_another_tokenizer(saved):
    """A normaliser replaced on the loaded tokenizer (same object, same length) maps
    '7' to '1' while the cached digest stayed; the cache must be refused, as a fresh process would."""
    from tokenizers import normalizers

    model = dllm.load_model(device="cpu")
    dllm.DocumentCache.load(saved, model)  # the tokenizer digest is now cached on the model
    model.tokenizer.backend_tokenizer.normalizer = normalizers.Replace("7", "1")
    assert encode_text(model, "7").tolist() == encode_text(model, "1").tolist()
    with pytest.raises(ValueError, match="tokenizer mismatch"):
        dllm.DocumentCache.load(saved, model)


def test_load_without_the_model_says_it_needs_it(saved):
    with pytest.raises(TypeError, match=r"DocumentCache.load\(path, model\) needs the model"):
        dllm.DocumentCache.load(saved)


def test_a_config_over_the_checkpoints_defaults_answers_from_a_default_document(saved):
    """``PrefillingConfig(top_k=2)`` starts from the paper's C=1024: the mismatch error says how to change one
    setting over the checkpoint's defaults, and that way (the README's) answers from the document."""
    model = dllm.load_model(device="cpu")
    doc = dllm.DocumentCache.load(saved, model)
    parts = PromptParts(
        encode_text(model, "There is a pass key hidden in the text below.\n\n", bos=True),
        None,
        encode_text(model, "\n\nWhat is the pass key? The pass key is "),
    )
    kw = dict(method="prefilling", prompt=parts, document=doc, gen_length=8)
    with pytest.raises(ValueError, match=r"chunk_size mismatch.*asks for 1024.*PrefillingConfig.from_pretrained\("):
        dllm.generate(model, prefilling=PrefillingConfig(top_k=2), **kw)
    cfg = PrefillingConfig.from_pretrained(model.model_dir, top_k=2)
    assert cfg.chunk_size == doc.chunk_size and cfg.top_k == 2
    out = dllm.generate(model, prefilling=cfg, **kw)
    assert len(out.stats.extra["selected_chunks"]) == 2


def test_the_readme_shows_the_model_argument_and_from_pretrained():
    from tests.test_readme import blocks

    (python,) = [b for b in blocks("python") if "DocumentCache" in b]
    assert "DocumentCache.load(path, model)" in python
    assert "PrefillingConfig.from_pretrained(model.model_dir, " in python


def test_texts_seen_before_a_tokenizer_change_are_tokenized_again(saved, tmp_path):
    """The ids of texts encoded before a normaliser was replaced were served from the memo (a
    cache built then carried the new digest over old ids), and a same-type, same-size model with another id
    mapping kept the old digest, so an old cache loaded."""
    from tokenizers import normalizers

    model = dllm.load_model(device="cpu")
    before = encode_text(model, DOCUMENT)  # now in the memo
    model.tokenizer.backend_tokenizer.normalizer = normalizers.Replace("7", "1")
    after = encode_text(model, DOCUMENT)
    fresh = torch.tensor(model.tokenizer(DOCUMENT, add_special_tokens=False)["input_ids"])
    assert torch.equal(after, fresh) and not torch.equal(after, before)
    # the model swapped for one of the same type and size whose '7' and '1' trade ids
    model = dllm.load_model(device="cpu")
    dllm.DocumentCache.load(saved, model)  # the tokenizer digest is now cached on the model
    swapped = _swapped_tokenizer(tmp_path / "alt", "7", "1")
    other = dllm.load_model(device="cpu", tokenizer_path=str(swapped)).tokenizer.backend_tokenizer.model
    model.tokenizer.backend_tokenizer.model = other
    assert encode_text(model, "7").tolist() == [_ids(dllm.load_model(device="cpu"), "1")]
    with pytest.raises(ValueError, match="tokenizer mismatch"):
        dllm.DocumentCache.load(saved, model)
