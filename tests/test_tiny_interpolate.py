"""bench.tiny.interpolate (WiSE-FT weight interpolation): values against hand-computed blends, the files it
writes, a checkpoint that loads and reads like its input, and clear errors."""

import hashlib
import json
import os

import pytest
import torch
from safetensors.torch import load_file, save_file

import dllm
from bench.tiny import interpolate

BUNDLED = os.path.join(os.path.dirname(dllm.__file__), "assets", "tiny-dream")


def test_blend_matches_hand_computed_values():
    base = {"w": torch.tensor([[0.0, 2.0], [4.0, -8.0]]), "b": torch.tensor([1.0, 1.0], dtype=torch.bfloat16)}
    tuned = {"w": torch.tensor([[4.0, 2.0], [0.0, 8.0]]), "b": torch.tensor([3.0, -1.0], dtype=torch.bfloat16)}
    out = interpolate.interpolate_state(base, tuned, 0.25)
    assert torch.equal(out["w"], torch.tensor([[1.0, 2.0], [3.0, -4.0]]))
    assert torch.equal(out["b"], torch.tensor([1.5, 0.5])) and out["b"].dtype == torch.float32
    assert torch.equal(interpolate.interpolate_state(base, tuned, 0.0)["w"], base["w"])
    assert torch.equal(interpolate.interpolate_state(base, tuned, 1.0)["w"], tuned["w"])


@pytest.mark.parametrize(
    "tuned, alpha, message",
    [
        ({"w": torch.zeros(2)}, 1.5, "alpha must be in"),
        ({"w": torch.zeros(2)}, float("nan"), "alpha must be in"),
        ({"v": torch.zeros(2)}, 0.5, "different tensors"),
        ({"w": torch.zeros(3)}, 0.5, "shape"),
        ({"w": torch.zeros(2, dtype=torch.int64)}, 0.5, "not a floating"),
    ],
)
def test_bad_inputs_raise(tuned, alpha, message):
    with pytest.raises(ValueError, match=message):
        interpolate.interpolate_state({"w": torch.ones(2)}, tuned, alpha)


def test_checkpoint_blend_of_the_bundled_weights_with_a_shifted_copy(tmp_path):
    """Tuned = bundled + 1 on every weight, alpha 0.5: each written tensor is bundled + 0.5, the other files are
    the tuned folder's, and interpolation.json names alpha and both inputs' sha256."""
    tuned = tmp_path / "tuned"
    tuned.mkdir()
    for name in os.listdir(BUNDLED):
        if name != "model.safetensors":
            (tuned / name).write_bytes(open(os.path.join(BUNDLED, name), "rb").read())
    bundled = load_file(os.path.join(BUNDLED, "model.safetensors"))
    save_file({k: v + 1.0 for k, v in bundled.items()}, str(tuned / "model.safetensors"))
    out = tmp_path / "mid"
    assert interpolate.main(["--base", BUNDLED, "--tuned", str(tuned), "--alpha", "0.5", "--out", str(out)]) == 0
    mid = load_file(str(out / "model.safetensors"))
    assert set(mid) == set(bundled)
    for k, v in bundled.items():
        torch.testing.assert_close(mid[k], v.float() + 0.5, rtol=0, atol=1e-6)
    assert (out / "config.json").read_bytes() == (tuned / "config.json").read_bytes()
    record = json.loads((out / "interpolation.json").read_text())
    assert record["alpha"] == 0.5
    bundled_bytes = open(os.path.join(BUNDLED, "model.safetensors"), "rb").read()
    assert record["base_sha256"] == hashlib.sha256(bundled_bytes).hexdigest()
    assert record["tuned_sha256"] == hashlib.sha256((tuned / "model.safetensors").read_bytes()).hexdigest()


def test_alpha_zero_loads_and_reads_like_the_bundled_model(tmp_path):
    out = tmp_path / "same"
    assert interpolate.main(["--base", BUNDLED, "--tuned", BUNDLED, "--alpha", "0", "--out", str(out)]) == 0
    ref, got = dllm.load_model(device="cpu"), dllm.load_model(str(out), device="cpu")
    ids = dllm.encode_text(ref, "The pass key is 40213. Remember it. What is the pass key?")[None]
    pos = torch.arange(ids.shape[1])
    torch.testing.assert_close(got(ids, pos).logits, ref(ids, pos).logits, rtol=0, atol=0)


def test_cli_errors_are_one_line_and_exit_2(tmp_path, capsys):
    assert interpolate.main(["--base", BUNDLED, "--tuned", BUNDLED, "--alpha", "2", "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: alpha must be in") and err.count("\n") == 1
    assert interpolate.main(["--base", str(tmp_path), "--tuned", BUNDLED, "--alpha", "0.5", "--out", "y"]) == 2
    assert "error: no model.safetensors in" in capsys.readouterr().err
    assert interpolate.main(["--base", BUNDLED, "--tuned", BUNDLED, "--alpha", "0.5", "--out", BUNDLED]) == 2
    assert "must be a new folder" in capsys.readouterr().err
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json}      ")
    args = ["--base", BUNDLED, "--tuned", str(bad), "--alpha", "0.5", "--out", str(tmp_path / "z")]
    assert interpolate.main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "bad/model.safetensors is not a readable safetensors file" in err
    assert err.count("\n") == 1 and not (tmp_path / "z").exists()
