"""RocketMQ's official Python 5.x client for tests: its virtualenv, and its driver.

The client (PyPI ``rocketmq-python-client``, gRPC over grpcio) installs a top-level
``rocketmq`` package, as the 4.x client in .venv does, so it gets a virtualenv of its
own: ``.venv-rmq5`` at the repository's root, made from the package index on first use
(``ensure_venv``; a file lock keeps two pytest-xdist workers from making it at once; a
stamp names the pinned version, so a change of pin reinstalls). The driver
(rocketmq5_driver.py) runs there, one process per client, and reports as JSON lines.
"""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
from anyio.abc import Process

from tests.support.processes import ROOT, kill_and_reap, open_child

PIN = "rocketmq-python-client==5.1.2"
VENV = ROOT / ".venv-rmq5"
DRIVER = Path(__file__).with_name("rocketmq5_driver.py")
#: how long making the virtualenv may take (grpcio and protobuf wheels from the index)
INSTALL_TIMEOUT_S = 600


def ensure_venv() -> Path:
    """The virtualenv's python, made (or remade for a new pin) if needed."""
    python = VENV / "bin" / "python"
    stamp = VENV / ".installed"
    with open(ROOT / ".venv-rmq5.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if stamp.exists() and stamp.read_text() == PIN and python.exists():
            return python
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(VENV)], check=True)
        subprocess.run(
            [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", PIN],
            check=True,
            timeout=INSTALL_TIMEOUT_S,
        )
        stamp.write_text(PIN)
    return python


def _env() -> dict[str, str]:
    # the client logs to ~/logs/rocketmq_python; keep each run's under the test's HOME
    return {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}


class Driver:
    """A running driver: its records as they come."""

    def __init__(self, proc: Process) -> None:
        self.proc = proc
        self.records: list[dict[str, Any]] = []
        self._buffer = b""

    async def next(self) -> dict[str, Any] | None:
        """The next record; None once the driver has exited."""
        assert self.proc.stdout is not None
        while b"\n" not in self._buffer:
            try:
                chunk = await self.proc.stdout.receive()
            except (anyio.EndOfStream, anyio.ClosedResourceError):
                return None
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        record: dict[str, Any] = json.loads(line)
        self.records.append(record)
        return record

    async def until(self, key: str, count: int = 1) -> list[dict[str, Any]]:
        """Read until ``count`` records with ``key`` came (or the driver ended)."""
        while sum(key in r for r in self.records) < count:
            if await self.next() is None:
                break
        return [r for r in self.records if key in r]

    async def finish(self) -> list[dict[str, Any]]:
        """Every record, once the driver has exited."""
        while await self.next() is not None:
            pass
        return self.records

    def all(self, key: str) -> list[Any]:
        return [r[key] for r in self.records if key in r]


@asynccontextmanager
async def driving(
    python: Path,
    command: str,
    *args: str,
    home: Path,
    stderr: Path | None = None,
    extra_env: dict[str, str] | None = None,
) -> AsyncIterator[Driver]:
    """The driver running ``command`` while the block runs; killed by PID at the end.
    ``home``: its HOME (the client's logs go to HOME/logs/rocketmq_python)."""
    env = {**_env(), "HOME": str(home), **(extra_env or {})}
    with open(stderr or os.devnull, "wb") as err:  # noqa: ASYNC230 (opening is instant)
        proc = await open_child([str(python), str(DRIVER), command, *args], stderr=err, env=env)
    try:
        yield Driver(proc)
    finally:
        await kill_and_reap(proc)


async def run_driver(
    python: Path,
    command: str,
    *args: str,
    home: Path,
    timeout_s: float = 120,
    extra_env: dict[str, str] | None = None,
) -> Driver:
    """Run the driver to its end (bounded); its records."""
    err = home / f"{command}.err"
    async with driving(python, command, *args, home=home, stderr=err, extra_env=extra_env) as run:
        with anyio.fail_after(timeout_s):
            await run.finish()
        return run
