"""The frame codec: layout, incremental decoding, and every way a frame can be bad."""

from __future__ import annotations

import struct
import subprocess
import sys

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from hamq.protocol import (
    FrameDecoder,
    ProtocolError,
    RemotingCommand,
    SerializeType,
    encode_frame,
)
from tests.support.strategies import as_rocketmq_delivers, commands


def frame_of(serialize_type: int, header: bytes, body: bytes = b"") -> bytes:
    return (
        struct.pack(">iI", 4 + len(header) + len(body), (serialize_type << 24) | len(header))
        + header
        + body
    )


def test_protocol_package_never_imports_trio() -> None:
    code = "import hamq.protocol, sys; assert 'trio' not in sys.modules, 'trio imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_frame_layout_is_length_then_type_and_header_length() -> None:
    cmd = RemotingCommand(code=10, opaque=7, body=b"hello", serialize_type=SerializeType.JSON)
    frame = encode_frame(cmd)
    length, word = struct.unpack_from(">iI", frame)
    header_length = word & 0xFFFFFF
    assert length == len(frame) - 4  # the length field does not count itself
    assert word >> 24 == 0  # JSON
    assert frame[8 : 8 + header_length].startswith(b'{"code":10,')
    assert frame[8 + header_length :] == b"hello"


@given(commands())
def test_any_command_round_trips_through_a_frame(cmd: RemotingCommand) -> None:
    decoder = FrameDecoder()
    decoder.feed(encode_frame(cmd))
    decoded = decoder.next_command()
    assert decoded is not None
    if cmd.serialize_type == SerializeType.ROCKETMQ:
        cmd = as_rocketmq_delivers(cmd)
    assert decoded == cmd
    assert decoder.next_command() is None


@given(st.lists(commands(), min_size=1, max_size=5), st.data())
def test_frames_split_anywhere_decode_the_same(
    cmds: list[RemotingCommand], data: st.DataObject
) -> None:
    stream = b"".join(encode_frame(c) for c in cmds)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=8)))
    decoder = FrameDecoder()
    out: list[RemotingCommand] = []
    start = 0
    for cut in [*cuts, len(stream)]:
        decoder.feed(stream[start:cut])
        start = cut
        out.extend(decoder.commands())
    assert [c.opaque for c in out] == [c.opaque for c in cmds]
    assert [c.body for c in out] == [c.body for c in cmds]
    assert decoder.buffered == 0


def test_every_truncation_of_a_frame_needs_more_data() -> None:
    frame = encode_frame(RemotingCommand(code=11, ext_fields={"topic": "T"}, body=b"x" * 50))
    for cut in range(len(frame)):
        decoder = FrameDecoder()
        decoder.feed(frame[:cut])
        assert decoder.next_command() is None
        decoder.feed(frame[cut:])
        assert decoder.next_command() is not None


@given(st.binary(max_size=200))
def test_random_bytes_raise_nothing_but_protocol_error(data: bytes) -> None:
    decoder = FrameDecoder(max_frame_length=1024)
    decoder.feed(data)
    try:
        while decoder.next_command() is not None:
            pass
    except ProtocolError:
        pass


@given(st.integers(0, 255), st.binary(max_size=120), st.binary(max_size=20))
def test_well_framed_random_headers_raise_nothing_but_protocol_error(
    serialize_type: int, header: bytes, body: bytes
) -> None:
    decoder = FrameDecoder()
    decoder.feed(frame_of(serialize_type, header, body))
    try:
        decoder.next_command()
    except ProtocolError:
        pass


_json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats(allow_nan=False)
    | st.text(max_size=10),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=4)
    ),
    max_leaves=12,
)
_header_like = st.fixed_dictionaries(
    {},
    optional={
        "code": _json_values,
        "opaque": _json_values,
        "flag": _json_values,
        "version": _json_values,
        "language": _json_values,
        "remark": _json_values,
        "extFields": _json_values,
    },
)


@given(_header_like | _json_values)
def test_structured_junk_headers_raise_nothing_but_protocol_error(value: object) -> None:
    import json

    for serialize_type, header in (
        (0, json.dumps(value).encode()),
        (2, msgpack.packb(value)),
    ):
        decoder = FrameDecoder()
        decoder.feed(frame_of(serialize_type, header))
        try:
            cmd = decoder.next_command()
        except ProtocolError:
            continue
        assert cmd is not None
        assert all(isinstance(k, str) and isinstance(v, str) for k, v in cmd.ext_fields.items())


@pytest.mark.parametrize(
    ("prefix", "message"),
    [
        (struct.pack(">i", -5), "frame length -5 is impossible"),
        (struct.pack(">i", 3), "frame length 3 is impossible"),
        (struct.pack(">i", 2**31 - 1), "exceeds the maximum frame length 1024"),
        (struct.pack(">i", 1025), "exceeds the maximum frame length 1024"),
        (struct.pack(">iI", 10, 7), "header length 7 runs past the end of a frame of length 10"),
        (struct.pack(">iI", 10, (9 << 24) | 2) + b"{}" + b"1234", "unknown serialize type 9"),
        (frame_of(0, b"{not json"), "JSON header does not parse"),
        (frame_of(0, b"[1, 2]"), "header must be a map"),
        (frame_of(0, b'{"opaque": 1}'), "header has no 'code'"),
        (frame_of(0, b'{"code": "ten"}'), "'code' must be an integer"),
        (frame_of(0, b'{"code": 10, "opaque": 4294967296}'), "does not fit in an int32"),
        (frame_of(0, b'{"code": 10, "extFields": {"a": [1]}}'), "extFields value for 'a'"),
        (frame_of(0, b'{"code": 10, "extFields": "x"}'), "extFields must be an object"),
        (frame_of(2, b"\xc1"), "msgpack header does not parse"),
        (frame_of(1, b"\x00\x0a\x01"), "ROCKETMQ header ends inside the fixed fields"),
    ],
)
def test_bad_frames_are_named(prefix: bytes, message: str) -> None:
    decoder = FrameDecoder(max_frame_length=1024)
    decoder.feed(prefix)
    with pytest.raises(ProtocolError, match=message):
        decoder.next_command()
    # the decoder is poisoned: the stream cannot be trusted any more
    assert decoder.failed
    with pytest.raises(ProtocolError, match=message):
        decoder.next_command()


def test_oversized_frame_is_refused_before_it_is_buffered() -> None:
    decoder = FrameDecoder(max_frame_length=1024)
    decoder.feed(struct.pack(">i", 16 * 1024 * 1024))  # only the length field has arrived
    with pytest.raises(ProtocolError, match="exceeds the maximum frame length"):
        decoder.next_command()


def test_default_maximum_frame_is_rocketmqs_16_mib() -> None:
    decoder = FrameDecoder()
    decoder.feed(struct.pack(">iI", 16 * 1024 * 1024 + 1, 0))
    with pytest.raises(ProtocolError, match="16777216"):
        decoder.next_command()


def test_commands_before_a_bad_frame_are_still_delivered() -> None:
    good = encode_frame(RemotingCommand(code=1, opaque=1))
    decoder = FrameDecoder()
    decoder.feed(good + good + struct.pack(">i", -1))
    assert [c.opaque for c in decoder.commands()] == [1, 1]
    assert decoder.failed
    with pytest.raises(ProtocolError):
        decoder.commands()


def test_large_bodies_survive_carrying_across_feeds() -> None:
    body = bytes(range(256)) * 1024  # 256 KiB, above the one-copy threshold
    frame = encode_frame(RemotingCommand(code=1, body=body))
    decoder = FrameDecoder()
    for start in range(0, len(frame), 10_000):
        decoder.feed(frame[start : start + 10_000])
    [cmd] = decoder.commands()
    assert cmd.body == body


def test_encoder_refuses_a_header_the_frame_cannot_describe() -> None:
    cmd = RemotingCommand(code=1, ext_fields={"k": "v" * 0x1000000})
    with pytest.raises(ValueError, match="cannot be encoded"):
        encode_frame(cmd)


def test_rocketmq_header_cannot_carry_codes_beyond_int16() -> None:
    cmd = RemotingCommand(code=200050, serialize_type=SerializeType.ROCKETMQ)
    with pytest.raises(ValueError, match="does not fit a ROCKETMQ header"):
        encode_frame(cmd)


def test_max_frame_length_must_be_sensible() -> None:
    with pytest.raises(ValueError, match="max_frame_length"):
        FrameDecoder(max_frame_length=4)
