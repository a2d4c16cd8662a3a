"""JSON read as a user's file should be: an invalid file or a value of the wrong kind is one clear error.

The JSON a user hands this package (a checkpoint's ``config.json``, ``generation_config.json`` and
``tokenizer_config.json``, a safetensors index, ``prefilling_config.json``, a document cache's header, a LongBench
line) goes through these two functions, so their messages read alike:
``<where> is not valid JSON (<reason>)`` and ``<where> must hold a JSON object, got a JSON <kind>``.
"""

from __future__ import annotations

import json

_JSON_KINDS = {list: "array", str: "string", int: "number", float: "number", bool: "boolean", type(None): "null"}


def parse_json(text: str | bytes, where: str, error: type[Exception] = ValueError, *, require_object: bool = True):
    """Parse ``text`` as JSON.

    Args:
        text: the JSON text (bytes: UTF-8, or UTF-16/32 as :func:`json.loads` detects them; a BOM is skipped).
        where: what the text is, for the message (a path, ``path:line``, ``path's header``).
        error: the exception class to raise (the caller's own error type, e.g. ``ConfigError``).
        require_object: the value must be a JSON object (a ``dict``).

    Returns:
        the parsed value (a ``dict`` when ``require_object``).

    Raises:
        error: invalid UTF-8 or JSON (also an integer longer than Python converts, or nesting deeper than
            the recursion limit), or (``require_object``) a value that is not an object.
    """
    if isinstance(text, str):
        text = text.removeprefix("\ufeff")  # a BOM, as json.loads already skips in bytes
    try:
        value = json.loads(text)
    except (ValueError, RecursionError) as e:
        # ValueError: JSONDecodeError, UnicodeDecodeError and an integer of more than 4300 digits;
        # RecursionError: arrays/objects nested deeper than the interpreter's recursion limit
        reason = "nested too deeply" if isinstance(e, RecursionError) else e
        raise error(f"{where} is not valid JSON ({reason})") from None
    if require_object and not isinstance(value, dict):
        raise error(f"{where} must hold a JSON object, got a JSON {_JSON_KINDS.get(type(value), 'value')}")
    return value


def read_json(path: str, error: type[Exception] = ValueError, *, require_object: bool = True):
    """:func:`parse_json` of the file at ``path`` (its path is the ``where`` of the message).

    Raises:
        OSError: the file cannot be read (e.g. ``FileNotFoundError``).
        error: as :func:`parse_json`.
    """
    with open(path, "rb") as f:
        return parse_json(f.read(), str(path), error, require_object=require_object)
