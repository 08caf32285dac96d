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
"""

from __future__ import annotations

import struct
import zlib
from pathlib import Path

import attrs

from hamq.store.files import write_atomically
from hamq.store.segment import StoreCorruptionError

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
