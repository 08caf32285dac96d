"""The message store: CommitLog, consume queues, index, flush, recovery, delay levels.

No network code here; the broker drives it through ``MessageStore``
(docs/ARCHITECTURE.md#storage, formats in docs/PROTOCOL.md#store-formats).

- config.py         StoreConfig, BrokerRole, FlushDiskType
- segment.py        fixed-size mmap'd files and the queue of them
- commitlog.py      the log of records (appends, raw appends for slaves, truncation)
- records.py        reading records back: sizes, damage, lost-record placeholders
- consume_queue.py  20-byte entries per topic/queue, and the table of every queue
- index.py          RocketMQ's hash index files (KEYS, UNIQ_KEY)
- reput.py          the reput task that builds queues and index from the log
- checkpoint.py     how far things are on disk; files.py: atomic writes, the lock
- extents.py        each queue's extent at the last clean stop (queueExtents.json)
- recovery.py       finding the CommitLog's end at start (clean and crash), the recovery steps
- queue_check.py    consume queues at start: checked against the log, rebuilt, lost offsets kept
- redispatch.py     recovery's dispatch passes; torn/ copies of damaged records
- deletions.py      deleted topics: where each was deleted (topicDeletions.json)
- flush.py          async flush, group commit, checkpointing
- offset_waiters.py puts waiting for an offset (the fsync's, the replicas' acks)
- durability.py     the durability ticket: what a put waits for, and its status
- role.py           the broker's role as the store and the HA service read it
- schedule.py       delay levels
- timer.py          timer messages (any delivery time): what waits, and their delivery
- retention.py      deleting old segments
- encoding.py       a put's checks and its record
- values.py         what puts and reads take and answer
- reads.py          the read path (StoreReader)
- message_store.py  the facade processors use: lifecycle, writes, replication
"""

from hamq.protocol.message import SCHEDULE_TOPIC
from hamq.store.commitlog import AppendResult
from hamq.store.config import BrokerRole, FlushDiskType, StoreConfig, parse_delay_levels
from hamq.store.durability import PutMessageStatus, ReplicaGate, Ticket
from hamq.store.encoding import is_timer_message
from hamq.store.message_store import MessageStore
from hamq.store.reput import DispatchRequest
from hamq.store.role import ConfiguredRole, RoleReader
from hamq.store.segment import StoreCorruptionError, StoreError
from hamq.store.values import (
    GetMessageResult,
    GetMessageStatus,
    MessageToStore,
    PutMessageResult,
    StoreStatistics,
    copy_to_store,
)

__all__ = [
    "SCHEDULE_TOPIC",
    "AppendResult",
    "BrokerRole",
    "ConfiguredRole",
    "DispatchRequest",
    "FlushDiskType",
    "GetMessageResult",
    "GetMessageStatus",
    "MessageStore",
    "MessageToStore",
    "PutMessageResult",
    "PutMessageStatus",
    "ReplicaGate",
    "RoleReader",
    "StoreConfig",
    "StoreCorruptionError",
    "StoreError",
    "StoreStatistics",
    "Ticket",
    "copy_to_store",
    "is_timer_message",
    "parse_delay_levels",
]
