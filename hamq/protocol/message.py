"""Messages by name: property keys and their encoding, sys flags, topic and group names,
tag expressions, hosts and message ids, and the batch body a producer sends.

This is what producers, consumers, the broker and the store agree on about a message
apart from how the CommitLog stores it (that is hamq/protocol/record.py, which builds on
this module; this module never imports it).

Invariants: a property key or value never holds 0x01 or 0x02, and a properties string is
``key 0x01 value 0x02`` per pair, at most MAX_PROPERTIES_LENGTH (32767) bytes; a topic
or group name is letters, digits, ``%``, ``|``, ``_`` and ``-``; a tag code is Java's
``String.hashCode()`` of the TAGS value, as Java clients compute it. A batch body
(docs/PROTOCOL.md#batch-body) is entries back to back, each ``TOTALSIZE MAGIC(0)
BODYCRC(0) FLAG BODYLEN`` (int32 each), the body, an int16 properties length and the
properties. Everything here is pure: bytes in, values out. ``MessageFormatError`` names
what is wrong with a message, a record (record.py raises it too) or a batch.
"""

from __future__ import annotations

import functools
import ipaddress
import os
import random
import re
import struct
import time
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime

import attrs

# ---------------------------------------------------------------- constants

#: the longest properties string, in bytes (its length is an int16 in a record or batch)
MAX_PROPERTIES_LENGTH = 32767

#: SYSFLAG's bits (a record's int32 SYSFLAG, a send header's sysFlag)
SYSFLAG_COMPRESSED = 0x1
SYSFLAG_MULTI_TAGS = 0x2
SYSFLAG_TRANSACTION_MASK = 0xC
SYSFLAG_TRANSACTION_NOT_TYPE = 0x0
SYSFLAG_TRANSACTION_PREPARED = 0x4
SYSFLAG_TRANSACTION_COMMIT = 0x8
SYSFLAG_TRANSACTION_ROLLBACK = 0xC
SYSFLAG_BORNHOST_V6 = 0x10
SYSFLAG_STOREHOST_V6 = 0x20

NAME_VALUE_SEPARATOR = "\x01"
PROPERTY_SEPARATOR = "\x02"

# well-known property keys (docs/PROTOCOL.md#properties)
PROPERTY_KEYS = "KEYS"
PROPERTY_TAGS = "TAGS"
PROPERTY_WAIT = "WAIT"
PROPERTY_DELAY = "DELAY"
PROPERTY_UNIQ_KEY = "UNIQ_KEY"
PROPERTY_RETRY_TOPIC = "RETRY_TOPIC"
PROPERTY_REAL_TOPIC = "REAL_TOPIC"
PROPERTY_REAL_QUEUE_ID = "REAL_QID"
PROPERTY_TRANSACTION_PREPARED = "TRAN_MSG"
PROPERTY_PRODUCER_GROUP = "PGROUP"
#: how often the broker asked the producer about a half message (transactions)
PROPERTY_TRANSACTION_CHECK_TIMES = "TRANSACTION_CHECK_TIMES"
#: seconds before a half message's first check-back, set by the producer (transactions)
PROPERTY_CHECK_IMMUNITY_TIME = "CHECK_IMMUNITY_TIME_IN_SECONDS"
PROPERTY_MIN_OFFSET = "MIN_OFFSET"
PROPERTY_MAX_OFFSET = "MAX_OFFSET"
PROPERTY_ORIGIN_MESSAGE_ID = "ORIGIN_MESSAGE_ID"
PROPERTY_RECONSUME_TIME = "RECONSUME_TIME"
PROPERTY_MAX_RECONSUME_TIMES = "MAX_RECONSUME_TIMES"
PROPERTY_CONSUME_START_TIME = "CONSUME_START_TIME"
PROPERTY_MSG_REGION = "MSG_REGION"
PROPERTY_TRACE_SWITCH = "TRACE_ON"
PROPERTY_CLUSTER = "CLUSTER"
#: hamq's own: a record that holds a queue offset whose message a crash cut from the
#: log (hamq/store/queue_check.py writes it at recovery, with an empty body; pulls pass
#: over it). Its value says where the lost record was.
PROPERTY_LOST = "HAMQ_LOST"
# timer messages (RocketMQ 5: any delivery time, hamq/store/timer.py): a producer sets
# one of the first three; the broker adds TIMER_OUT_MS (when it is due) to the record
# it keeps in TIMER_TOPIC, and ENQUEUE/DEQUEUE (store time of that record, delivery
# time) to the copy it delivers
PROPERTY_TIMER_DELIVER_MS = "TIMER_DELIVER_MS"
PROPERTY_TIMER_DELAY_SEC = "TIMER_DELAY_SEC"
PROPERTY_TIMER_DELAY_MS = "TIMER_DELAY_MS"
PROPERTY_TIMER_OUT_MS = "TIMER_OUT_MS"
PROPERTY_TIMER_ENQUEUE_MS = "TIMER_ENQUEUE_MS"
PROPERTY_TIMER_DEQUEUE_MS = "TIMER_DEQUEUE_MS"
PROPERTY_TIMER_DEL_UNIQKEY = "TIMER_DEL_UNIQKEY"
#: hamq's own: on a timer message's delivered copy (or a record saying it can never be
#: delivered), the queue offset in TIMER_TOPIC of the record it was delivered from: what
#: every broker counts as delivered (hamq/store/timer.py). Producers cannot set it.
PROPERTY_TIMER_SOURCE = "HAMQ_TIMER_SOURCE"
#: hamq's own: index marks of a record (space-separated), indexed as ``HAMQ_MARKS#<mark>``
#: so that the broker can find the record by them (pop acks and revives: hamq/broker/pop.py)
PROPERTY_MARKS = "HAMQ_MARKS"
#: hamq's own properties of a pop's records (hamq/broker/pop.py)
PROPERTY_POP_CK = "HAMQ_POP_CK"
PROPERTY_POP_ACK = "HAMQ_POP_ACK"
PROPERTY_POP_REVIVED = "HAMQ_POP_REVIVED"
PROPERTY_POP_ORDER = "HAMQ_POP_ORDER"
PROPERTY_POP_ORDER_VISIBLE = "HAMQ_POP_ORDER_VISIBLE"
#: the properties only the broker writes: a producer's are dropped (each says something
#: the broker acts on: a timer delivery, a pop's ack, a lost record)
INTERNAL_PROPERTIES = (
    PROPERTY_LOST,
    PROPERTY_TIMER_SOURCE,
    PROPERTY_MARKS,
    PROPERTY_POP_CK,
    PROPERTY_POP_ACK,
    PROPERTY_POP_REVIVED,
    PROPERTY_POP_ORDER,
    PROPERTY_POP_ORDER_VISIBLE,
)
#: what every internal property's name starts with (a cheap test of a properties text)
INTERNAL_PREFIX = "HAMQ_"
KEY_SEPARATOR = " "


class MessageFormatError(ValueError):
    """Bytes that are not a valid stored message (or batch); the text says why."""


class PropertiesTooLong(MessageFormatError):
    """A properties string over MAX_PROPERTIES_LENGTH bytes (the store answers it with
    PROPERTIES_SIZE_EXCEEDED, other format errors with MESSAGE_ILLEGAL)."""


#: RocketMQ's TopicValidator: letters, digits, ``%``, ``|``, ``_`` and ``-``, at most 127
TOPIC_MAX_LENGTH = 127
_TOPIC = re.compile(r"[%|a-zA-Z0-9_-]+")


@functools.lru_cache(maxsize=4096)
def topic_error(topic: str) -> str | None:
    """Why ``topic`` is not a valid topic name, or None if it is (memoized: every message
    sent and stored is checked, and a program uses few topics)."""
    return _name_error("topic", topic, TOPIC_MAX_LENGTH)


def _name_error(kind: str, name: str, longest: int) -> str | None:
    if not name:
        return f"the {kind} is empty"
    if len(name) > longest:
        return f"{kind} {name[:40]!r}... is {len(name)} characters, over {longest}"
    if not _TOPIC.fullmatch(name):
        return f"{kind} {name!r} may only contain letters, digits, '%', '|', '_' and '-'"
    return None


#: RocketMQ's Validators.checkGroup: the topic's characters, at most 255
GROUP_MAX_LENGTH = 255


def group_error(group: str) -> str | None:
    """Why ``group`` is not a valid producer or consumer group name, or None if it is."""
    return _name_error("group", group, GROUP_MAX_LENGTH)


#: topics with a meaning of their own
DEFAULT_TOPIC = "TBW102"  # the template auto-created topics copy
SCHEDULE_TOPIC = "SCHEDULE_TOPIC_XXXX"  # delayed messages wait here, a queue per level
#: transactions: prepared (half) messages wait here, one queue, until committed
TRANS_HALF_TOPIC = "RMQ_SYS_TRANS_HALF_TOPIC"
#: transactions: one record per half message that is done with (its half queue offset)
TRANS_OP_HALF_TOPIC = "RMQ_SYS_TRANS_OP_HALF_TOPIC"
#: transactions: half messages no producer settled after transaction_check_max checks
TRANS_CHECK_MAX_TIME_TOPIC = "TRANS_CHECK_MAX_TIME_TOPIC"
#: timer messages wait here (queue 0) until their delivery time (RocketMQ's name);
#: queue 1 holds hamq's records of timer messages that can never be delivered
TIMER_TOPIC = "rmq_sys_wheel_timer"
SYSTEM_TOPICS = frozenset(
    {
        DEFAULT_TOPIC,
        SCHEDULE_TOPIC,
        TIMER_TOPIC,
        TRANS_HALF_TOPIC,
        TRANS_OP_HALF_TOPIC,
        TRANS_CHECK_MAX_TIME_TOPIC,
    }
)
#: hamq's own: a record of this topic (body: a topic's name) says the topic was deleted
#: there: the topic's records before it are gone for every reader (hamq/store/
#: deletions.py). It has no consume queue, and no producer may send to it.
TOPIC_DELETION_TOPIC = "HAMQ_SYS_TOPIC_DELETION"
RETRY_GROUP_TOPIC_PREFIX = "%RETRY%"
DLQ_GROUP_TOPIC_PREFIX = "%DLQ%"


def retry_topic(group: str) -> str:
    """Where a consumer group's failed messages come back from."""
    return RETRY_GROUP_TOPIC_PREFIX + group


def is_retry_topic(topic: str) -> bool:
    return topic.startswith(RETRY_GROUP_TOPIC_PREFIX)


def dlq_topic(group: str) -> str:
    """Where a consumer group's messages go after their last retry."""
    return DLQ_GROUP_TOPIC_PREFIX + group


#: what separates the tags of a subscription expression
TAG_SEPARATOR = "||"


class TagExpressionError(ValueError):
    """A subscription expression that is neither ``*`` nor tags joined by ``||``; the
    text quotes the expression and says what is wrong with it."""


def parse_tags(expression: str | None) -> frozenset[str] | None:
    """The tags a subscription expression (``a || b``) accepts; None: all (``*``, or
    empty). Spaces around tags are trimmed, as RocketMQ does.

    TagExpressionError for an empty tag (``a ||``, ``|| a``, ``a || || b``) or ``*``
    among tags; RocketMQ's FilterAPI drops trailing empty tags silently, which hides
    a typo, so hamq refuses them."""
    text = (expression or "").strip()
    if not text or text == "*":
        return None
    tags = [t.strip() for t in text.split(TAG_SEPARATOR)]
    if "" in tags:
        raise TagExpressionError(
            f"tag expression {expression!r} has an empty tag: write '*' for every tag, "
            f"or tags joined by '||' ('a || b')"
        )
    if "*" in tags:
        raise TagExpressionError(
            f"tag expression {expression!r} mixes '*' with tags: '*' alone takes every tag"
        )
    return frozenset(tags)


# ------------------------------------------------- tag codes, properties, hosts, ids


def java_string_hash(text: str) -> int:
    """Java's ``String.hashCode()``: 31-polynomial over UTF-16 code units, signed int32."""
    h = 0
    if text.isascii():  # one code unit per byte; reduce modulo 2**32 once at the end
        for unit in text.encode():
            h = 31 * h + unit
    else:
        data = text.encode("utf-16-be")
        for i in range(0, len(data), 2):
            h = 31 * h + ((data[i] << 8) | data[i + 1])
    h &= 0xFFFFFFFF
    return h - 2**32 if h & 0x80000000 else h


@functools.lru_cache(maxsize=4096)
def tags_code(tags: str | None) -> int:
    """The consume-queue tag code of a TAGS value: its Java hash, 0 without tags.

    Java clients send these codes in their subscriptions, so it must be Java's hash.
    Memoized: a topic uses few distinct tags."""
    return java_string_hash(tags) if tags else 0


#: "key 0x01 value" of a (key, value) pair
_join_pair = NAME_VALUE_SEPARATOR.join


def encode_properties(properties: Mapping[str, str]) -> str:
    """``key 0x01 value 0x02`` for each pair; keys or values holding 0x01/0x02 are refused."""
    if not properties:
        return ""
    try:
        # (joining each pair raises TypeError unless key and value are strings)
        text = PROPERTY_SEPARATOR.join(map(_join_pair, properties.items())) + PROPERTY_SEPARATOR
    except TypeError:
        text = ""
    pairs = len(properties)
    if text.count(NAME_VALUE_SEPARATOR) != pairs or text.count(PROPERTY_SEPARATOR) != pairs:
        for key, value in properties.items():
            if not isinstance(key, str) or not isinstance(value, str):
                raise MessageFormatError(f"property {key!r}: keys and values must be strings")
            if any(c in key or c in value for c in (NAME_VALUE_SEPARATOR, PROPERTY_SEPARATOR)):
                raise MessageFormatError(
                    f"property {key!r}: keys and values may not contain \\x01 or \\x02"
                )
    return text


def decode_properties(text: str) -> dict[str, str]:
    """The map of a properties string; pairs without a separator are skipped."""
    properties: dict[str, str] = {}
    for pair in text.split(PROPERTY_SEPARATOR):
        key, sep, value = pair.partition(NAME_VALUE_SEPARATOR)
        if sep:
            properties[key] = value
    return properties


_U64 = 2**64 - 1


@functools.lru_cache(maxsize=4096)
def pack_host(host: str, port: int) -> bytes:
    """BORNHOST / STOREHOST bytes: 4- or 16-byte address + int32 port (memoized: a
    broker sees few distinct hosts, and parsing one costs microseconds)."""
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        raise MessageFormatError(f"host {host!r} is not an IP address") from None
    if not 0 <= port < 65536:
        raise MessageFormatError(f"port {port} is not in 0..65535")
    return address.packed + port.to_bytes(4, "big")


@functools.lru_cache(maxsize=4096)
def unpack_host(raw: bytes) -> str:
    """``ip:port`` of packed host bytes (8 for IPv4, 20 for IPv6). Memoized: every
    record has two hosts, a pull body few distinct ones, and formatting one through
    ipaddress costs microseconds."""
    port = int.from_bytes(raw[-4:], "big")
    address = ipaddress.ip_address(raw[:-4])
    return f"[{address}]:{port}" if address.version == 6 else f"{address}:{port}"


def offset_msg_id(store_host: bytes, physical_offset: int) -> str:
    """The offset message id (docs/PROTOCOL.md#message-ids): STOREHOST bytes + int64
    commit-log offset, upper hex (a damaged record's negative offset as Java's putLong
    writes it, two's complement)."""
    return (store_host + (physical_offset & _U64).to_bytes(8, "big")).hex().upper()


def parse_offset_msg_id(msg_id: str) -> tuple[str, int]:
    """(``ip:port`` of the store host, commit-log offset) of an offset message id."""
    try:
        raw = bytes.fromhex(msg_id)
    except ValueError:
        raise MessageFormatError(f"message id {msg_id!r} is not hex") from None
    if len(raw) not in (16, 28):
        raise MessageFormatError(
            f"message id {msg_id!r} has {len(raw)} bytes; an offset id has 16 or 28"
        )
    return unpack_host(raw[:-8]), int.from_bytes(raw[-8:], "big")


class MessageIdGenerator:
    """UNIQ_KEY ids laid out as Java's MessageClientIDSetter lays them out
    (docs/PROTOCOL.md#message-ids).

    16 bytes as 32 upper-case hex digits: IPv4 (4) + pid (2) + a per-generator random
    int (4, Java's class-loader hash) + ms since the start of the month (4) + counter (2).
    """

    def __init__(self, ip: str = "127.0.0.1") -> None:
        address = ipaddress.ip_address(ip)
        fixed = address.packed + (os.getpid() & 0xFFFF).to_bytes(2, "big")
        fixed += random.getrandbits(32).to_bytes(4, "big")
        self._prefix = fixed.hex().upper()
        self._counter = 0
        self._month_start_ms = 0
        self._next_month_ms = 0

    def next_id(self, now_ms: int | None = None) -> str:
        now = int(time.time() * 1000) if now_ms is None else now_ms
        if now >= self._next_month_ms or now < self._month_start_ms:
            self._set_month(now)
        self._counter = (self._counter + 1) & 0xFFFF
        span = (now - self._month_start_ms) & 0xFFFFFFFF
        return f"{self._prefix}{span:08X}{self._counter:04X}"

    def _set_month(self, now_ms: int) -> None:
        moment = datetime.fromtimestamp(now_ms / 1000, UTC)
        start = moment.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
        following = (
            start.replace(year=start.year + 1, month=1)
            if start.month == 12
            else (start.replace(month=start.month + 1))
        )
        self._month_start_ms = int(start.timestamp() * 1000)
        self._next_month_ms = int(following.timestamp() * 1000)


# ---------------------------------------------------------------- batches
# (docs/PROTOCOL.md#batch-body)


@attrs.define(slots=True)
class BatchEntry:
    body: bytes
    flag: int = 0
    properties: str = ""


#: an entry's TOTALSIZE MAGIC(0) BODYCRC(0) FLAG BODYLEN, and its int16 properties length
_BATCH_HEAD = struct.Struct(">iiiii")
_PROPERTIES_LENGTH = struct.Struct(">h")


def encode_batch(entries: Iterable[BatchEntry]) -> bytes:
    parts = []
    for entry in entries:
        properties = entry.properties.encode()
        if len(properties) > MAX_PROPERTIES_LENGTH:
            raise PropertiesTooLong(f"batch entry properties of {len(properties)} bytes")
        size = 20 + len(entry.body) + 2 + len(properties)
        parts.append(_BATCH_HEAD.pack(size, 0, 0, entry.flag, len(entry.body)))
        parts += [entry.body, _PROPERTIES_LENGTH.pack(len(properties)), properties]
    return b"".join(parts)


def decode_batch(body: bytes | memoryview) -> list[BatchEntry]:
    """The messages of a batch body; MessageFormatError names the bad entry.

    Each entry's body is a slice of ``body`` (copied once first if it is not bytes)."""
    data = body if isinstance(body, bytes) else bytes(body)
    entries: list[BatchEntry] = []
    head, text_length = _BATCH_HEAD.unpack_from, _PROPERTIES_LENGTH.unpack_from  # (bound once)
    pos, total = 0, len(data)
    while pos < total:
        if total - pos < 22:
            raise MessageFormatError(f"batch entry {len(entries)} is cut short at byte {pos}")
        size, _magic, _crc, flag, body_len = head(data, pos)
        end = pos + size
        if size < 22 or end > total or body_len < 0 or 20 + body_len + 2 > size:
            raise MessageFormatError(
                f"batch entry {len(entries)}: sizes do not add up (total {size}, body {body_len})"
            )
        at = pos + 20 + body_len
        (properties_len,) = text_length(data, at)
        if properties_len < 0 or at + 2 + properties_len != end:
            raise MessageFormatError(f"batch entry {len(entries)}: properties length mismatch")
        try:
            properties = data[at + 2 : end].decode()
        except UnicodeDecodeError as exc:
            raise MessageFormatError(f"batch entry {len(entries)}: {exc}") from None
        entries.append(BatchEntry(data[pos + 20 : at], flag, properties))
        pos = end
    return entries
