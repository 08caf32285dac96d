"""Hypothesis strategies for protocol objects."""

from __future__ import annotations

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
