"""Hypothesis strategies for protocol objects, and ``sample``: the same kinds of values
drawn from a seeded ``random.Random`` (the fuzz corpus of tests/test_fuzz.py)."""

from __future__ import annotations

import enum
import random
import types
import typing
from typing import Any

import attrs
from hypothesis import strategies as st

from hamq.protocol import LanguageCode, RemotingCommand, SerializeType

INT16 = st.integers(-(2**15), 2**15 - 1)
INT32 = st.integers(-(2**31), 2**31 - 1)
INT64 = st.integers(-(2**63), 2**63 - 1)
# any text UTF-8 can carry (lone surrogates cannot be encoded)
TEXT = st.text(st.characters(blacklist_categories=("Cs",)), max_size=40)
# the ROCKETMQ binary header cannot carry an empty string (it is null there)
NONEMPTY_TEXT = st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=40)
EXT_FIELDS = st.dictionaries(TEXT, TEXT, max_size=6)


def commands(serialize_type: SerializeType | None = None) -> st.SearchStrategy[RemotingCommand]:
    """Commands every header codec can carry (ROCKETMQ's int16 code and version)."""
    return st.builds(
        RemotingCommand,
        code=INT16,
        opaque=INT32,
        flag=INT32,
        remark=st.none() | TEXT,
        ext_fields=EXT_FIELDS,
        body=st.binary(max_size=300),
        language=st.sampled_from(LanguageCode),
        version=INT16,
        serialize_type=st.just(serialize_type)
        if serialize_type is not None
        else st.sampled_from(SerializeType),
    )


def _for_type(tp: Any) -> st.SearchStrategy[Any]:
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        return st.one_of(*(_for_type(arg) for arg in typing.get_args(tp)))
    return {
        int: INT64,
        str: NONEMPTY_TEXT,
        bool: st.booleans(),
        type(None): st.none(),
    }[tp]


def as_rocketmq_delivers(cmd: RemotingCommand) -> RemotingCommand:
    """What a command looks like after a ROCKETMQ header: "" is null there, so an empty
    remark is None and empty ext fields are absent."""
    cmd.remark = cmd.remark or None
    cmd.ext_fields = {k: v for k, v in cmd.ext_fields.items() if k and v}
    return cmd


def headers(cls: type) -> st.SearchStrategy[Any]:
    """Instances of a typed header class, every field drawn from its annotated type."""
    attrs.resolve_types(cls)
    return st.builds(cls, **{f.name: _for_type(f.type) for f in attrs.fields(cls)})


# ---------------------------------------------------------------- seeded samples
#: integers a field is likely to meet at its edges, besides small random ones
EDGE_INTS = (0, 1, -1, 127, 128, 2**15 - 1, -(2**15), 2**31 - 1, -(2**31), 2**63 - 1, -(2**63))
#: characters that trip codecs: separators, quotes, escapes, controls, non-BMP
ODD_CHARS = '\x00\x01\x02"\\{}[]:,;| \t\n\u00e9\u4e2d\U0001f600\ufeff'


def sample_text(rng: random.Random, *, min_size: int = 0, max_size: int = 24) -> str:
    """Text UTF-8 can carry: letters, digits, and now and then an odd character."""
    size = rng.randint(min_size, max_size)
    pool = "abcXYZ0123456789_-%" if rng.random() < 0.7 else "abcXYZ09_-" + ODD_CHARS
    return "".join(rng.choice(pool) for _ in range(size))


def sample_int(rng: random.Random, bits: int = 64) -> int:
    """An int of a signed ``bits``-bit field: an edge value, or a small or large one."""
    low, high = -(2 ** (bits - 1)), 2 ** (bits - 1) - 1
    roll = rng.random()
    if roll < 0.3:
        return rng.choice([v for v in EDGE_INTS if low <= v <= high])
    if roll < 0.7:
        return rng.randint(0, 1000)
    return rng.randint(low, high)


def sample(tp: Any, rng: random.Random, *, depth: int = 0) -> Any:
    """A value of the annotated type ``tp``: int, str (non-empty), bool, float, an enum,
    ``X | None``, ``list[X]``, ``dict[K, V]`` and attrs classes (every field drawn, so
    that a value survives an encode that leaves out Nones)."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        options = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(options) < len(typing.get_args(tp)) and rng.random() < 0.3:
            return None
        return sample(rng.choice(options), rng, depth=depth)
    if origin is list:
        (item,) = typing.get_args(tp)
        return [sample(item, rng, depth=depth + 1) for _ in range(_count(rng, depth))]
    if origin is dict:
        key, value = typing.get_args(tp)
        return {
            sample(key, rng, depth=depth + 1): sample(value, rng, depth=depth + 1)
            for _ in range(_count(rng, depth))
        }
    if attrs.has(tp):
        attrs.resolve_types(tp)
        return tp(**{f.name: sample(f.type, rng, depth=depth + 1) for f in attrs.fields(tp)})
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return rng.choice(list(tp))
    if tp is bool:
        return rng.random() < 0.5
    if tp is int:
        return sample_int(rng)
    if tp is float:
        return rng.choice([0.0, 1.5, -2.25, 1e-3, 123456.75])
    if tp is str:
        return sample_text(rng, min_size=1)
    raise TypeError(f"no sample for {tp!r}")


def _count(rng: random.Random, depth: int) -> int:
    return rng.randint(0, 3 if depth < 3 else 1)
