"""fastjson's JSON dialect (hamq/protocol/fastjson.py): maps keyed by bare numbers or by
objects, read and written as Java's fastjson does, and plain JSON read as json reads it."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hamq.protocol.fastjson import ObjectKey, dumps, loads

#: what fastjson writes for a ConsumeStats' offset table (not JSON: the key is an object)
OBJECT_KEYED = '{"offsetTable":{{"brokerName":"b","queueId":3,"topic":"T"}:{"pullOffset":4}}}'

_JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner),
    max_leaves=20,
)


def test_an_object_key_reads_as_its_sorted_compact_json_and_is_written_back_inline() -> None:
    value = loads(OBJECT_KEYED)
    (key,) = value["offsetTable"]
    assert isinstance(key, ObjectKey)
    assert key == '{"brokerName":"b","queueId":3,"topic":"T"}'
    assert value["offsetTable"][key] == {"pullOffset": 4}
    assert dumps(value) == OBJECT_KEYED
    # white space anywhere, and the object's fields in another order: the same key
    spaced = (
        '{ "offsetTable" : { { "topic":"T", "queueId":3, "brokerName":"b" } : {"pullOffset":4} } }'
    )
    assert loads(spaced) == value


def test_a_bare_number_key_reads_as_its_digits() -> None:
    assert loads('{"brokerAddrs":{0:"a:1",12:"b:2"}}') == {"brokerAddrs": {"0": "a:1", "12": "b:2"}}


def test_an_object_key_that_is_a_plain_string_is_quoted_when_written() -> None:
    assert dumps({'{"a":1}': [1, "x", None]}) == '{"{\\"a\\":1}":[1,"x",null]}'
    assert dumps({ObjectKey('{"a":1}'): True}) == '{{"a":1}:true}'


@given(_JSON)
def test_plain_json_reads_as_json_reads_it_and_is_written_as_json(value: Any) -> None:
    text = json.dumps(value, ensure_ascii=False)
    assert loads(text) == json.loads(text)
    assert json.loads(dumps(value)) == json.loads(text)


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ('{"a":1', r"',' or '\}' expected at char 6"),
        ('{"a" 1}', "':' expected at char 5"),
        ("[1 2]", r"',' or '\]' expected at char 3"),
        ('{"a":1} x', "extra data at char 8"),
        ("{true:1}", "a key expected at char 1"),
        ("", "a value expected at char 0"),
        ('{"a":tru}', "Expecting value at char 5"),
    ],
)
def test_what_is_not_fastjson_is_refused_naming_where(text: str, problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        loads(text)
