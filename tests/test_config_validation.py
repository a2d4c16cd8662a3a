"""A checkpoint whose config.json or safetensors index is wrong fails with an error naming the field or
file, before any memory is allocated, never with a crash deep inside or a model whose logits are NaN."""

from __future__ import annotations

import json
import time

import pytest
import torch
from safetensors.torch import load_file, save_file

import dllm
from dllm.model.config import ConfigError
from dllm.model.weights import WeightError
from tests.tiny_checkpoints import small_config, write_dream_checkpoint, write_llada_checkpoint

# the sizes of a valid Dream config built directly (small_config adds Dream's bias and shifted logits, theta 1e4)
_TINY_FIELDS = dict(
    vocab_size=10, hidden_size=8, intermediate_size=8, num_layers=1, num_heads=2, num_kv_heads=1, head_dim=4,
    mask_token_id=3,
)  # fmt: skip


@pytest.fixture(scope="module")
def dream_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("dream_cfg")
    write_dream_checkpoint(str(path))
    return path


def _with_config(src, dst, **changes):
    """A copy of checkpoint ``src`` in ``dst`` whose config.json has ``changes`` (None deletes a key)."""
    import shutil

    shutil.copytree(src, dst)
    cfg = json.loads((dst / "config.json").read_text())
    for k, v in changes.items():
        if v is None:
            cfg.pop(k, None)
        else:
            cfg[k] = v
    (dst / "config.json").write_text(json.dumps(cfg))  # json writes float("inf") as Infinity
    return str(dst)


@pytest.mark.parametrize(
    "changes, field",
    [
        (dict(num_attention_heads=0), "num_attention_heads"),
        (dict(num_attention_heads=-2), "num_attention_heads"),
        (dict(num_hidden_layers=1e9), "num_hidden_layers"),  # a float in JSON
        (dict(hidden_size=112.5), "hidden_size"),
        (dict(rope_theta="1e6"), "rope_theta"),
        (dict(rope_scaling={"rope_type": "yarn", "factor": 4.0, "beta_fast": -1}), "rope_scaling.beta_fast"),
        (dict(vocab_size=True), "vocab_size"),
        (dict(num_key_value_heads="2"), "num_key_value_heads"),
        (dict(rms_norm_eps=0), "rms_norm_eps"),
        (dict(rms_norm_eps=-1e-6), "rms_norm_eps"),
        (dict(rope_theta=float("inf")), "rope_theta"),
        (dict(rope_theta=0), "rope_theta"),
        (dict(rope_scaling={"rope_type": "linear", "factor": 0}), "rope_scaling.factor"),
        (dict(rope_scaling={"rope_type": "linear", "factor": -2.0}), "rope_scaling.factor"),
        (dict(rope_scaling={"rope_type": "yarn", "factor": float("inf")}), "rope_scaling.factor"),
        (dict(mask_token_id=-1), "mask_token_id"),
    ],
)
def test_bad_config_fields_are_config_errors_naming_the_field(dream_dir, tmp_path, changes, field):
    path = _with_config(dream_dir, tmp_path / "ckpt", **changes)
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        dllm.load_model(path)


def test_real_world_config_spellings_still_load(dream_dir, tmp_path):
    """What exporters write and transformers accepts: integral floats, a list of EOS ids, pad -1, mscale 0."""
    path = _with_config(
        dream_dir,
        tmp_path / "ckpt",
        max_position_embeddings=131072.0,
        hidden_size=112.0,
        eos_token_id=[127, 128],
        pad_token_id=-1,
        rope_scaling={
            "rope_type": "yarn",
            "factor": 2.0,
            "original_max_position_embeddings": 4096,
            "mscale_all_dim": 0,
        },
    )
    cfg = dllm.load_model(path).config
    assert (cfg.max_position_embeddings, cfg.hidden_size, cfg.eos_token_id, cfg.pad_token_id) == (
        131072,
        112,
        127,
        None,
    )


def test_layer_count_is_checked_against_the_checkpoint_before_building(dream_dir, tmp_path):
    # 10**9 layers would take hours (and all memory) to build, even on the meta device.
    path = _with_config(dream_dir, tmp_path / "ckpt", num_hidden_layers=10**9)
    t0 = time.perf_counter()
    with pytest.raises(ConfigError, match=r"num_hidden_layers=1000000000 but the checkpoint's tensors hold 2 layer"):
        dllm.load_model(path)
    assert time.perf_counter() - t0 < 5


def test_llada_layer_count_names_its_own_field(tmp_path):
    write_llada_checkpoint(str(tmp_path))
    cfg = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps(dict(cfg, n_layers=5)))
    with pytest.raises(ConfigError, match=r"n_layers=5 but the checkpoint's tensors hold 3 layer"):
        dllm.load_model(str(tmp_path))


def test_huge_vocab_is_a_shape_error_before_allocation(dream_dir, tmp_path):
    # 10**11 x 112 fp32 rows would be 45 TB: the headers' shapes are compared before to_empty.
    path = _with_config(dream_dir, tmp_path / "ckpt", vocab_size=10**11)
    with pytest.raises(WeightError, match="shape mismatch"):
        dllm.load_model(path)


def test_model_config_rejects_bad_values_when_built_directly():
    small_config("dream", **_TINY_FIELDS)  # the valid one builds
    for key, value in [("rms_norm_eps", 0.0), ("rope_theta", float("nan")), ("num_layers", 2.5), ("num_heads", True)]:
        with pytest.raises(ConfigError, match=key):
            small_config("dream", **{**_TINY_FIELDS, key: value})


def _sharded(tmp_path):
    write_dream_checkpoint(str(tmp_path), shards=2)
    return tmp_path / "model.safetensors.index.json"


@pytest.mark.parametrize(
    "index, message",
    [
        ([1, 2], "must hold a JSON object, got a JSON array"),
        ({"metadata": {}}, "no 'weight_map'"),
        ({"weight_map": ["a", "b"]}, "'weight_map' that is a list"),
        ({"weight_map": {"model.norm.weight": 7}}, "are not file names"),
    ],
)
def test_malformed_index_is_a_weight_error(tmp_path, index, message):
    path = _sharded(tmp_path)
    path.write_text(json.dumps(index))
    with pytest.raises(WeightError, match=message):
        dllm.load_model(str(tmp_path))


def test_tensor_in_two_shards_names_both(tmp_path):
    _sharded(tmp_path)
    a, b = "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"
    ta, tb = load_file(str(tmp_path / a)), load_file(str(tmp_path / b))
    name = next(iter(ta))
    tb[name] = ta[name].clone()
    save_file(tb, str(tmp_path / b))
    with pytest.raises(WeightError, match=rf"{name}.*stored twice: in {a} and in {b}"):
        dllm.load_model(str(tmp_path))


def test_integer_weights_are_a_weight_error(dream_dir, tmp_path):
    import shutil

    shutil.copytree(dream_dir, tmp_path / "ckpt")
    path = tmp_path / "ckpt" / "model.safetensors"
    t = load_file(str(path))
    t["model.norm.weight"] = torch.ones_like(t["model.norm.weight"], dtype=torch.int32)
    save_file(t, str(path))
    with pytest.raises(WeightError, match="model.norm.weight.*dtype I32.*floating point"):
        dllm.load_model(str(tmp_path / "ckpt"))


def test_trained_positions_include_a_static_rope_scaling_factor():
    base = dict(_TINY_FIELDS, max_position_embeddings=64)
    assert small_config("dream", **base).trained_positions == 64
    yarn = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64}
    assert small_config("dream", **base, rope_scaling=yarn).trained_positions == 256
    assert small_config("dream", **base, rope_scaling={"rope_type": "linear", "factor": 2.0}).trained_positions == 128
    assert small_config("dream", **dict(base, max_position_embeddings=None)).trained_positions is None
