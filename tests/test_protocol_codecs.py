"""The three header codecs, checked against the bytes RocketMQ writes and reads."""

from __future__ import annotations

import json
import struct

import msgpack
from hypothesis import given
from hypothesis import strategies as st

from hamq.protocol import (
    FrameDecoder,
    LanguageCode,
    ProtocolError,
    RemotingCommand,
    SerializeType,
    encode_frame,
)
from hamq.protocol.serialization import (
    _JSON_DECODER,
    _from_mapping,
    decode_json_header,
    decode_msgpack_header,
    decode_rocketmq_header,
    encode_json_header,
    encode_msgpack_header,
    encode_rocketmq_header,
)
from tests.support.strategies import as_rocketmq_delivers, commands

# A SEND_MESSAGE header as the C++ client 1.2.x sent it (docs/PROTOCOL.md#rocketmq-clients): keys
# sorted, ext values a mix of strings and numbers, a trailing newline in the header.
CPP_SEND_HEADER = (
    '{"code":10,"extFields":{"AccessKey":"","OnsChannel":"ALIYUN",'
    '"Signature":"/6eBTC7IAbbWd2RMu95BRquKmlQ=","batch":"0","bornTimestamp":"1795267292855",'
    '"defaultTopic":"TBW102","defaultTopicQueueNums":4,"flag":0,"producerGroup":"PID_TEST",'
    '"properties":"KEYS\\u0001key0\\u0002TAGS\\u0001tagA\\u0002UNIQ_KEY\\u0001'
    '0100007F0000EC70000037513A6F0100\\u0002WAIT\\u0001true\\u0002myprop\\u0001v0\\u0002",'
    '"queueId":0,"reconsumeTimes":"0","sysFlag":0,"topic":"TopicTest","unitMode":"0"},'
    '"flag":0,"language":"CPP","opaque":1,"remark":"","version":63}\n'
)


@given(commands(SerializeType.JSON))
def test_json_round_trip(cmd: RemotingCommand) -> None:
    assert decode_json_header(encode_json_header(cmd), cmd.body) == cmd


@given(commands(SerializeType.JSON))
def test_json_headers_are_the_bytes_the_standard_library_writes(cmd: RemotingCommand) -> None:
    """msgspec writes a JSON header (serialization.py) byte for byte as
    ``json.dumps(sort_keys=True, separators=(",", ":"), ensure_ascii=False)`` does:
    sorted keys, no spaces, raw UTF-8, control characters escaped as the stdlib does."""
    reference: dict[str, object] = {
        "code": cmd.code,
        "flag": cmd.flag,
        "language": LanguageCode(cmd.language).name,
        "opaque": cmd.opaque,
        "serializeTypeCurrentRPC": "JSON",
        "version": cmd.version,
    }
    if cmd.ext_fields:
        reference["extFields"] = cmd.ext_fields
    if cmd.remark is not None:
        reference["remark"] = cmd.remark
    expected = json.dumps(reference, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    assert encode_json_header(cmd) == expected.encode()
    assert json.loads(encode_json_header(cmd)) == reference


@given(commands(SerializeType.MSGPACK))
def test_msgpack_round_trip(cmd: RemotingCommand) -> None:
    assert decode_msgpack_header(encode_msgpack_header(cmd), cmd.body) == cmd


@given(commands(SerializeType.ROCKETMQ))
def test_rocketmq_round_trip(cmd: RemotingCommand) -> None:
    decoded = decode_rocketmq_header(encode_rocketmq_header(cmd), cmd.body)
    assert decoded == as_rocketmq_delivers(cmd)


def test_json_is_written_as_fastjson_writes_it() -> None:
    cmd = RemotingCommand(
        code=0,
        opaque=1,
        flag=1,
        ext_fields={"queueOffset": "0", "msgId": "7F00000100002A9F0000000000000000", "k": "é\x01"},
        language=LanguageCode.JAVA,
        version=401,
        serialize_type=SerializeType.JSON,
    )
    assert (
        encode_json_header(cmd)
        == (
            '{"code":0,"extFields":{"k":"é\\u0001","msgId":"7F00000100002A9F0000000000000000",'
            '"queueOffset":"0"},"flag":1,"language":"JAVA","opaque":1,'
            '"serializeTypeCurrentRPC":"JSON","version":401}'
        ).encode()
    )


def test_json_writes_a_remark_and_leaves_out_a_null_one() -> None:
    with_remark = RemotingCommand(
        code=17, remark="topic x not exist", serialize_type=SerializeType.JSON
    )
    assert b'"remark":"topic x not exist"' in encode_json_header(with_remark)
    assert b"remark" not in encode_json_header(
        RemotingCommand(code=0, serialize_type=SerializeType.JSON)
    )


def test_the_cpp_clients_send_header_decodes_with_every_value_a_string() -> None:
    cmd = decode_json_header(CPP_SEND_HEADER.encode(), b"hello-0")
    assert cmd.code == 10
    assert cmd.language is LanguageCode.CPP
    assert cmd.version == 63
    assert cmd.opaque == 1
    assert cmd.remark == ""
    assert cmd.ext_fields["queueId"] == "0"
    assert cmd.ext_fields["defaultTopicQueueNums"] == "4"
    assert cmd.ext_fields["bornTimestamp"] == "1795267292855"
    assert cmd.ext_fields["properties"].startswith("KEYS\x01key0\x02TAGS\x01tagA\x02")


def test_json_decode_accepts_numbers_booleans_and_nulls_in_ext_fields() -> None:
    header = b'{"code":11,"extFields":{"a":5,"b":true,"c":null,"d":2.0,"e":"x"}}'
    cmd = decode_json_header(header, b"")
    assert cmd.ext_fields == {"a": "5", "b": "true", "d": "2", "e": "x"}
    assert cmd.language is LanguageCode.JAVA  # RocketMQ's default when none is given


_ANY_VALUE = (
    st.none()
    | st.booleans()
    | st.integers(-(2**33), 2**33)
    | st.sampled_from([0, 1, 2**31 - 1, 2**31, -1])
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=5)
    | st.sampled_from(["JAVA", "CPP", "GO", "COBOL"])
)
_JSON_HEADER_MAPS = st.dictionaries(
    st.sampled_from(["code", "opaque", "flag", "language", "version", "remark", "extFields", "x"]),
    _ANY_VALUE | st.dictionaries(st.text(max_size=3), _ANY_VALUE | st.lists(st.integers())),
)


@given(_JSON_HEADER_MAPS)
def test_a_json_header_decodes_as_its_map_reads(header: dict[str, object]) -> None:
    """The typed decode (the usual shape, checked by msgspec while it parses) gives what
    reading the header as a map gives, for any shape: the command, or the same error."""
    data = json.dumps(header).encode()

    def outcome(decode: object) -> object:
        try:
            return decode()  # type: ignore[operator]
        except ProtocolError as exc:
            return str(exc)

    typed = outcome(lambda: decode_json_header(data, b"body"))
    as_map = outcome(lambda: _from_mapping(_JSON_DECODER.decode(data), SerializeType.JSON, b"body"))
    assert typed == as_map


def test_unknown_language_names_count_as_other() -> None:
    cmd = decode_json_header(b'{"code":1,"language":"COBOL"}', b"")
    assert cmd.language is LanguageCode.OTHER


def test_rocketmq_binary_layout_matches_protocol_section_2_2() -> None:
    cmd = RemotingCommand(
        code=105,
        opaque=9,
        flag=2,
        remark="hi",
        ext_fields={"topic": "T1"},
        language=LanguageCode.JAVA,
        version=401,
        serialize_type=SerializeType.ROCKETMQ,
    )
    header = encode_rocketmq_header(cmd)
    expected = (
        struct.pack(">hBhii", 105, 0, 401, 9, 2)
        + struct.pack(">i", 2)
        + b"hi"
        + struct.pack(">i", 2 + 5 + 4 + 2)
        + struct.pack(">h", 5)
        + b"topic"
        + struct.pack(">i", 2)
        + b"T1"
    )
    assert header == expected
    assert len(header) == 21 + 2 + 13  # 21 + remark + ext fields
    frame = encode_frame(cmd)
    assert struct.unpack_from(">I", frame, 4)[0] == (1 << 24) | len(header)


def test_rocketmq_empty_ext_value_is_an_absent_field() -> None:
    cmd = RemotingCommand(
        code=10, ext_fields={"topic": "T", "remark": ""}, serialize_type=SerializeType.ROCKETMQ
    )
    assert decode_rocketmq_header(encode_rocketmq_header(cmd), b"").ext_fields == {"topic": "T"}


def test_rocketmq_zero_length_remark_is_null() -> None:
    header = struct.pack(">hBhii", 0, 1, 63, 1, 1) + struct.pack(">i", 0) + struct.pack(">i", 0)
    cmd = decode_rocketmq_header(header, b"")
    assert cmd.remark is None
    assert cmd.language is LanguageCode.CPP
    assert cmd.ext_fields == {}


def test_msgpack_header_uses_the_json_field_names() -> None:
    cmd = RemotingCommand(code=34, opaque=3, remark="r", ext_fields={"a": "1"})
    assert msgpack.unpackb(encode_msgpack_header(cmd)) == {
        "code": 34,
        "extFields": {"a": "1"},
        "flag": 0,
        "language": "PYTHON",
        "opaque": 3,
        "remark": "r",
        "version": cmd.version,
    }


def test_response_to_copies_opaque_and_serialize_type() -> None:
    request = RemotingCommand(code=10, opaque=77, serialize_type=SerializeType.JSON)
    response = request.response_to(17, "no such topic", ext_fields={"x": "1"})
    assert response.is_response
    assert not request.is_response
    assert response.opaque == 77
    assert response.serialize_type == SerializeType.JSON
    decoder = FrameDecoder()
    decoder.feed(encode_frame(response))
    decoded = decoder.next_command()
    assert decoded is not None
    assert json.loads(encode_json_header(response))["flag"] == 1
    assert decoded.remark == "no such topic"
    assert decoded.ext_fields == {"x": "1"}
