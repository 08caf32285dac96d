"""Fuzzing every decoder that reads a peer's or a disk's bytes.

A mutation fuzzer with a fixed seed (the same inputs on every run, in a few seconds):
for each decoder, a corpus of valid encodings (drawn by ``tests.support.strategies.sample``)
that must round-trip, and from each of them mutated copies — bits flipped, bytes set,
ranges cut, doubled or spliced from another input, lengths and int32 fields set to
edge values, inputs cut short — plus hand-made hostile ones (deep nesting, huge
lengths). The property: a decoder either decodes the input or raises its module's
documented error; never another exception (IndexError, struct.error,
UnicodeDecodeError, RecursionError, MemoryError, ...), and never hangs (pytest-timeout
ends a run that does). Each test prints what it ran:
``fuzz <target>: N inputs (D decoded, R refused with <Error>)``.

Decoders: the remoting frame (FrameDecoder), the three header serializations, every
typed header (ext fields), every JSON body, CommitLog records (and pull bodies of
several), batch bodies, HA messages of both protocols. And a real broker: mutated
frames over real connections to its remoting port, its embedded nameserver's and its
HA port; afterwards it still serves a producer and a consumer.
"""

from __future__ import annotations

import collections
import logging
import random
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio

from hamq.client import Message, Producer, PullConsumer, PullStatus, SendStatus
from hamq.protocol import (
    FrameDecoder,
    HeaderError,
    LanguageCode,
    ProtocolError,
    RemotingCommand,
    RequestCode,
    SerializeType,
    decode_header,
    encode_frame,
    encode_header,
    ha_wire,
)
from hamq.protocol import bodies as bodies_module
from hamq.protocol import headers as headers_module
from hamq.protocol.bodies import BodyError, decode_body, decode_reset_offsets, encode_body
from hamq.protocol.codes import code_name
from hamq.protocol.converter import wire_name
from hamq.protocol.ha_wire import (
    EpochEntry,
    HAProtocol,
    HAProtocolError,
    MasterHandshake,
    MasterMessageDecoder,
    SlaveHandshake,
    SlaveMessageDecoder,
    SlaveReport,
    Transfer,
)
from hamq.protocol.headers import SendMessageRequestHeader, SendMessageResponseHeader
from hamq.protocol.message import (
    BatchEntry,
    MessageFormatError,
    decode_batch,
    encode_batch,
    encode_properties,
)
from hamq.protocol.record import decode_messages, make_record_template, read_record, read_summary
from hamq.protocol.send_fields import decode_send_header, decode_send_response, to_v2_fields
from hamq.protocol.serialization import decode_command, encode_header_bytes
from tests.support.brokers import running_broker, send_request
from tests.support.strategies import (
    EDGE_INTS,
    as_rocketmq_delivers,
    sample,
    sample_int,
    sample_text,
)

SEED = 14
#: mutated inputs made from each valid one
MUTANTS_PER_SEED = 80


# ---------------------------------------------------------------- the mutator
def _int32_at(data: bytearray, rng: random.Random) -> None:
    if len(data) >= 4:
        at = rng.randrange(len(data) - 3)
        value = rng.choice([*EDGE_INTS[:9], len(data), len(data) - at, 2**24, -4])
        data[at : at + 4] = (value & 0xFFFFFFFF).to_bytes(4, "big")


def _mutate_once(data: bytearray, rng: random.Random, corpus: list[bytes]) -> None:
    """One random change of ``data``, in place."""
    kind = rng.randrange(8)
    at = rng.randrange(len(data)) if data else 0
    if kind == 0 and data:  # flip a bit
        data[at] ^= 1 << rng.randrange(8)
    elif kind == 1 and data:  # an interesting byte
        data[at] = rng.choice([0x00, 0x01, 0x02, 0x7F, 0x80, 0xFF, 0x22, 0x7B, 0x5B])
    elif kind == 2:  # a length or an int32 field set to an edge value
        _int32_at(data, rng)
    elif kind == 3:  # cut short
        del data[rng.randrange(len(data) + 1) :]
    elif kind == 4 and data:  # a range removed
        del data[at : at + rng.randint(1, 16)]
    elif kind == 5 and data:  # a range doubled
        chunk = data[at : at + rng.randint(1, 32)]
        data[at:at] = chunk
    elif kind == 6:  # random bytes inserted
        data[at:at] = rng.randbytes(rng.randint(1, 8))
    else:  # spliced with another input
        other = rng.choice(corpus)
        cut = rng.randrange(len(other) + 1)
        data[at:] = other[cut:]


def mutants(seed: bytes, rng: random.Random, corpus: list[bytes], count: int) -> Iterator[bytes]:
    """``count`` mutated copies of ``seed``, each from one to four changes."""
    for _ in range(count):
        data = bytearray(seed)
        for _ in range(rng.randint(1, 4)):
            _mutate_once(data, rng, corpus)
        yield bytes(data)


#: hostile inputs for decoders that parse JSON or msgpack
DEEP_JSON = [
    b"[" * 100_000,
    b'{"a":' * 50_000,
    b"[" * 10_000 + b"]" * 10_000,
    b'{"code":1,"extFields":' + b"[" * 50_000,
    b'{"code":' + b"9" * 5000 + b"}",
    b'{"code":1e999,"opaque":-1e999}',
    b"\xef\xbb\xbf{}",
    b"\xff\xfe{\x00}\x00",
]
DEEP_MSGPACK = [b"\x91" * 100_000, b"\x81\xa1a" * 30_000, b"\xdd\xff\xff\xff\xff", b"\xc1"]


# ---------------------------------------------------------------- the driver
@attrs.define
class Tally:
    """What one target ran: inputs, how many decoded, how many were refused (by type)."""

    name: str
    inputs: int = 0
    decoded: int = 0
    refused: collections.Counter[str] = attrs.Factory(collections.Counter)

    def line(self) -> str:
        refusals = ", ".join(f"{n} refused with {e}" for e, n in sorted(self.refused.items()))
        return f"fuzz {self.name}: {self.inputs} inputs ({self.decoded} decoded, {refusals})"


def fuzz(
    name: str,
    inputs: Iterable[Any],
    decode: Callable[[Any], object],
    allowed: tuple[type[Exception], ...],
    tally: Tally | None = None,
) -> Tally:
    """Decode each input (bytes, or ext fields); anything but success or ``allowed``
    fails, naming the input. Counts go to ``tally`` (a new one by default)."""
    tally = tally or Tally(name)
    for data in inputs:
        tally.inputs += 1
        try:
            decode(data)
        except allowed as exc:
            tally.refused[type(exc).__name__] += 1
        except BaseException as exc:
            raise AssertionError(
                f"{name}: {type(exc).__name__}: {exc!s:.300} for input {data!r:.400} "
                f"({len(data)} long)"
            ) from exc
        else:
            tally.decoded += 1
    return tally


def report(capsys: pytest.CaptureFixture[str], *tallies: Tally) -> None:
    with capsys.disabled():
        for tally in tallies:
            print(f"\n{tally.line()}", end="")


def fuzz_corpus(
    name: str,
    corpus: list[bytes],
    decode: Callable[[bytes], object],
    allowed: tuple[type[Exception], ...],
    rng: random.Random,
    hostile: Iterable[bytes] = (),
    *,
    valid: bool = True,
) -> Tally:
    """The corpus itself (``valid``: each must decode; its round trip is the caller's to
    check), its mutants and the hostile inputs."""
    if valid:
        for data in corpus:
            decode(data)

    def inputs() -> Iterator[bytes]:
        yield from hostile
        if not valid:
            yield from corpus
        for seed in corpus:
            yield from mutants(seed, rng, corpus, MUTANTS_PER_SEED)

    return fuzz(name, inputs(), decode, allowed)


def in_chunks(data: bytes, rng: random.Random) -> list[bytes]:
    """``data`` cut at random points, as a stream delivers it."""
    cuts = sorted(rng.sample(range(1, len(data)), min(3, len(data) - 1))) if len(data) > 1 else []
    return [data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)], strict=True)]


# ---------------------------------------------------------------- frames and headers
def sample_command(rng: random.Random, serialize_type: SerializeType) -> RemotingCommand:
    """A request as clients send them: a real code, a typed header's ext fields."""
    header_class = rng.choice(headers_module.ALL_HEADERS)
    fields = encode_header(sample(header_class, rng))
    if rng.random() < 0.3:
        fields[sample_text(rng, min_size=1)] = sample_text(rng, min_size=1)
    cmd = RemotingCommand(
        # (ROCKETMQ's binary header holds a 16-bit code: pop's 200050... go as JSON)
        code=rng.choice(
            [c for c in RequestCode if serialize_type is not SerializeType.ROCKETMQ or c < 2**15]
        ),
        opaque=sample_int(rng, 32),
        flag=rng.choice([0, 1, 2]),
        remark=rng.choice([None, sample_text(rng, min_size=1)]),
        ext_fields=fields,
        body=rng.randbytes(rng.choice([0, 3, 40])),
        language=rng.choice(list(LanguageCode)),
        version=sample_int(rng, 16),
        serialize_type=serialize_type,
    )
    return as_rocketmq_delivers(cmd) if serialize_type is SerializeType.ROCKETMQ else cmd


def decode_stream(data: bytes, rng: random.Random) -> list[RemotingCommand]:
    """Every command of ``data`` fed to one FrameDecoder in chunks."""
    decoder = FrameDecoder(max_frame_length=1 << 20)
    commands: list[RemotingCommand] = []
    for chunk in in_chunks(data, rng):
        decoder.feed(chunk)
        commands += decoder.commands()
    return commands


def test_the_frame_decoder_decodes_or_refuses_mutated_streams(
    capsys: pytest.CaptureFixture[str],
) -> None:
    rng = random.Random(SEED)
    corpus = []
    for _ in range(60):
        commands = [sample_command(rng, rng.choice(list(SerializeType))) for _ in range(3)]
        stream = b"".join(encode_frame(cmd) for cmd in commands)
        assert decode_stream(stream, rng) == commands
        corpus.append(stream)
    tally = fuzz_corpus(
        "remoting frames", corpus, lambda data: decode_stream(data, rng), (ProtocolError,), rng
    )
    report(capsys, tally)


def test_each_header_serialization_decodes_or_refuses_mutated_headers(
    capsys: pytest.CaptureFixture[str],
) -> None:
    rng = random.Random(SEED)
    hostile = {SerializeType.JSON: DEEP_JSON, SerializeType.MSGPACK: DEEP_MSGPACK}
    tallies = []
    for serialize_type in SerializeType:
        corpus = []
        for _ in range(60):
            cmd = sample_command(rng, serialize_type)
            cmd.body = b""
            header = encode_header_bytes(cmd)
            assert decode_command(serialize_type, header, b"") == cmd
            corpus.append(header)
        tallies.append(
            fuzz_corpus(
                f"{serialize_type.name} headers",
                corpus,
                lambda data, t=serialize_type: decode_command(t, data, b""),
                (ProtocolError,),
                rng,
                hostile.get(serialize_type, ()),
            )
        )
    report(capsys, *tallies)


def _mutated_fields(
    fields: Mapping[str, str], rng: random.Random, wire_keys: list[str]
) -> dict[str, object]:
    """Ext fields with a field dropped, a value replaced by something odd, a key added."""
    out: dict[str, object] = dict(fields)
    for _ in range(rng.randint(1, 3)):
        key = rng.choice(wire_keys)
        roll = rng.randrange(4)
        if roll == 0:
            out.pop(key, None)
        elif roll == 1:
            out[key] = rng.choice(ODD_VALUES)
        elif roll == 2:
            value = bytearray(str(out.get(key, "")).encode())
            _mutate_once(value, rng, [b"0", b"true"])
            out[key] = value.decode(errors="replace")
        else:
            out[sample_text(rng, min_size=1)] = sample_text(rng)
    return out


#: values a header field may meet: numbers in odd spellings, out of range, not numbers
ODD_VALUES: list[object] = [
    "",
    " ",
    "-",
    "+1",
    " 12 ",
    "1e5",
    "0x10",
    "9" * 30,
    "-9223372036854775809",
    "9223372036854775808",
    "\u0663",
    "\u00b2",
    "١٢",
    "true",
    "TRUE",
    "yes",
    "null",
    "\x00",
    "\ufffd",
    "x" * 5000,
    "9" * 5000,
    7,
    -(2**64),
    1.5,
    True,
    None,
]


def test_every_typed_header_decodes_or_refuses_mutated_ext_fields(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Every attrs header class of headers.py (ALL_HEADERS), through the converter, and
    the send request/response through their fast paths: HeaderError or a header."""
    rng = random.Random(SEED)
    tally = Tally("typed headers (ext fields)")
    for cls in headers_module.ALL_HEADERS:
        decoders: list[Callable[[Mapping[str, object]], object]] = [
            lambda fields, cls=cls: decode_header(cls, fields)
        ]
        if cls is SendMessageRequestHeader:
            decoders += [
                lambda fields: decode_send_header(fields, v2=False),
                lambda fields: decode_send_header(to_v2_fields(fields), v2=True),
            ]
        if cls is SendMessageResponseHeader:
            decoders.append(decode_send_response)
        wire_keys = [wire_name(a) for a in attrs.fields(cls)] or ["x"]
        for _ in range(12):
            header = sample(cls, rng)
            fields = encode_header(header)
            for decoder in decoders:
                assert decoder(fields) == header
            inputs = [_mutated_fields(fields, rng, wire_keys) for _ in range(MUTANTS_PER_SEED)]
            for decoder in decoders:
                fuzz(cls.__name__, inputs, decoder, (HeaderError,), tally)
    report(capsys, tally)


# ---------------------------------------------------------------- JSON bodies
BODY_CLASSES = [
    obj
    for obj in vars(bodies_module).values()
    if isinstance(obj, type) and attrs.has(obj) and obj.__module__ == bodies_module.__name__
]


def test_every_json_body_decodes_or_refuses_mutated_json(
    capsys: pytest.CaptureFixture[str],
) -> None:
    rng = random.Random(SEED)
    tallies = []
    for cls in BODY_CLASSES:
        corpus = []
        for _ in range(8):
            body = sample(cls, rng)
            encoded = encode_body(body)
            assert decode_body(cls, encoded) == body
            corpus.append(encoded)
        tallies.append(
            fuzz_corpus(
                f"{cls.__name__} bodies",
                corpus,
                lambda data, cls=cls: decode_body(cls, data),
                (BodyError,),
                rng,
                DEEP_JSON,
            )
        )
    tallies.append(
        fuzz_corpus(
            "reset-offset bodies (both forms)",
            [encode_body(sample(bodies_module.ResetOffsetBody, rng)) for _ in range(8)],
            decode_reset_offsets,
            (BodyError,),
            rng,
            DEEP_JSON,
        )
    )
    total = Tally("JSON bodies, all classes")
    for tally in tallies:
        total.inputs += tally.inputs
        total.decoded += tally.decoded
        total.refused.update(tally.refused)
    report(capsys, total)


# ---------------------------------------------------------------- stored messages
def _sample_host(rng: random.Random) -> bytes:
    """BORNHOST / STOREHOST bytes: IPv4 or IPv6, and a port."""
    return rng.randbytes(rng.choice([4, 16])) + rng.randbytes(2).rjust(4, b"\0")


def _property_text(rng: random.Random, min_size: int = 0) -> str:
    """Text a property may hold (no 0x01 or 0x02, its separators)."""
    text = sample_text(rng, min_size=min_size).replace("\x01", "").replace("\x02", "")
    return text or ("k" if min_size else "")


def sample_record(rng: random.Random) -> tuple[bytes, dict[str, Any]]:
    """A CommitLog record and what it holds."""
    long_topic = rng.random() < 0.2
    properties = {_property_text(rng, 1): _property_text(rng) for _ in range(rng.randint(0, 3))}
    values: dict[str, Any] = {
        "topic": "T" * rng.randint(128, 300) if long_topic else sample_text(rng, min_size=1),
        "queue_id": sample_int(rng, 32),
        "body": rng.randbytes(rng.choice([0, 1, 50])),
        "flag": sample_int(rng, 32),
        "properties": encode_properties(properties),
        "born_timestamp": sample_int(rng),
        "born_host": _sample_host(rng),
        "store_host": _sample_host(rng),
        "reconsume_times": sample_int(rng, 32),
        "prepared_transaction_offset": sample_int(rng),
    }
    placed = {
        "queue_offset": rng.randint(0, 2**40),
        "physical_offset": rng.randint(0, 2**40),
        "store_timestamp": rng.randint(0, 2**41),
    }
    record = make_record_template(**values).encode(**placed)
    return record, {**values, **placed}


def decode_records(data: bytes) -> object:
    """Every reader of records on the same bytes: a pull body's records, the first
    record as recovery reads it (no CRC check) and as the dispatcher summarizes it.
    Each must decode or raise MessageFormatError; the first refusal is raised."""
    readers = (
        lambda: decode_messages(data),
        lambda: read_record(data, 0, check_crc=False),
        lambda: read_summary(data, 0),
    )
    refusals = []
    for reader in readers:
        try:
            reader()
        except MessageFormatError as exc:
            refusals.append(exc)
    if refusals:
        raise refusals[0]
    return data


def test_commitlog_records_decode_or_are_refused_when_mutated(
    capsys: pytest.CaptureFixture[str],
) -> None:
    rng = random.Random(SEED)
    corpus = []
    for _ in range(60):
        records = [sample_record(rng) for _ in range(rng.randint(1, 3))]
        data = b"".join(record for record, _ in records)
        decoded = decode_messages(data)
        for message, (_, values) in zip(decoded, records, strict=True):
            assert (message.topic, message.body, message.queue_offset) == (
                values["topic"],
                values["body"],
                values["queue_offset"],
            )
            assert encode_properties(message.properties) == values["properties"]
        corpus.append(data)
    tally = fuzz_corpus("CommitLog records", corpus, decode_records, (MessageFormatError,), rng)
    report(capsys, tally)


def test_batch_bodies_decode_or_are_refused_when_mutated(
    capsys: pytest.CaptureFixture[str],
) -> None:
    rng = random.Random(SEED)
    corpus = []
    for _ in range(60):
        entries = [
            BatchEntry(
                rng.randbytes(rng.choice([0, 5, 60])),
                sample_int(rng, 32),
                encode_properties({"KEYS": _property_text(rng)}),
            )
            for _ in range(rng.randint(1, 4))
        ]
        body = encode_batch(entries)
        assert decode_batch(body) == entries
        corpus.append(body)
    tally = fuzz_corpus("batch bodies", corpus, decode_batch, (MessageFormatError,), rng)
    report(capsys, tally)


# ---------------------------------------------------------------- HA
def _events(
    decoder: SlaveMessageDecoder | MasterMessageDecoder, data: bytes, rng: random.Random
) -> list[Any]:
    """Every event of ``data`` fed in chunks; a Transfer as a tuple with its body's bytes."""
    events: list[Any] = []
    for chunk in in_chunks(data, rng):
        decoder.feed(chunk)
        while (event := decoder.next_event()) is not None:
            if isinstance(event, Transfer):
                event = (event.offset, bytes(event.body), event.epoch, event.epoch_start_offset)
            events.append(event)
    return events


def _slave_stream(protocol: HAProtocol, rng: random.Random) -> tuple[bytes, list[Any]]:
    """A slave's messages (a handshake in auto-switch, then reports) and their events."""
    parts, events = [], []
    if protocol is HAProtocol.AUTOSWITCH:
        handshake = SlaveHandshake(rng.random() < 0.5, False, sample_int(rng))
        parts.append(ha_wire.encode_slave_handshake(handshake))
        events.append(handshake)
    for _ in range(3):
        offset = rng.randint(0, 2**50)
        parts.append(ha_wire.encode_report(protocol, offset))
        events.append(SlaveReport(offset))
    return b"".join(parts), events


def _master_stream(protocol: HAProtocol, rng: random.Random) -> tuple[bytes, list[Any]]:
    """A master's messages (a handshake in auto-switch, then transfers) and their events."""
    parts, events = [], []
    autoswitch = protocol is HAProtocol.AUTOSWITCH
    if autoswitch:
        epochs = tuple(EpochEntry(sample_int(rng, 32), rng.randint(0, 2**40)) for _ in range(3))
        handshake = MasterHandshake(rng.randint(0, 2**40), sample_int(rng, 32), epochs)
        parts.append(ha_wire.encode_master_handshake(handshake))
        events.append(handshake)
    for _ in range(3):
        body = rng.randbytes(rng.choice([0, 30]))
        offset, epoch, start = rng.randint(0, 2**40), sample_int(rng, 32), rng.randint(0, 2**40)
        if not autoswitch:
            epoch = start = 0
        parts += [
            ha_wire.encode_transfer_header(
                protocol, offset, len(body), epoch=epoch, epoch_start_offset=start
            ),
            body,
        ]
        events.append((offset, body, epoch, start))
    return b"".join(parts), events


def test_ha_messages_decode_or_are_refused_when_mutated(
    capsys: pytest.CaptureFixture[str],
) -> None:
    rng = random.Random(SEED)
    tallies = []
    for protocol in HAProtocol:
        for side, make, decoder_class in (
            ("slave", _slave_stream, SlaveMessageDecoder),
            ("master", _master_stream, MasterMessageDecoder),
        ):
            corpus = []
            for _ in range(60):
                stream, expected = make(protocol, rng)
                assert _events(decoder_class(protocol), stream, rng) == expected
                corpus.append(stream)
            tallies.append(
                fuzz_corpus(
                    f"HA {protocol.value} {side} messages",
                    corpus,
                    lambda data, p=protocol, d=decoder_class: _events(d(p), data, rng),
                    (HAProtocolError,),
                    rng,
                )
            )
    report(capsys, *tallies)


def test_every_ha_decode_function_decodes_or_refuses_mutated_bytes(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Each ``decode_*`` of ha_wire (the secret exchange's messages, whatever they are):
    fixed-size messages, so the corpus is inputs of every size around theirs, starting
    with the magic or not."""
    rng = random.Random(SEED)
    magic: bytes = getattr(ha_wire, "AUTH_MAGIC", b"")
    corpus = [
        (magic if rng.random() < 0.7 else b"") + rng.randbytes(rng.randint(0, 80))
        for _ in range(60)
    ]
    tallies = [
        fuzz_corpus(f"HA {name}", corpus, function, (HAProtocolError,), rng, valid=False)
        for name, function in sorted(vars(ha_wire).items())
        if name.startswith("decode_") and callable(function)
    ]
    report(capsys, *tallies)


# ---------------------------------------------------------------- a real broker
#: connections each server gets, each with five hostile requests
BROKER_CONNECTIONS = 200
NAMESERVER_CONNECTIONS = 60
FUZZ_TOPIC = "FuzzTopic"
FUZZ_GROUP = "FuzzGroup"
#: requests a broker serves, each with its typed header and a body maker
BROKER_REQUESTS: list[tuple[int, type | None, Callable[[random.Random], bytes] | None]] = [
    (RequestCode.SEND_MESSAGE_V2, SendMessageRequestHeader, lambda r: r.randbytes(20)),
    (RequestCode.SEND_MESSAGE, SendMessageRequestHeader, lambda r: r.randbytes(20)),
    (
        RequestCode.SEND_BATCH_MESSAGE,
        SendMessageRequestHeader,
        lambda r: encode_batch([BatchEntry(r.randbytes(9)), BatchEntry(b"", 1, "KEYS\x01k\x02")]),
    ),
    (RequestCode.PULL_MESSAGE, headers_module.PullMessageRequestHeader, None),
    (RequestCode.QUERY_CONSUMER_OFFSET, headers_module.QueryConsumerOffsetRequestHeader, None),
    (RequestCode.UPDATE_CONSUMER_OFFSET, headers_module.UpdateConsumerOffsetRequestHeader, None),
    (RequestCode.GET_MAX_OFFSET, headers_module.GetMaxOffsetRequestHeader, None),
    (RequestCode.GET_MIN_OFFSET, headers_module.GetMinOffsetRequestHeader, None),
    (RequestCode.SEARCH_OFFSET_BY_TIMESTAMP, headers_module.SearchOffsetRequestHeader, None),
    (
        RequestCode.GET_EARLIEST_MSG_STORETIME,
        headers_module.GetEarliestMsgStoretimeRequestHeader,
        None,
    ),
    (RequestCode.VIEW_MESSAGE_BY_ID, headers_module.ViewMessageRequestHeader, None),
    (RequestCode.QUERY_MESSAGE, headers_module.QueryMessageRequestHeader, None),
    (RequestCode.CONSUMER_SEND_MSG_BACK, headers_module.ConsumerSendMsgBackRequestHeader, None),
    (RequestCode.UNREGISTER_CLIENT, headers_module.UnregisterClientRequestHeader, None),
    (
        RequestCode.GET_CONSUMER_LIST_BY_GROUP,
        headers_module.GetConsumerListByGroupRequestHeader,
        None,
    ),
    (RequestCode.GET_CONSUME_STATS, headers_module.GetConsumeStatsRequestHeader, None),
    (RequestCode.GET_TOPIC_STATS_INFO, headers_module.GetTopicStatsInfoRequestHeader, None),
    (RequestCode.HEART_BEAT, None, lambda r: encode_body(sample(bodies_module.HeartbeatData, r))),
    (
        RequestCode.LOCK_BATCH_MQ,
        None,
        lambda r: encode_body(sample(bodies_module.LockBatchRequestBody, r)),
    ),
    (
        RequestCode.UNLOCK_BATCH_MQ,
        None,
        lambda r: encode_body(sample(bodies_module.UnlockBatchRequestBody, r)),
    ),
    (RequestCode.GET_BROKER_RUNTIME_INFO, None, None),
    (RequestCode.GET_ALL_TOPIC_CONFIG, None, None),
    (RequestCode.GET_ALL_CONSUMER_OFFSET, None, None),
]
#: requests a nameserver serves (a made-up broker registers)
NAMESERVER_REQUESTS: list[tuple[int, type | None, Callable[[random.Random], bytes] | None]] = [
    (RequestCode.GET_ROUTEINFO_BY_TOPIC, headers_module.GetRouteInfoRequestHeader, None),
    (
        RequestCode.REGISTER_BROKER,
        headers_module.RegisterBrokerRequestHeader,
        lambda r: encode_body(sample(bodies_module.RegisterBrokerBody, r)),
    ),
    (RequestCode.GET_BROKER_CLUSTER_INFO, None, None),
    (RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER, None, None),
    (RequestCode.GET_TOPICS_BY_CLUSTER, headers_module.GetTopicsByClusterRequestHeader, None),
]
#: fields the seeds point at harmless names (mutations may still change them)
_NAMED = {
    "topic": FUZZ_TOPIC,
    "consumer_group": FUZZ_GROUP,
    "producer_group": FUZZ_GROUP,
    "broker_name": "broker-fuzz",
    "broker_addr": "127.0.0.1:1",
    "cluster_name": "FuzzCluster",
}


def _seed_request(
    request: tuple[int, type | None, Callable[[random.Random], bytes] | None],
    rng: random.Random,
) -> RemotingCommand:
    code, header_class, body = request
    fields: dict[str, str] = {}
    if header_class is SendMessageRequestHeader:  # a send as clients make it
        batch = code == RequestCode.SEND_BATCH_MESSAGE
        keys = {"KEYS": _property_text(rng), "TAGS": _property_text(rng, 1)}
        fields = send_request(FUZZ_TOPIC, code=code, batch=batch or None, **keys).ext_fields
    elif header_class is not None:
        header = sample(header_class, rng)
        named = {k: v for k, v in _NAMED.items() if k in attrs.fields_dict(header_class)}
        fields = encode_header(attrs.evolve(header, **named))
    return RemotingCommand.request(
        code,
        ext_fields=fields,
        body=body(rng) if body is not None else b"",
        serialize_type=rng.choice(list(SerializeType)),
    )


def _sendable(data: bytes, allowed_codes: set[int]) -> bool:
    """Whether the frames ``data`` begins with ask only for what the test means to
    send: the seeds' codes, or codes no server serves (REQUEST_CODE_NOT_SUPPORTED).
    A mutation may turn a code into an admin one that changes what the broker is
    (WIPE_WRITE_PERM_OF_BROKER, UPDATE_BROKER_CONFIG, DELETE_TOPIC_...): not sent."""
    decoder = FrameDecoder(max_frame_length=1 << 20)
    decoder.feed(data)
    try:
        commands = decoder.commands()
    except ProtocolError:
        return True
    known = set(RequestCode) | set(range(900, 1100))
    return all(c.code in allowed_codes or c.code not in known for c in commands)


def _hostile_connections(
    requests: list[tuple[int, type | None, Callable[[random.Random], bytes] | None]],
    rng: random.Random,
    connections: int,
) -> list[list[bytes]]:
    """What each of ``connections`` connections sends: four seed requests, each well
    framed but with odd ext fields or a mutated body (they reach the processors), then
    one whose bytes are mutated (it reaches the frame decoder, and may end the
    connection: so it comes last)."""
    allowed = {code for code, _, _ in requests}
    seeds = [_seed_request(request, rng) for request in requests for _ in range(3)]
    corpus = [encode_frame(cmd) for cmd in seeds]

    def framed() -> bytes:
        seed = rng.choice(seeds)
        fields = _mutated_fields(seed.ext_fields, rng, list(seed.ext_fields) or ["x"])
        body = next(mutants(seed.body, rng, corpus, 1)) if rng.random() < 0.5 else seed.body
        cmd = attrs.evolve(seed, ext_fields={k: str(v) for k, v in fields.items()}, body=body)
        return encode_frame(cmd)

    def mangled() -> bytes:
        return next(mutants(encode_frame(rng.choice(seeds)), rng, corpus, 1))

    plans = []
    for _ in range(connections):
        plan: list[bytes] = []
        for make in (framed, framed, framed, framed, mangled):
            while not _sendable(data := make(), allowed):
                pass
            plan.append(data)
        plans.append(plan)
    return plans


@attrs.define
class Delivery:
    """What the hostile connections met."""

    frames: int = 0
    connections: int = 0
    #: the responses that came back, by code name
    answers: collections.Counter[str] = attrs.Factory(collections.Counter)

    def line(self, name: str) -> str:
        codes = ", ".join(f"{n} {code}" for code, n in self.answers.most_common())
        return (
            f"fuzz real {name}: {self.frames} mutated inputs over {self.connections} "
            f"connections, {sum(self.answers.values())} answered ({codes or 'none'}); then "
            "a producer and a consumer were served"
        )


async def _deliver(address: str, payloads: list[bytes], delivery: Delivery) -> None:
    """One connection: ``payloads`` sent, our side shut, everything read until the
    server closes (bounded)."""
    host, port = address.rsplit(":", 1)
    with trio.fail_after(15):
        stream = await trio.open_tcp_stream(host, int(port))
        async with stream:
            try:
                for payload in payloads:
                    await stream.send_all(payload)
                await stream.send_eof()
            except trio.BrokenResourceError:
                pass  # the server closed at a bad frame while we were still sending
            answers = FrameDecoder()
            try:
                while chunk := await stream.receive_some(65536):
                    answers.feed(chunk)
            except trio.BrokenResourceError:
                pass  # (a reset: the server closed with our bytes unread)
    for answer in answers.commands():
        delivery.answers[code_name(answer.code, response=True)] += 1
    delivery.connections += 1
    delivery.frames += len(payloads)


async def _deliver_all(address: str, plans: list[list[bytes]]) -> Delivery:
    """Each plan over a connection of its own, eight at a time."""
    delivery = Delivery()
    limit = trio.CapacityLimiter(8)

    async def one(plan: list[bytes]) -> None:
        async with limit:
            await _deliver(address, plan, delivery)

    async with trio.open_nursery() as nursery:
        for plan in plans:
            nursery.start_soon(one, plan)
    return delivery


async def test_a_broker_fed_mutated_frames_stays_up_and_serves_clients(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    """Mutated frames over real connections to a broker's remoting port, its embedded
    nameserver's and its HA port (mutated slave reports); then a producer and a
    consumer are served as if nothing happened. No processor fails on what it got (a
    failure is logged as an error with its traceback, and answered SYSTEM_ERROR): each
    refuses bad input with a clear error."""
    caplog.set_level(logging.ERROR)
    rng = random.Random(SEED)
    async with running_broker(tmp_path / "store") as node:
        ns = node.namesrv_addrs[0]
        assert node.ha_service is not None
        ha = f"127.0.0.1:{node.ha_service.port}"
        to_broker = await _deliver_all(
            node.address, _hostile_connections(BROKER_REQUESTS, rng, BROKER_CONNECTIONS)
        )
        to_nameserver = await _deliver_all(
            ns, _hostile_connections(NAMESERVER_REQUESTS, rng, NAMESERVER_CONNECTIONS)
        )
        reports = [_slave_stream(HAProtocol.CLASSIC, rng)[0] for _ in range(20)]
        to_ha = await _deliver_all(ha, [list(mutants(r, rng, reports, 3)) for r in reports])

        async with Producer("PG", ns) as producer:
            sent = await producer.send(Message("FuzzCheck", b"after the fuzz"))
            assert sent.status is SendStatus.SEND_OK
        async with PullConsumer("check", ns) as consumer:
            result = await consumer.pull(sent.queue, sent.queue_offset)
        assert result.status is PullStatus.FOUND
        assert [m.body for m in result.messages] == [b"after the fuzz"]
    failures = [
        f"{r.name}: {r.getMessage()}: {r.exc_info[1]!r}" if r.exc_info else r.getMessage()
        for r in caplog.records
        if r.levelno >= logging.ERROR
    ]
    assert not failures, "\n".join(failures[:20])
    with capsys.disabled():
        for name, delivery in (
            ("broker", to_broker),
            ("nameserver", to_nameserver),
            ("HA port", to_ha),
        ):
            print(f"\n{delivery.line(name)}", end="")
