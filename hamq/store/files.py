"""Durable small files: atomic replacement, directory fsync, the store's lock file;
and the process's open-files limit.

``write_atomically`` is how every metadata file of hamq is written (checkpoint, delay
offsets, the broker's topic/offset/subscription tables): write a temporary file in the
same directory, fsync it, rename it over the old one, fsync the directory. A reader —
or a restart after a crash — sees the old content or the new, never a mix.
All of it blocks: callers on the event loop use a worker thread.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import resource
import tempfile
from pathlib import Path

log = logging.getLogger(__name__)

#: what RocketMQ's deployment guide asks ``ulimit -n`` to be
RECOMMENDED_OPEN_FILES = 655_350
#: below this many open files a broker with many topics and clients is at risk (warned)
LOW_OPEN_FILES = 4096


def fsync_directory(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def sync_file_data(path: Path) -> None:
    """fdatasync ``path`` through a descriptor opened for the call (store files keep
    none open). Blocking: run it in a worker thread. Writeback errors not yet reported
    are reported to a new descriptor too (Linux's errseq)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fdatasync(fd)
    finally:
        os.close(fd)


def open_files_limit() -> int:
    """This process's soft limit of open files."""
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def raise_open_files_limit() -> int:
    """Raise this process's soft limit of open files to its hard limit (a broker holds
    connections, and maps many files), log what it is, warn when it is low; returns
    the soft limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else max(soft, RECOMMENDED_OPEN_FILES)
    advice = f"RocketMQ's deployment guide asks for {RECOMMENDED_OPEN_FILES}"
    if target > soft:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (ValueError, OSError) as exc:
            log.warning("cannot raise the open files limit from %d to %d: %s", soft, target, exc)
        else:
            log.info(
                "open files limit raised from %d to %d (the hard limit); %s", soft, target, advice
            )
            soft = target
    else:
        log.info("open files limit %d (the hard limit); %s", soft, advice)
    if soft < LOW_OPEN_FILES:
        log.warning(
            "the open files limit is only %d: many topics, queues or clients will exhaust "
            "it; %s (ulimit -n, or LimitNOFILE in a systemd unit)",
            soft,
            advice,
        )
    return soft


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


class DirectoryInUseError(Exception):
    """Another process (or another lock in this one) holds the directory: ``pid`` is
    the holder's process id as it wrote it in the lock file, None if unreadable."""

    def __init__(self, directory: Path, pid: int | None) -> None:
        self.directory = directory
        self.pid = pid
        holder = f"process {pid}" if pid is not None else "another process"
        super().__init__(f"{directory} is in use by {holder}")


class DirectoryLock:
    """An exclusive ``flock`` on ``<directory>/lock``: one process per store directory.

    The holder writes its PID (decimal, then a newline) into the file once it has the
    lock, and empties it when it lets go; the PID only names the holder in the error
    of whoever is refused (the lock itself is the flock, which the kernel drops when
    the holder dies)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.path = directory / "lock"
        self._fd = -1

    def acquire(self) -> None:
        """Take the lock; DirectoryInUseError (nothing held, nothing written) if another
        open holds it, OSError if the file cannot be opened."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            try:
                holder = _read_pid(fd)
            finally:
                os.close(fd)
            raise DirectoryInUseError(self.directory, holder) from None
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        except OSError:
            os.close(fd)  # (closing drops the flock too)
            raise
        self._fd = fd

    def release(self) -> None:
        if self._fd >= 0:
            with contextlib.suppress(OSError):  # (else a stale PID stays; the flock rules)
                os.ftruncate(self._fd, 0)
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = -1


def _read_pid(fd: int) -> int | None:
    """The PID a lock file names; None if it holds none (yet): the holder may be
    between taking the lock and writing it."""
    try:
        text = os.pread(fd, 32, 0).decode("ascii").strip()
    except (OSError, UnicodeDecodeError):
        return None
    return int(text) if text.isdigit() else None
