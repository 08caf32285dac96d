"""One child of ``hamq cluster up``: a server process started, watched until it is
ready and until it ends, and signalled.

``spawn`` starts a command in a process group of its own (a terminal's Ctrl-C reaches
only ``up``, which stops the children in order), stdin /dev/null, stdout a pipe read
here, stderr the child's log, with PARENT_DEATH_SIGNAL (SIGTERM) set for the death of
the thread that forked it, always the main thread, so that children stop even when
``up`` is killed with SIGKILL. A Child is ready at its one ``hamq ... ready:`` line
(at most READY_TIMEOUT_S; the line names its address, and a broker's its
nameservers); its stderr goes to its log, and so does its stdout, ready line included,
copied by ``until_ready`` and ``until_exit``.
``open_log`` keeps a non-empty log of the last run as ``<...>.log.1`` (one
generation); a restart appends to the same log.

Invariants: a spawn that fails leaves nothing open; ``ChildProcess.aclose`` closes
only our ends (stdout, pidfd), never the process. Which children run, in what order,
and what happens when one ends is cli/supervisor.py's; what they run, cli/profiles.py's.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

import attrs
import trio

from cli.profiles import ChildSpec

#: how long a child may take to say it is ready
READY_TIMEOUT_S = 30.0
#: how long a SIGKILLed child is waited for (it cannot refuse; this only bounds a hang)
KILL_WAIT_S = 5.0
#: how much of a child's log an error shows
LOG_TAIL_LINES = 15
LOG_TAIL_BYTES = 16 * 1024
#: what each child gets when ``up`` ends, however it ends (SIGTERM: a clean stop)
PARENT_DEATH_SIGNAL = signal.SIGTERM
#: how often a child's end is polled where Linux has no pidfd_open
EXIT_POLL_S = 0.05


def open_log(path: Path) -> BinaryIO:
    """``path``, empty, opened for appending (the child's stderr and our copies of its
    stdout never overwrite each other). A non-empty log of an earlier run becomes
    ``<name>.1``, replacing the one before. Raises OSError; a failed rename leaves both
    files as they were."""
    with contextlib.suppress(FileNotFoundError):
        if path.stat().st_size > 0:
            os.replace(path, path.with_name(f"{path.name}.1"))
    return path.open("ab")


_PR_SET_PDEATHSIG = 1


def _parent_death_hook() -> Callable[[], None] | None:
    """A ``preexec_fn`` asking the kernel to send PARENT_DEATH_SIGNAL to the child when
    the thread that forks it ends; None where there is no prctl (not Linux)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    parent = os.getpid()
    death_signal = int(PARENT_DEATH_SIGNAL)

    def hook() -> None:  # in the child, between fork and exec
        if prctl(_PR_SET_PDEATHSIG, death_signal, 0, 0, 0) != 0 or os.getppid() != parent:
            os._exit(127)  # no signal set, or ``up`` is gone already: do not run orphaned

    return hook


class ChildProcess:
    """A child started by ``spawn``: its pid, its stdout as a Trio stream, and waits that
    keep the run loop going (on a pidfd where Linux has them, else polling)."""

    def __init__(self, popen: subprocess.Popen[bytes], stdout: trio.lowlevel.FdStream) -> None:
        self._popen = popen
        self.pid = popen.pid
        self.stdout = stdout
        self._wait_lock = trio.Lock()
        self._pidfd: int | None
        try:
            self._pidfd = os.pidfd_open(popen.pid)
        except (AttributeError, OSError):
            self._pidfd = None

    @property
    def returncode(self) -> int | None:
        """None while it runs, else its exit code (-N: killed by signal N); reaps it."""
        return self._popen.poll()

    async def wait(self) -> int:
        """Until it has ended; its return code."""
        async with self._wait_lock:
            while (code := self._popen.poll()) is None:
                if self._pidfd is None:
                    await trio.sleep(EXIT_POLL_S)
                    continue
                try:
                    await trio.lowlevel.wait_readable(self._pidfd)
                except trio.ClosedResourceError:  # (aclose meanwhile: poll instead)
                    pass
        return code

    def send_signal(self, sig: int) -> None:
        """``sig`` to the child, unless it has ended (and been reaped) already."""
        self._popen.send_signal(sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    async def aclose(self) -> None:
        """Close our ends of it (its stdout, the pidfd); the process itself is left alone.
        Idempotent."""
        if self._pidfd is not None:
            pidfd, self._pidfd = self._pidfd, None
            trio.lowlevel.notify_closing(pidfd)
            os.close(pidfd)
        await self.stdout.aclose()


def spawn(command: list[str], log: BinaryIO) -> ChildProcess:
    """Start ``command`` in a process group of its own (a terminal's Ctrl-C is for ``up``)
    with stdin /dev/null, stdout a pipe we read, stderr ``log``, and a parent-death signal.

    It forks from the main thread and blocks it for the fork and exec (milliseconds):
    the kernel sends the parent-death signal when the *thread* that forked the child
    ends, so a fork from a worker thread (``trio.lowlevel.open_process`` forks in one,
    and idle ones end after 10 s) would stop the children long before ``up`` ends.
    Raises RuntimeError off the main thread, OSError if the command cannot start;
    nothing is left open then."""
    if threading.current_thread() is not threading.main_thread():
        raise RuntimeError("spawn() forks from the main thread only")
    read_fd, write_fd = os.pipe()
    try:
        popen = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=write_fd,
            stderr=log,
            process_group=0,
            preexec_fn=_parent_death_hook(),
        )
    except BaseException:
        os.close(read_fd)
        raise
    finally:
        os.close(write_fd)
    return ChildProcess(popen, trio.lowlevel.FdStream(read_fd))


@attrs.define(eq=False)
class Child:
    """One child as ``up`` keeps it: what it runs, its current process and log, what its
    ready line said, and (for the supervisor) its restarts and how it ended."""

    spec: ChildSpec
    #: the current process (a restart replaces it)
    process: ChildProcess
    log_path: Path
    #: the parent's handle on the log (the child writes its stderr through its own)
    log: BinaryIO
    address: str = "-"
    #: the nameservers a broker's ready line names
    namesrvs: list[str] = attrs.Factory(list)
    #: trio.current_time() when the current process was ready; None before
    ready_at: float | None = None
    #: how many times it was started again
    restarts: int = 0
    #: how it ended, for the stop report
    outcome: str = ""

    @property
    def title(self) -> str:
        return f"{self.spec.name} ({self.spec.kind.value}, pid {self.process.pid})"

    def write_log(self, data: bytes | bytearray) -> None:
        if data and not self.log.closed:
            self.log.write(data)
            self.log.flush()

    async def until_ready(self) -> str | None:
        """Wait (at most READY_TIMEOUT_S) for the ready line; None once it is ready
        (``ready_at``, ``address``, ``namesrvs`` set), else what went wrong (a late
        child is still running)."""
        try:
            with trio.fail_after(READY_TIMEOUT_S):
                line = await self._ready_line()
        except trio.TooSlowError:
            return f"was not ready after {READY_TIMEOUT_S:.0f} s"
        if line is None:
            with trio.move_on_after(KILL_WAIT_S):
                await self.process.wait()
            code = self.process.returncode
            how = describe_exit(code) if code is not None else "its output closed"
            return f"ended before it was ready ({how})"
        self.ready_at = trio.current_time()
        match = _BROKER_READY.match(line) or _NAMESERVER_READY.match(line)
        if match:
            self.address = match.group(1).rstrip(",")
            if match.re is _BROKER_READY:
                self.namesrvs = [a.strip(",") for a in match.group(2).split(";") if a.strip(",")]
        return None

    async def _ready_line(self) -> str | None:
        """The ``hamq ... ready:`` line; None if stdout ends first. Other lines, and
        what follows the ready line in the same read, go to the log."""
        stream = self.process.stdout
        buffer = b""
        while True:
            chunk = await stream.receive_some(4096)
            if not chunk:
                self.write_log(buffer)
                return None
            buffer += chunk
            while b"\n" in buffer:
                raw, buffer = buffer.split(b"\n", 1)
                line = raw.decode(errors="replace").strip()
                if line.startswith("hamq ") and " ready: " in line:
                    self.write_log(raw + b"\n" + buffer)
                    return line
                self.write_log(raw + b"\n")

    async def until_exit(self) -> str:
        """Copy stdout to the log until the process ends; how it ended."""
        async for chunk in self.process.stdout:
            self.write_log(chunk)
        code = await self.process.wait()
        await self.process.aclose()
        return f"exited unexpectedly ({describe_exit(code)})"


def log_tail(path: Path, lines: int = LOG_TAIL_LINES) -> list[str]:
    try:
        with path.open("rb") as f:
            size = f.seek(0, 2)
            f.seek(max(0, size - LOG_TAIL_BYTES))
            data = f.read()
    except OSError as exc:
        return [f"(cannot read {path}: {exc.strerror or exc})"]
    return data.decode(errors="replace").splitlines()[-lines:]


def describe_exit(code: int) -> str:
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


_BROKER_READY = re.compile(r"^hamq broker ready: .* at (\S+), nameserver (\S+)")
_NAMESERVER_READY = re.compile(r"^hamq nameserver ready: (\S+)")
