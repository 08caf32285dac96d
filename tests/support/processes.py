"""Real processes for fault tests: start on loopback, learn the port, kill by PID.

Every wait is bounded, and ``running`` always kills its process, whatever happens.
The processes are AnyIO's (``anyio.abc.Process``): one implementation for the plain
Trio tests and for the client tests on every AnyIO backend (Trio, asyncio, uvloop).
"""

from __future__ import annotations

import contextlib
import os
import random
import re
import signal
import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import IO, Any

import anyio
from anyio.abc import Process

#: how long a killed process may take to be reaped
REAP_S = 10


async def open_child(
    args: list[str],
    *,
    stdout: int | IO[Any] = subprocess.PIPE,
    stderr: int | IO[Any] | None = None,
    **options: Any,
) -> Process:
    """``args`` as a child process: stdin nothing, stdout a pipe unless given, stderr
    inherited unless given (AnyIO's defaults are pipes, and a pipe nobody reads would
    block a chatty child). ``options``: ``anyio.open_process``'s (cwd, env)."""
    return await anyio.open_process(
        args, stdin=subprocess.DEVNULL, stdout=stdout, stderr=stderr, **options
    )


async def kill_and_reap(proc: Process) -> None:
    """For ``finally``: SIGKILL ``proc`` by PID unless it has ended, close our ends of
    its pipes and reap it (bounded). Shielded: it runs even in a cancelled scope."""
    with anyio.CancelScope(shield=True):
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):  # (ended meanwhile)
                os.kill(proc.pid, signal.SIGKILL)
        with anyio.move_on_after(REAP_S):
            await proc.aclose()  # (closes the pipes, then waits for the exit)


@asynccontextmanager
async def running(code: str, *, ready_timeout_s: float = 30) -> AsyncIterator[tuple[int, int]]:
    """Run ``python -c code``; it must print its port on the first line. Yields (pid, port)."""
    proc = await open_child([sys.executable, "-c", code])
    try:
        assert proc.stdout is not None
        line = b""
        with anyio.fail_after(ready_timeout_s):
            while not line.endswith(b"\n"):
                try:
                    line += await proc.stdout.receive(1)
                except anyio.EndOfStream:
                    raise RuntimeError(
                        f"process exited before printing its port: {code!r}"
                    ) from None
        yield proc.pid, int(line)
    finally:
        await kill_and_reap(proc)


HAMQ = [sys.executable, "-m", "cli.main", "--log-level", "warning"]


async def read_ready_line(proc: Process, what: str, timeout_s: float = 30) -> str:
    """Read ``proc``'s stdout, a byte at a time (nothing past it is taken), up to its
    ``hamq ... ready: ...`` line (bounded); that line. RuntimeError naming ``what`` if
    the process ends first."""
    assert proc.stdout is not None
    line = b""
    with anyio.fail_after(timeout_s):
        while b" ready: " not in line or not line.endswith(b"\n"):
            try:
                chunk = await proc.stdout.receive(1)
            except anyio.EndOfStream:
                raise RuntimeError(f"{what} exited before it was ready") from None
            line = b"" if line.endswith(b"\n") else line
            line += chunk
    return line.decode().strip()


#: a broker's ready line: ``hamq broker ready: ... at <address>, nameserver <address> ...``
BROKER_READY = re.compile(r"at (\S+), nameserver (\S+)")


def ready_addresses(line: str) -> tuple[str, str]:
    """(broker address, nameserver address) from a broker's ready line."""
    match = BROKER_READY.search(line)
    assert match, f"no broker ready line: {line!r}"
    return match.group(1).rstrip(","), match.group(2).rstrip(",")


@asynccontextmanager
async def hamq_server(
    *args: str, ready_timeout_s: float = 30
) -> AsyncIterator[tuple[Process, str]]:
    """Run ``hamq <args>`` (a broker or nameserver) until its ``hamq ... ready:`` line;
    yields (process, that line). The process is killed by PID at the end."""
    proc = await open_child([*HAMQ, *args])
    try:
        yield proc, await read_ready_line(proc, f"hamq {' '.join(args)}", ready_timeout_s)
    finally:
        await kill_and_reap(proc)


async def hamq_command(*args: str, timeout_s: float = 60) -> subprocess.CompletedProcess[bytes]:
    """Run ``hamq <args>`` to the end (bounded: killed when it runs longer); its output
    captured."""
    with anyio.fail_after(timeout_s):
        return await anyio.run_process([*HAMQ, *args], stdin=subprocess.DEVNULL, check=False)


async def stop(proc: Process, sig: int = signal.SIGTERM, timeout_s: float = 20) -> int:
    """Signal ``proc`` and wait (bounded) for it to exit; its return code."""
    os.kill(proc.pid, sig)
    with anyio.fail_after(timeout_s):
        return await proc.wait()


@contextmanager
def broker_process(
    store_dir: Path, config_toml: str = "", store_toml: str = ""
) -> Iterator[tuple[str, str]]:
    """A ``hamq broker`` process with small store files (plus ``config_toml``, top-level
    keys, and ``store_toml``, [store] keys) and its embedded nameserver, both on free
    ports, for a whole test module.
    Yields (broker address, nameserver address); killed by PID at the end."""
    from tests.support.brokers import SMALL_STORE

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
        yield ready_addresses(line)
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


#: where ``free_ports`` looks: below the kernel's ephemeral range, which it reads here
EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
FREE_PORTS_FROM = 20000


def _worker_slice(low: int, high: int) -> tuple[int, int]:
    """This pytest-xdist worker's share of ``range(low, high)`` (all of it outside
    xdist): workers never pick the same port, one between its check and its server's
    bind."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    try:
        count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
        index = int(worker.removeprefix("gw")) if worker else 0
    except ValueError:
        return low, high
    if count <= 1 or not 0 <= index < count:
        return low, high
    span = (high - low) // count
    return low + index * span, low + (index + 1) * span


def free_ports(count: int) -> list[int]:
    """``count`` distinct ports free right now (the sockets are closed on return), for
    servers started later. They are taken below the ephemeral range: a port bound to 0
    comes from that range, and any outgoing connection (of the cluster itself, of other
    tests) could take it as its local port before the server that is to listen there
    starts ("Address already in use", by chance); under pytest-xdist, from this
    worker's share of it."""
    try:
        below = int(EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        below = 0
    low, high = _worker_slice(FREE_PORTS_FROM, below)
    with contextlib.ExitStack() as stack:
        ports: list[int] = []
        while len(ports) < count:
            sock = stack.enter_context(socket.socket())
            if high - low < 100 * count:  # no room below: the kernel's choice
                sock.bind(("127.0.0.1", 0))
                ports.append(sock.getsockname()[1])
                continue
            port = random.randrange(low, high)
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            if port not in ports:
                ports.append(port)
        return ports


#: ``hamq`` at its default log level, as a user runs it (HAMQ asks for warnings only)
HAMQ_AS_RUN = [sys.executable, "-m", "cli.main"]
ROOT = Path(__file__).resolve().parents[2]


def user_env() -> dict[str, str]:
    """This environment without the HAMQ_* settings a user may not have."""
    return {k: v for k, v in os.environ.items() if not k.startswith("HAMQ_")}


@asynccontextmanager
async def hamq_process(
    *args: str, stdout: int | Path = subprocess.PIPE, stderr: Path | None = None
) -> AsyncIterator[Process]:
    """``hamq <args>`` at its default log level, running while the block runs; its
    stdout a pipe (``proc.stdout``), a file descriptor or a file, its stderr a file
    (so that much logging cannot block it). Killed by PID at the end."""
    with contextlib.ExitStack() as files:
        out: int | IO[bytes] = (
            files.enter_context(stdout.open("wb")) if isinstance(stdout, Path) else stdout
        )
        err = files.enter_context(stderr.open("wb")) if stderr is not None else None
        proc = await open_child(
            [*HAMQ_AS_RUN, *args], stdout=out, stderr=err, cwd=ROOT, env=user_env()
        )
    try:
        yield proc
    finally:
        await kill_and_reap(proc)


async def hamq_as_run(
    *args: str, timeout_s: float = 60, stdin: bytes | None = None
) -> subprocess.CompletedProcess[bytes]:
    """Run ``hamq <args>`` at its default log level to the end (bounded; killed if it
    runs longer); its output captured. ``stdin``: what its stdin holds (a pipe), else
    nothing (/dev/null)."""
    with anyio.fail_after(timeout_s):
        return await anyio.run_process(
            [*HAMQ_AS_RUN, *args],
            input=stdin,
            stdin=subprocess.DEVNULL if stdin is None else None,
            check=False,
            cwd=ROOT,
            env=user_env(),
        )


#: a port in a shipped profile (conf/): RocketMQ's 98xx and 109xx-style numbers and the
#: gRPC 808x, whole
_PROFILE_PORT = re.compile(r"(?<![\d.])(808\d|9[89]\d\d|1[01]\d\d\d)(?![\d.])")


def copy_profile(name: str, directory: Path, data_dir: Path) -> dict[int, int]:
    """conf/<name> copied into ``directory`` with ``./data/`` moved to ``data_dir`` and
    every port moved to a free one whose next port is free too (a broker's HA port is
    its listen port + 1); returns {shipped port: port used}."""
    shipped = sorted((ROOT / "conf" / name).glob("*.toml"))
    texts = {path.name: path.read_text() for path in shipped}
    old_ports = sorted({int(p) for text in texts.values() for p in _PROFILE_PORT.findall(text)})
    taken: set[int] = set()
    moved: dict[int, int] = {}
    for old in old_ports:
        after = moved.get(old - 1, -2) + 1  # (kept next to it when it was: an HA port)
        if after > 0 and after + 1 not in taken and _bindable(after + 1):
            new = after
        else:
            while True:
                (new,) = free_ports(1)
                if not {new, new + 1} & taken and _bindable(new + 1):
                    break
        taken |= {new, new + 1}
        moved[old] = new
    directory.mkdir(parents=True)
    for file_name, text in texts.items():
        text = text.replace("./data/", f"{data_dir}/")
        text = _PROFILE_PORT.sub(lambda m: str(moved[int(m.group(1))]), text)
        (directory / file_name).write_text(text)
    return moved


def _bindable(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True
