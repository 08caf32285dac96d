"""The three header encodings, selected by the frame's serialize-type byte.

- 0 JSON (docs/PROTOCOL.md#json-header), written as Java's fastjson writes it: keys sorted,
  no spaces, raw UTF-8, control characters escaped, a null remark left out, ext
  field values as strings, plus ``serializeTypeCurrentRPC``. On decode an ext value
  may be a string, a number or a boolean; all become strings. msgspec reads and writes
  it (the same bytes as the stdlib's ``json.dumps(sort_keys=True, separators=(",",
  ":"), ensure_ascii=False)``, in a fifth of the time: every RocketMQ client but hamq's
  own sends JSON headers, one per message).
- 1 ROCKETMQ binary (docs/PROTOCOL.md#rocketmq-binary-header): code int16, language
  byte, version int16, opaque int32, flag int32, remark (int32 length, 0 = null), ext
  fields (int32 block length, then int16 key length + key, int32 value length +
  value). Big-endian.
- 2 MSGPACK (hamq's own clients): a map with the JSON header's field names.

Every decode failure raises ``ProtocolError`` naming what was wrong; nothing else
escapes a decoder (tests feed them random bytes).
"""

from __future__ import annotations

import struct
import threading
from collections.abc import Mapping
from typing import Annotated, Any

import msgpack
import msgspec

from hamq.protocol.codes import LanguageCode, SerializeType
from hamq.protocol.command import RemotingCommand
from hamq.protocol.errors import ProtocolError

#: what the decoders read a header from
Buffer = bytes | bytearray | memoryview

_INT32_MIN = -(2**31)
_INT32_MAX = 2**31 - 1

# ---------------------------------------------------------------- shared mapping form


#: language names by code, and codes by name (enum lookups cost more than dict ones)
_LANGUAGE_NAMES: dict[int, str] = {code: code.name for code in LanguageCode}
_LANGUAGE_BY_NAME: dict[str, LanguageCode] = {code.name: code for code in LanguageCode}
_LANGUAGE_BY_CODE: dict[int, LanguageCode] = {code.value: code for code in LanguageCode}
# Enum member lookups cost a descriptor call each; hot paths use these names.
_OTHER = LanguageCode.OTHER
_JSON = SerializeType.JSON
_ROCKETMQ = SerializeType.ROCKETMQ
_MSGPACK = SerializeType.MSGPACK


def _command_fields(cmd: RemotingCommand) -> dict[str, Any]:
    """The JSON/msgpack map of a command (JSON sorts the keys when it writes them)."""
    fields: dict[str, Any] = {
        "code": cmd.code,
        "flag": cmd.flag,
        "language": _LANGUAGE_NAMES.get(cmd.language, "OTHER"),
        "opaque": cmd.opaque,
        "version": cmd.version,
    }
    if cmd.ext_fields:
        fields["extFields"] = cmd.ext_fields
    if cmd.remark is not None:
        fields["remark"] = cmd.remark
    return fields


def _int_field(header: Mapping[Any, Any], key: str, default: int | None) -> int:
    value = header.get(key, default)
    if value is None:
        raise ProtocolError(f"header has no {key!r}")
    if isinstance(value, bool) or not isinstance(value, int):
        raise ProtocolError(f"header field {key!r} must be an integer, not {value!r:.40}")
    if not _INT32_MIN <= value <= _INT32_MAX:
        raise ProtocolError(f"header field {key!r} = {value} does not fit in an int32")
    return value


def _ext_value(key: str, value: object) -> str | None:
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return str(int(value)) if value.is_integer() else str(value)
    if value is None:
        return None
    raise ProtocolError(
        f"extFields value for {key!r} must be a string or a number, not {type(value).__name__}"
    )


def _ext_fields(raw: dict[Any, Any]) -> dict[str, str]:
    """Ext fields with every value a string (numbers and booleans converted)."""
    fields: dict[str, str] = {}
    for key, value in raw.items():
        if not isinstance(key, str):
            raise ProtocolError(f"extFields key {key!r:.40} is not a string")
        text = _ext_value(key, value)
        if text is not None:
            fields[key] = text
    return fields


def _from_mapping(header: Any, serialize_type: SerializeType, body: bytes) -> RemotingCommand:
    """A command from a decoded JSON/msgpack header map.

    The fast path takes a header with every field present and well typed; anything
    else goes through ``_checked_from_mapping``, which applies RocketMQ's defaults and
    names what is wrong.
    """
    try:
        code = header["code"]
        opaque = header["opaque"]
        flag = header["flag"]
        version = header["version"]
        language = _LANGUAGE_BY_NAME.get(header["language"], _OTHER)
        remark = header.get("remark")
        ext = header.get("extFields")
    except (KeyError, TypeError, AttributeError):
        return _checked_from_mapping(header, serialize_type, body)
    if not (
        type(code) is type(opaque) is type(flag) is type(version) is int
        and not (code | opaque | flag | version) >> 31  # four non-negative int32s
        and (remark is None or type(remark) is str)
    ):
        return _checked_from_mapping(header, serialize_type, body)
    if ext is None:
        ext = {}
    elif type(ext) is dict:
        for key, value in ext.items():
            if type(value) is not str or type(key) is not str:
                return _checked_from_mapping(header, serialize_type, body)
    else:
        return _checked_from_mapping(header, serialize_type, body)
    return RemotingCommand(code, opaque, flag, remark, ext, body, language, version, serialize_type)


def _checked_from_mapping(
    header: Any, serialize_type: SerializeType, body: bytes
) -> RemotingCommand:
    if type(header) is not dict:
        raise ProtocolError(f"header must be a map, not {type(header).__name__}")
    language_name = header.get("language", "JAVA")
    if type(language_name) is not str:
        raise ProtocolError(f"header field 'language' must be a name, not {language_name!r:.40}")
    remark = header.get("remark")
    if remark is not None and type(remark) is not str:
        raise ProtocolError(f"header field 'remark' must be a string, not {remark!r:.40}")
    ext = header.get("extFields")
    if ext is not None and type(ext) is not dict:
        raise ProtocolError(f"extFields must be an object, not {type(ext).__name__}")
    return RemotingCommand(
        _int_field(header, "code", None),
        _int_field(header, "opaque", 0),
        _int_field(header, "flag", 0),
        remark,
        _ext_fields(ext) if ext else {},
        body,
        _LANGUAGE_BY_NAME.get(language_name, _OTHER),
        _int_field(header, "version", 0),
        serialize_type,
    )


# ---------------------------------------------------------------- JSON (0)


_JSON_ENCODER = msgspec.json.Encoder(order="sorted")
_JSON_DECODER = msgspec.json.Decoder()

_Int32 = Annotated[int, msgspec.Meta(ge=0, le=_INT32_MAX)]


class _JsonHeader(msgspec.Struct):
    """A JSON header of the usual shape, typed: msgspec checks it while it parses (in
    half the time of parsing to a map and checking that). Anything else (a field
    missing but ``code``, a number as an ext value, a negative opaque) fails here and
    is read as a map, which applies RocketMQ's defaults and names what is wrong."""

    code: _Int32
    opaque: _Int32 = 0
    flag: _Int32 = 0
    language: str = "JAVA"
    version: _Int32 = 0
    remark: str | None = None
    extFields: dict[str, str] = {}  # (the wire's name; msgspec gives each its own dict)


_JSON_HEADER_DECODER = msgspec.json.Decoder(_JsonHeader)


def encode_json_header(cmd: RemotingCommand) -> bytes:
    fields = _command_fields(cmd)
    fields["serializeTypeCurrentRPC"] = "JSON"
    return _JSON_ENCODER.encode(fields)


def decode_json_header(data: Buffer, body: bytes) -> RemotingCommand:
    try:
        typed = _JSON_HEADER_DECODER.decode(data)
    except (ValueError, RecursionError):  # (msgspec's ValidationError is a ValueError)
        pass
    else:
        return RemotingCommand(
            typed.code,
            typed.opaque,
            typed.flag,
            typed.remark,
            typed.extFields,
            body,
            _LANGUAGE_BY_NAME.get(typed.language, _OTHER),
            typed.version,
            _JSON,
        )
    try:
        header = _JSON_DECODER.decode(data)
    except (ValueError, RecursionError) as exc:  # (msgspec.DecodeError is a ValueError)
        raise ProtocolError(f"JSON header does not parse: {exc}") from None
    return _from_mapping(header, _JSON, body)


# ---------------------------------------------------------------- MSGPACK (2)


_PACKERS = threading.local()


def encode_msgpack_header(cmd: RemotingCommand) -> bytes:
    try:
        packer = _PACKERS.packer
    except AttributeError:
        packer = _PACKERS.packer = msgpack.Packer()
    packed: bytes = packer.pack(_command_fields(cmd))
    return packed


def decode_msgpack_header(data: Buffer, body: bytes) -> RemotingCommand:
    try:
        header = msgpack.unpackb(data)  # raw=False, strict_map_key=True are the defaults
    except (ValueError, TypeError, msgpack.UnpackException) as exc:
        raise ProtocolError(f"msgpack header does not parse: {exc}") from None
    return _from_mapping(header, _MSGPACK, body)


# ---------------------------------------------------------------- ROCKETMQ binary (1)

_FIXED = struct.Struct(">hBhii")  # code, language, version, opaque, flag: 13 bytes
_INT32 = struct.Struct(">i")
_INT16 = struct.Struct(">h")


def encode_rocketmq_header(cmd: RemotingCommand) -> bytes:
    try:
        parts = [_FIXED.pack(cmd.code, cmd.language, cmd.version, cmd.opaque, cmd.flag)]
    except struct.error as exc:
        raise ValueError(f"{cmd.describe()} does not fit a ROCKETMQ header: {exc}") from None
    remark = cmd.remark.encode() if cmd.remark else b""
    parts += [_INT32.pack(len(remark)), remark]
    ext = bytearray()
    for key, value in cmd.ext_fields.items():
        key_bytes = key.encode()
        value_bytes = value.encode()
        ext += _INT16.pack(len(key_bytes))
        ext += key_bytes
        ext += _INT32.pack(len(value_bytes))
        ext += value_bytes
    parts += [_INT32.pack(len(ext)), bytes(ext)]
    return b"".join(parts)


class _Reader:
    """Bounds-checked reads from a header slice."""

    __slots__ = ("data", "pos")

    def __init__(self, data: Buffer) -> None:
        self.data = data
        self.pos = 0

    def unpack(self, fmt: struct.Struct, what: str) -> tuple[Any, ...]:
        if self.pos + fmt.size > len(self.data):
            raise ProtocolError(f"ROCKETMQ header ends inside {what}")
        values = fmt.unpack_from(self.data, self.pos)
        self.pos += fmt.size
        return values

    def text(self, length: int, what: str) -> str:
        if length < 0 or self.pos + length > len(self.data):
            raise ProtocolError(
                f"ROCKETMQ header: {what} length {length} runs past the header "
                f"({len(self.data) - self.pos} bytes left)"
            )
        raw = self.data[self.pos : self.pos + length]
        self.pos += length
        try:
            return bytes(raw).decode()
        except UnicodeDecodeError as exc:
            raise ProtocolError(f"ROCKETMQ header: {what} is not UTF-8: {exc}") from None


def decode_rocketmq_header(data: Buffer, body: bytes) -> RemotingCommand:
    reader = _Reader(data)
    code, language, version, opaque, flag = reader.unpack(_FIXED, "the fixed fields")
    (remark_length,) = reader.unpack(_INT32, "the remark length")
    remark = reader.text(remark_length, "remark") if remark_length else None
    (ext_length,) = reader.unpack(_INT32, "the extFields length")
    if ext_length < 0 or reader.pos + ext_length != len(data):
        raise ProtocolError(
            f"ROCKETMQ header: extFields length {ext_length} does not match the "
            f"{len(data) - reader.pos} bytes left in the header"
        )
    fields: dict[str, str] = {}
    while reader.pos < len(data):
        (key_length,) = reader.unpack(_INT16, "an extFields key length")
        key = reader.text(key_length, "extFields key")
        (value_length,) = reader.unpack(_INT32, f"the length of extFields value {key!r}")
        value = reader.text(value_length, f"extFields value {key!r}")
        if key and value:  # a zero-length string is null on this wire: the field is absent
            fields[key] = value
    return RemotingCommand(
        code=code,
        opaque=opaque,
        flag=flag,
        remark=remark,
        ext_fields=fields,
        body=body,
        language=_LANGUAGE_BY_CODE.get(language, _OTHER),
        version=version,
        serialize_type=_ROCKETMQ,
    )


# ---------------------------------------------------------------- selection

#: header encoders indexed by serialize type
ENCODERS = (encode_json_header, encode_rocketmq_header, encode_msgpack_header)
#: header decoders indexed by serialize type
DECODERS = (decode_json_header, decode_rocketmq_header, decode_msgpack_header)
assert [SerializeType(i).name for i in range(len(ENCODERS))] == ["JSON", "ROCKETMQ", "MSGPACK"]


def encode_header_bytes(cmd: RemotingCommand) -> bytes:
    """The header of ``cmd`` in its own serialize type."""
    return ENCODERS[cmd.serialize_type](cmd)


def decode_command(serialize_type: int, header: Buffer, body: bytes) -> RemotingCommand:
    """A command from a header in the given serialize type and its body."""
    if not 0 <= serialize_type < len(DECODERS):
        raise ProtocolError(
            f"unknown serialize type {serialize_type} (0 JSON, 1 ROCKETMQ, 2 MSGPACK)"
        )
    return DECODERS[serialize_type](header, body)
