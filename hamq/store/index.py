"""Index: find messages by key (KEYS property) and by unique id (UNIQ_KEY).

RocketMQ's index file format, so the files read the same way::

    header (40 bytes): begin timestamp int64, end timestamp int64,
                       begin commit-log offset int64, end commit-log offset int64,
                       used hash slots int32, entry count int32 (entry 0 is never used)
    hash slots:        ``hash_slots`` x int32, the newest entry of each slot (0 = none)
    entries:           ``max_entries`` x (key hash int32, commit-log offset int64,
                       seconds since begin timestamp int32, previous entry int32)

The key of a message is ``topic#key`` for each of its KEYS and for its UNIQ_KEY. One
deliberate difference from RocketMQ: the key hash is CRC32 of the UTF-8 key (masked
to 31 bits) instead of Java's ``String.hashCode``. Layout and lookups are the same, but
Java's hash costs about 3 us a key in Python and CRC32 about 0.1 us; every message
has at least two keys, and nothing outside hamq reads these files. A file is one
time slice: when it is full a new one starts, named by the creation time
(``yyyyMMddHHmmssSSS``). Entries chain newest to oldest within a slot. The header is
rewritten with every entry, so after a killed process (the page cache intact) it
always agrees with the slots.

Invariants and choices:
- ``indexed_offset`` (the header's end offset of the newest file) says which records
  are indexed; dispatch skips records below it, so re-dispatching is harmless;
- hash collisions and entries left by a truncated log are filtered by the caller, which
  reads each candidate record and checks its topic and keys (MessageStore.query);
  truncation therefore only moves ``indexed_offset`` back.
"""

from __future__ import annotations

import logging
import struct
import zlib
from datetime import UTC, datetime
from pathlib import Path

from hamq.store.files import fsync_directory, sync_file_data
from hamq.store.segment import close_map, map_existing_file, map_new_file

log = logging.getLogger(__name__)

_HEADER = struct.Struct(">qqqqii")
_SLOT = struct.Struct(">i")
_ENTRY = struct.Struct(">iqii")
HEADER_SIZE = _HEADER.size  # 40


def index_key(topic: str, key: str) -> str:
    return f"{topic}#{key}"


def key_hash(key: str) -> int:
    """CRC32 of the UTF-8 key, non-negative int32 (see the module notes)."""
    return zlib.crc32(key.encode()) & 0x7FFFFFFF


class IndexFile:
    def __init__(self, path: Path, hash_slots: int, max_entries: int, *, create: bool) -> None:
        self.path = path
        self.hash_slots = hash_slots
        self.max_entries = max_entries
        size = HEADER_SIZE + hash_slots * _SLOT.size + max_entries * _ENTRY.size
        self._mm = (map_new_file if create else map_existing_file)(path, size)
        header: tuple[int, int, int, int, int, int] = _HEADER.unpack_from(self._mm, 0)
        self.begin_timestamp: int = header[0]
        self.end_timestamp: int = header[1]
        self.begin_offset: int = header[2]
        self.end_offset: int = header[3]
        self.used_slots: int = header[4]
        self.count: int = max(header[5], 1)
        self._entries_at = HEADER_SIZE + hash_slots * _SLOT.size
        self.dirty = create

    def __repr__(self) -> str:
        return f"<IndexFile {self.path.name} entries={self.count - 1} end={self.end_offset}>"

    @property
    def full(self) -> bool:
        return self.count >= self.max_entries

    def room_for(self, keys: int) -> bool:
        return self.count + keys <= self.max_entries

    def put(self, key: str, physical_offset: int, store_timestamp: int) -> bool:
        """Index ``key`` for the record at ``physical_offset``; False when the file is full."""
        count = self.count
        if count >= self.max_entries:
            return False
        mm = self._mm
        h = zlib.crc32(key.encode()) & 0x7FFFFFFF
        slot_at = HEADER_SIZE + (h % self.hash_slots) * 4
        (previous,) = _SLOT.unpack_from(mm, slot_at)
        if previous <= 0 or previous >= count:
            previous = 0
            self.used_slots += 1
        if count == 1:
            self.begin_timestamp = store_timestamp
            self.begin_offset = physical_offset
        seconds = (store_timestamp - self.begin_timestamp) // 1000
        if seconds < 0:
            seconds = 0
        elif seconds > 0x7FFFFFFF:
            seconds = 0x7FFFFFFF
        _ENTRY.pack_into(mm, self._entries_at + count * 20, h, physical_offset, seconds, previous)
        _SLOT.pack_into(mm, slot_at, count)
        self.count = count + 1
        if store_timestamp > self.end_timestamp:
            self.end_timestamp = store_timestamp
        if physical_offset > self.end_offset:
            self.end_offset = physical_offset
        self._write_header()
        self.dirty = True
        return True

    def _write_header(self) -> None:
        _HEADER.pack_into(
            self._mm,
            0,
            self.begin_timestamp,
            self.end_timestamp,
            self.begin_offset,
            self.end_offset,
            self.used_slots,
            self.count,
        )

    def select(self, key: str, max_num: int, begin_ms: int, end_ms: int) -> list[int]:
        """Commit-log offsets of entries for ``key`` stored in [begin_ms, end_ms], newest first."""
        h = key_hash(key)
        (current,) = _SLOT.unpack_from(self._mm, HEADER_SIZE + (h % self.hash_slots) * _SLOT.size)
        found: list[int] = []
        entries_at = HEADER_SIZE + self.hash_slots * _SLOT.size
        seen = 0
        while 0 < current < self.count and len(found) < max_num and seen < self.count:
            entry_hash, physical_offset, seconds, previous = _ENTRY.unpack_from(
                self._mm, entries_at + current * _ENTRY.size
            )
            stored = self.begin_timestamp + seconds * 1000
            if entry_hash == h and begin_ms <= stored <= end_ms + 999:
                found.append(physical_offset)
            if previous >= current:  # chains only go back in time; anything else is damage
                break
            current = previous
            seen += 1
        return found

    def lower_end(self, physical_offset: int) -> None:
        """After a truncation: records from ``physical_offset`` on are to be indexed again."""
        if self.end_offset >= physical_offset:
            self.end_offset = physical_offset - 1
            self._write_header()
            self.dirty = True

    def sync_data(self) -> None:
        """Blocking: write the file's dirty pages to disk (run in a worker thread)."""
        sync_file_data(self.path)

    def close(self) -> None:
        close_map(self._mm, self.path)

    def destroy(self) -> None:
        self.close()
        self.path.unlink(missing_ok=True)


class IndexService:
    def __init__(self, directory: Path, hash_slots: int, max_entries: int) -> None:
        self.directory = directory
        self.hash_slots = hash_slots
        self.max_entries = max_entries
        self.files: list[IndexFile] = []

    def load(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        for leftover in self.directory.glob(".*.creating"):
            leftover.unlink()
        for path in sorted(p for p in self.directory.iterdir() if p.name.isdigit()):
            self.files.append(IndexFile(path, self.hash_slots, self.max_entries, create=False))

    def close(self) -> None:
        for index_file in self.files:
            index_file.close()

    @property
    def indexed_offset(self) -> int:
        """Records at commit-log offsets up to this one are indexed (-1: none)."""
        if self.files and self.files[-1].count > 1:
            return self.files[-1].end_offset  # the newest file holds the newest entries
        return max((f.end_offset for f in self.files if f.count > 1), default=-1)

    def add(
        self,
        topic: str,
        keys: list[str],
        physical_offset: int,
        store_timestamp: int,
        marks: tuple[str, ...] = (),
    ) -> None:
        """Index one record's keys (KEYS and UNIQ_KEY) under its topic, and ``marks``
        (whole index keys, ``index_key``'s); records already indexed are skipped.

        A record's keys go into one file when they fit in an empty one: a new file is
        started first when the current one lacks room for all of them, so that a
        failure to create it (a full disk) leaves the record wholly unindexed, and
        dispatching it again indexes it whole.
        """
        if not keys and not marks:
            return
        current = self.files[-1] if self.files else None
        # (indexed_offset, read off the newest file when it holds any entry)
        if current is not None and current.count > 1:
            if physical_offset <= current.end_offset:
                return
        elif physical_offset <= self.indexed_offset:
            return
        count = len(keys) + len(marks)
        if current is None or not current.room_for(count):  # (most records: it has room)
            current = self._writable(store_timestamp)
            if not current.room_for(count) and current.count > 1:
                current = self._new_file(store_timestamp)
        full_keys = [f"{topic}#{key}" for key in keys]
        if marks:
            full_keys.extend(marks)
        for full_key in full_keys:
            if not current.put(full_key, physical_offset, store_timestamp):
                current = self._new_file(store_timestamp)
                current.put(full_key, physical_offset, store_timestamp)

    def _writable(self, now_ms: int) -> IndexFile:
        if not self.files or self.files[-1].full:
            return self._new_file(now_ms)
        return self.files[-1]

    def _new_file(self, now_ms: int) -> IndexFile:
        stamp = now_ms
        if self.files:  # names must keep growing, even if the clock went back
            newest = datetime.strptime(self.files[-1].path.name, "%Y%m%d%H%M%S%f")
            stamp = max(stamp, int(newest.replace(tzinfo=UTC).timestamp() * 1000) + 1)
        while True:
            name = datetime.fromtimestamp(stamp / 1000, UTC).strftime("%Y%m%d%H%M%S%f")[:-3]
            path = self.directory / name
            if not path.exists():
                break
            stamp += 1
        index_file = IndexFile(path, self.hash_slots, self.max_entries, create=True)
        self.files.append(index_file)
        return index_file

    def query(self, topic: str, key: str, max_num: int, begin_ms: int, end_ms: int) -> list[int]:
        """Candidate commit-log offsets for ``key`` of ``topic``, newest first, deduplicated.

        Candidates may be hash collisions: callers check the records themselves.
        """
        full_key = index_key(topic, key)
        found: list[int] = []
        for index_file in reversed(self.files):
            if index_file.count <= 1:
                continue
            if index_file.end_timestamp < begin_ms or index_file.begin_timestamp > end_ms + 999:
                continue
            for offset in index_file.select(full_key, max_num, begin_ms, end_ms):
                if offset not in found:
                    found.append(offset)
            if len(found) >= max_num:
                break
        return found[:max_num]

    def truncate(self, physical_offset: int) -> None:
        """Records from ``physical_offset`` on were dropped from the log: index them anew
        when they come back (stale entries are filtered at query time)."""
        for index_file in self.files:
            index_file.lower_end(physical_offset)

    def delete_expired(self, commitlog_min_offset: int) -> int:
        """Delete files (never the newest) whose every entry points below the log's start."""
        deleted = 0
        while len(self.files) > 1 and self.files[0].end_offset < commitlog_min_offset:
            self.files.pop(0).destroy()
            deleted += 1
        if deleted:
            fsync_directory(self.directory)
        return deleted

    def dirty_files(self) -> list[IndexFile]:
        return [f for f in self.files if f.dirty]
