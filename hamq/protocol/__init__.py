"""hamq's sans-IO protocol layer: bytes in, objects out. Never imports trio.

- codes.py         request/response codes, languages, serialize types, flag bits
- command.py       RemotingCommand
- serialization.py the JSON, ROCKETMQ and MSGPACK header codecs
- frame.py         FrameDecoder / encode_frame
- headers.py       typed request/response headers (attrs)
- send_fields.py   the send's headers: SEND_MESSAGE_V2's one-letter keys, hot-path codec
- converter.py     headers <-> ext fields (cattrs)
- errors.py        ProtocolError, RequestError, HeaderError
- message.py       messages by name: property keys and their encoding, sys flags, topic
                   and group names, tag codes, hosts, message ids, batch bodies
- record.py        the CommitLog record codec (encode, read, pull bodies), on message.py
- bodies.py        JSON request/response bodies (attrs classes and their converter)
- fastjson.py      fastjson's JSON: maps keyed by bare numbers or by objects
- ha_wire.py       the HA channel's messages (classic, auto-switch, membership proof)
- send_timing.py   a send's timing contract: broker waits, client per-try waits
- secret.py        Secret: a secret text (ACL key, HA secret) that never shows itself
"""

from hamq.protocol.codes import (
    FLAG_ONEWAY,
    FLAG_RESPONSE,
    HAMQ_PROTOCOL_VERSION,
    LanguageCode,
    RequestCode,
    ResponseCode,
    SerializeType,
    code_name,
)
from hamq.protocol.command import RemotingCommand
from hamq.protocol.converter import decode_header, encode_header
from hamq.protocol.errors import HeaderError, ProtocolError, RequestError
from hamq.protocol.frame import DEFAULT_MAX_FRAME_LENGTH, FrameDecoder, encode_frame

__all__ = [
    "DEFAULT_MAX_FRAME_LENGTH",
    "FLAG_ONEWAY",
    "FLAG_RESPONSE",
    "HAMQ_PROTOCOL_VERSION",
    "FrameDecoder",
    "HeaderError",
    "LanguageCode",
    "ProtocolError",
    "RemotingCommand",
    "RequestCode",
    "RequestError",
    "ResponseCode",
    "SerializeType",
    "code_name",
    "decode_header",
    "encode_frame",
    "encode_header",
]
