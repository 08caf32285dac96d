"""Persisted broker state: a JSON file per manager under ``<store>/config/``.

Each manager (topics, consumer offsets, subscription groups) keeps its table in
memory and marks itself dirty when it changes; ``BrokerNode`` writes dirty state
with ``write_atomically`` in a worker thread (temp file, fsync, rename, directory
fsync), and loads it at start. The files have RocketMQ's shapes (topics.json,
consumerOffset.json, subscriptionGroup.json), so a slave can copy them as they are.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Generic, TypeVar

import trio

from hamq.protocol.bodies import BodyError, decode_body, encode_body
from hamq.store.files import write_atomically

log = logging.getLogger(__name__)

W = TypeVar("W")


class StateFile(Generic[W]):
    """A manager's file: ``snapshot()`` makes the wrapper object that is written."""

    def __init__(self, path: Path, wrapper_type: type[W]) -> None:
        self.path = path
        self.wrapper_type = wrapper_type
        self.dirty = False

    def read(self) -> W | None:
        """The saved wrapper, None if there is no file; ValueError names a bad file."""
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return None
        try:
            return decode_body(self.wrapper_type, data)
        except BodyError as exc:
            raise ValueError(f"{self.path}: {exc}") from None

    async def load(self) -> None:
        """Read the saved state (in a worker thread) and take it over."""
        self.restore(await trio.to_thread.run_sync(self.read))

    def restore(self, saved: W | None) -> None:
        raise NotImplementedError

    def snapshot(self) -> W:
        raise NotImplementedError

    def mark_dirty(self) -> None:
        self.dirty = True

    async def persist(self) -> bool:
        """Write the state if it changed; True if it wrote."""
        if not self.dirty:
            return False
        self.dirty = False
        data = encode_body(self.snapshot())
        try:
            await trio.to_thread.run_sync(write_atomically, self.path, data)
        except BaseException:
            self.dirty = True
            raise
        return True
