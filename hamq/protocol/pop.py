"""Pop consumption's texts on the wire (RocketMQ 5's ``ExtraInfoUtil`` and ``KeyBuilder``).

A popped message's **receipt handle** ("extra info", the POP_CK property a client gives
it) is eight fields separated by spaces::

    <ck offset> <pop time> <invisible time> <revive queue> <topic kind> <broker> <queue> <offset>

the first offset the pop read from that queue, when it popped (ms), for how long (ms),
the revive queue, ``0`` for the topic asked for, ``1`` for the group's pop retry topic
(``%RETRY%<group>_<topic>``; ``2``: its ``+`` form), the broker's name, the queue id and
the message's own queue offset. ACK_MESSAGE and CHANGE_MESSAGE_INVISIBLETIME send it
back with the message's queue and offset.

A POP_MESSAGE answer says where its messages came from in two header fields, entries
separated by ``;``: ``startOffsetInfo`` ``<kind> <queue> <ck offset>`` and
``msgOffsetInfo`` ``<kind> <queue> <offset>,<offset>,...``; ``orderCountInfo`` (FIFO)
``<kind> <queue> <count>`` or ``<kind> <queue> <offset> <count>``.
"""

from __future__ import annotations

import re

import attrs

from hamq.protocol.headers import (
    AckMessageRequestHeader,
    ChangeInvisibleTimeRequestHeader,
    ChangeInvisibleTimeResponseHeader,
    PopMessageResponseHeader,
)
from hamq.protocol.message import (
    PROPERTY_RETRY_TOPIC,
    RETRY_GROUP_TOPIC_PREFIX,
    is_retry_topic,
)
from hamq.protocol.record import StoredMessage

NORMAL_TOPIC = "0"
RETRY_TOPIC = "1"
RETRY_TOPIC_V2 = "2"
#: the revive queue hamq names in every handle (it has one; FIFO pops: RocketMQ's 999)
REVIVE_QUEUE = 0
ORDER_REVIVE_QUEUE = 999
#: most messages one pop may ask for (RocketMQ's limit)
MAX_POP_MESSAGES = 32

_NUMBER = r"(0|[1-9][0-9]{0,17})"
_HANDLE = re.compile(rf"{_NUMBER} {_NUMBER} {_NUMBER} {_NUMBER} ([012]) (\S+) {_NUMBER} {_NUMBER}")


def pop_retry_topic(group: str, topic: str) -> str:
    """The topic a group's popped messages of ``topic`` come back from
    (``KeyBuilder.buildPopRetryTopicV1``)."""
    return f"{RETRY_GROUP_TOPIC_PREFIX}{group}_{topic}"


def topic_kind(topic: str) -> str:
    """``0`` for a topic, ``1`` for a pop retry topic, ``2`` for its ``+`` form."""
    if topic.startswith(RETRY_GROUP_TOPIC_PREFIX):
        return RETRY_TOPIC_V2 if "+" in topic else RETRY_TOPIC
    return NORMAL_TOPIC


def real_topic(kind: str, topic: str, group: str) -> str:
    """The topic a handle's message was popped from, given the topic the consumer asked
    for (``ExtraInfoUtil.getRealTopic``)."""
    if kind == RETRY_TOPIC:
        return pop_retry_topic(group, topic)
    if kind == RETRY_TOPIC_V2:
        return f"{RETRY_GROUP_TOPIC_PREFIX}{group}+{topic}"
    return topic


class ReceiptHandleError(ValueError):
    """A receipt handle that does not read; the text says why."""


@attrs.define
class ReceiptHandle:
    """A receipt handle's fields (a value: not frozen only because a frozen attrs
    ``__init__`` costs several times more, and a batch ack reads one a message)."""

    ck_offset: int
    pop_time: int
    invisible_time: int
    revive_queue: int
    kind: str
    broker_name: str
    queue_id: int
    offset: int

    @classmethod
    def parse(cls, text: str) -> ReceiptHandle:
        found = _HANDLE.fullmatch(text)
        if found is None:
            raise ReceiptHandleError(
                f"receipt handle {text[:80]!r} is not '<ck offset> <pop time> <invisible time> "
                "<revive queue> <0|1|2> <broker> <queue> <offset>'"
            )
        ck, pop_time, invisible, revive, kind, broker, queue, offset = found.groups()
        return cls(
            int(ck),
            int(pop_time),
            int(invisible),
            int(revive),
            kind,
            broker,
            int(queue),
            int(offset),
        )

    def __str__(self) -> str:
        return (
            f"{self.ck_offset} {self.pop_time} {self.invisible_time} {self.revive_queue} "
            f"{self.kind} {self.broker_name} {self.queue_id} {self.offset}"
        )

    @property
    def visible_at(self) -> int:
        """When the message comes back unless acked (ms since the epoch)."""
        return self.pop_time + self.invisible_time


def start_offset_info(entries: list[tuple[str, int, int]]) -> str:
    """``startOffsetInfo`` of (topic, queue id, ck offset) entries."""
    return ";".join(f"{topic_kind(t)} {q} {o}" for t, q, o in entries)


def msg_offset_info(entries: list[tuple[str, int, list[int]]]) -> str:
    """``msgOffsetInfo`` of (topic, queue id, offsets) entries."""
    return ";".join(f"{topic_kind(t)} {q} {','.join(map(str, o))}" for t, q, o in entries)


def parse_offset_info(text: str | None) -> dict[tuple[str, int], list[int]]:
    """(topic kind, queue id) -> the numbers of either field (a start offset: one).
    ValueError names what does not read."""
    parsed: dict[tuple[str, int], list[int]] = {}
    for entry in (text or "").split(";") if text else ():
        parts = entry.split(" ")
        if len(parts) != 3 or parts[0] not in (NORMAL_TOPIC, RETRY_TOPIC, RETRY_TOPIC_V2):
            raise ValueError(f"offset info entry {entry!r} is not '<kind> <queue> <offsets>'")
        try:
            parsed[(parts[0], int(parts[1]))] = [int(n) for n in parts[2].split(",")]
        except ValueError:
            raise ValueError(f"offset info entry {entry!r} holds a non-number") from None
    return parsed


#: the property a popped message's receipt handle is kept in (RocketMQ's POP_CK)
PROPERTY_RECEIPT_HANDLE = "POP_CK"


def read_popped(
    answer: PopMessageResponseHeader, messages: list[StoredMessage], broker: str, topic: str
) -> None:
    """Make the messages of a POP_MESSAGE answer (of ``topic`` from ``broker``) what a
    consumer is given: each gets its receipt handle (PROPERTY_RECEIPT_HANDLE), a FIFO
    pop's earlier deliveries as its reconsume times, and one from the pop retry topic
    the topic it was sent to (RETRY_TOPIC)."""
    starts = parse_offset_info(answer.start_offset_info)
    counts = _order_counts(answer.order_count_info)
    # (each handle as ReceiptHandle's text, written here at once: one a message)
    common = f"{answer.pop_time} {answer.invisible_time} {answer.revive_qid}"
    for message in messages:
        kind = topic_kind(message.topic)
        start = starts.get((kind, message.queue_id), [message.queue_offset])[0]
        message.properties[PROPERTY_RECEIPT_HANDLE] = (
            f"{start} {common} {kind} {broker} {message.queue_id} {message.queue_offset}"
        )
        count = counts.get((kind, message.queue_id, message.queue_offset))
        if count:
            message.reconsume_times = count
        if is_retry_topic(message.topic):
            message.topic = message.properties.get(PROPERTY_RETRY_TOPIC, topic)


def ack_header(group: str, topic: str, handle: ReceiptHandle) -> AckMessageRequestHeader:
    """ACK_MESSAGE's header for the message ``handle`` names, in ``topic`` (the one its
    handle is in: the pop retry topic's, or the topic)."""
    return AckMessageRequestHeader(
        consumer_group=group,
        topic=topic,
        queue_id=handle.queue_id,
        extra_info=str(handle),
        offset=handle.offset,
    )


def change_invisible_header(
    group: str, topic: str, handle: ReceiptHandle, invisible_ms: int
) -> ChangeInvisibleTimeRequestHeader:
    """CHANGE_MESSAGE_INVISIBLETIME's header: the message ``handle`` names (in ``topic``,
    as for ``ack_header``) comes back ``invisible_ms`` from now."""
    return ChangeInvisibleTimeRequestHeader(
        consumer_group=group,
        topic=topic,
        queue_id=handle.queue_id,
        extra_info=str(handle),
        offset=handle.offset,
        invisible_time=invisible_ms,
    )


def changed_handle(
    handle: ReceiptHandle, answer: ChangeInvisibleTimeResponseHeader
) -> ReceiptHandle:
    """The receipt handle a CHANGE_MESSAGE_INVISIBLETIME answer gives the message."""
    return ReceiptHandle(
        handle.offset,
        answer.pop_time,
        answer.invisible_time,
        answer.revive_qid,
        handle.kind,
        handle.broker_name,
        handle.queue_id,
        handle.offset,
    )


def _order_counts(text: str | None) -> dict[tuple[str, int, int], int]:
    """(kind, queue, offset) -> earlier deliveries, from a FIFO pop's orderCountInfo
    (``<kind> qo<queue>%<offset> <count>`` entries; queue-level ones passed over)."""
    counts = {}
    for entry in (text or "").split(";") if text else ():
        parts = entry.split(" ")
        if len(parts) == 3 and parts[1].startswith("qo") and "%" in parts[1]:
            queue, offset = parts[1][2:].split("%", 1)
            counts[(parts[0], int(queue), int(offset))] = int(parts[2])
    return counts
