"""What the CLI notes or does, Python does too: ``warnings`` from the library in the CLI's words (shown once by the
CLI), and ``decode_text`` takes the ids ``encode_text`` gives.

A prompt whose answer reaches past the model's trained positions, and characters the tokenizer cannot encode,
used to be silent in Python (the CLI alone noted them).
"""

import shlex
import warnings

import pytest
import torch

import dllm
from dllm import PromptParts, encode_text
from dllm.cli.parser import main
from dllm.generate import PositionWindowWarning
from dllm.model.tokenization import UnencodableCharactersWarning


@pytest.fixture(scope="module")
def model():
    return dllm.load_model()


def test_encode_text_warns_of_characters_it_drops(model):
    said = r"2 character\(s\) .* '€' \(U\+20AC\) x1, 'é' \(U\+00E9\) x1"
    with pytest.warns(UnencodableCharactersWarning, match=said):
        ids = encode_text(model, "€25,000 paid to Dupré")
    assert ids.numel() == len("25,000 paid to Dupr")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        encode_text(model, "plain ASCII, and a newline\n")


def test_generate_warns_past_the_trained_window(model):
    limit = model.config.trained_positions
    prompt = torch.randint(10, 90, (1, limit - 40))
    with pytest.warns(PositionWindowWarning, match=f"reach position {limit - 40 + 64}, past the model's {limit}"):
        dllm.generate(model, prompt, gen_length=64, steps=4, block_length=64)
    context = encode_text(model, "abc " * 1000)
    parts = PromptParts(encode_text(model, "Read:", bos=True), context, encode_text(model, "?"))
    with pytest.warns(PositionWindowWarning, match="prefix, kept chunks and query"):
        dllm.generate(model, method="prefilling", prompt=parts, gen_length=1024, steps=32, block_length=32)
    with warnings.catch_warnings():  # inside the window: silent
        warnings.simplefilter("error")
        dllm.generate(model, prompt[:, :100], gen_length=64, steps=4, block_length=64)


def test_the_cli_notes_once_without_the_python_warning(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "doc.txt").write_text("The pass key is 12345. Dupré paid €3. " * 20)
    rc = main(shlex.split("generate --context-file doc.txt --question 'What is the pass key?' --gen-length 8"))
    err = capsys.readouterr().err
    assert rc == 0 and "Warning" not in err
    assert err.count("cannot encode") == 1  # the CLI's note on the context, not a second one from encode_text


def test_decode_text_takes_what_encode_text_gives(model):
    """``decode_text(model, encode_text(model, t))`` was "TypeError: 'int' object is not iterable"."""
    ids = encode_text(model, "The pass key is 12345.")
    assert dllm.decode_text(model, ids) == "The pass key is 12345."
    assert dllm.decode_text(model, ids[None]) == ["The pass key is 12345."]
    with pytest.raises(ValueError, match=r"\[L\] or \[B, L\]"):
        dllm.decode_text(model, ids[None, None])
