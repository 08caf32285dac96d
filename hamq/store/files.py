"""Durable small files: atomic replacement, directory fsync, the store's lock file.

``write_atomically`` is how every metadata file of hamq is written (checkpoint, delay
offsets, the broker's topic/offset/subscription tables): write a temporary file in the
same directory, fsync it, rename it over the old one, fsync the directory. A reader —
or a restart after a crash — sees the old content or the new, never a mix.
All of it blocks: callers on the event loop use a worker thread.
"""

from __future__ import annotations

import fcntl
import os
import tempfile
from pathlib import Path


def fsync_directory(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomically(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        os.replace(name, path)
    except BaseException:
        Path(name).unlink(missing_ok=True)
        raise
    fsync_directory(path.parent)


class DirectoryLock:
    """An exclusive ``flock`` on ``<directory>/lock``: one process per store directory."""

    def __init__(self, directory: Path) -> None:
        self.path = directory / "lock"
        self._fd = -1

    def acquire(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise RuntimeError(
                f"store directory {self.path.parent} is in use by another process"
            ) from None
        self._fd = fd

    def release(self) -> None:
        if self._fd >= 0:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = -1
