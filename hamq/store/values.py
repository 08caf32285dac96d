"""The store's values: what a put takes and answers, what a read answers, statistics.

Plain values, no I/O: ``MessageToStore`` (a message as a send gives it),
``PutMessageResult`` (a put's status and where it went), ``GetMessageResult`` (a read of
a consume queue: zero-copy views of the CommitLog, used before the next await),
``StoreStatistics``, and ``copy_to_store`` (a stored message to store again: a delayed
message coming due, a transaction's half message committed).
"""

from __future__ import annotations

import enum
import time
from collections.abc import Mapping

import attrs

from hamq.protocol.message import (
    PROPERTY_WAIT,
)
from hamq.protocol.record import (
    StoredMessage,
)
from hamq.store.commitlog import AppendResult
from hamq.store.durability import PutMessageStatus
from hamq.store.segment import StoreError


def wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


class GetMessageStatus(enum.Enum):
    FOUND = "FOUND"
    NO_MATCHED_MESSAGE = "NO_MATCHED_MESSAGE"
    MESSAGE_WAS_REMOVING = "MESSAGE_WAS_REMOVING"
    OFFSET_FOUND_NULL = "OFFSET_FOUND_NULL"
    OFFSET_OVERFLOW_BADLY = "OFFSET_OVERFLOW_BADLY"
    OFFSET_OVERFLOW_ONE = "OFFSET_OVERFLOW_ONE"
    OFFSET_TOO_SMALL = "OFFSET_TOO_SMALL"
    NO_MATCHED_LOGIC_QUEUE = "NO_MATCHED_LOGIC_QUEUE"
    NO_MESSAGE_IN_QUEUE = "NO_MESSAGE_IN_QUEUE"


@attrs.define(slots=True)
class MessageToStore:
    """A message as a producer's request gives it; the store adds place and time.
    (Not frozen: one is made per send on the hot path; the store does not change it.)"""

    topic: str
    queue_id: int
    body: bytes
    flag: int = 0
    properties: Mapping[str, str] = attrs.field(factory=dict)
    sys_flag: int = 0
    born_timestamp: int = 0
    born_host: tuple[str, int] = ("127.0.0.1", 0)
    store_host: tuple[str, int] = ("127.0.0.1", 10911)
    reconsume_times: int = 0
    prepared_transaction_offset: int = 0
    #: ``properties`` as text, when the caller has it (the text a client sent, the pairs
    #: added since appended: it decodes to ``properties``); the record then takes it as
    #: it is, not encoded again. Whoever changes ``properties`` sets it None.
    properties_text: str | None = None

    @property
    def wait_store_ok(self) -> bool:
        """WAIT=false asks not to wait for flush or replicas (RocketMQ's default: wait)."""
        return self.properties.get(PROPERTY_WAIT, "true") != "false"


@attrs.define(slots=True)
class PutMessageResult:
    status: PutMessageStatus
    append: AppendResult | None = None
    remark: str = ""

    @property
    def stored(self) -> bool:
        """True when the message is in the CommitLog (even if a flush or replica timed out)."""
        return self.append is not None


@attrs.frozen
class GetMessageResult:
    status: GetMessageStatus
    next_begin_offset: int
    min_offset: int
    max_offset: int
    #: the records found, in queue order: zero-copy views of the CommitLog, each of one
    #: record or of several back to back (``messages``: one view a record)
    runs: tuple[memoryview, ...] = ()
    message_count: int = 0
    #: how far the last record found is behind the CommitLog's end, in bytes (a master
    #: sends consumers this far behind to a slave, slaveReadEnable)
    lag_bytes: int = 0
    #: damaged records passed over (not in ``runs``; ``next_begin_offset`` is past them)
    skipped: int = 0

    @property
    def body(self) -> bytes:
        """The records back to back: a PULL response body."""
        return b"".join(self.runs)

    @property
    def messages(self) -> tuple[memoryview, ...]:
        """The records found, a view each, in queue order."""
        records = []
        for run in self.runs:
            at = 0
            while at < len(run):
                size = int.from_bytes(run[at : at + 4], "big")
                if not 0 < size <= len(run) - at:  # (never for records this store read)
                    raise StoreError(f"a TOTALSIZE of {size} at byte {at} of a run of records")
                records.append(run[at : at + size])
                at += size
        return tuple(records)


@attrs.frozen
class StoreStatistics:
    running: bool
    role: str
    commitlog_min_offset: int
    commitlog_max_offset: int
    flushed_offset: int
    dispatched_offset: int
    consume_queues: int
    messages_put: int
    put_failures: int
    messages_got: int
    flush_rounds: int
    delayed_delivered: int
    segments_deleted: int
    dispatch_failure: str | None
    #: damaged records dispatching passed over (each once), and pulls skipped (each time)
    damaged_records_dispatched: int = 0
    damaged_records_read: int = 0
    #: timer messages waiting for their time, and delivered since this broker became
    #: master (hamq/store/timer.py)
    timers_waiting: int = 0
    timers_delivered: int = 0


def copy_to_store(
    message: StoredMessage,
    topic: str,
    queue_id: int,
    properties: Mapping[str, str],
    *,
    sys_flag: int | None = None,
    prepared_transaction_offset: int | None = None,
) -> MessageToStore:
    """A stored message to store again under ``topic`` and ``queue_id`` with
    ``properties`` (a delayed message coming due, a transaction's half message put back
    or committed): born time and hosts, flag and reconsume times are kept."""
    return MessageToStore(
        topic=topic,
        queue_id=queue_id,
        body=message.body,
        flag=message.flag,
        properties=properties,
        sys_flag=message.sys_flag if sys_flag is None else sys_flag,
        born_timestamp=message.born_timestamp,
        born_host=_split_host(message.born_host),
        store_host=_split_host(message.store_host),
        reconsume_times=message.reconsume_times,
        prepared_transaction_offset=(
            message.prepared_transaction_offset
            if prepared_transaction_offset is None
            else prepared_transaction_offset
        ),
    )


def _split_host(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host.strip("[]"), int(port)
