"""Persisted broker state: a JSON file per manager under ``<store>/config/``.

Each manager (topics, consumer offsets, subscription groups) keeps its table in
memory and marks itself dirty when it changes; ``BrokerNode`` writes dirty state
in a worker thread, and loads it at start. The files have RocketMQ's shapes (topics.json,
consumerOffset.json, subscriptionGroup.json), so a slave can copy them as they are.

Writes are atomic (temp file, fsync, rename, directory fsync) and keep the previous
content as ``<name>.bak`` (RocketMQ's ConfigManager). A file that does not decode at
start is reported in one line naming it, kept aside as ``<name>.damaged``, and the
``.bak`` is used with a warning (hamq/store/checkpoint.py ``load_with_backup``); with
no usable ``.bak`` the broker does not start, and the error names the file.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Generic, TypeVar

import trio

from hamq.protocol.bodies import BodyError, decode_body, encode_body
from hamq.store.checkpoint import load_with_backup, save_with_backup

log = logging.getLogger(__name__)

W = TypeVar("W")


class StateFile(Generic[W]):
    """A manager's file: ``snapshot()`` makes the wrapper object that is written."""

    def __init__(self, path: Path, wrapper_type: type[W]) -> None:
        self.path = path
        self.wrapper_type = wrapper_type
        self.dirty = False

    def read(self) -> W | None:
        """The saved wrapper (or its backup's, if the file is damaged), None if there is
        none; MetadataFileError (a StoreError) if neither decodes. Blocking."""
        return load_with_backup(self.path, self._decode)

    def _decode(self, data: bytes) -> W:
        try:
            return decode_body(self.wrapper_type, data)
        except BodyError as exc:
            raise ValueError(str(exc)) from None

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
            await trio.to_thread.run_sync(save_with_backup, self.path, data)
        except BaseException:
            self.dirty = True
            raise
        return True
