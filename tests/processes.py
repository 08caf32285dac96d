"""Real processes for fault tests: start on loopback, learn the port, kill by PID.

Every wait is bounded, and ``running`` always kills its process, whatever happens.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import trio


@asynccontextmanager
async def running(code: str, *, ready_timeout_s: float = 30) -> AsyncIterator[tuple[int, int]]:
    """Run ``python -c code``; it must print its port on the first line. Yields (pid, port)."""
    proc = await trio.lowlevel.open_process([sys.executable, "-c", code], stdout=subprocess.PIPE)
    try:
        assert proc.stdout is not None
        line = b""
        with trio.fail_after(ready_timeout_s):
            while not line.endswith(b"\n"):
                chunk = await proc.stdout.receive_some(1)
                if not chunk:
                    raise RuntimeError(f"process exited before printing its port: {code!r}")
                line += chunk
        yield proc.pid, int(line)
    finally:
        with trio.CancelScope(shield=True):
            if proc.returncode is None:
                os.kill(proc.pid, signal.SIGKILL)
            with trio.move_on_after(10):
                await proc.wait()
            if proc.stdout is not None:
                await proc.stdout.aclose()
