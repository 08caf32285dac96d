"""The values users handle: Message to send, SendResult, received messages, PullResult.

A ``Message`` carries its tags, keys, delay level and delivery time as fields; on the
wire they are the TAGS, KEYS, DELAY and TIMER_DELIVER_MS / TIMER_DELAY_MS properties
(docs/PROTOCOL.md#properties), next to the user's own properties. Received messages are
``hamq.protocol.message.StoredMessage`` values (exported here as ``MessageExt``) with
the body already inflated when the producer compressed it.
"""

from __future__ import annotations

import enum
import math
import zlib
from collections.abc import Sequence
from datetime import datetime, timedelta

import attrs

from hamq.client.errors import InvalidArgumentError
from hamq.protocol.bodies import MessageQueue
from hamq.protocol.message import (
    KEY_SEPARATOR,
    NAME_VALUE_SEPARATOR,
    PROPERTY_DELAY,
    PROPERTY_KEYS,
    PROPERTY_SEPARATOR,
    PROPERTY_TAGS,
    PROPERTY_TIMER_DELAY_MS,
    PROPERTY_TIMER_DELAY_SEC,
    PROPERTY_TIMER_DELIVER_MS,
    PROPERTY_TIMER_SOURCE,
    PROPERTY_WAIT,
    SYSFLAG_COMPRESSED,
    MessageFormatError,
    group_error,
    retry_topic,
    topic_error,
)
from hamq.protocol.record import StoredMessage

MessageExt = StoredMessage

#: sysflag bits 8-10: the compression of a compressed body (0 = zlib, from old clients)
COMPRESSION_TYPE_MASK = 0x700
COMPRESSION_ZLIB = 0x300
_COMPRESSION_NAMES = {0x100: "LZ4", 0x200: "ZSTD"}
#: the largest body RocketMQ accepts by default (maxMessageSize)
DEFAULT_MAX_MESSAGE_SIZE = 4 * 1024 * 1024
#: properties the client sets itself; a user's properties may not use them
RESERVED_PROPERTIES = frozenset(
    {
        PROPERTY_TAGS,
        PROPERTY_KEYS,
        PROPERTY_DELAY,
        PROPERTY_WAIT,
        PROPERTY_TIMER_DELIVER_MS,
        PROPERTY_TIMER_DELAY_MS,
        PROPERTY_TIMER_DELAY_SEC,
        PROPERTY_TIMER_SOURCE,
    }
)


def _body(value: bytes | bytearray | memoryview | str) -> bytes:
    if isinstance(value, str):
        return value.encode()
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value)
    raise InvalidArgumentError(f"a message body is bytes or str, not {type(value).__name__}")


def _seconds(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise InvalidArgumentError(f"{name} must be a number of seconds, not {value!r}")
    return float(value)


def _deliver_at(value: datetime | float | None) -> float | None:
    """An aware datetime or seconds since the epoch, as seconds since the epoch."""
    if value is None:
        return None
    if isinstance(value, datetime):
        if value.tzinfo is None:
            raise InvalidArgumentError(
                f"deliver_at {value.isoformat()} has no time zone: give one "
                "(datetime.now(UTC) + ...), or seconds since the epoch"
            )
        return value.timestamp()
    return _seconds("deliver_at", value)


def _deliver_after(value: timedelta | float | None) -> float | None:
    """A timedelta or seconds, as seconds (positive)."""
    if value is None:
        return None
    seconds = (
        value.total_seconds() if isinstance(value, timedelta) else _seconds("deliver_after", value)
    )
    if not seconds > 0:
        raise InvalidArgumentError(f"deliver_after {value!r} is not a positive time")
    return seconds


def _keys(value: str | Sequence[str] | None) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        return tuple(k for k in value.split(KEY_SEPARATOR) if k)
    return tuple(value)


@attrs.define
class Message:
    """A message to send.

    ``keys`` are what QUERY_MESSAGE finds it by (space-separated on the wire);
    ``delay_level`` 1-18 delivers it later (1s 5s 10s 30s 1m ... 2h), 0 at once;
    ``deliver_at`` (an aware datetime, or seconds since the epoch) or ``deliver_after``
    (a timedelta, or seconds) delivers it at any time up to the broker's
    ``timer_max_delay_s`` (3 days by default; RocketMQ 5's timer messages), to the
    millisecond: never before, within a second after (docs/ARCHITECTURE.md#timers);
    ``wait_store_msg_ok`` False lets a SYNC_FLUSH broker answer before the fsync.
    """

    topic: str
    body: bytes = attrs.field(converter=_body)
    tags: str | None = None
    keys: tuple[str, ...] = attrs.field(default=(), converter=_keys)
    flag: int = 0
    delay_level: int = 0
    wait_store_msg_ok: bool = True
    properties: dict[str, str] = attrs.field(factory=dict)
    deliver_at: float | None = attrs.field(default=None, converter=_deliver_at)
    deliver_after: float | None = attrs.field(default=None, converter=_deliver_after)

    def wire_properties(self) -> dict[str, str]:
        """Every property as sent: the user's, then TAGS, KEYS, DELAY, the delivery time
        (TIMER_DELIVER_MS, or TIMER_DELAY_MS: the broker counts from its own clock) and
        WAIT."""
        props = dict(self.properties)
        if self.tags:
            props[PROPERTY_TAGS] = self.tags
        if self.keys:
            props[PROPERTY_KEYS] = KEY_SEPARATOR.join(self.keys)
        if self.delay_level > 0:
            props[PROPERTY_DELAY] = str(self.delay_level)
        if self.deliver_at is not None:
            props[PROPERTY_TIMER_DELIVER_MS] = str(round(self.deliver_at * 1000))
        if self.deliver_after is not None:
            props[PROPERTY_TIMER_DELAY_MS] = str(round(self.deliver_after * 1000))
        if not self.wait_store_msg_ok:
            props[PROPERTY_WAIT] = "false"
        return props


def check_topic(topic: str) -> None:
    problem = topic_error(topic)
    if problem is not None:
        raise InvalidArgumentError(problem)


def check_group(group: str) -> None:
    problem = group_error(group)
    if problem is not None:
        raise InvalidArgumentError(problem)
    check_topic(retry_topic(group))  # a consumer group's retry topic must be a topic too


def check_timeout(name: str, timeout_s: float) -> float:
    """``timeout_s`` if it is a positive number of seconds, else InvalidArgumentError
    naming ``name``: an API's default is asked for with None, never with 0 (which
    would give up before anything is sent)."""
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, int | float):
        raise InvalidArgumentError(f"{name} must be a number of seconds, not {timeout_s!r}")
    if not timeout_s > 0:  # (NaN too)
        raise InvalidArgumentError(f"{name} {timeout_s!r} is not a positive number of seconds")
    return timeout_s


def check_message(message: Message, max_size: int) -> None:
    """Refuse what a broker would refuse, before sending (Java's Validators)."""
    if not isinstance(message, Message):
        raise InvalidArgumentError(f"expected a Message, got {type(message).__name__}")
    check_topic(message.topic)
    if not message.body:
        raise InvalidArgumentError(f"the message body to topic {message.topic} is empty")
    if len(message.body) > max_size:
        raise InvalidArgumentError(
            f"the message body size {len(message.body)} exceeds the maximum "
            f"{max_size} bytes (max_message_size)"
        )
    if message.delay_level < 0:
        raise InvalidArgumentError(
            f"delay_level {message.delay_level} is negative: 0 sends at once, 1 and up "
            "name the broker's delay levels (1 = 1s, 2 = 5s, 3 = 10s ... 18 = 2h)"
        )
    if message.delay_level > 255:
        raise InvalidArgumentError(f"delay_level {message.delay_level} is not in 0..255")
    if message.deliver_at is not None and message.deliver_after is not None:
        raise InvalidArgumentError("give deliver_at or deliver_after, not both")
    if message.delay_level > 0 and (message.deliver_at or message.deliver_after) is not None:
        raise InvalidArgumentError("give a delay_level or a delivery time, not both")
    if not -(2**31) <= message.flag < 2**31:
        raise InvalidArgumentError(f"flag {message.flag} does not fit in 32 bits")
    for text in (message.tags or "", *message.keys):
        _check_text("tags and keys", text)
    for key, value in message.properties.items():
        if key in RESERVED_PROPERTIES:
            raise InvalidArgumentError(
                f"property {key!r} is set through the Message's own field, not properties"
            )
        if not key:
            raise InvalidArgumentError("a property name is empty")
        _check_text(f"property {key!r}", key)
        _check_text(f"property {key!r}", value)
    if any(KEY_SEPARATOR in k for k in message.keys):
        raise InvalidArgumentError(f"a key may not hold a space: {message.keys}")


def _check_text(what: str, text: str) -> None:
    if not isinstance(text, str):
        raise InvalidArgumentError(f"{what} must be str, not {type(text).__name__}")
    if NAME_VALUE_SEPARATOR in text or PROPERTY_SEPARATOR in text:
        raise InvalidArgumentError(f"{what} may not hold the characters \\x01 or \\x02")


def inflate(message: StoredMessage) -> StoredMessage:
    """The message with its body inflated if the producer compressed it;
    MessageFormatError if it cannot be."""
    if not message.sys_flag & SYSFLAG_COMPRESSED:
        return message
    kind = message.sys_flag & COMPRESSION_TYPE_MASK
    if kind not in (0, COMPRESSION_ZLIB):
        raise MessageFormatError(
            f"message {message.msg_id} is compressed with "
            f"{_COMPRESSION_NAMES.get(kind, hex(kind))}, which hamq cannot inflate"
        )
    try:
        body = zlib.decompress(message.body)
    except zlib.error as exc:
        raise MessageFormatError(
            f"message {message.msg_id}: its compressed body does not inflate ({exc})"
        ) from None
    return attrs.evolve(message, body=body)


class SendStatus(enum.Enum):
    SEND_OK = "SEND_OK"
    FLUSH_DISK_TIMEOUT = "FLUSH_DISK_TIMEOUT"
    FLUSH_SLAVE_TIMEOUT = "FLUSH_SLAVE_TIMEOUT"
    SLAVE_NOT_AVAILABLE = "SLAVE_NOT_AVAILABLE"


@attrs.frozen
class SendResult:
    status: SendStatus
    #: the id users see (UNIQ_KEY); for a batch, the ids comma-joined
    msg_id: str
    #: where it is stored: store host + CommitLog offset (docs/PROTOCOL.md#message-ids)
    offset_msg_id: str
    queue: MessageQueue
    queue_offset: int
    transaction_id: str | None = None
    region_id: str | None = None


class PullStatus(enum.Enum):
    FOUND = "FOUND"
    NO_NEW_MSG = "NO_NEW_MSG"
    NO_MATCHED_MSG = "NO_MATCHED_MSG"
    OFFSET_ILLEGAL = "OFFSET_ILLEGAL"


@attrs.frozen
class PullResult:
    status: PullStatus
    next_begin_offset: int
    min_offset: int
    max_offset: int
    messages: list[StoredMessage] = attrs.field(factory=list)
    #: the broker id the broker suggested for the next pull of this queue
    suggest_which_broker_id: int = 0
    #: the records as the broker sent them, when the pull left decoding to its caller
    #: (``PullCaller.pull(decode=False)``; ``messages`` is then empty)
    raw: bytes = b""


class ConsumeResult(enum.Enum):
    """What a push consumer's handler answers (None counts as SUCCESS)."""

    SUCCESS = "CONSUME_SUCCESS"
    #: concurrent mode: send the messages back to be retried later (%RETRY%group)
    RECONSUME_LATER = "RECONSUME_LATER"
    #: orderly mode: try the same messages again in a moment, keeping the order
    SUSPEND_CURRENT_QUEUE_A_MOMENT = "SUSPEND_CURRENT_QUEUE_A_MOMENT"
