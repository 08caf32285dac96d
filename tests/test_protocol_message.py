"""Messages by name (hamq/protocol/message.py): properties, tag codes, message ids and
batch bodies, against docs/PROTOCOL.md and what Java writes."""

from __future__ import annotations

import struct

import pytest

from hamq.protocol.message import (
    BatchEntry,
    MessageFormatError,
    MessageIdGenerator,
    decode_batch,
    decode_properties,
    encode_batch,
    encode_properties,
    java_string_hash,
    offset_msg_id,
    pack_host,
    parse_offset_msg_id,
    tags_code,
    unpack_host,
)

UNIQ = "0100007F0000EC70000037513A6F0100"
PROPERTIES = f"KEYS\x01key0\x02TAGS\x01tagA\x02UNIQ_KEY\x01{UNIQ}\x02"


def test_properties_encode_as_rocketmq_writes_them() -> None:
    assert encode_properties({"TAGS": "a", "KEYS": "k1 k2"}) == "TAGS\x01a\x02KEYS\x01k1 k2\x02"
    assert decode_properties(PROPERTIES)["UNIQ_KEY"] == UNIQ
    assert decode_properties("") == {}
    assert decode_properties("a\x01b\x02junk\x02c\x01\x02") == {"a": "b", "c": ""}
    assert encode_properties({}) == "" and encode_properties({"a": ""}) == "a\x01\x02"
    for bad in ({"k": "v\x02w"}, {"k\x01": "v"}, {"a": "b", "k": "\x01"}):
        with pytest.raises(MessageFormatError, match="may not contain"):
            encode_properties(bad)
    for wrong in ({"k": 5}, {5: "v"}, {"a": "b", "k": None}):
        with pytest.raises(MessageFormatError, match="must be strings"):
            encode_properties(wrong)  # type: ignore[arg-type]


def test_java_string_hash_matches_java() -> None:
    assert java_string_hash("") == 0
    assert java_string_hash("tagA") == 3552231
    # values printed by Java 17's String.hashCode()
    assert java_string_hash("TopicTest#key0") == -1655984461
    assert java_string_hash("héllo") == 103094734
    assert java_string_hash("\U0001f600") == 1772899  # a surrogate pair: two code units
    assert tags_code(None) == 0
    assert tags_code("tagA") == 3552231


def test_offset_message_id() -> None:
    assert offset_msg_id(pack_host("127.0.0.1", 10911), 212) == "7F00000100002A9F00000000000000D4"
    assert parse_offset_msg_id("7F00000100002A9F00000000000000D4") == ("127.0.0.1:10911", 212)
    with pytest.raises(MessageFormatError, match="not hex"):
        parse_offset_msg_id("xyz")
    with pytest.raises(MessageFormatError, match="has 5 bytes; an offset id has 16 or 28"):
        parse_offset_msg_id("0011223344")


def test_hosts_pack_and_unpack_as_ip_and_port() -> None:
    for host, port, text in (("10.1.2.3", 10911, "10.1.2.3:10911"), ("::1", 8, "[::1]:8")):
        packed = pack_host(host, port)
        assert len(packed) == (8 if "." in host else 20)
        assert unpack_host(packed) == text
        assert parse_offset_msg_id(offset_msg_id(packed, 2**40)) == (text, 2**40)
    with pytest.raises(MessageFormatError, match=r"'example\.org' is not an IP address"):
        pack_host("example.org", 1)
    with pytest.raises(MessageFormatError, match=r"port 65536 is not in 0\.\.65535"):
        pack_host("127.0.0.1", 65536)


def test_unique_ids_are_32_hex_digits_and_distinct() -> None:
    generator = MessageIdGenerator("10.0.0.7")
    ids = [generator.next_id(1_700_000_000_000) for _ in range(1000)]
    assert len(set(ids)) == 1000
    assert all(len(i) == 32 and i == i.upper() for i in ids)
    assert ids[0].startswith("0A000007")  # the IP comes first, as in Java


def test_batch_body_round_trips_and_names_a_bad_entry() -> None:
    entries = [
        BatchEntry(b"one", flag=1, properties="UNIQ_KEY\x01A\x02"),
        BatchEntry(b"", properties=""),
        BatchEntry(b"three" * 100, flag=7, properties="TAGS\x01t\x02"),
    ]
    body = encode_batch(entries)
    assert struct.unpack_from(">i", body)[0] == 20 + 3 + 2 + len("UNIQ_KEY\x01A\x02")
    assert decode_batch(body) == entries
    with pytest.raises(MessageFormatError, match="batch entry 2"):
        decode_batch(body[:-3])
