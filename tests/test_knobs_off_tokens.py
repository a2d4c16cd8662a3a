"""The selection knobs (boundary snapping, redundancy-aware top-K, the first stage) off reproduce the tokens of
the code before they existed.

``tests/data/tokens_before_selection_knobs.json`` holds the tokens and kept chunks that the code at commit 86494fc (the
parent of the commit that added ``boundary_snap``, ``redundancy_threshold`` and ``candidates``) decoded with
today's bundled weights, for two 6K-token passkey prompts (stored as text: the bundled tokenizer is
character-level) under the paper's configuration (``PrefillingConfig()``), the paper's scores at C=256, and
the bundled defaults with snapping off. The expected values come from that older implementation, run
separately; this test decodes the same prompts with today's code.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path

import pytest
import torch

import dllm
from dllm.model.loader import default_model_dir
from dllm.model.tokenization import encode_text
from dllm.prefilling import PrefillingConfig, PromptParts

DATA = json.loads((Path(__file__).parent / "data" / "tokens_before_selection_knobs.json").read_text())


@pytest.fixture(scope="module")
def tiny():
    weights = Path(default_model_dir()) / "model.safetensors"
    sha = hashlib.sha256(weights.read_bytes()).hexdigest()
    assert sha == DATA["weights_sha256"], (
        "the bundled weights changed: regenerate tests/data/tokens_before_selection_knobs.json with the code of "
        f"commit {DATA['code_commit']} and the new weights"
    )
    return dllm.load_model(device="cpu")


def test_bundled_defaults_with_snap_off_are_the_recorded_configuration():
    bundled = PrefillingConfig.from_pretrained(default_model_dir())
    recorded = PrefillingConfig(**{**DATA["configs"]["bundled_snap_off"], "score_terms": ("draft_contrast",)})
    # the first stage the bundled file turns on (candidates="auto") is off in the recorded one too,
    # and so are the lexical term (lexical_weight) and adaptive K (a fixed K of 4)
    off = dataclasses.replace(
        bundled, boundary_snap=0, candidates=None, candidate_layer=None, lexical_weight=0.0, adaptive_k=None
    )
    assert off == recorded


@pytest.mark.parametrize("name", sorted(DATA["configs"]))
@pytest.mark.parametrize("i", range(len(DATA["prompts"])))
def test_knobs_off_decode_the_tokens_of_the_code_before_them(tiny, name, i):
    fields = dict(DATA["configs"][name])
    if "score_terms" in fields:
        fields["score_terms"] = tuple(fields["score_terms"])
    # the three knobs spelled out in their off state: the defaults must be exactly that
    cfg = PrefillingConfig(**fields, boundary_snap=0, redundancy_threshold=None, candidates=None)
    assert cfg == PrefillingConfig(**fields)
    p = DATA["prompts"][i]
    parts = PromptParts(
        encode_text(tiny, p["prefix"], bos=True), encode_text(tiny, p["context"]), encode_text(tiny, p["query"])
    )
    res = dllm.generate(
        tiny, method="prefilling", prompt=parts, prefilling=cfg, gen_length=DATA["gen_length"], steps=DATA["steps"]
    )
    want = DATA["expected"][f"{name}/{i}"]
    assert res.stats.extra["selected_chunks"] == want["kept"]
    assert torch.equal(res.tokens[0], torch.tensor(want["tokens"]))
