"""RocketMQ 5's gRPC messages <-> the broker's messages, properties and answer codes.

Pure functions, no I/O. What a v2 Message becomes (``outgoing``): its system properties
as the RocketMQ properties a remoting send carries (TAGS, KEYS space-separated,
UNIQ_KEY the client's message id, the message group as ``__SHARDINGKEY``, a delivery
time as TIMER_DELIVER_MS, a transaction as TRAN_MSG), its user properties as they are.
What a stored message becomes (``delivered``): the reverse, with the pop's receipt
handle, invisible time and attempt, and the body's CRC32 digest (every official client
checks it). ``code_of`` maps remoting answer codes onto the v2 ``Code`` enum.
"""

from __future__ import annotations

import zlib

from google.protobuf.duration_pb2 import Duration
from google.protobuf.timestamp_pb2 import Timestamp

from hamq.protocol import ResponseCode
from hamq.protocol.message import (
    KEY_SEPARATOR,
    PROPERTY_KEYS,
    PROPERTY_TAGS,
    PROPERTY_TIMER_DELIVER_MS,
    PROPERTY_TRANSACTION_PREPARED,
    PROPERTY_UNIQ_KEY,
    SYSFLAG_TRANSACTION_MASK,
    SYSFLAG_TRANSACTION_PREPARED,
)
from hamq.protocol.pop import PROPERTY_RECEIPT_HANDLE
from hamq.protocol.record import StoredMessage
from hamq.protocol.v2 import definition_pb2 as pb

#: RocketMQ's MessageConst.PROPERTY_SHARDING_KEY: a FIFO message's group
PROPERTY_MESSAGE_GROUP = "__SHARDINGKEY"
#: RocketMQ's own property names (MessageConst.STRING_HASH_SET, and the timer's): a
#: client may not send them as user properties, and they are not delivered as such
SYSTEM_PROPERTIES = frozenset(
    {
        "KEYS", "TAGS", "WAIT", "DELAY", "RETRY_TOPIC", "REAL_TOPIC", "REAL_QID",
        "TRAN_MSG", "PGROUP", "MIN_OFFSET", "MAX_OFFSET", "BUYER_ID", "ORIGIN_MESSAGE_ID",
        "TRANSFER_FLAG", "CORRECTION_FLAG", "MQ2_FLAG", "RECONSUME_TIME", "MSG_REGION",
        "TRACE_ON", "UNIQ_KEY", "MAX_RECONSUME_TIMES", "CONSUME_START_TIME", "POP_CK",
        "POP_CK_OFFSET", "1ST_POP_TIME", "TRAN_PREPARED_QUEUE_OFFSET",
        "TRANSACTION_CHECK_TIMES", "CHECK_IMMUNITY_TIME_IN_SECONDS", "CLUSTER",
        "INNER_NUM", "INNER_BASE", "__STARTDELIVERTIME", "TIMER_DELIVER_MS",
        "TIMER_DELAY_SEC", "TIMER_DELAY_MS", "TIMER_OUT_MS", "TIMER_ENQUEUE_MS",
        "TIMER_DEQUEUE_MS", "TIMER_ROLL_TIMES", "TIMER_DEL_UNIQKEY", "INSTANCE_ID",
        "CORRELATION_ID", "REPLY_TO_CLIENT", "TTL", "ARRIVE_TIME", "MSG_TYPE",
        PROPERTY_MESSAGE_GROUP,
    }
)  # fmt: skip


def is_system_property(key: str) -> bool:
    return key in SYSTEM_PROPERTIES or key.startswith(("HAMQ_", "__RMQ."))


class Refused(Exception):
    """A request the endpoint refuses before it reaches the broker: its v2 code."""

    def __init__(self, code: pb.Code, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def status(code: pb.Code, message: str = "") -> pb.Status:
    return pb.Status(code=code, message=message or pb.Code.Name(code))


def millis(duration: Duration) -> int:
    return duration.seconds * 1000 + duration.nanos // 1_000_000


def duration(ms: int) -> Duration:
    return Duration(seconds=ms // 1000, nanos=(ms % 1000) * 1_000_000)


def timestamp(ms: int) -> Timestamp:
    return Timestamp(seconds=ms // 1000, nanos=(ms % 1000) * 1_000_000)


def timestamp_ms(value: Timestamp) -> int:
    return value.seconds * 1000 + value.nanos // 1_000_000


# ---------------------------------------------------------------------- sending
def outgoing(message: pb.Message, max_body_bytes: int) -> tuple[dict[str, str], int]:
    """The properties and sys flag of a v2 message sent; Refused names what is wrong."""
    system = message.system_properties
    if not message.body:
        raise Refused(pb.MESSAGE_BODY_EMPTY, "the message has no body")
    if len(message.body) > max_body_bytes:
        raise Refused(
            pb.MESSAGE_BODY_TOO_LARGE,
            f"a body of {len(message.body)} bytes is past the limit of {max_body_bytes}",
        )
    if not system.message_id:
        raise Refused(pb.ILLEGAL_MESSAGE_ID, "the message has no message_id")
    properties: dict[str, str] = {}
    for key, value in message.user_properties.items():
        if not key or is_system_property(key):
            raise Refused(
                pb.ILLEGAL_MESSAGE_PROPERTY_KEY, f"user property {key!r} is a reserved name"
            )
        properties[key] = value
    if system.HasField("tag"):
        if not system.tag.strip() or "|" in system.tag:
            raise Refused(pb.ILLEGAL_MESSAGE_TAG, f"tag {system.tag!r} is empty or holds '|'")
        properties[PROPERTY_TAGS] = system.tag
    if system.keys:
        if any(not key.strip() or KEY_SEPARATOR in key for key in system.keys):
            raise Refused(pb.ILLEGAL_MESSAGE_KEY, "a key is empty or holds a space")
        properties[PROPERTY_KEYS] = KEY_SEPARATOR.join(system.keys)
    properties[PROPERTY_UNIQ_KEY] = system.message_id
    kind = system.message_type
    sys_flag = 0
    if system.HasField("message_group"):
        if kind != pb.FIFO or not system.message_group.strip():
            raise Refused(
                pb.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE,
                "a message group is for FIFO messages, and not empty",
            )
        properties[PROPERTY_MESSAGE_GROUP] = system.message_group
    elif kind == pb.FIFO:
        raise Refused(pb.ILLEGAL_MESSAGE_GROUP, "a FIFO message needs a message group")
    if system.HasField("delivery_timestamp"):
        if kind != pb.DELAY:
            raise Refused(
                pb.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE, "a delivery time is for DELAY messages"
            )
        properties[PROPERTY_TIMER_DELIVER_MS] = str(timestamp_ms(system.delivery_timestamp))
    elif kind == pb.DELAY:
        raise Refused(pb.ILLEGAL_DELIVERY_TIME, "a DELAY message needs a delivery timestamp")
    if kind == pb.TRANSACTION:
        properties[PROPERTY_TRANSACTION_PREPARED] = "true"
        sys_flag |= SYSFLAG_TRANSACTION_PREPARED
    elif kind not in (pb.NORMAL, pb.FIFO, pb.DELAY):
        raise Refused(
            pb.UNSUPPORTED, f"message type {pb.MessageType.Name(kind)} is not supported here"
        )
    return properties, sys_flag


# ---------------------------------------------------------------------- delivering
def delivered(message: StoredMessage, invisible_ms: int) -> pb.Message:
    """A popped message (read_popped made it: its receipt handle is a property) as a
    ReceiveMessage answer carries it."""
    properties = message.properties
    system = pb.SystemProperties(
        message_id=message.msg_id,
        body_digest=pb.Digest(type=pb.CRC32, checksum=f"{zlib.crc32(message.body):08X}"),
        body_encoding=pb.IDENTITY,
        born_timestamp=timestamp(message.born_timestamp),
        born_host=message.born_host,
        store_timestamp=timestamp(message.store_timestamp),
        store_host=message.store_host,
        queue_id=message.queue_id,
        queue_offset=message.queue_offset,
        invisible_duration=duration(invisible_ms),
        delivery_attempt=message.reconsume_times + 1,
    )
    if (tag := properties.get(PROPERTY_TAGS)) is not None:
        system.tag = tag
    system.keys.extend(message.keys)
    if (handle := properties.get(PROPERTY_RECEIPT_HANDLE)) is not None:
        system.receipt_handle = handle
    group = properties.get(PROPERTY_MESSAGE_GROUP)
    deliver_ms = properties.get(PROPERTY_TIMER_DELIVER_MS)
    if group is not None:
        system.message_type = pb.FIFO
        system.message_group = group
    elif deliver_ms is not None and deliver_ms.isdigit():
        system.message_type = pb.DELAY
        system.delivery_timestamp.CopyFrom(timestamp(int(deliver_ms)))
    elif message.sys_flag & SYSFLAG_TRANSACTION_MASK or PROPERTY_TRANSACTION_PREPARED in properties:
        system.message_type = pb.TRANSACTION
    else:
        system.message_type = pb.NORMAL
    user = {key: value for key, value in properties.items() if not is_system_property(key)}
    return pb.Message(
        topic=pb.Resource(name=message.topic),
        user_properties=user,
        system_properties=system,
        body=message.body,
    )


# ---------------------------------------------------------------------- answers
_CODES: dict[int, pb.Code] = {
    ResponseCode.SUCCESS: pb.OK,
    ResponseCode.FLUSH_DISK_TIMEOUT: pb.MASTER_PERSISTENCE_TIMEOUT,
    ResponseCode.FLUSH_SLAVE_TIMEOUT: pb.SLAVE_PERSISTENCE_TIMEOUT,
    ResponseCode.SLAVE_NOT_AVAILABLE: pb.HA_NOT_AVAILABLE,
    ResponseCode.TOPIC_NOT_EXIST: pb.TOPIC_NOT_FOUND,
    ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST: pb.CONSUMER_GROUP_NOT_FOUND,
    ResponseCode.NO_PERMISSION: pb.FORBIDDEN,
    ResponseCode.SYSTEM_BUSY: pb.TOO_MANY_REQUESTS,
    ResponseCode.POLLING_FULL: pb.TOO_MANY_REQUESTS,
    ResponseCode.MESSAGE_ILLEGAL: pb.BAD_REQUEST,
    ResponseCode.REQUEST_CODE_NOT_SUPPORTED: pb.NOT_IMPLEMENTED,
    ResponseCode.POLLING_TIMEOUT: pb.MESSAGE_NOT_FOUND,
    ResponseCode.PULL_NOT_FOUND: pb.MESSAGE_NOT_FOUND,
    ResponseCode.NO_MESSAGE: pb.MESSAGE_NOT_FOUND,
    ResponseCode.SERVICE_NOT_AVAILABLE: pb.INTERNAL_SERVER_ERROR,
    ResponseCode.INVALID_PARAMETER: pb.BAD_REQUEST,
}


def code_of(response_code: int) -> pb.Code:
    """The v2 Code of a remoting answer's code (INTERNAL_SERVER_ERROR when it has none)."""
    return _CODES.get(response_code, pb.INTERNAL_SERVER_ERROR)
