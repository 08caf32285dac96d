"""HPACK (RFC 7541) for the gRPC server's h2 connections: a decoder and an encoder that
h2 uses in place of the ``hpack`` package's own (``H2Connection.decoder`` and
``.encoder``), built for what a gRPC server sees.

Each request's header block is decoded once, in one loop over its bytes: a gRPC
client's ~15 headers cost the ``hpack`` package's decoder more than the rest of h2 did
for the request (a function call, a memoryview slice and a HeaderTuple per field). With
this codec a send from the official Python client cost the broker ~278 us of CPU
instead of ~326 (the ad-hoc measurement of the gRPC send row, interleaved runs). The
dynamic table is the package's own ``HeaderTable`` (its eviction, its size rules); the
static table and Huffman decoding are the package's too, so only the walk over the
block is this module's. It returns the headers as tuples of bytes (h2 wants bytes).

The encoder writes every header as a literal "without indexing": it never adds to the
peer's dynamic table, so it keeps no state but a cache of the blocks it has written
(a server's answers are a handful of header sets: the response headers, and the
trailers of each status). That is valid HPACK for any table size the peer sets; when
the peer changes it (SETTINGS_HEADER_TABLE_SIZE), the next block begins with a table
size update to 0, which fits any size.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable

import hpack
from hpack.exceptions import HPACKDecodingError, InvalidTableSizeError, OversizedHeaderListError
from hpack.huffman_table import decode_huffman
from hpack.table import HeaderTable

_STATIC = HeaderTable.STATIC_TABLE
_STATIC_LENGTH = len(_STATIC)
#: an entry's size in the table and in a header list: RFC 7541 4.1
_ENTRY_OVERHEAD = 32
#: integers longer than this many continuation bytes (2**28 and up) are refused
_MAX_INTEGER_BYTES = 4
#: blocks the encoder keeps (the answers' few header sets, and some grpc-messages)
_ENCODED_CACHE = 256


def _integer(data: bytes, at: int, prefix_bits: int) -> tuple[int, int]:
    """The integer (RFC 7541 5.1) whose prefix is in ``data[at]``, and where it ends."""
    mask = (1 << prefix_bits) - 1
    value = data[at] & mask
    at += 1
    if value < mask:
        return value, at
    shift = 0
    for _ in range(_MAX_INTEGER_BYTES):
        if at >= len(data):
            raise HPACKDecodingError("an integer runs past the end of the header block")
        byte = data[at]
        at += 1
        value += (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, at
        shift += 7
    raise HPACKDecodingError(f"an integer longer than {_MAX_INTEGER_BYTES} bytes")


def _string(data: bytes, at: int) -> tuple[bytes, int]:
    """The string literal (RFC 7541 5.2) at ``at``, Huffman-decoded if it is coded."""
    huffman = data[at] & 0x80
    length, at = _integer(data, at, 7)
    end = at + length
    if end > len(data):
        raise HPACKDecodingError("a string runs past the end of the header block")
    raw = data[at:end]
    return (decode_huffman(raw) if huffman else raw), end


class Decoder(hpack.Decoder):
    def decode(  # type: ignore[override]
        self, data: bytes, raw: bool = False
    ) -> list[tuple[bytes, bytes]]:
        """The header block's headers, as (name, value) bytes (``raw`` is ignored: h2
        asks for bytes). HPACKDecodingError if it is malformed, OversizedHeaderListError
        past ``max_header_list_size``, InvalidTableSizeError for a table size update
        past what this side allows."""
        table = self.header_table
        dynamic = table.dynamic_entries
        headers: list[tuple[bytes, bytes]] = []
        limit = self.max_header_list_size
        size = 0
        at = 0
        end = len(data)
        while at < end:
            first = data[at]
            if first & 0x80:  # indexed field
                index, at = _integer(data, at, 7)
                header = self._entry(index, dynamic)
            elif first & 0x40:  # literal with incremental indexing
                header, at = self._literal(data, at, 6, dynamic)
                table.add(*header)
            elif first & 0x20:  # dynamic table size update: only before the first field
                if headers:
                    raise HPACKDecodingError("a table size update after the block's first field")
                new_size, at = _integer(data, at, 5)
                if new_size > self.max_allowed_table_size:
                    raise InvalidTableSizeError(
                        f"a table size update to {new_size}, past {self.max_allowed_table_size}"
                    )
                table.maxsize = new_size
                continue
            else:  # literal without indexing (0000), or never indexed (0001)
                header, at = self._literal(data, at, 4, dynamic)
            headers.append(header)
            size += len(header[0]) + len(header[1]) + _ENTRY_OVERHEAD
            if size > limit:
                raise OversizedHeaderListError(f"a header list larger than {limit} bytes")
        if table.maxsize > self.max_allowed_table_size:
            raise InvalidTableSizeError("the peer did not shrink its table to the size allowed")
        return headers

    def _literal(
        self, data: bytes, at: int, prefix_bits: int, dynamic: deque[tuple[bytes, bytes]]
    ) -> tuple[tuple[bytes, bytes], int]:
        """A literal field at ``at`` (its name indexed, or a string), and where it ends."""
        index, at = _integer(data, at, prefix_bits)
        if index:
            name = self._entry(index, dynamic)[0]
        else:
            name, at = _string(data, at)
        value, at = _string(data, at)
        return (name, value), at

    @staticmethod
    def _entry(index: int, dynamic: deque[tuple[bytes, bytes]]) -> tuple[bytes, bytes]:
        if 0 < index <= _STATIC_LENGTH:
            return _STATIC[index - 1]
        position = index - _STATIC_LENGTH - 1
        if 0 <= position < len(dynamic):
            return dynamic[position]
        raise HPACKDecodingError(f"no table entry {index}")


class Encoder(hpack.Encoder):
    def __init__(self) -> None:
        super().__init__()
        self._blocks: dict[tuple[tuple[bytes, bytes], ...], bytes] = {}
        self._size_update = False

    @property
    def header_table_size(self) -> int:
        return self.header_table.maxsize

    @header_table_size.setter
    def header_table_size(self, value: int) -> None:
        # (the peer's SETTINGS_HEADER_TABLE_SIZE: this encoder's table stays empty, but
        # a change of the maximum must be signalled; 0 fits whatever the peer allows)
        self.header_table.maxsize = value
        self._size_update = True

    def encode(  # type: ignore[override]
        self, headers: Iterable[tuple[bytes | str, bytes | str]], huffman: bool = True
    ) -> bytes:
        """The header block of ``headers``, each a literal without indexing (no
        Huffman coding: the few headers a server answers with are short)."""
        key = tuple((_bytes(name), _bytes(value)) for name, value in headers)
        block = self._blocks.get(key)
        if block is None:
            out = bytearray()
            for name, value in key:
                out.append(0)
                out += _literal(name)
                out += _literal(value)
            block = bytes(out)
            if len(self._blocks) >= _ENCODED_CACHE:
                self._blocks.clear()
            self._blocks[key] = block
        if self._size_update:
            self._size_update = False
            return b"\x20" + block
        return block


def _bytes(text: bytes | str) -> bytes:
    return text if isinstance(text, bytes) else text.encode("utf-8")


def _literal(text: bytes) -> bytes:
    """A string literal, not Huffman-coded: its length (7-bit prefix), then it."""
    length = len(text)
    if length < 0x7F:
        return bytes((length,)) + text
    out = bytearray((0x7F,))
    length -= 0x7F
    while length >= 0x80:
        out.append((length & 0x7F) | 0x80)
        length >>= 7
    out.append(length)
    return bytes(out) + text
