"""The store checkpoint: how far the CommitLog is on disk and the queues are built.

File ``<store>/checkpoint``, 56 bytes, big-endian::

     0  8s  magic b"HAMQCKPT"
     8  i   format version (1)
    12  q   commitlog_flushed_offset   every CommitLog byte below it is on disk
    20  q   dispatched_offset          consume queues and index on disk cover every
                                       record below it
    28  q   physic_msg_timestamp       store time of the last flushed message (ms)
    36  q   logics_msg_timestamp       store time of the last dispatched message (ms)
    44  q   confirm_offset             what the replicas confirmed (HA; 0 without)
    52  I   CRC32 of bytes 0..52

Written with ``write_atomically`` (temp file, fsync, rename, directory fsync). The
offsets only move forward between two writes, except through an explicit truncation.

The JSON metadata files (the broker's topics.json, consumerOffset.json,
subscriptionGroup.json; the store's delayOffset.json) are written with
``save_with_backup`` and read with ``load_with_backup``, RocketMQ's ConfigManager rule:
the previous content stays beside the file as ``<name>.bak`` (a hard link to the old
file, so it is as durable as the old file was; a copy where links do not work). A file
that does not decode is reported in one line naming it, kept as ``<name>.damaged``, and
the backup is used (a warning says so) and written back under the file's name. With no
usable backup, MetadataFileError names both and nothing is changed on disk.
"""

from __future__ import annotations

import logging
import os
import secrets
import struct
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import attrs

from hamq.store.files import write_atomically
from hamq.store.segment import StoreCorruptionError

log = logging.getLogger(__name__)

T = TypeVar("T")

MAGIC = b"HAMQCKPT"
VERSION = 1
_LAYOUT = struct.Struct(">8siqqqqq")
_CRC = struct.Struct(">I")
SIZE = _LAYOUT.size + _CRC.size


@attrs.frozen
class Checkpoint:
    commitlog_flushed_offset: int = 0
    dispatched_offset: int = 0
    physic_msg_timestamp: int = 0
    logics_msg_timestamp: int = 0
    confirm_offset: int = 0

    def encode(self) -> bytes:
        body = _LAYOUT.pack(
            MAGIC,
            VERSION,
            self.commitlog_flushed_offset,
            self.dispatched_offset,
            self.physic_msg_timestamp,
            self.logics_msg_timestamp,
            self.confirm_offset,
        )
        return body + _CRC.pack(zlib.crc32(body))

    @classmethod
    def decode(cls, data: bytes, *, source: str = "checkpoint") -> Checkpoint:
        if len(data) != SIZE:
            raise StoreCorruptionError(f"{source} has {len(data)} bytes, expected {SIZE}")
        body = data[: _LAYOUT.size]
        (crc,) = _CRC.unpack_from(data, _LAYOUT.size)
        if zlib.crc32(body) != crc:
            raise StoreCorruptionError(f"{source}: CRC mismatch, the file is damaged")
        magic, version, *offsets = _LAYOUT.unpack(body)
        if magic != MAGIC:
            raise StoreCorruptionError(f"{source} is not a hamq checkpoint (magic {magic!r})")
        if version != VERSION:
            raise StoreCorruptionError(f"{source} has format version {version}, expected 1")
        return cls(*offsets)


def load_checkpoint(path: Path) -> Checkpoint | None:
    """The saved checkpoint, or None when there is none yet."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    return Checkpoint.decode(data, source=str(path))


def save_checkpoint(path: Path, checkpoint: Checkpoint) -> None:
    """Blocking (fsyncs): run it in a worker thread."""
    write_atomically(path, checkpoint.encode())


# ---------------------------------------------------------------- metadata files with a backup


class MetadataFileError(StoreCorruptionError):
    """A metadata file does not decode and has no usable backup; the text names both."""


def backup_path(path: Path) -> Path:
    return path.with_name(f"{path.name}.bak")


def _unused(path: Path) -> Path:
    candidate, n = path, 0
    while candidate.exists():
        n += 1
        candidate = path.with_name(f"{path.name}.{n}")
    return candidate


def _keep_backup(path: Path) -> None:
    """Make the current ``path`` its backup: a hard link (the same inode, already on
    disk) renamed over ``<name>.bak``; a durable copy where links do not work."""
    backup = backup_path(path)
    link = path.with_name(f".{path.name}.bak.{secrets.token_hex(4)}.tmp")
    try:
        os.link(path, link)
    except FileNotFoundError:
        return  # nothing to keep
    except OSError:
        write_atomically(backup, path.read_bytes())
        return
    try:
        os.replace(link, backup)
    except BaseException:
        link.unlink(missing_ok=True)
        raise


def save_with_backup(path: Path, data: bytes) -> None:
    """Replace ``path`` atomically with ``data``, its previous content kept as
    ``<name>.bak``. Blocking (fsyncs): run it in a worker thread. A failure half-way
    leaves the old file under its name (and possibly as the backup too)."""
    _keep_backup(path)
    write_atomically(path, data)  # (its directory fsync covers the backup's rename too)


def _decoded(path: Path, decode: Callable[[bytes], T]) -> tuple[T | None, bytes, str | None]:
    """(value, bytes, None) or (None, bytes, what is wrong); FileNotFoundError passes."""
    data = path.read_bytes()
    if not data.strip():
        return None, data, "the file is empty"
    try:
        return decode(data), data, None
    except ValueError as exc:
        return None, data, str(exc)


def load_with_backup(path: Path, decode: Callable[[bytes], T]) -> T | None:
    """The value in ``path`` (``decode`` raises ValueError for content it refuses), or
    in its backup if ``path`` is damaged or missing; None if neither exists. Blocking.

    A damaged file is logged in one line, moved to ``<name>.damaged`` and replaced by
    the backup; MetadataFileError (nothing moved) if there is no usable backup."""
    backup = backup_path(path)
    try:
        value, _data, problem = _decoded(path, decode)
    except FileNotFoundError:
        if not backup.exists():
            return None
        problem = None
    else:
        if problem is None:
            return value
        log.error("%s is damaged: %s", path, problem)
    try:
        saved, data, backup_problem = _decoded(backup, decode)
    except FileNotFoundError:
        backup_problem = "there is none"
    if backup_problem is not None:
        if problem is None:  # the file is missing, its backup damaged: start without
            log.error(
                "%s is missing and its backup %s is damaged: %s", path, backup, backup_problem
            )
            return None
        raise MetadataFileError(
            f"{path} is damaged ({problem}) and its backup {backup} cannot be used "
            f"({backup_problem}); repair or remove the file"
        )
    if problem is None:
        log.warning("%s is missing: using its backup %s", path, backup)
    else:
        kept = _unused(path.with_name(f"{path.name}.damaged"))
        os.replace(path, kept)
        log.warning(
            "using the previous copy %s for %s; the damaged file is kept as %s", backup, path, kept
        )
    write_atomically(path, data)  # (its directory fsync covers the move aside too)
    return saved
