"""The send's ext fields (hamq/protocol/send_fields.py): SEND_MESSAGE_V2's one-letter
keys, and the hot-path codec giving and refusing exactly what the converter does."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hamq.protocol import HeaderError, decode_header, encode_header
from hamq.protocol.headers import SendMessageRequestHeader, SendMessageResponseHeader
from hamq.protocol.send_fields import (
    SEND_V2_KEYS,
    decode_send_header,
    decode_send_response,
    from_v2_fields,
    send_answer_fields,
    send_response_fields,
    send_v2_fields,
    to_v2_fields,
)
from tests.support.brokers import send_header
from tests.support.strategies import headers


def test_send_v2_short_keys_map_to_send_message_keys() -> None:
    fields = encode_header(send_header(properties="p", batch=False, broker_name="broker-a"))
    short = to_v2_fields(fields)
    assert short["a"] == "PID"
    assert short["b"] == "TopicTest"
    assert short["m"] == "false"
    assert short["n"] == "broker-a"
    assert from_v2_fields(short) == fields
    assert decode_header(SendMessageRequestHeader, from_v2_fields(short)) == send_header(
        properties="p", batch=False, broker_name="broker-a"
    )


def _outcome(decode: Any, fields: dict[str, Any]) -> object:
    try:
        return decode(fields)
    except HeaderError as exc:
        return ("HeaderError", str(exc))


_FIELD_VALUES = st.one_of(
    st.none(),
    st.integers(-(2**64), 2**64),
    st.booleans(),
    st.sampled_from(["", "0", "1", "-1", "007", "+5", " 5", "1_0", "²", "true", "FALSE", "x"]),
    st.text(max_size=5),
)


@given(header=headers(SendMessageRequestHeader))
def test_the_send_hot_path_encodes_and_decodes_as_the_converter_does(
    header: SendMessageRequestHeader,
) -> None:
    fields = encode_header(header)
    assert send_v2_fields(header) == to_v2_fields(fields)
    assert decode_send_header(fields, v2=False) == header
    assert decode_send_header(send_v2_fields(header), v2=True) == header


@given(
    fields=st.dictionaries(
        st.sampled_from(["a", "b", "c", "d", "e", "f", "g", "h", "i", "j", "k", "l", "m", "n"]),
        _FIELD_VALUES,
    )
)
def test_the_send_hot_path_takes_and_refuses_what_the_converter_does(
    fields: dict[str, Any],
) -> None:
    generic = _outcome(lambda f: decode_header(SendMessageRequestHeader, from_v2_fields(f)), fields)
    assert _outcome(lambda f: decode_send_header(f, v2=True), fields) == generic


@given(
    header=headers(SendMessageResponseHeader),
    junk=st.dictionaries(st.text(max_size=3), _FIELD_VALUES),
)
def test_send_answers_encode_and_decode_as_the_converter_does(
    header: SendMessageResponseHeader, junk: dict[str, Any]
) -> None:
    fields = encode_header(header)
    assert send_response_fields(header) == fields
    assert decode_send_response(fields) == header
    generic = _outcome(lambda f: decode_header(SendMessageResponseHeader, f), junk)
    assert _outcome(decode_send_response, junk) == generic


_NEAR_USUAL_VALUES = st.sampled_from(
    [None, "", "0", "7", "-1", "-2", "007", "9" * 18, "9" * 19, "1|2", "true", "false", "True"]
) | st.integers(-3, 2**63)


_NUMBER = st.integers(0, 10**18 - 1)
#: headers as producers send them (numbers of up to 18 digits, no max_reconsume_times)
_USUAL_HEADERS = st.builds(
    SendMessageRequestHeader,
    st.text(max_size=5),
    st.text(max_size=5),
    st.text(max_size=5),
    _NUMBER,
    _NUMBER | st.just(-1),
    _NUMBER,
    _NUMBER,
    _NUMBER,
    st.none() | st.text(max_size=5),
    st.none() | _NUMBER,
    st.none() | st.booleans(),
    st.none() | st.booleans(),
    st.none(),
    st.none() | st.text(max_size=5),
)


_EDGE_TEXTS = ["", "0", "-1", "-2", "+5", "007", "9" * 18, "9" * 19, "1|2", "²", "true", "True"]


@pytest.mark.parametrize("key", ["a", "d", "e", "f", "g", "h", "i", "j", "k", "l", "m", "n"])
def test_each_field_at_its_edges_is_taken_as_the_converter_takes_it(key: str) -> None:
    """A producer's usual fields with one set to each edge value (or left out)."""
    usual = {"a": "PG", "b": "T", "c": "TBW102", "d": "4", "e": "3", "f": "0", "g": "17"}
    usual |= {"h": "0", "i": "WAIT\x01true\x02", "j": "0", "k": "false", "m": "false"}
    for value in [None, *_EDGE_TEXTS]:
        fields = {k: v for k, v in usual.items() if k != key}
        if value is not None:
            fields[key] = value
        generic = _outcome(
            lambda f: decode_header(SendMessageRequestHeader, from_v2_fields(f)), fields
        )
        assert _outcome(lambda f: decode_send_header(f, v2=True), fields) == generic, value


@settings(max_examples=500)  # (half a second: the edges are a few values among many)
@given(
    header=_USUAL_HEADERS,
    changes=st.dictionaries(
        st.sampled_from(["a", "b", "c", "d", "e", "f", "g", "h", "i", "j", "k", "l", "m", "n"]),
        _NEAR_USUAL_VALUES,
        max_size=2,
    ),
)
def test_the_usual_send_shape_is_taken_as_the_converter_takes_it(
    header: SendMessageRequestHeader, changes: dict[str, Any]
) -> None:
    """A producer's fields with one or two changed to a value at the edge of what is
    taken (None: left out) are decoded by the one-pass check as the converter decodes
    them, or refused alike."""
    fields: dict[str, Any] = send_v2_fields(header)
    for key, value in changes.items():
        if value is None:
            fields.pop(key, None)
        else:
            fields[key] = value
    generic = _outcome(lambda f: decode_header(SendMessageRequestHeader, from_v2_fields(f)), fields)
    assert _outcome(lambda f: decode_send_header(f, v2=True), fields) == generic


@given(
    msg_id=st.text(max_size=40),
    queue_id=st.integers(0, 2**31 - 1),
    queue_offset=st.integers(0, 2**63 - 1),
    transaction_id=st.none() | st.text(max_size=40),
)
def test_the_broker_answers_a_send_with_its_header_s_fields(
    msg_id: str, queue_id: int, queue_offset: int, transaction_id: str | None
) -> None:
    header = SendMessageResponseHeader(
        msg_id=msg_id,
        queue_id=queue_id,
        queue_offset=queue_offset,
        transaction_id=transaction_id,
        msg_region="DefaultRegion",
        trace_on="true",
    )
    fields = send_answer_fields(
        msg_id, queue_id, queue_offset, transaction_id, None, "DefaultRegion", "true"
    )
    assert fields == encode_header(header)
    assert list(fields) == list(send_response_fields(header))  # (the binary header's order)


def test_every_send_field_has_one_short_key() -> None:
    """Each of SendMessageRequestHeader's wire keys has one V2 key, and no other key has."""
    full = set(
        encode_header(
            send_header(
                properties="p",
                reconsume_times=1,
                unit_mode=True,
                batch=True,
                max_reconsume_times=3,
                broker_name="b",
            )
        )
    )
    assert set(SEND_V2_KEYS.values()) == full
    assert len(SEND_V2_KEYS) == len(full)
