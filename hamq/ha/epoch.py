"""The epoch file: which mastership wrote which part of the CommitLog.

An entry ``(epoch, start_offset)`` says that the log from ``start_offset`` up to the
next entry's start (the last entry: up to the log's end) was written by the master of
``epoch``. Epochs and start offsets only grow. A master adds an entry when it starts
to serve as master (statically configured: at every start; with a controller: when
elected); a slave adds the entries it is told about as replicated data crosses into
them, and drops the entries past a truncation.

Two replicas agree up to their *consistent point*: the end (the lesser of the two) of
the newest epoch both have with the same start offset (RocketMQ's
``EpochFileCache.findConsistentPoint``). A slave truncates its log there before it takes
data from a master of the auto-switch protocol.

Persisted as ``<store>/epochFileCheckpoint``, JSON ``{"epochs": [[epoch, start], ...]}``,
written with temp file + fsync + rename; a file that does not parse is an error that
names it (it is never silently reset).
"""

from __future__ import annotations

import itertools
import json
import logging
from collections.abc import Sequence
from pathlib import Path

import trio

from hamq.protocol.ha_wire import EpochEntry
from hamq.store.files import write_atomically

log = logging.getLogger(__name__)

FILE_NAME = "epochFileCheckpoint"


class EpochFileError(ValueError):
    """An epoch file that cannot be used; the text names the file and the problem."""


class EpochFile:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.entries: list[EpochEntry] = []

    def load(self) -> None:
        try:
            text = self.path.read_text()
        except FileNotFoundError:
            self.entries = []
            return
        try:
            raw = json.loads(text)["epochs"]
            entries = [EpochEntry(int(e), int(s)) for e, s in raw]
        except (ValueError, KeyError, TypeError) as exc:
            raise EpochFileError(f"{self.path} is not an epoch file: {exc}") from None
        for before, after in itertools.pairwise(entries):
            if after.epoch <= before.epoch or after.start_offset < before.start_offset:
                raise EpochFileError(f"{self.path}: entry {after} does not follow {before}")
        self.entries = entries

    async def save(self) -> None:
        data = json.dumps({"epochs": [[e.epoch, e.start_offset] for e in self.entries]})
        await trio.to_thread.run_sync(write_atomically, self.path, data.encode())

    @property
    def last(self) -> EpochEntry | None:
        return self.entries[-1] if self.entries else None

    @property
    def last_epoch(self) -> int:
        return self.entries[-1].epoch if self.entries else 0

    async def append(self, epoch: int, start_offset: int) -> None:
        """Record that ``epoch`` writes from ``start_offset`` on (and persist it)."""
        last = self.last
        if last is not None:
            if epoch == last.epoch:
                return
            if epoch < last.epoch or start_offset < last.start_offset:
                raise EpochFileError(
                    f"epoch {epoch} from offset {start_offset} cannot follow "
                    f"epoch {last.epoch} from offset {last.start_offset}"
                )
        self.entries.append(EpochEntry(epoch, start_offset))
        log.info("epoch %d starts at commitlog offset %d", epoch, start_offset)
        await self.save()

    async def truncate(self, offset: int) -> None:
        """Forget the epochs that start at or after ``offset`` (the log was cut there)."""
        kept = [e for e in self.entries if e.start_offset < offset]
        if len(kept) != len(self.entries):
            dropped = self.entries[len(kept) :]
            self.entries = kept
            log.warning("epochs %s dropped with the log past offset %d", dropped, offset)
            await self.save()

    def entry_at(self, offset: int) -> EpochEntry | None:
        """The epoch that wrote ``offset`` (the newest starting at or before it)."""
        found = None
        for entry in self.entries:
            if entry.start_offset <= offset:
                found = entry
            else:
                break
        return found

    def end_of(self, entry: EpochEntry, max_offset: int) -> int:
        """Where ``entry``'s part of the log ends: the next entry's start, or the log's end."""
        later = [e.start_offset for e in self.entries if e.epoch > entry.epoch]
        return min(later) if later else max_offset


def consistent_point(
    local: Sequence[EpochEntry], local_max: int, remote: Sequence[EpochEntry], remote_max: int
) -> int:
    """The offset up to which two logs agree by their epochs; -1 if they share none."""
    remote_by_epoch = {e.epoch: i for i, e in enumerate(remote)}
    for i in range(len(local) - 1, -1, -1):
        entry = local[i]
        j = remote_by_epoch.get(entry.epoch)
        if j is None or remote[j].start_offset != entry.start_offset:
            continue
        local_end = local[i + 1].start_offset if i + 1 < len(local) else local_max
        remote_end = remote[j + 1].start_offset if j + 1 < len(remote) else remote_max
        return min(local_end, remote_end)
    return -1
