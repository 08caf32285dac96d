"""Helpers for store tests: small configurations and a running store."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import trio

from hamq.store import MessageStore, MessageToStore, StoreConfig

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


def virtual_clock(base_ms: int = 1_700_000_000_000) -> Callable[[], int]:
    """A store clock (ms) that follows Trio's clock, so MockClock drives it."""
    return lambda: base_ms + int(trio.current_time() * 1000)


@asynccontextmanager
async def open_store(config: StoreConfig, **kwargs: Any) -> AsyncIterator[MessageStore]:
    """Run a MessageStore for the block; it stops cleanly at the end."""
    store = MessageStore(config, **kwargs)
    async with trio.open_nursery() as nursery:
        await nursery.start(store.run)
        yield store
        nursery.cancel_scope.cancel()


def message(
    topic: str = "T", queue_id: int = 0, body: bytes = b"body", **properties: str
) -> MessageToStore:
    return MessageToStore(topic=topic, queue_id=queue_id, body=body, properties=properties)
