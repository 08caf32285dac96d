"""hamq/grpc/hpack_codec.py against the hpack package: what one encodes, the other
decodes to the same headers, block after block on one connection's tables."""

from __future__ import annotations

import random

import hpack
import pytest
from hpack.exceptions import HPACKDecodingError, InvalidTableSizeError, OversizedHeaderListError

from hamq.grpc.hpack_codec import Decoder, Encoder

#: metadata in the shape grpcio's core sends a gRPC client's: literals with a literal
#: name, not Huffman-coded, without indexing (and here one never indexed)
GRPCIO_BLOCK = bytes.fromhex(
    "000d782d6d712d6c616e677561676506505954484f4e"  # x-mq-language: PYTHON
    "100f782d6d712d726571756573742d6964037a7a7a"  # never indexed x-mq-request-id: zzz
)


def _headers(rng: random.Random, n: int) -> list[tuple[bytes, bytes]]:
    names = [b":path", b"content-type", b"x-mq-client-id", b"grpc-timeout", b"user-agent"]
    out = []
    for _ in range(n):
        name = rng.choice(names) if rng.random() < 0.7 else f"x-h{rng.randrange(40)}".encode()
        value = bytes(rng.randrange(32, 127) for _ in range(rng.choice((0, 3, 20, 130, 300))))
        out.append((name, value))
    return out


@pytest.mark.parametrize("seed", range(5))
def test_blocks_the_hpack_package_encodes_decode_alike(seed: int) -> None:
    rng = random.Random(seed)
    encoder = hpack.Encoder()
    ours, theirs = Decoder(), hpack.Decoder()
    for round_no in range(300):
        if round_no % 97 == 50:  # (a table size change: the next block says so)
            encoder.header_table_size = rng.choice((0, 256, 4096))
        headers = _headers(rng, rng.randrange(1, 12))
        block = encoder.encode(headers, huffman=rng.random() < 0.5)
        expected = [(bytes(k), bytes(v)) for k, v in theirs.decode(block, raw=True)]
        assert ours.decode(block, raw=True) == expected == headers
        assert list(ours.header_table.dynamic_entries) == list(theirs.header_table.dynamic_entries)


def test_literals_without_indexing_and_never_indexed() -> None:
    assert Decoder().decode(GRPCIO_BLOCK) == [
        (b"x-mq-language", b"PYTHON"),
        (b"x-mq-request-id", b"zzz"),
    ]


@pytest.mark.parametrize(
    ("block", "error"),
    [
        (b"\x80", HPACKDecodingError),  # index 0
        (b"\xff\x00", HPACKDecodingError),  # index 127: no such entry
        (b"\xbe", HPACKDecodingError),  # index 62: the dynamic table is empty
        (b"\x00\x05ab", HPACKDecodingError),  # a name past the end
        (b"\x7f\xff\xff\xff\xff\xff\x01", HPACKDecodingError),  # an endless integer
        (b"\x82\x20", HPACKDecodingError),  # a size update after a field
        (b"\x3f\xe2\x1f", InvalidTableSizeError),  # a size update to 4096+1
        (b"\x00\x01a\x81\xff", HPACKDecodingError),  # bad Huffman padding
    ],
)
def test_malformed_blocks_are_refused(block: bytes, error: type[Exception]) -> None:
    with pytest.raises(error):
        Decoder().decode(block)


def test_a_header_list_past_the_limit_is_refused() -> None:
    decoder = Decoder()
    decoder.max_header_list_size = 100
    block = hpack.Encoder().encode([(b"a", b"x" * 30), (b"b", b"y" * 40)])
    with pytest.raises(OversizedHeaderListError):
        decoder.decode(block)


def test_what_the_encoder_writes_the_hpack_package_decodes() -> None:
    encoder, decoder = Encoder(), hpack.Decoder()
    answers = [
        [(":status", "200"), ("content-type", "application/grpc")],
        [("grpc-status", "0")],
        [("grpc-status", "3"), ("grpc-message", "x" * 200 + " ü")],
    ]
    for headers in answers * 3:
        decoded = decoder.decode(encoder.encode(headers))
        assert decoded == list(headers)
    # the peer shrinks its table: the next block says so first, and still decodes
    decoder.max_allowed_table_size = 0
    encoder.header_table_size = 0
    block = encoder.encode([("grpc-status", "0")])
    assert block[0] == 0x20
    assert decoder.decode(block) == [("grpc-status", "0")]
    assert encoder.encode([("grpc-status", "0")])[0] == 0  # (said once)
