"""Real processes for fault tests: start on loopback, learn the port, kill by PID.

Every wait is bounded, and ``running`` always kills its process, whatever happens.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path

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


HAMQ = [sys.executable, "-m", "cli.main", "--log-level", "warning"]


@asynccontextmanager
async def hamq_server(
    *args: str, ready_timeout_s: float = 30
) -> AsyncIterator[tuple[trio.Process, str]]:
    """Run ``hamq <args>`` (a broker or nameserver) until its ``hamq ... ready:`` line;
    yields (process, that line). The process is killed by PID at the end."""
    proc = await trio.lowlevel.open_process([*HAMQ, *args], stdout=subprocess.PIPE)
    try:
        assert proc.stdout is not None
        line = b""
        with trio.fail_after(ready_timeout_s):
            while b" ready: " not in line or not line.endswith(b"\n"):
                chunk = await proc.stdout.receive_some(1)
                if not chunk:
                    raise RuntimeError(f"hamq {' '.join(args)} exited before it was ready")
                line = b"" if line.endswith(b"\n") else line
                line += chunk
        yield proc, line.decode().strip()
    finally:
        with trio.CancelScope(shield=True):
            if proc.returncode is None:
                os.kill(proc.pid, signal.SIGKILL)
            with trio.move_on_after(10):
                await proc.wait()
            if proc.stdout is not None:
                await proc.stdout.aclose()


async def hamq_command(*args: str, timeout_s: float = 60) -> subprocess.CompletedProcess[bytes]:
    """Run ``hamq <args>`` to the end (bounded); its output captured."""
    with trio.fail_after(timeout_s):
        return await trio.run_process(
            [*HAMQ, *args], capture_stdout=True, capture_stderr=True, check=False
        )


async def stop(proc: trio.Process, sig: int = signal.SIGTERM, timeout_s: float = 20) -> int:
    """Signal ``proc`` and wait (bounded) for it to exit; its return code."""
    os.kill(proc.pid, sig)
    with trio.fail_after(timeout_s):
        return await proc.wait()


@contextmanager
def broker_process(
    store_dir: Path, config_toml: str = "", store_toml: str = ""
) -> Iterator[tuple[str, str]]:
    """A ``hamq broker`` process with small store files (plus ``config_toml``, top-level
    keys, and ``store_toml``, [store] keys) and its embedded nameserver, both on free
    ports, for a whole test module.
    Yields (broker address, nameserver address); killed by PID at the end."""
    from tests.broker_support import SMALL_STORE

    config = store_dir / "broker.toml"
    store = "".join(f"{k} = {v}\n" for k, v in SMALL_STORE.items())
    config.write_text(
        f"{config_toml}\n[store]\nstore_dir = '{store_dir / 'store'}'\n{store}{store_toml}\n"
    )
    args = ["broker", "-c", str(config), "--port", "0", "--namesrv-port", "0"]
    proc = subprocess.Popen([*HAMQ, *args], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()  # the ready line (the process exits if it cannot start)
        match = re.search(r"at (\S+), nameserver (\S+) ", line)
        assert match, f"no ready line from the broker: {line!r}"
        yield match.group(1), match.group(2)
    finally:
        proc.kill()
        proc.wait(timeout=10)


def toml_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, list | tuple):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    return '"' + str(value).replace("\\", "\\\\").replace('"', '\\"') + '"'


def write_toml(path: Path, values: dict[str, object]) -> Path:
    """A TOML file of top-level keys and one level of tables (``store``, ``ha``)."""
    top = [f"{k} = {toml_value(v)}" for k, v in values.items() if not isinstance(v, dict)]
    tables = [
        f"\n[{name}]\n" + "\n".join(f"{k} = {toml_value(v)}" for k, v in table.items())
        for name, table in values.items()
        if isinstance(table, dict)
    ]
    path.write_text("\n".join(top) + "\n" + "\n".join(tables) + "\n")
    return path


def free_ports(count: int) -> list[int]:
    """``count`` distinct ports free right now (the sockets are closed on return)."""
    with contextlib.ExitStack() as stack:
        ports = []
        for _ in range(count):
            sock = stack.enter_context(socket.socket())
            sock.bind(("127.0.0.1", 0))
            ports.append(sock.getsockname()[1])
        return ports
