"""Typed headers <-> ext fields, through one private cattrs converter.

Ext fields are a flat str -> str map on the wire. A typed header is a frozen attrs
class (headers.py) whose snake_case field names map to RocketMQ's camelCase keys
(``producer_group`` <-> ``producerGroup``); a field whose wire key is not the plain
camelCase form says so in its metadata: ``attrs.field(metadata={"wire": "clientID"})``.

Decoding rules (RocketMQ's, docs/PROTOCOL.md#typed-headers and docs/PROTOCOL.md#rocketmq-clients):
- ints parse from decimal strings or numbers (``int(str(v))``) within Java's long
  range, booleans from ``true``/``false`` (any case) and ``1``/``0``;
- a field without a default is required; every missing or malformed field is
  reported at once, by its wire name, in a ``HeaderError``;
- unknown keys are ignored (clients add credentials and newer fields).
Encoding writes every value as a string (``true``/``false`` for booleans) and leaves
out fields whose value is None.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import attrs
import cattrs
from cattrs.errors import ClassValidationError
from cattrs.gen import make_dict_structure_fn, make_dict_unstructure_fn, override

from hamq.protocol.errors import HeaderError

T = TypeVar("T")

_INT_RE = re.compile(r"[+-]?[0-9]{1,20}")
_INT64_MIN = -(2**63)
_INT64_MAX = 2**63 - 1
_TRUE = frozenset({"true", "1"})
_FALSE = frozenset({"false", "0", ""})


def wire_name(field: attrs.Attribute[Any]) -> str:
    """The ext-field key of a header field: its metadata ``wire`` or its camelCase name."""
    explicit = field.metadata.get("wire")
    if explicit is not None:
        return str(explicit)
    head, *rest = field.name.split("_")
    return head + "".join(part[:1].upper() + part[1:] for part in rest)


def _structure_int(value: object, _type: object) -> int:
    if isinstance(value, int) and not isinstance(value, bool):
        number = value
    elif isinstance(value, str) and _INT_RE.fullmatch(value.strip()):
        number = int(value)
    else:
        raise ValueError(f"{value!r} is not an integer")
    if not _INT64_MIN <= number <= _INT64_MAX:
        raise ValueError(f"{value!r} is out of range for a 64-bit integer")
    return number


def _structure_bool(value: object, _type: object) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise ValueError(f"{value!r} is not a boolean (true/false)")


def _structure_str(value: object, _type: object) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, int | float):
        return str(value)
    raise ValueError(f"{value!r} is not a string")


def _unstructure_bool(value: bool) -> str:
    return "true" if value else "false"


def _renames(cls: type) -> dict[str, Any]:
    return {a.name: override(rename=wire_name(a)) for a in attrs.fields(cls)}


def _make_converter() -> cattrs.Converter:
    conv = cattrs.Converter(detailed_validation=True, forbid_extra_keys=False)
    conv.register_structure_hook(int, _structure_int)
    conv.register_structure_hook(bool, _structure_bool)
    conv.register_structure_hook(str, _structure_str)
    conv.register_unstructure_hook(bool, _unstructure_bool)
    conv.register_unstructure_hook(int, str)

    def structure_factory(cls: type) -> Callable[[Any, Any], Any]:
        attrs.resolve_types(cls)
        return make_dict_structure_fn(cls, conv, **_renames(cls))

    def unstructure_factory(cls: type) -> Callable[[Any], Any]:
        attrs.resolve_types(cls)
        return make_dict_unstructure_fn(cls, conv, **_renames(cls))

    conv.register_structure_hook_factory(attrs.has, structure_factory)
    conv.register_unstructure_hook_factory(attrs.has, unstructure_factory)
    return conv


_CONVERTER = _make_converter()


def _describe(cls: type, fields: Mapping[str, object], exc: ClassValidationError) -> str:
    by_name = {a.name: wire_name(a) for a in attrs.fields(cls)}
    missing: list[str] = []
    bad: list[str] = []
    with_notes, without_notes = exc.group_exceptions()
    for error, note in with_notes:
        key = by_name.get(note.name, note.name)
        if isinstance(error, KeyError):
            missing.append(key)
        else:
            bad.append(f"{key}={fields.get(key)!r} ({error})")
    bad.extend(str(error) for error in without_notes)
    parts = []
    if missing:
        parts.append("missing required field(s) " + ", ".join(missing))
    if bad:
        parts.append("bad field(s) " + "; ".join(bad))
    return f"{cls.__name__}: " + "; ".join(parts)


def decode_header(cls: type[T], fields: Mapping[str, object]) -> T:
    """Build a typed header from ext fields; ``HeaderError`` names every bad field."""
    try:
        return _CONVERTER.structure(fields, cls)
    except ClassValidationError as exc:
        raise HeaderError(_describe(cls, fields, exc)) from None


def encode_header(header: object) -> dict[str, str]:
    """The ext fields of a typed header: every value a string, None values left out."""
    raw: dict[str, Any] = _CONVERTER.unstructure(header)
    return {key: value for key, value in raw.items() if value is not None}
