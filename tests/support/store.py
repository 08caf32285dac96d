"""Helpers for store tests: small configurations and a running store."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import trio

from hamq.store import (
    ConfiguredRole,
    MessageStore,
    MessageToStore,
    PutMessageResult,
    PutMessageStatus,
    StoreConfig,
)

SEGMENT = 256 * 1024


def small_config(store_dir: Path, **overrides: Any) -> StoreConfig:
    """Segments of 256 KiB, 100-entry consume-queue files, tiny index files."""
    settings: dict[str, Any] = {
        "store_dir": store_dir,
        "commitlog_segment_bytes": SEGMENT,
        "max_message_bytes": 64 * 1024,
        "consume_queue_entries_per_file": 100,
        "index_hash_slots": 97,
        "index_max_entries": 400,
    }
    settings.update(overrides)
    return StoreConfig(**settings)


@asynccontextmanager
async def open_store(config: StoreConfig, **kwargs: Any) -> AsyncIterator[MessageStore]:
    """Run a MessageStore for the block; it stops cleanly at the end."""
    store = MessageStore(config, **kwargs)
    async with trio.open_nursery() as nursery:
        await nursery.start(store.run)
        yield store
        nursery.cancel_scope.cancel()


async def put(store: MessageStore, message: MessageToStore) -> PutMessageResult:
    """Append ``message`` the way a send does, and return once the store answers it
    (durability.py's ticket: on disk with SYNC_FLUSH, on the replicas the store was
    given), its status saying what did not happen in time; the message is stored either
    way. A checkpoint, so a loop of puts lets the store's tasks run."""
    await trio.lowlevel.checkpoint()
    ticket = store.durability.ticket(message.wait_store_ok)
    result = store.put_message_nowait(message)
    if result.append is not None and ticket is not None:
        result.status, result.remark = await ticket.result(result.append.end_offset)
    return result


async def promote(store: MessageStore) -> None:
    """Make a store on its own (its ``ConfiguredRole``) a master's, in the order a
    broker's role does (hamq/broker/roles.py): settle, the role, then its scheduler."""
    assert isinstance(store.role, ConfiguredRole)
    await store.prepare_master()
    store.role.is_master = True
    await store.follow_role()


def message(
    topic: str = "T", queue_id: int = 0, body: bytes = b"body", **properties: str
) -> MessageToStore:
    return MessageToStore(topic=topic, queue_id=queue_id, body=body, properties=properties)


async def put_many(
    store: MessageStore, count: int, *, queues: int = 4, padding: int = 2000
) -> list[int]:
    """Put ``count`` messages; their CommitLog offsets. Message ``i`` goes to queue
    ``i % queues`` with body ``m<i>.`` and ``padding`` dots (so ``body.split(b".")[0]``
    names it), key ``k<i>``, tag ``odd`` or ``even`` and unique key ``UNIQ<i:06>``.
    Each put must be PUT_OK."""
    offsets = []
    for i in range(count):
        result = await put(
            store,
            message(
                queue_id=i % queues,
                body=f"m{i}.".encode() + b"." * padding,
                KEYS=f"k{i}",
                TAGS="odd" if i % 2 else "even",
                UNIQ_KEY=f"UNIQ{i:06d}",
            ),
        )
        assert result.status is PutMessageStatus.PUT_OK, result
        assert result.append is not None, result
        offsets.append(result.append.physical_offset)
    return offsets
