"""Fixed-size files mapped into memory, and the ordered queue of them that makes a log.

A ``Segment`` is one file of exactly ``size`` bytes named by the 20-digit offset of its
first byte in the log (``00000000001073741824``). Invariants:
- bytes [0, wrote) hold data, [wrote, size) are zeros; ``flushed <= wrote`` is what is
  known to be on disk;
- small writes go through the mmap (a memcpy; measured about 2x ``pwrite`` at 4 KiB);
  large ones (a replica's transfers, a put batch's records of a page or more) go
  through ``write_bulk``'s pwritev, which spares the fault on each fresh page. Reads
  are zero-copy memoryviews of the mmap, which sees the same page cache;
- the part of a mapping not written yet is advised MADV_RANDOM, the written part
  normal again a chunk at a time (``advise_written``): a write's fault on a fresh page
  then brings in that page alone. With the normal advice each such fault read around
  it (8 MiB on a disk with read_ahead_kb 8192), zero-filling page cache for blocks
  fallocated but never written: a new consume queue's first entry took its whole
  6 MB file into the page cache (100 new queues of 10 entries: 572 MiB and 160 ms of
  CPU; now 0.4 MiB and 32 ms). The CommitLog takes the same advice: with it on the
  queues alone, a store's put and dispatch of 1 KiB messages measured 12 us a message,
  against 9.5 with it on both or on neither. Reads of written data keep their
  readahead;
- a segment file is created under a temporary name, its blocks reserved with
  ``posix_fallocate`` (a full disk is an error at creation, never a SIGBUS on a later
  write), then renamed into place and the directory fsynced: a file with a segment
  name always has its full size;
- no file descriptor is kept: the one a file is mapped through is closed at once (the
  map holds the file; CPython before 3.13 keeps one duplicate inside the mmap object),
  and ``sync_data`` and ``write_bulk`` open the file for the call;
- ``sync_data`` (fdatasync, which on Linux writes back pages dirtied through the map)
  blocks, so callers run it in a worker thread.

Segments of many small logs (the consume queues: thousands of topics x queues) share
a ``MappedFiles``: at most its ``limit`` of them are mapped at a time, the least
recently used are unmapped, and a segment is mapped again when next used. Their
state (wrote, flushed) lives in the Segment, so nothing is lost by unmapping; pages
written through the map stay in the page cache until synced. Segments without one
(CommitLog) stay mapped.

A ``SegmentQueue`` is the ordered, contiguous list of a log's segments; it knows
nothing of what the bytes mean.

A failure to create, open or map a file is a ``StoreFileError`` (an OSError too: a
full disk, too many open files), which callers may retry; ``reserve_blocks`` is the
seam through which tests play a full disk.
"""

from __future__ import annotations

import contextlib
import logging
import mmap
import os
import re
import sys
from collections import OrderedDict
from collections.abc import Callable, Sequence
from pathlib import Path

from hamq.store.files import fsync_directory, sync_file_data

log = logging.getLogger(__name__)

_NAME = re.compile(r"\d{20}")
#: the most buffers one pwritev takes (Linux IOV_MAX is 1024)
IOV_MAX = 1024
#: how far writes go past the normal-advice part of a mapping before it is moved up
ADVICE_CHUNK = 4 << 20


class StoreError(Exception):
    """The store cannot do what was asked; the text says why."""


class StoreCorruptionError(StoreError):
    """Files on disk are not what the store wrote (wrong size, gap, bad name)."""


class StoreFileError(StoreError, OSError):
    """A store file could not be created, opened or mapped (a full disk, too many open
    files): worth trying again later. ``errno`` is the cause's; the text names the file."""

    def __init__(self, cause: OSError, what: str) -> None:
        super().__init__(cause.errno, f"{what}: {cause.strerror or cause}")

    def __str__(self) -> str:
        return str(self.strerror)


def segment_name(start: int) -> str:
    return f"{start:020d}"


def _reserve(fd: int, size: int, path: Path) -> None:
    os.posix_fallocate(fd, 0, size)


#: reserves the blocks of a new store file (``fd`` open on it, ``path`` its final name):
#: posix_fallocate. A seam: tests put a function here that raises OSError(ENOSPC) to
#: play a full disk; nothing else replaces it.
reserve_blocks: Callable[[int, int, Path], None] = _reserve


if sys.version_info >= (3, 13):

    def _map(fd: int, size: int) -> mmap.mmap:
        return mmap.mmap(fd, size, trackfd=False)  # holds no descriptor of its own

else:

    def _map(fd: int, size: int) -> mmap.mmap:
        return mmap.mmap(fd, size)  # (keeps a duplicate of fd until it is closed)


def map_new_file(path: Path, size: int) -> mmap.mmap:
    """Create ``path`` with ``size`` reserved zero bytes, atomically, and map it.

    On any failure nothing is left behind under ``path`` (a retry can create it again);
    an OSError is raised as a StoreFileError naming the file.
    """
    if path.exists():
        raise StoreCorruptionError(f"{path} exists already")
    temporary = path.with_name(f".{path.name}.creating")
    try:
        fd = os.open(temporary, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    except OSError as exc:
        raise StoreFileError(exc, f"cannot create {path}") from exc
    renamed = False
    try:
        try:
            reserve_blocks(fd, size, path)
            os.fsync(fd)  # the size is on disk before the name is
            os.rename(temporary, path)
            renamed = True
            fsync_directory(path.parent)
            return _map(fd, size)
        except OSError as exc:
            raise StoreFileError(exc, f"cannot create {path} ({size} bytes)") from exc
    except BaseException:
        temporary.unlink(missing_ok=True)
        if renamed:
            path.unlink(missing_ok=True)
        raise
    finally:
        os.close(fd)


def map_existing_file(path: Path, size: int) -> mmap.mmap:
    """Map an existing file that must be exactly ``size`` bytes."""
    check_size(path, size)
    try:
        fd = os.open(path, os.O_RDWR)
    except OSError as exc:
        raise StoreFileError(exc, f"cannot open {path}") from exc
    try:
        return _map(fd, size)
    except OSError as exc:
        raise StoreFileError(exc, f"cannot map {path}") from exc
    finally:
        os.close(fd)


def check_size(path: Path, size: int) -> None:
    """StoreCorruptionError unless ``path`` has exactly ``size`` bytes."""
    actual = path.stat().st_size
    if actual != size:
        raise StoreCorruptionError(
            f"{path} has {actual} bytes, not {size}: it was cut short or changed by "
            f"something else, or the store's configured file size changed since it was "
            f"written"
        )


def _size_problem(path: Path, size: int, sizes: list[int], owner: SegmentQueue) -> str:
    """Why a segment file of ``size`` bytes among files of ``sizes`` does not load, with
    the explanations its neighbours leave open."""
    configured, setting = owner.segment_size, owner.size_setting
    text = f"{path} has {size} bytes, not the {configured} that {setting} says"
    if len(set(sizes)) == 1 and len(sizes) > 1:
        return (
            f"{text}, and so do the other {len(sizes) - 1} files in {owner.directory}: the "
            f"store was written with {setting} = {size}; set it back to that"
        )
    if size == 0:
        return f"{text}: it is empty (cut to nothing, or never written); remove it if so"
    if size > configured:
        return (
            f"{text}: it is larger, so {setting} was probably made smaller since the store "
            f"was written (set it back), or the file was replaced by another"
        )
    if len(sizes) == 1:
        return (
            f"{text}: either {setting} was changed since the store was written (then set "
            f"it back to {size}), or the file was cut short (truncated, or only partly "
            f"copied or restored)"
        )
    return (
        f"{text}, unlike the segments after it: it was cut short (truncated, or only "
        f"partly copied or restored) or replaced; restore it from a copy or a replica"
    )


def close_map(mm: mmap.mmap, path: Path) -> None:
    try:
        mm.close()
    except BufferError:
        # a reader still holds a view; the map closes when that view is dropped
        log.debug("%s still viewed at close; the map outlives it", path)


class MappedFiles:
    """The mapped segments of a family of small logs, least recently used first; when
    there are more than ``limit``, the oldest are unmapped (each map costs a file
    descriptor before CPython 3.13, and a kernel map area always)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._order: OrderedDict[Segment, None] = OrderedDict()
        #: how many times a file was mapped again after being unmapped for lack of room
        self.remaps = 0

    def __len__(self) -> int:
        return len(self._order)

    def used(self, segment: Segment) -> None:
        """``segment`` (mapped) was used now; unmap the least recently used beyond the limit."""
        order = self._order
        if segment in order:
            order.move_to_end(segment)
            return
        order[segment] = None
        while len(order) > max(1, self.limit):
            oldest, _ = order.popitem(last=False)
            oldest.unmap()

    def forget(self, segment: Segment) -> None:
        self._order.pop(segment, None)

    def shrink(self) -> None:
        """Unmap the least recently used until at most ``limit`` are mapped (after the
        limit was lowered)."""
        while len(self._order) > max(1, self.limit):
            oldest, _ = self._order.popitem(last=False)
            oldest.unmap()


class Segment:
    __slots__ = (
        "_closed",
        "_files",
        "_mm",
        "_normal_to",
        "_view",
        "advice_due",
        "flushed",
        "needs_sync",
        "path",
        "size",
        "start",
        "wrote",
    )

    def __init__(
        self,
        path: Path,
        start: int,
        size: int,
        mm: mmap.mmap | None,
        files: MappedFiles | None = None,
    ) -> None:
        self.path = path
        self.start = start
        self.size = size
        self._files = files
        self._mm = mm
        self._view = memoryview(mm) if mm is not None else None
        self._closed = False
        self.wrote = 0
        self.flushed = 0
        #: bytes below ``flushed`` changed (zeroed by a cut) and must be synced again
        self.needs_sync = False
        #: the map's advice: normal below ``_normal_to``, MADV_RANDOM from there on;
        #: writers call ``advise_written`` once ``wrote`` reaches ``advice_due``
        self._normal_to = self.advice_due = size
        if mm is not None and files is not None:
            files.used(self)

    @classmethod
    def create(
        cls, directory: Path, start: int, size: int, files: MappedFiles | None = None
    ) -> Segment:
        path = directory / segment_name(start)
        segment = cls(path, start, size, map_new_file(path, size), files)
        segment.advise_unwritten()
        return segment

    @classmethod
    def open(cls, path: Path, start: int, size: int, files: MappedFiles | None = None) -> Segment:
        """An existing segment file; with ``files`` it is mapped when first used."""
        if files is None:
            mm: mmap.mmap | None = map_existing_file(path, size)
        else:
            check_size(path, size)
            mm = None
        segment = cls(path, start, size, mm, files)
        segment.wrote = segment.flushed = size
        return segment

    # ------------------------------------------------------------------ state
    @property
    def end(self) -> int:
        """The log offset just past this segment."""
        return self.start + self.size

    @property
    def remaining(self) -> int:
        return self.size - self.wrote

    @property
    def dirty(self) -> bool:
        """True if the file has changes that are not known to be on disk."""
        return self.flushed < self.wrote or self.needs_sync

    @property
    def mapped(self) -> bool:
        return self._mm is not None

    @property
    def buffer(self) -> mmap.mmap:
        """The mapped bytes, for ``struct.pack_into`` and slice assignment (mapped now
        if it was not). Use it at once: a later use of other segments of the same
        ``MappedFiles`` may unmap this one."""
        mm = self._mm
        if mm is None:
            mm = self._map()
        if self._files is not None:
            self._files.used(self)
        return mm

    def _map(self) -> mmap.mmap:
        if self._closed:
            raise StoreError(f"{self.path} is closed")
        mm = map_existing_file(self.path, self.size)
        self._mm, self._view = mm, memoryview(mm)
        self.advise_unwritten()
        if self._files is not None:
            self._files.remaps += 1
        return mm

    def advise_unwritten(self) -> None:
        """Advise MADV_RANDOM from the page that ``wrote`` is in to the end of the map."""
        start = self.wrote - self.wrote % mmap.PAGESIZE
        self._normal_to = start
        self.advice_due = start + ADVICE_CHUNK
        if self._mm is not None and start < self.size:
            with contextlib.suppress(OSError):  # (advice: without it, only slower)
                self._mm.madvise(mmap.MADV_RANDOM, start, self.size - start)

    def advise_written(self) -> None:
        """Writers call this once ``wrote`` reaches ``advice_due``: the whole pages
        written since the last call get the normal advice (readahead for reads of them
        once they have left the page cache)."""
        end = self.wrote - self.wrote % mmap.PAGESIZE
        if self._mm is not None and end > self._normal_to:
            with contextlib.suppress(OSError):
                self._mm.madvise(mmap.MADV_NORMAL, self._normal_to, end - self._normal_to)
        self._normal_to = max(self._normal_to, end)
        self.advice_due = self._normal_to + ADVICE_CHUNK

    def unmap(self) -> None:
        """Let go of the map (it is made again when next used); what was written through
        it stays in the page cache, to be synced as before."""
        mm, view = self._mm, self._view
        if mm is None:
            return
        self._mm = self._view = None
        if view is not None:
            view.release()
        close_map(mm, self.path)

    def __repr__(self) -> str:
        return f"<Segment {self.path.name} wrote={self.wrote} flushed={self.flushed}>"

    # ------------------------------------------------------------------ data
    def write(self, data: bytes | bytearray | memoryview) -> int:
        """Append ``data``; returns the position it was written at."""
        pos = self.wrote
        end = pos + len(data)
        if end > self.size:
            raise StoreError(f"{len(data)} bytes do not fit in {self!r}")
        self.buffer[pos:end] = data
        self.wrote = end
        if end >= self.advice_due:
            self.advise_written()
        return pos

    def write_bulk(self, chunks: Sequence[bytes | bytearray | memoryview]) -> int:
        """Append large chunks (a replica's transfers) with one gathered pwritev: no
        page faults on fresh pages, unlike a copy into the map (which sees the same page
        cache). Returns the position they were written at."""
        pos = self.wrote
        total = sum(len(c) for c in chunks)
        if pos + total > self.size:
            raise StoreError(f"{total} bytes do not fit in {self!r}")
        views = [memoryview(c) for c in chunks]
        at = pos
        fd = os.open(self.path, os.O_WRONLY)
        try:
            while views:
                written = os.pwritev(fd, views[:IOV_MAX], at)
                at += written
                while views and written >= len(views[0]):
                    written -= len(views.pop(0))
                if written:
                    views[0] = views[0][written:]
        finally:
            os.close(fd)
        self.wrote = pos + total
        if self.wrote >= self.advice_due:
            self.advise_written()
        return pos

    def view(self, pos: int, length: int) -> memoryview:
        """Zero-copy view of ``length`` bytes at ``pos`` (within what was written)."""
        view = self._view
        if view is None or self._files is not None:
            self.buffer  # noqa: B018 - mapped now if it was not, and counted as used
            view = self._view
            assert view is not None
        return view[pos : pos + length]

    def cut(self, pos: int) -> None:
        """End the data at ``pos``: zero what follows and mark it for the next sync."""
        if pos < self.wrote:
            self.zero(pos, self.wrote)
            self.needs_sync = True
        self.wrote = pos
        self.flushed = min(self.flushed, pos)

    def zero(self, start: int, stop: int) -> None:
        """Overwrite [start, stop) with zeros."""
        mm = self.buffer
        chunk = 1 << 20
        for pos in range(start, stop, chunk):
            end = min(stop, pos + chunk)
            mm[pos:end] = bytes(end - pos)

    def sync_data(self) -> None:
        """Blocking fdatasync of the file: run it in a worker thread."""
        sync_file_data(self.path)

    def mtime(self) -> float:
        return self.path.stat().st_mtime

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._files is not None:
            self._files.forget(self)
        self.unmap()

    def destroy(self) -> None:
        """Close and delete the file."""
        self.close()
        self.path.unlink(missing_ok=True)


class SegmentQueue:
    """The contiguous, ordered segments of one log in one directory; with ``files``
    its segments are mapped only while used (see MappedFiles)."""

    def __init__(
        self,
        directory: Path,
        segment_size: int,
        files: MappedFiles | None = None,
        *,
        size_setting: str = "the segment size",
    ) -> None:
        self.directory = directory
        self.segment_size = segment_size
        self.files = files
        self.segments: list[Segment] = []
        #: what configures ``segment_size``, for error messages
        self.size_setting = size_setting
        #: segment files found cut short and brought back to full size by ``load``
        #: (``extend_short_last``): (the file, the bytes it had)
        self.extended: list[tuple[Path, int]] = []

    def load(self, *, extend_short_last: bool = False) -> None:
        """Open every segment file; StoreCorruptionError for a gap or a stray size.

        A file of another size than ``segment_size`` is named with what can explain it
        (``_size_problem``). With ``extend_short_last``, a last file shorter than the
        others, which have the configured size, was cut short (truncated, or only partly
        copied): it is brought back to full size with zeros and listed in ``extended``;
        its owner must then scan it as after a crash.

        Loaded segments count as full; their owner sets the real end (``set_end``).
        """
        self.directory.mkdir(parents=True, exist_ok=True)
        for leftover in self.directory.glob(".*.creating"):
            log.warning("removing %s, a segment whose creation was interrupted", leftover)
            leftover.unlink()
        names = sorted(p.name for p in self.directory.iterdir() if _NAME.fullmatch(p.name))
        self._check_sizes(names, extend_short_last)
        expected: int | None = None
        for name in names:
            start = int(name)
            if start % self.segment_size:
                raise StoreCorruptionError(
                    f"segment {self.directory / name} does not start at a multiple of the "
                    f"segment size {self.segment_size}"
                )
            if expected is not None and start != expected:
                raise StoreCorruptionError(
                    f"segments of {self.directory} have a gap: expected {segment_name(expected)}"
                    f" after the previous one, found {name}"
                )
            self.segments.append(
                Segment.open(self.directory / name, start, self.segment_size, self.files)
            )
            expected = start + self.segment_size

    def _check_sizes(self, names: list[str], extend_short_last: bool) -> None:
        """StoreCorruptionError naming the first file whose size is not ``segment_size``
        and what can explain it; a short last file extended instead, if allowed."""
        sizes = [(self.directory / name).stat().st_size for name in names]
        for i, (name, size) in enumerate(zip(names, sizes, strict=True)):
            if size == self.segment_size:
                continue
            path = self.directory / name
            last_cut_short = i == len(names) - 1 and i > 0 and 0 < size < self.segment_size
            if extend_short_last and last_cut_short:
                self._extend(path, size)
                continue
            raise StoreCorruptionError(_size_problem(path, size, sizes, self))

    def _extend(self, path: Path, size: int) -> None:
        """Bring a segment file cut short back to ``segment_size`` (zeros, blocks
        reserved); StoreCorruptionError if the disk cannot take it."""
        log.error(
            "%s has %d bytes, not %d like the segments before it: it was cut short "
            "(truncated, or only partly copied); it is brought back to full size with "
            "zeros and scanned as after a crash (what it lost is lost)",
            path,
            size,
            self.segment_size,
        )
        try:
            fd = os.open(path, os.O_RDWR)
            try:
                reserve_blocks(fd, self.segment_size, path)
                os.fsync(fd)
            finally:
                os.close(fd)
        except OSError as exc:
            raise StoreCorruptionError(
                f"{path} has {size} bytes, not {self.segment_size}: it was cut short, and "
                f"bringing it back to full size failed: {exc}"
            ) from exc
        self.extended.append((path, size))

    @property
    def empty(self) -> bool:
        return not self.segments

    @property
    def first(self) -> Segment | None:
        return self.segments[0] if self.segments else None

    @property
    def last(self) -> Segment | None:
        return self.segments[-1] if self.segments else None

    @property
    def min_offset(self) -> int:
        return self.segments[0].start if self.segments else 0

    @property
    def max_offset(self) -> int:
        last = self.last
        return last.start + last.wrote if last is not None else 0

    def find(self, offset: int) -> Segment | None:
        """The segment holding log offset ``offset``."""
        if not self.segments:
            return None
        index = (offset - self.segments[0].start) // self.segment_size
        if 0 <= index < len(self.segments):
            return self.segments[index]
        return None

    def create(self, start: int) -> Segment:
        """A new last segment starting at ``start``."""
        last = self.last
        if last is not None and start != last.end:
            raise StoreError(f"new segment at {start} does not follow {last!r}")
        if start % self.segment_size:
            raise StoreError(f"new segment at {start} is not segment-aligned")
        self.directory.mkdir(parents=True, exist_ok=True)
        segment = Segment.create(self.directory, start, self.segment_size, self.files)
        self.segments.append(segment)
        return segment

    def set_end(self, offset: int) -> None:
        """Make ``offset`` the end of the log: segments before it are full, the one
        holding it ends there; segments after it must already have been removed."""
        for segment in self.segments:
            if segment.end <= offset:
                segment.wrote = segment.flushed = segment.size
            elif segment.start <= offset:
                segment.wrote = segment.flushed = offset - segment.start
                segment.advise_unwritten()
            else:
                raise StoreError(f"{segment!r} lies past the end offset {offset}")

    def remove_after(self, offset: int) -> list[Segment]:
        """Delete the segments that start at or after ``offset``; returns them (closed).

        Newest first, so a crash part way leaves the log contiguous, only shorter.
        """
        keep = [s for s in self.segments if s.start < offset]
        dropped = self.segments[len(keep) :]
        for segment in reversed(dropped):
            segment.destroy()
            self.segments.pop()
        if dropped:
            fsync_directory(self.directory)
        return dropped

    def remove_first(self) -> Segment:
        segment = self.segments.pop(0)
        segment.destroy()
        fsync_directory(self.directory)
        return segment

    def close(self) -> None:
        for segment in self.segments:
            segment.close()
