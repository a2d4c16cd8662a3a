"""dllm.model.json_files: every way a JSON file can be wrong is one error of the caller's type naming the file."""

import pytest

from dllm.model.config import ConfigError
from dllm.model.json_files import parse_json, read_json


@pytest.mark.parametrize(
    "text, reason",
    [
        ("{not json", "Expecting property name"),
        ("", "Expecting value"),
        (b"\xff\xfe\xfa", "not valid JSON"),  # not UTF-8/16/32 text
        ('{"a": ' + "[" * 100_000 + "]" * 100_000 + "}", "nested too deeply"),  # RecursionError in json
        ('{"a": ' + "9" * 5000 + "}", "4300 digits"),  # int() limit: a ValueError that is not a JSONDecodeError
    ],
)
def test_invalid_text_is_the_callers_error_naming_where(text, reason):
    with pytest.raises(ConfigError, match=reason) as e:
        parse_json(text, "ckpt/config.json", ConfigError)
    assert str(e.value).startswith("ckpt/config.json is not valid JSON (")


@pytest.mark.parametrize(
    "text, kind", [("[1, 2]", "array"), ('"x"', "string"), ("3", "number"), ("2.5", "number"), ("null", "null")]
)
def test_a_value_that_is_not_an_object(text, kind):
    with pytest.raises(ValueError, match=rf"^f\.json must hold a JSON object, got a JSON {kind}$"):
        parse_json(text, "f.json")
    assert parse_json(text, "f.json", require_object=False) == __import__("json").loads(text)


def test_a_bom_is_skipped_in_text_and_in_files(tmp_path):
    assert parse_json('\ufeff{"a": 1}', "h") == {"a": 1}
    path = tmp_path / "c.json"
    path.write_bytes(b'\xef\xbb\xbf{"a": [1, 2]}')
    assert read_json(str(path)) == {"a": [1, 2]}
    with pytest.raises(FileNotFoundError):
        read_json(str(tmp_path / "missing.json"))


def test_a_checkpoints_generation_config_that_is_not_an_object_is_an_error(tmp_path):
    """It used to read as {} (no generation defaults) without a word."""
    from dllm.model.config import read_generation_config

    assert read_generation_config(str(tmp_path)) == {}  # absent: no defaults
    (tmp_path / "generation_config.json").write_text("[1, 2]")
    with pytest.raises(ConfigError, match=r"generation_config.json must hold a JSON object, got a JSON array"):
        read_generation_config(str(tmp_path))


@pytest.mark.parametrize("content, reason", [("{oops", "is not valid JSON"), ('["x"]', "must hold a JSON object")])
def test_a_bad_tokenizer_config_is_a_config_error_naming_it(tmp_path, content, reason):
    import shutil

    from dllm.model.loader import default_model_dir, load_tokenizer

    d = tmp_path / "tok"
    shutil.copytree(default_model_dir(), d)
    (d / "tokenizer_config.json").write_text(content)
    with pytest.raises(ConfigError, match=reason) as e:
        load_tokenizer(str(d))
    assert str(d / "tokenizer_config.json") in str(e.value)
