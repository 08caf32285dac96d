"""The CommitLog record codec (hamq/protocol/record.py), field by field against
docs/PROTOCOL.md#commitlog-record, and pull bodies as consumers decode them."""

from __future__ import annotations

import re
import struct
import zlib
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hamq.protocol.message import (
    SYSFLAG_BORNHOST_V6,
    SYSFLAG_STOREHOST_V6,
    BatchEntry,
    MessageFormatError,
    PropertiesTooLong,
    encode_batch,
    encode_properties,
    offset_msg_id,
    pack_host,
    parse_offset_msg_id,
)
from hamq.protocol.record import (
    BLANK_MAGIC,
    MAGIC_V1,
    MAGIC_V2,
    StoredMessage,
    decode_message,
    decode_messages,
    is_blank,
    make_record_template,
    make_record_templates,
    read_record,
    stored_message,
)
from tests.support.strategies import TEXT

UNIQ = "0100007F0000EC70000037513A6F0100"
PROPERTIES = (
    f"KEYS\x01key0\x02TAGS\x01tagA\x02UNIQ_KEY\x01{UNIQ}\x02WAIT\x01true\x02"
    "CLUSTER\x01DefaultCluster\x02"
)


def example_record() -> bytes:
    """The annotated example of PROTOCOL.md §6.2."""
    template = make_record_template(
        topic="TopicTest",
        queue_id=0,
        body=b"hello-0",
        properties=PROPERTIES,
        born_timestamp=0x18BCFE56800,
        born_host=pack_host("127.0.0.1", 54321),
        store_host=pack_host("127.0.0.1", 10911),
    )
    return template.encode(queue_offset=0, physical_offset=0, store_timestamp=0x18BCFE56801)


def test_record_matches_the_annotated_example_byte_by_byte() -> None:
    record = example_record()
    expected = (
        bytes.fromhex("000000ca")  # 0 TOTALSIZE 202
        + bytes.fromhex("daa320a7")  # 4 MAGICCODE V1
        + bytes.fromhex("154677bc")  # 8 BODYCRC crc32("hello-0") & 0x7fffffff
        + bytes.fromhex("00000000")  # 12 QUEUEID
        + bytes.fromhex("00000000")  # 16 FLAG
        + bytes.fromhex("0000000000000000")  # 20 QUEUEOFFSET
        + bytes.fromhex("0000000000000000")  # 28 PHYSICALOFFSET
        + bytes.fromhex("00000000")  # 36 SYSFLAG
        + bytes.fromhex("0000018bcfe56800")  # 40 BORNTIMESTAMP
        + bytes.fromhex("7f000001 0000d431")  # 48 BORNHOST 127.0.0.1:54321
        + bytes.fromhex("0000018bcfe56801")  # 56 STORETIMESTAMP
        + bytes.fromhex("7f000001 00002a9f")  # 64 STOREHOST 127.0.0.1:10911
        + bytes.fromhex("00000000")  # 72 RECONSUMETIMES
        + bytes.fromhex("0000000000000000")  # 76 PREPARED TRANSACTION OFFSET
        + bytes.fromhex("00000007")
        + b"hello-0"  # 84 BODY
        + bytes.fromhex("09")
        + b"TopicTest"  # 95 TOPIC
        + bytes.fromhex("005f")
        + PROPERTIES.encode()  # 105 PROPERTIES
    )
    assert record == expected
    assert len(record) == 91 + 7 + 9 + 95 == 202
    assert zlib.crc32(b"hello-0") & 0x7FFFFFFF == 0x154677BC


def test_record_decodes_to_what_a_consumer_needs() -> None:
    message = decode_message(example_record())
    assert message.topic == "TopicTest"
    assert message.body == b"hello-0"
    assert message.tags == "tagA"
    assert message.keys == ["key0"]
    assert message.msg_id == UNIQ  # UNIQ_KEY is the id users see
    assert message.offset_msg_id == "7F00000100002A9F0000000000000000"
    assert message.born_host == "127.0.0.1:54321"
    assert message.store_host == "127.0.0.1:10911"
    assert message.store_timestamp == 0x18BCFE56801
    assert message.properties["CLUSTER"] == "DefaultCluster"


def test_ipv6_hosts_set_their_sysflag_bits_and_widen_the_record() -> None:
    template = make_record_template(
        topic="T",
        queue_id=1,
        body=b"b",
        born_host=pack_host("::1", 1),
        store_host=pack_host("::1", 10911),
    )
    record = template.encode(queue_offset=3, physical_offset=99, store_timestamp=5)
    info = read_record(record)
    assert info.sys_flag & SYSFLAG_BORNHOST_V6 and info.sys_flag & SYSFLAG_STOREHOST_V6
    assert len(record) == 91 + 24 + 1 + 1
    message = decode_message(record)
    assert message.store_host == "[::1]:10911"
    assert message.offset_msg_id == offset_msg_id(pack_host("::1", 10911), 99)
    assert len(message.offset_msg_id) == 56
    assert parse_offset_msg_id(message.offset_msg_id) == ("[::1]:10911", 99)


def test_topics_over_127_bytes_use_magic_v2_with_a_two_byte_length() -> None:
    topic = "t" * 200
    record = make_record_template(topic=topic, queue_id=0, body=b"").encode(
        queue_offset=0, physical_offset=0, store_timestamp=0
    )
    assert struct.unpack_from(">i", record, 4)[0] == MAGIC_V2
    assert decode_message(record).topic == topic
    short = make_record_template(topic="t" * 127, queue_id=0, body=b"")
    assert short.magic == MAGIC_V1


@given(
    topic=st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=200),
    body=st.binary(max_size=500),
    properties=st.dictionaries(
        TEXT.filter(lambda t: "\x01" not in t and "\x02" not in t),
        TEXT.filter(lambda t: "\x01" not in t and "\x02" not in t),
        max_size=5,
    ),
    offsets=st.tuples(
        st.integers(0, 2**62),
        st.integers(0, 2**62),
        st.integers(0, 2**62),
        st.integers(-5, 2**31 - 1),
    ),
)
def test_any_record_round_trips(
    topic: str, body: bytes, properties: dict[str, str], offsets: tuple[int, int, int, int]
) -> None:
    queue_offset, physical_offset, timestamp, queue_id = offsets
    template = make_record_template(
        topic=topic, queue_id=queue_id, body=body, properties=encode_properties(properties)
    )
    record = template.encode(
        queue_offset=queue_offset, physical_offset=physical_offset, store_timestamp=timestamp
    )
    assert len(record) == template.size
    message = decode_message(record)
    assert (message.topic, message.body, message.queue_id) == (topic, body, queue_id)
    assert (message.queue_offset, message.physical_offset) == (queue_offset, physical_offset)
    assert message.store_timestamp == timestamp
    assert message.properties == properties


def test_damaged_records_are_named() -> None:
    bad_body = bytearray(example_record())
    bad_body[90] ^= 0x01  # inside "hello-0"
    with pytest.raises(MessageFormatError, match="body CRC"):
        read_record(bytes(bad_body))
    assert read_record(bytes(bad_body), check_crc=False).topic == "TopicTest"
    bad_magic = bytearray(example_record())
    bad_magic[4:8] = b"\x00\x00\x00\x00"
    with pytest.raises(MessageFormatError, match="magic code 0x00000000"):
        read_record(bytes(bad_magic))
    with pytest.raises(MessageFormatError, match="runs past"):
        read_record(example_record()[:150])
    with pytest.raises(MessageFormatError, match="a record header needs 48"):
        read_record(b"\x00" * 10)
    bad_size = bytearray(example_record())
    bad_size[0:4] = struct.pack(">i", 190)
    with pytest.raises(MessageFormatError):
        read_record(bytes(bad_size))


IPV4_HOST = pack_host("10.0.0.1", 10911)


@pytest.mark.parametrize(
    ("fields", "error"),
    [
        ({"queue_id": 2**31}, f"queue id {2**31} does not fit in a signed 32-bit field"),
        ({"flag": -(2**31) - 1}, f"flag {-(2**31) - 1} does not fit in a signed 32-bit"),
        ({"sys_flag": 2**32}, "sysFlag 4294967296 does not fit in a signed 32-bit"),
        ({"reconsume_times": 2**31}, "reconsumeTimes 2147483648 does not fit"),
        ({"born_timestamp": 2**63}, f"bornTimestamp {2**63} does not fit in a signed 64-bit"),
        ({"prepared_transaction_offset": -(2**63) - 1}, "preparedTransactionOffset -"),
        # the first culprit is named
        ({"flag": 2**40, "born_timestamp": 2**64}, "flag 1099511627776 does not fit"),
        ({"topic": ""}, "topic is empty"),
        ({"topic": "t" * 32768}, "topic of 32768 bytes is over 32767"),
        ({"born_host": b"\x01" * 9}, "born host of 9 bytes; expected 8 or 20"),
        ({"store_host": b"\x01" * 4}, "store host of 4 bytes; expected 8 or 20"),
        ({"born_host": b"", "store_host": b""}, "born host of 0 bytes"),
        # (checked in this order: numbers, topic, properties, hosts)
        ({"topic": "", "born_host": b""}, "topic is empty"),
        ({"properties": "p" * 32768, "born_host": b""}, "properties of 32768 bytes"),
    ],
)
def test_a_template_that_cannot_be_stored_names_the_field(
    fields: dict[str, Any], error: str
) -> None:
    with pytest.raises(MessageFormatError, match=re.escape(error)) as raised:
        make_record_template(**{"topic": "T", "queue_id": 0, "body": b"b", **fields})
    assert isinstance(raised.value, PropertiesTooLong) == ("properties" in fields)


def test_templates_of_a_batch_are_the_templates_of_its_messages() -> None:
    """make_record_templates encodes what the entries share once: each record is byte
    for byte the one make_record_template makes of that message alone; a bad entry is
    named as make_record_template names it."""
    shared: dict[str, Any] = {
        "topic": "t" * 200,  # (a V2 topic)
        "queue_id": 3,
        "sys_flag": 4,
        "born_timestamp": 0x18BCFE56800,
        "born_host": IPV4_HOST,
        "store_host": pack_host("::1", 10911),
        "reconsume_times": 2,
        "prepared_transaction_offset": 7,
    }
    entries = [(b"", 0, ""), (b"body-1", -5, PROPERTIES), (b"x" * 5000, 2**31 - 1, "A\x01b\x02")]
    batch = make_record_templates(entries=entries, **shared)
    alone = [
        make_record_template(body=body, flag=flag, properties=properties, **shared)
        for body, flag, properties in entries
    ]
    place = {"queue_offset": 9, "physical_offset": 1234, "store_timestamp": 5678}
    assert [t.encode(**place) for t in batch] == [t.encode(**place) for t in alone]
    assert make_record_templates(entries=[], **shared) == []
    with pytest.raises(MessageFormatError, match=re.escape(f"flag {2**31} does not fit")):
        make_record_templates(entries=[*entries, (b"", 2**31, "")], **shared)
    with pytest.raises(PropertiesTooLong):
        make_record_templates(entries=[*entries, (b"", 0, "p" * 32768)], **shared)


def test_properties_too_long_have_their_own_error_type() -> None:
    """The store answers PROPERTIES_SIZE_EXCEEDED by this type (not by the text)."""
    with pytest.raises(PropertiesTooLong, match="properties of 32768 bytes are over 32767"):
        make_record_template(topic="T", queue_id=0, body=b"", properties="p" * 32768)
    with pytest.raises(PropertiesTooLong):
        encode_batch([BatchEntry(body=b"", properties="p" * 32768)])
    # at the limit it is stored; an illegal key is a format error of another type
    make_record_template(topic="T", queue_id=0, body=b"", properties="p" * 32767)
    with pytest.raises(MessageFormatError, match="may not contain") as raised:
        encode_properties({"properties of\x01": "v"})
    assert not isinstance(raised.value, PropertiesTooLong)


def test_host_sizes_set_the_host_bits_of_sys_flag() -> None:
    ipv6 = pack_host("::1", 10911)
    cases = [(IPV4_HOST, IPV4_HOST, 0), (ipv6, IPV4_HOST, SYSFLAG_BORNHOST_V6)]
    cases += [(IPV4_HOST, ipv6, SYSFLAG_STOREHOST_V6)]
    cases += [(ipv6, ipv6, SYSFLAG_BORNHOST_V6 | SYSFLAG_STOREHOST_V6)]
    for born, store, bits in cases:
        for given_bits in (0, SYSFLAG_BORNHOST_V6 | SYSFLAG_STOREHOST_V6):
            template = make_record_template(
                topic="T",
                queue_id=0,
                body=b"",
                sys_flag=0x8 | given_bits,
                born_host=born,
                store_host=store,
            )
            assert template.sys_flag == 0x8 | bits
            record = template.encode(queue_offset=0, physical_offset=0, store_timestamp=0)
            info = read_record(record)
            assert (info.born_host, info.store_host, info.sys_flag) == (born, store, 0x8 | bits)


@given(st.binary(max_size=300))
def test_random_bytes_raise_only_message_format_error(data: bytes) -> None:
    try:
        read_record(data)
    except MessageFormatError:
        pass


def test_pull_body_of_several_records_decodes() -> None:
    records = b"".join(
        make_record_template(topic="T", queue_id=0, body=str(i).encode()).encode(
            queue_offset=i, physical_offset=i * 100, store_timestamp=0
        )
        for i in range(3)
    )
    assert [m.body for m in decode_messages(records)] == [b"0", b"1", b"2"]


def decode_field_by_field(body: bytes) -> list[StoredMessage]:
    """A pull body decoded record by record through ``read_record`` (what
    ``decode_messages``'s one-struct path must agree with)."""
    messages, pos = [], 0
    while pos < len(body):
        info = read_record(body, pos)
        messages.append(stored_message(info))
        pos += info.size
    return messages


@given(
    records=st.lists(
        st.tuples(
            st.sampled_from(["T", "topic-" + "x" * 130]),  # MAGIC V1 and V2
            st.binary(max_size=64),
            st.sampled_from([IPV4_HOST, pack_host("::1", 1)]),
            st.sampled_from([pack_host("10.0.0.9", 7), pack_host("fe80::2", 2)]),
            st.dictionaries(st.sampled_from(["UNIQ_KEY", "TAGS", "a"]), st.text("abc"), max_size=3),
        ),
        max_size=5,
    ),
    damage=st.one_of(st.none(), st.tuples(st.integers(0, 10_000), st.integers(1, 255))),
)
def test_a_pull_body_decodes_as_read_record_reads_it_record_by_record(
    records: list[tuple[str, bytes, bytes, bytes, dict[str, str]]],
    damage: tuple[int, int] | None,
) -> None:
    body = bytearray()
    for i, (topic, data, born, store, properties) in enumerate(records):
        body += make_record_template(
            topic=topic,
            queue_id=i,
            body=data,
            properties=encode_properties(properties),
            born_host=born,
            store_host=store,
            born_timestamp=i,
        ).encode(queue_offset=i, physical_offset=len(body), store_timestamp=7)
    if damage is not None and body:
        body[damage[0] % len(body)] ^= damage[1]
    assert_decoded_as_read_record_reads_it(bytes(body))


@pytest.mark.parametrize(
    ("at", "value"),
    [
        (4, b"\x00"),  # magic
        (8, b"\x7f"),  # BODYCRC
        (84, b"\x7f"),  # BODY length: past the record
        (84 + 4 + 5, b"\x00"),  # TOPIC length 0
        (84 + 4 + 5, b"\x7f"),  # TOPIC length past the record
        (84 + 4 + 5 + 1 + 1, b"\xff"),  # PROPERTIES length negative
        (84 + 4 + 5 + 1 + 1, b"\x01"),  # PROPERTIES length past the record
        (84 + 4 + 5 + 1 + 1 + 2, b"\xff"),  # PROPERTIES not UTF-8
        (0, b"\x01"),  # TOTALSIZE too large
        (3, b"\x10"),  # TOTALSIZE too small
    ],
)
def test_a_damaged_field_is_named_as_read_record_names_it(at: int, value: bytes) -> None:
    record = bytearray(
        make_record_template(topic="T", queue_id=0, body=b"hello", properties="a\x01b\x02").encode(
            queue_offset=0, physical_offset=0, store_timestamp=0
        )
    )
    assert record[84:88] == b"\x00\x00\x00\x05" and record[93:95] == b"\x01T"
    record[at : at + len(value)] = value
    with pytest.raises(MessageFormatError):
        decode_field_by_field(bytes(record) * 2)
    assert_decoded_as_read_record_reads_it(bytes(record) * 2)


def assert_decoded_as_read_record_reads_it(body: bytes) -> None:
    try:
        expected: list[StoredMessage] | str = decode_field_by_field(body)
    except MessageFormatError as exc:
        expected = str(exc)
    for form in (body, bytearray(body), memoryview(body)):  # a pull body is any of them
        try:
            got: list[StoredMessage] | str = decode_messages(form)
        except MessageFormatError as exc:
            got = str(exc)
        assert got == expected


def test_blank_marker() -> None:
    blank = struct.pack(">ii", 100, BLANK_MAGIC)
    assert is_blank(blank, 0)
    assert not is_blank(example_record(), 0)
