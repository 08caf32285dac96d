"""RemotingCommand: the one message shape of every remoting request and response.

A command is code + language + version + opaque + flag + remark + ext fields + body
(docs/PROTOCOL.md#headers). Invariants:
- ``ext_fields`` maps str -> str. Values arrive as strings or numbers (the C++ client
  mixes both); header codecs normalise them to strings on decode and always write
  strings, so typed headers are built from strings only.
- ``opaque`` is an int32 request id; a response carries its request's opaque.
- ``serialize_type`` is how the command travels; a response is sent in its request's
  serialize type (``RemotingCommand.response_to`` copies it).
- A command is built, handed to the remoting layer once and not touched afterwards;
  it is a mutable ``define`` class only because building one is on the hot path.
"""

from __future__ import annotations

from typing import Any, TypeVar

import attrs

from hamq.protocol.codes import (
    FLAG_ONEWAY,
    FLAG_RESPONSE,
    HAMQ_PROTOCOL_VERSION,
    LanguageCode,
    ResponseCode,
    SerializeType,
    code_name,
)
from hamq.protocol.converter import decode_header, encode_header

H = TypeVar("H")

_PYTHON = LanguageCode.PYTHON  # enum member lookups are slow; response_to is hot


@attrs.define(slots=True, eq=True)
class RemotingCommand:
    code: int
    opaque: int = 0
    flag: int = 0
    remark: str | None = None
    ext_fields: dict[str, str] = attrs.field(factory=dict)
    body: bytes = b""
    language: LanguageCode = LanguageCode.PYTHON
    version: int = HAMQ_PROTOCOL_VERSION
    serialize_type: SerializeType = SerializeType.MSGPACK

    # ------------------------------------------------------------ building
    @classmethod
    def request(
        cls,
        code: int,
        header: Any = None,
        *,
        body: bytes = b"",
        ext_fields: dict[str, str] | None = None,
        oneway: bool = False,
        serialize_type: SerializeType = SerializeType.MSGPACK,
    ) -> RemotingCommand:
        """A request; ``header`` is a typed header object (headers.py) or None."""
        fields = encode_header(header) if header is not None else {}
        if ext_fields:
            fields.update(ext_fields)
        return cls(
            code=code,
            flag=FLAG_ONEWAY if oneway else 0,
            ext_fields=fields,
            body=body,
            serialize_type=serialize_type,
        )

    def response_to(
        self,
        code: int = ResponseCode.SUCCESS,
        remark: str | None = None,
        header: Any = None,
        *,
        body: bytes = b"",
        ext_fields: dict[str, str] | None = None,
    ) -> RemotingCommand:
        """The response to this request: same opaque and serialize type, response bit set."""
        fields = encode_header(header) if header is not None else {}
        if ext_fields:
            fields.update(ext_fields)
        return RemotingCommand(
            code,
            self.opaque,
            FLAG_RESPONSE,
            remark,
            fields,
            body,
            _PYTHON,
            HAMQ_PROTOCOL_VERSION,
            self.serialize_type,
        )

    # ------------------------------------------------------------ reading
    @property
    def is_response(self) -> bool:
        return bool(self.flag & FLAG_RESPONSE)

    @property
    def is_oneway(self) -> bool:
        return bool(self.flag & FLAG_ONEWAY)

    def header(self, cls: type[H]) -> H:
        """The ext fields as a typed header; HeaderError names every bad field."""
        return decode_header(cls, self.ext_fields)

    def describe(self) -> str:
        """A short text for logs: ``request SEND_MESSAGE(10) opaque 7``."""
        kind = "response" if self.is_response else "request"
        return f"{kind} {code_name(self.code, response=self.is_response)} opaque {self.opaque}"
