"""Typed headers: round trips through every codec, and errors that name the field."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hamq.protocol import (
    FrameDecoder,
    HeaderError,
    RemotingCommand,
    RequestCode,
    ResponseCode,
    SerializeType,
    decode_header,
    encode_frame,
    encode_header,
)
from hamq.protocol.headers import (
    ALL_HEADERS,
    PullMessageRequestHeader,
    SendMessageRequestHeader,
    SendMessageResponseHeader,
    UnregisterClientRequestHeader,
)
from tests.support.brokers import send_header
from tests.support.strategies import headers


@pytest.mark.parametrize("cls", ALL_HEADERS, ids=lambda c: c.__name__)
@given(data=st.data())
def test_every_header_round_trips_through_every_codec(cls: type, data: st.DataObject) -> None:
    header = data.draw(headers(cls))
    fields = encode_header(header)
    assert all(isinstance(v, str) for v in fields.values())  # RocketMQ writes strings only
    for serialize_type in SerializeType:
        cmd = RemotingCommand.request(
            RequestCode.SEND_MESSAGE, header, serialize_type=serialize_type
        )
        decoder = FrameDecoder()
        decoder.feed(encode_frame(cmd))
        decoded = decoder.next_command()
        assert decoded is not None
        assert decoded.header(cls) == header


def test_wire_names_are_rocketmqs_camel_case() -> None:
    fields = encode_header(send_header(properties="TAGS\x01a\x02", batch=True))
    assert fields == {
        "producerGroup": "PID",
        "topic": "TopicTest",
        "defaultTopic": "TBW102",
        "defaultTopicQueueNums": "4",
        "queueId": "0",
        "sysFlag": "0",
        "bornTimestamp": "1795267292855",
        "flag": "0",
        "properties": "TAGS\x01a\x02",
        "batch": "true",
    }
    assert encode_header(UnregisterClientRequestHeader(client_id="1-127.0.0.1@DEFAULT")) == {
        "clientID": "1-127.0.0.1@DEFAULT"
    }
    reply = SendMessageResponseHeader(
        msg_id="7F", queue_id=1, queue_offset=2, msg_region="DefaultRegion", trace_on="true"
    )
    assert encode_header(reply)["MSG_REGION"] == "DefaultRegion"
    assert encode_header(reply)["TRACE_ON"] == "true"


def test_cpp_pull_request_decodes_with_numbers_and_strings_mixed() -> None:
    fields = {
        "AccessKey": "",
        "OnsChannel": "ALIYUN",
        "Signature": "x",
        "commitOffset": "0",
        "consumerGroup": "CID_PULL",
        "maxMsgNums": 32,
        "queueId": 0,
        "queueOffset": "0",
        "subVersion": "0",
        "subscription": "*",
        "suspendTimeoutMillis": "20000",
        "sysFlag": 4,
        "topic": "TopicTest",
    }
    header = decode_header(PullMessageRequestHeader, fields)
    assert header.max_msg_nums == 32
    assert header.suspend_timeout_millis == 20000
    assert header.subscription == "*"
    assert header.expression_type is None


def test_cpp_booleans_zero_and_one_decode() -> None:
    fields = encode_header(send_header())
    assert decode_header(SendMessageRequestHeader, {**fields, "unitMode": "0"}).unit_mode is False
    assert decode_header(SendMessageRequestHeader, {**fields, "batch": "1"}).batch is True
    assert decode_header(SendMessageRequestHeader, {**fields, "batch": "TRUE"}).batch is True


def test_missing_and_bad_fields_are_all_named_at_once() -> None:
    with pytest.raises(HeaderError) as caught:
        decode_header(SendMessageRequestHeader, {"topic": "T", "queueId": "x", "batch": "maybe"})
    message = str(caught.value)
    assert message.startswith("SendMessageRequestHeader: missing required field(s) producerGroup")
    for name in ("defaultTopic", "defaultTopicQueueNums", "sysFlag", "bornTimestamp", "flag"):
        assert name in message
    assert "queueId='x' ('x' is not an integer)" in message
    assert "batch='maybe'" in message
    assert caught.value.code == ResponseCode.INVALID_PARAMETER


def test_unknown_ext_fields_are_ignored() -> None:
    fields = {**encode_header(send_header()), "AccessKey": "", "Signature": "abc"}
    assert decode_header(SendMessageRequestHeader, fields) == send_header()


def test_header_error_travels_as_invalid_parameter_response() -> None:
    request = RemotingCommand.request(RequestCode.PULL_MESSAGE, ext_fields={"topic": "T"})
    with pytest.raises(HeaderError, match="consumerGroup"):
        request.header(PullMessageRequestHeader)


def test_integers_must_fit_javas_long() -> None:
    fields = encode_header(send_header())
    with pytest.raises(HeaderError, match="out of range for a 64-bit integer"):
        decode_header(SendMessageRequestHeader, {**fields, "bornTimestamp": str(2**63)})
    header = decode_header(SendMessageRequestHeader, {**fields, "bornTimestamp": str(-(2**63))})
    assert header.born_timestamp == -(2**63)


def test_broker_name_travels_as_bname_like_rocketmq_5() -> None:
    fields = encode_header(send_header(broker_name="broker-a"))
    assert fields["bname"] == "broker-a"
    assert "brokerName" not in fields
