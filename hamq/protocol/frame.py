"""The remoting frame: sans-IO incremental decoder and encoder (docs/PROTOCOL.md#remoting-frames).

Layout, big-endian::

    int32 length | int32 (serializeType << 24 | headerLength) | header | body

``length`` counts everything after itself (4 + headerLength + bodyLength), so a valid
frame has ``length >= 4`` and ``headerLength <= length - 4``. Frames longer than the
configured maximum (16 MiB default, RocketMQ's ``frameMaxLength``) are refused as soon
as their length field is seen, before any of the frame is buffered.

``FrameDecoder`` consumes only whole frames: feed it bytes, then take commands until
``next_command()`` answers None (need more data). After a ``ProtocolError`` the
decoder is poisoned and raises the same error again: the stream cannot be trusted.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator

from hamq.protocol.command import RemotingCommand
from hamq.protocol.errors import ProtocolError
from hamq.protocol.serialization import DECODERS as _DECODERS
from hamq.protocol.serialization import ENCODERS as _ENCODERS

#: RocketMQ's default ``com.rocketmq.remoting.frameMaxLength``.
DEFAULT_MAX_FRAME_LENGTH = 16 * 1024 * 1024
#: The largest header the 24-bit header-length field can describe.
MAX_HEADER_LENGTH = 0xFFFFFF

#: bodies above this are copied out of a carried bytearray through a memoryview (one copy)
_COPY_ONCE_BYTES = 64 * 1024
_LENGTH = struct.Struct(">i")
_PREFIX = struct.Struct(">iI")  # length, serialize-type/header-length word
_SERIALIZE_TYPES = len(_DECODERS)


def encode_frame(cmd: RemotingCommand) -> bytes:
    """One whole frame for ``cmd``, its header in ``cmd.serialize_type``."""
    serialize_type = cmd.serialize_type
    header = _ENCODERS[serialize_type](cmd)
    header_length = len(header)
    length = 4 + header_length + len(cmd.body)
    if header_length > MAX_HEADER_LENGTH or length > 0x7FFFFFFF:
        raise ValueError(
            f"{cmd.describe()}: a header of {header_length} bytes (limit {MAX_HEADER_LENGTH}) "
            f"in a frame of {length} bytes (limit {0x7FFFFFFF}) cannot be encoded"
        )
    return _PREFIX.pack(length, (serialize_type << 24) | header_length) + header + cmd.body


class FrameDecoder:
    """Incremental decoder: ``feed(bytes)``, then ``next_command()`` until None."""

    __slots__ = ("_buffer", "_error", "_pos", "max_frame_length")

    def __init__(self, max_frame_length: int = DEFAULT_MAX_FRAME_LENGTH) -> None:
        if not 8 <= max_frame_length <= 0x7FFFFFFF:
            raise ValueError(f"max_frame_length {max_frame_length} is not in 8..2**31-1")
        self.max_frame_length = max_frame_length
        # Whole chunks are decoded straight from the received bytes; only a partial
        # frame left over is carried in a bytearray that later chunks are appended to.
        self._buffer: bytes | bytearray = b""
        self._pos = 0
        self._error: ProtocolError | None = None

    @property
    def buffered(self) -> int:
        """Bytes received but not yet returned as commands (a partial frame at EOF)."""
        return len(self._buffer) - self._pos

    def feed(self, data: bytes | bytearray | memoryview) -> None:
        buffer = self._buffer
        if self._pos >= len(buffer):
            self._buffer = data if type(data) is bytes else bytes(data)
        elif type(buffer) is bytearray and self._pos == 0:
            buffer += data
        else:
            carried = bytearray(memoryview(buffer)[self._pos :])
            carried += data
            self._buffer = carried
        self._pos = 0

    @property
    def failed(self) -> bool:
        """True once a bad frame was met; every later call raises its ProtocolError."""
        return self._error is not None

    def next_command(self) -> RemotingCommand | None:
        """The next whole command, or None when more bytes are needed."""
        commands = self._decode(1)
        return commands[0] if commands else None

    def commands(self) -> list[RemotingCommand]:
        """Every whole command buffered so far, in order (the hot path).

        Should the bytes after them not be a valid frame, the commands before the bad
        frame are still returned (they arrived intact), ``failed`` becomes true and the
        next call raises the ProtocolError.
        """
        return self._decode(-1)

    def __iter__(self) -> Iterator[RemotingCommand]:
        """Every whole command buffered so far; raises at a bad frame."""
        while (cmd := self.next_command()) is not None:
            yield cmd

    def _decode(self, limit: int) -> list[RemotingCommand]:
        if self._error is not None:
            raise self._error
        out: list[RemotingCommand] = []
        append = out.append
        buffer = self._buffer
        size = len(buffer)
        # slices of bytes are the one copy a body needs; a bytearray's need one more
        whole = buffer if type(buffer) is bytes else None
        max_length = self.max_frame_length
        decoders = _DECODERS
        pos = self._pos
        try:
            while limit:
                if size - pos < 8:
                    if size - pos >= 4:
                        self._check_length(_LENGTH.unpack_from(buffer, pos)[0])
                    break
                length, word = _PREFIX.unpack_from(buffer, pos)
                if length < 4 or length > max_length:
                    self._check_length(length)
                header_length = word & 0xFFFFFF
                if header_length > length - 4:
                    raise ProtocolError(
                        f"header length {header_length} runs past the end of a frame "
                        f"of length {length}"
                    )
                end = pos + 4 + length
                if size < end:
                    break
                serialize_type = word >> 24
                if serialize_type >= _SERIALIZE_TYPES:
                    raise ProtocolError(
                        f"unknown serialize type {serialize_type} (0 JSON, 1 ROCKETMQ, 2 MSGPACK)"
                    )
                header_start = pos + 8
                body_start = header_start + header_length
                pos = end
                if whole is not None:
                    body = whole[body_start:end]
                elif end - body_start > _COPY_ONCE_BYTES:
                    with memoryview(buffer) as view:
                        body = view[body_start:end].tobytes()
                else:
                    body = bytes(buffer[body_start:end])
                append(decoders[serialize_type](buffer[header_start:body_start], body))
                limit -= 1
        except ProtocolError as exc:
            self._error = exc
            if not out:
                raise
        finally:
            self._pos = pos
        return out

    def _check_length(self, length: int) -> None:
        if length < 4:
            raise ProtocolError(
                f"frame length {length} is impossible (it must count at least the "
                f"4-byte header-length field)"
            )
        if length > self.max_frame_length:
            raise ProtocolError(
                f"frame length {length} exceeds the maximum frame length {self.max_frame_length}"
            )
