"""The message store: CommitLog, consume queues, index, flush, recovery, delay levels.

No network code here; the broker drives it through ``MessageStore``
(shared/DESIGN.md §4, formats in shared/PROTOCOL.md §6).

- segment.py        fixed-size mmap'd files and the queue of them
- commitlog.py      the log of records (appends, raw appends for slaves, truncation)
- consume_queue.py  20-byte entries per topic/queue
- index.py          RocketMQ's hash index files (KEYS, UNIQ_KEY)
- reput.py          the reput task that builds queues and index from the log
- checkpoint.py     how far things are on disk; files.py: atomic writes, the lock
- recovery.py       clean and crash recovery
- flush.py          async flush, group commit, checkpointing
- durability.py     when a put is answered: its fsync and replicas (SYNC_FLUSH, SYNC_MASTER)
- schedule.py       delay levels
- retention.py      deleting old segments
- message_store.py  the facade processors use
"""

from hamq.protocol.message import SCHEDULE_TOPIC
from hamq.store.commitlog import AppendResult
from hamq.store.config import BrokerRole, FlushDiskType, StoreConfig, parse_delay_levels
from hamq.store.durability import PutMessageStatus, ReplicaGate, Ticket
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
    "parse_delay_levels",
]
