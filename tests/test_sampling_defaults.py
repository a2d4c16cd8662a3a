"""What differs from the official Dream loop at the defaults, pinned (README, real checkpoints; ``generate``).

The official ``diffusion_generate`` under transformers 4.46 inherits ``top_k=50`` from the model
config although Dream's ``generation_config.json`` says ``top_k: null``; ``dllm.generate`` follows
the checkpoint's file: no top-k filtering unless ``top_k`` is given.
"""

import pytest
import torch

import dllm


@pytest.fixture(scope="module")
def tiny():
    return dllm.load_model()


def _sample(model, seed, **kw):
    ids = dllm.encode_text(model, "The sky is blue. The grass is ", bos=True)[None]
    return dllm.generate(model, ids, gen_length=16, steps=16, alg="origin", temperature=2.0, seed=seed, **kw).tokens


def test_default_is_no_top_k_filtering_and_top_k_50_changes_the_draws(tiny):
    vocab = tiny.config.vocab_size
    assert vocab > 50  # so that top_k=50 removes tokens
    differs = 0
    for seed in range(4):
        default = _sample(tiny, seed)
        assert torch.equal(default, _sample(tiny, seed, top_k=vocab))  # the default filters nothing
        assert torch.equal(default, _sample(tiny, seed))  # same seed, same draws
        differs += not torch.equal(default, _sample(tiny, seed, top_k=50))
    assert differs >= 1  # at temperature 2, 50 of ~100 tokens is a real filter


def test_checkpoint_generation_config_has_no_top_k():
    """The Dream checkpoint's own generation config (vendored) says top_k null: the value we follow."""
    import json

    from tests.tiny_checkpoints import reference_file

    with open(reference_file("dream-v0-7b", "generation_config.json")) as f:
        gen = json.load(f)
    assert gen.get("top_k") is None
