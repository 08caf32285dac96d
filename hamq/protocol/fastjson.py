"""fastjson's JSON: what Java's fastjson writes that JSON parsers refuse, read and written.

RocketMQ's Java side serializes bodies with fastjson, which writes maps keyed by a Long
with bare numbers as keys (``{0:"ip:port"}``, old nameservers' ``brokerAddrs``) and maps
keyed by an object with the object itself as the key, inline and unquoted, its fields
in alphabetical order (``{{"brokerName":"b","queueId":0,"topic":"T"}:5}``: ConsumeStats'
``offsetTable`` and the like), so that RocketMQ's own admin tools read them.

- ``loads`` takes that dialect and plain JSON; scalars and strings are the json
  module's. A bare number key comes back as its digits; an object or array key as an
  ``ObjectKey``: its compact JSON with sorted keys. ValueError names the position of
  the first thing that is neither.
- ``dumps`` writes compact JSON, except that ``ObjectKey`` keys are written inline.

Pure: text in, values out; bodies.py maps these values to and from its classes.
"""

from __future__ import annotations

import json
from typing import Any


class ObjectKey(str):
    """A map key that is an object, as fastjson writes it: the object's compact JSON
    (fields sorted), written inline, unquoted."""


def dumps(value: Any) -> str:
    """Compact JSON, except that ObjectKey keys are written as they are (inline)."""
    if isinstance(value, dict):
        items = []
        for key, item in value.items():
            name = key if isinstance(key, ObjectKey) else json.dumps(str(key), ensure_ascii=False)
            items.append(f"{name}:{dumps(item)}")
        return "{" + ",".join(items) + "}"
    if isinstance(value, list):
        return "[" + ",".join(dumps(item) for item in value) + "]"
    return json.dumps(value, ensure_ascii=False)


_SCALARS = json.JSONDecoder()
_WHITESPACE = " \t\n\r"


def loads(text: str) -> Any:
    """Parse fastjson's output; ValueError (naming the position) if it is not that."""
    value, end = _lenient_value(text, _skip(text, 0))
    end = _skip(text, end)
    if end != len(text):
        raise ValueError(f"extra data at char {end}")
    return value


def _skip(text: str, i: int) -> int:
    while i < len(text) and text[i] in _WHITESPACE:
        i += 1
    return i


def _lenient_value(text: str, i: int) -> tuple[Any, int]:
    if i >= len(text):
        raise ValueError(f"a value expected at char {i}")
    if text[i] == "{":
        return _lenient_object(text, i + 1)
    if text[i] == "[":
        return _lenient_array(text, i + 1)
    try:
        value, end = _SCALARS.raw_decode(text, i)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{exc.msg} at char {exc.pos}") from None
    return value, end


def _lenient_key(text: str, i: int) -> tuple[str, int]:
    value, end = _lenient_value(text, i)
    if isinstance(value, str):
        return value, end
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value), end
    if isinstance(value, dict | list):
        compact = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        return ObjectKey(compact), end
    raise ValueError(f"a key expected at char {i}")


def _lenient_object(text: str, i: int) -> tuple[dict[str, Any], int]:
    result: dict[str, Any] = {}
    i = _skip(text, i)
    if text.startswith("}", i):
        return result, i + 1
    while True:
        key, i = _lenient_key(text, _skip(text, i))
        i = _skip(text, i)
        if not text.startswith(":", i):
            raise ValueError(f"':' expected at char {i}")
        result[key], i = _lenient_value(text, _skip(text, i + 1))
        i = _skip(text, i)
        if text.startswith(",", i):
            i += 1
        elif text.startswith("}", i):
            return result, i + 1
        else:
            raise ValueError(f"',' or '}}' expected at char {i}")


def _lenient_array(text: str, i: int) -> tuple[list[Any], int]:
    result: list[Any] = []
    i = _skip(text, i)
    if text.startswith("]", i):
        return result, i + 1
    while True:
        item, i = _lenient_value(text, _skip(text, i))
        result.append(item)
        i = _skip(text, i)
        if text.startswith(",", i):
            i += 1
        elif text.startswith("]", i):
            return result, i + 1
        else:
            raise ValueError(f"',' or ']' expected at char {i}")
