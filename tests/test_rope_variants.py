"""RoPE variants from a checkpoint's config.json, against transformers' own models with the same config.

The tiny checkpoints carry ``max_position_embeddings = 64`` (the "original" window) and the
sequences run past it, to position 199, where the variants differ from plain RoPE. Reference:
transformers' Qwen2ForCausalLM / LlamaForCausalLM, bidirectional, fp32, built from the same
``rope_scaling`` (so on 4.46.3 and on 5.x the reference follows that version's own formulas).
"""

import json

import pytest
import torch

import dllm
from dllm.decode.timer import PhaseTimer
from dllm.model.config import ConfigError, load_config
from dllm.model.kv_cache import StaticKVCache
from dllm.model.rope import apply_rope, rope_cos_sin, rotate_keys, scaled_inv_frequencies
from dllm.prefilling import PrefillingConfig, PromptParts, build_prefilling_policy
from tests.tiny_checkpoints import hf_bidirectional_logits, hf_dream, write_dream_checkpoint, write_llada_checkpoint

pytestmark = pytest.mark.compat

WINDOW = 64  # original_max_position_embeddings of the tiny checkpoints
SCALINGS = {
    "linear": {"rope_type": "linear", "factor": 4.0},
    "linear_legacy_key": {"type": "linear", "factor": 2.0},  # older configs say "type"
    "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": WINDOW},
    "llama3": {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": WINDOW,
    },
}


def _ids(vocab, n, seed=3):
    return torch.randint(0, vocab - 3, (1, n), generator=torch.Generator().manual_seed(seed))


def _dream(tmp_path, scaling, seed=0, **over):
    hf = write_dream_checkpoint(
        str(tmp_path), seed=seed, rope_scaling=scaling, max_position_embeddings=WINDOW, rope_theta=10000.0, **over
    )
    return hf, dllm.load_model(str(tmp_path), device="cpu", dtype=torch.float32)


@pytest.mark.parametrize("name", sorted(SCALINGS))
def test_dream_rope_scaling_logits_equal_transformers_qwen2(tmp_path, name):
    hf, model = _dream(tmp_path, SCALINGS[name])
    assert model.config.rope_scaling == SCALINGS[name] and model.config.rope_theta == 10000.0
    n = 200  # > 3x the 64-position window
    ids = _ids(model.config.vocab_size, n)
    with torch.no_grad():
        ref = hf_bidirectional_logits(hf, ids)
        ours = model(ids, torch.arange(n)).logits
    ref = torch.cat([ref[:, :1], ref[:, :-1]], dim=1)  # Dream's shift
    assert (ours - ref).abs().max().item() <= 1e-4
    # the variant matters at these positions: plain RoPE gives other logits
    plain = hf_dream(0, rope_theta=10000.0, max_position_embeddings=WINDOW)  # same weights, plain RoPE
    with torch.no_grad():
        base = hf_bidirectional_logits(plain, ids)
    assert (torch.cat([base[:, :1], base[:, :-1]], dim=1) - ref).abs().max().item() > 1e-3  # 10x the tolerance


def test_yarn_attention_factor_is_applied(tmp_path):
    """YaRN scales cos/sin by 0.1 ln(factor) + 1 (Peng et al. 2023), here 0.1 ln 4 + 1."""
    _, model = _dream(tmp_path, SCALINGS["yarn"])
    assert model.rope.rope_type == "yarn"
    assert model.rope.attention_factor == pytest.approx(0.1 * torch.log(torch.tensor(4.0)).item() + 1.0)
    cos, sin = model.rope.cos_sin(torch.arange(5))
    assert (cos**2 + sin**2).sqrt().sub(model.rope.attention_factor).abs().max().item() < 1e-6


def test_rope_theta_override_equals_transformers_llama_with_that_theta(tmp_path):
    """LongLLaDA-style static NTK: a larger base, here 4x, must equal Llama built with that base."""
    write_llada_checkpoint(str(tmp_path), seed=5)  # rope_theta 500000 in its config.json
    hf = write_llada_checkpoint(str(tmp_path / "ref"), seed=5, rope_theta=2_000_000.0)
    model = dllm.load_model(str(tmp_path), device="cpu", dtype=torch.float32, rope_theta=2_000_000.0)
    assert model.config.rope_theta == 2_000_000.0
    ids = _ids(97, 150)
    with torch.no_grad():
        ref = hf_bidirectional_logits(hf, ids)
        ours = model(ids, torch.arange(150)).logits
    assert (ours - ref).abs().max().item() <= 1e-4
    # the override changed something (the checkpoint's own theta gives other logits)
    default = dllm.load_model(str(tmp_path), device="cpu", dtype=torch.float32)
    with torch.no_grad():
        assert (default(ids, torch.arange(150)).logits - ref).abs().max().item() > 1e-3


def test_rope_theta_override_with_yarn(tmp_path):
    """The override is the base the scaling function reads too."""
    hf_ref = write_dream_checkpoint(
        str(tmp_path / "ref"), rope_scaling=SCALINGS["yarn"], max_position_embeddings=WINDOW, rope_theta=40000.0
    )
    write_dream_checkpoint(
        str(tmp_path / "ck"), rope_scaling=SCALINGS["yarn"], max_position_embeddings=WINDOW, rope_theta=10000.0
    )
    model = dllm.load_model(str(tmp_path / "ck"), device="cpu", dtype=torch.float32, rope_theta=40000.0)
    ids = _ids(131, 120)
    with torch.no_grad():
        ref = hf_bidirectional_logits(hf_ref, ids)
        ours = model(ids, torch.arange(120)).logits
    assert (ours - torch.cat([ref[:, :1], ref[:, :-1]], dim=1)).abs().max().item() <= 1e-4


@pytest.mark.parametrize("name", ["yarn", "linear", "llama3"])
def test_rotate_keys_under_scaling_equals_encoding_at_shifted_positions(tmp_path, name):
    """Re-positioning cached keys is a pure rotation with the scaled inv_freq (no attention factor)."""
    _, model = _dream(tmp_path, SCALINGS[name])
    ids = _ids(131, 13)
    for delta in (1, 37, 500, 4096):
        with torch.no_grad():
            local = model(ids, torch.arange(13), return_kv=True, logits_start=13)
            moved = model(ids, torch.arange(delta, delta + 13), return_kv=True, logits_start=13)
        for k0, k1 in zip(local.k, moved.k):
            assert (model.rope.rotate_keys(k0, delta) - k1).abs().max().item() < 2e-5
            # the functional form with the same frequencies agrees
            got = rotate_keys(k0, delta, model.config.rope_theta, inv_freq=model.rope.inv_freq)
            assert (got - k1).abs().max().item() < 2e-5
    if name == "yarn":  # guard: folding YaRN's factor into the rotation (applied twice) is detectably wrong
        k0 = local.k[0]
        cos, sin = rope_cos_sin(
            torch.full(k0.shape[:-2], 4096), k0.shape[-1], 1.0, inv_freq=model.rope.inv_freq, attention_factor=1.1386
        )
        assert (apply_rope(k0, cos, sin) - moved.k[0]).abs().max().item() > 1e-2
        # and so is rotating with the plain frequencies
        assert (rotate_keys(k0, 4096, model.config.rope_theta) - moved.k[0]).abs().max().item() > 1e-2


def test_prefilling_under_yarn_equals_chunk_encoded_at_its_final_positions(tmp_path):
    """The pipeline encodes BOS + chunk at local positions 0.. and rotates the cached keys to their place
    after the prefix (continuous mode); under YaRN that must equal encoding the chunk at those positions.
    Reference: the prefix and the anchored chunk each encoded alone at their final positions, as a two-segment
    StaticKVCache, with the live query + response after them."""
    _, model = _dream(tmp_path, SCALINGS["yarn"], seed=4)
    g = torch.Generator().manual_seed(0)
    bos = 128
    prefix = torch.cat([torch.tensor([bos]), torch.randint(0, 120, (40,), generator=g)])
    parts = PromptParts(prefix, torch.randint(0, 120, (60,), generator=g), torch.randint(0, 120, (5,), generator=g))
    cfg = PrefillingConfig(chunk_size=64, top_k=1, position_mode="continuous")
    setup = build_prefilling_policy(model, None, parts, cfg, PhaseTimer("cpu"), gen_length=6)
    policy, extra = setup.policy, setup.stats()
    assert extra["anchor_token_id"] == bos and extra["selected_chunks"] == [0]

    p, c = prefix.numel(), parts.context.numel()
    chunk = torch.cat([torch.tensor([bos]), parts.context])
    with torch.no_grad():
        pre = model(prefix[None], torch.arange(p), return_kv=True, logits_start=p)
        ch = model(chunk[None], torch.arange(p, p + 1 + c), return_kv=True, logits_start=1 + c)
    t = max(p, 1 + c)
    ks, vs = [], []
    for kp, kc, vp, vc in zip(pre.k, ch.k, pre.v, ch.v):
        kpool, vpool = kp.new_zeros((2, t) + kp.shape[2:]), vp.new_zeros((2, t) + vp.shape[2:])
        kpool[0, :p], kpool[1, : 1 + c], vpool[0, :p], vpool[1, : 1 + c] = kp[0], kc[0], vp[0], vc[0]
        ks.append(kpool)
        vs.append(vpool)
    cache = StaticKVCache(
        ks, vs, torch.tensor([[0, 1]], dtype=torch.int32), torch.tensor([[p, 1 + c]], dtype=torch.int32)
    )
    resp = torch.full((1, 6), model.mask_token_id)
    live = torch.cat([parts.query[None], resp], dim=1)
    q0 = p + 1 + c
    assert q0 > WINDOW  # the query sits past the original window
    with torch.no_grad():
        ref = model(live, torch.arange(q0, q0 + live.shape[1]), cache, logits_start=parts.query.numel()).logits
    policy.prepare(resp, slice(0, 6), 0)
    assert (policy.logits(resp) - ref).abs().max().item() < 1e-4


@pytest.mark.parametrize(
    "scaling, match",
    [
        ({"rope_type": "dynamic", "factor": 2.0}, "'dynamic' is not supported"),
        ({"rope_type": "longrope", "short_factor": [1.0], "long_factor": [2.0]}, "'longrope' is not supported"),
        ({"rope_type": "linear"}, "not a valid 'linear' RoPE scaling"),
        ({"rope_type": "llama3", "factor": 8.0}, "not a valid 'llama3' RoPE scaling"),
        ("linear", "must be a JSON object"),
    ],
)
def test_unsupported_or_incomplete_scaling_is_a_config_error(tmp_path, scaling, match):
    write_dream_checkpoint(str(tmp_path))
    path = tmp_path / "config.json"
    cfg = json.loads(path.read_text())
    path.write_text(json.dumps(dict(cfg, rope_scaling=scaling)))
    with pytest.raises(ConfigError, match=match):
        dllm.load_model(str(tmp_path))


def test_config_fields_read_from_json_not_through_pretrainedconfig(tmp_path):
    """transformers 5.x's PretrainedConfig moves rope_theta/rope_scaling into rope_parameters; we read the
    checkpoint's own fields on every version (the bug: scaling dropped, theta back to the 1e6 default)."""
    write_dream_checkpoint(str(tmp_path), rope_scaling=SCALINGS["linear"], rope_theta=12345.0)
    cfg = load_config(str(tmp_path))
    assert cfg.rope_theta == 12345.0 and cfg.rope_scaling == SCALINGS["linear"]


def test_config_saved_by_transformers_5_with_rope_parameters_only(tmp_path):
    """A config.json in transformers 5.x's layout (rope_parameters, no rope_theta / rope_scaling)."""
    hf = write_dream_checkpoint(str(tmp_path), rope_scaling={"rope_type": "linear", "factor": 2.0}, rope_theta=5000.0)
    path = tmp_path / "config.json"
    cfg = json.loads(path.read_text())
    del cfg["rope_theta"], cfg["rope_scaling"]
    cfg["rope_parameters"] = {"rope_type": "linear", "factor": 2.0, "rope_theta": 5000.0}
    path.write_text(json.dumps(cfg))
    model = dllm.load_model(str(tmp_path), device="cpu", dtype=torch.float32)
    assert model.config.rope_theta == 5000.0 and model.config.rope_scaling == {"rope_type": "linear", "factor": 2.0}
    ids = _ids(131, 90)
    with torch.no_grad():
        ref = hf_bidirectional_logits(hf, ids)
        ours = model(ids, torch.arange(90)).logits
    assert (ours - torch.cat([ref[:, :1], ref[:, :-1]], dim=1)).abs().max().item() <= 1e-4
    # "default" rope_parameters are plain RoPE
    cfg["rope_parameters"] = {"rope_type": "default", "rope_theta": 5000.0}
    path.write_text(json.dumps(cfg))
    assert load_config(str(tmp_path)).rope_scaling is None


def test_linear_inv_freq_by_hand():
    """Linear position interpolation divides every frequency by the factor (Chen et al. 2023)."""
    inv, factor = scaled_inv_frequencies(8, 10000.0, {"rope_type": "linear", "factor": 4.0})
    expect = torch.tensor([1.0, 0.1, 0.01, 0.001], dtype=torch.float64) / 4
    assert factor == 1.0 and torch.allclose(inv, expect, rtol=1e-6)
    plain, factor = scaled_inv_frequencies(8, 10000.0, None)
    assert factor == 1.0 and torch.allclose(plain, expect * 4, rtol=1e-12)
