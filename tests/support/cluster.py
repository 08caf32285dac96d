"""``hamq cluster up`` as a child process: profiles written with free ports, and a
handle on the running ``up`` (its output, its children's PIDs).

``cluster_up`` kills every process ``up`` started (seen in /proc while it runs, or in
the table it prints) by PID at the end, whatever happens; every wait is bounded. On
AnyIO (``up`` an AnyIO process): for tests on any backend.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import attrs
from anyio.abc import Process

from tests.support.brokers import SMALL_STORE
from tests.support.processes import HAMQ, kill_and_reap, open_child, write_toml

READY_S = 30
STOP_S = 30


@attrs.frozen
class Ports:
    namesrv: int
    master: int
    master_ha: int
    slave: int


def write_profile(directory: Path, data: Path, ports: Ports) -> Path:
    """A nameserver, a SYNC_MASTER and its SLAVE (broker group ``broker-t``)."""
    directory.mkdir()
    ns = f"127.0.0.1:{ports.namesrv}"
    write_toml(directory / "cluster.toml", {"nameserver_ports": [ports.namesrv]})
    write_toml(
        directory / "master.toml",
        {
            "broker_name": "broker-t",
            "broker_id": 0,
            "listen_port": ports.master,
            "ha_listen_port": ports.master_ha,
            "namesrv_addrs": [ns],
            "store": {"store_dir": str(data / "master"), "role": "SYNC_MASTER", **SMALL_STORE},
        },
    )
    write_toml(
        directory / "slave.toml",
        {
            "broker_name": "broker-t",
            "broker_id": 1,
            "listen_port": ports.slave,
            "namesrv_addrs": [ns],
            "store": {"store_dir": str(data / "slave"), "role": "SLAVE", **SMALL_STORE},
        },
    )
    return directory


def child_pids(pid: int) -> set[int]:
    """The children of ``pid`` (any of its threads may have spawned them)."""
    found: set[int] = set()
    with contextlib.suppress(OSError):
        for task in Path(f"/proc/{pid}/task").iterdir():
            with contextlib.suppress(OSError):
                found |= {int(p) for p in (task / "children").read_text().split()}
    return found


def alive(pid: int) -> bool:
    """``pid`` runs (a zombie does not: once ``up`` is gone, nobody may reap its children)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


@attrs.define
class ClusterUp:
    proc: Process
    stderr: Path
    out: bytearray = attrs.Factory(bytearray)

    @property
    def text(self) -> str:
        return self.out.decode(errors="replace")

    async def read_until(self, pattern: str, timeout_s: float) -> re.Match[str]:
        """Read stdout until ``pattern`` matches a whole line (bounded)."""
        stream = self.proc.stdout
        assert stream is not None
        with anyio.fail_after(timeout_s):
            while True:
                match = re.search(pattern, self.text, re.MULTILINE)
                if match:
                    return match
                try:
                    chunk = await stream.receive(4096)
                except anyio.EndOfStream:
                    raise AssertionError(
                        f"cluster up ended before {pattern!r}:\n{self.text}\n"
                        + self.stderr.read_text()
                    ) from None
                self.out += chunk

    async def stderr_until(self, pattern: str, timeout_s: float) -> re.Match[str]:
        """Poll ``up``'s stderr (a file) until ``pattern`` matches a whole line (bounded)."""
        with anyio.fail_after(timeout_s):
            while True:
                match = re.search(pattern, self.stderr.read_text(), re.MULTILINE)
                if match:
                    return match
                await anyio.sleep(0.05)

    async def read_to_end(self, timeout_s: float) -> str:
        stream = self.proc.stdout
        assert stream is not None
        with anyio.fail_after(timeout_s):
            async for chunk in stream:
                self.out += chunk
        return self.text

    def table_pids(self) -> dict[str, int]:
        """name -> pid, from the rows of the table ``up`` printed."""
        rows = {}
        for line in self.text.splitlines():
            cells = [c.strip() for c in line.split("│")]
            if len(cells) == 8 and cells[6].isdigit():
                rows[cells[1]] = int(cells[6])
        return rows


@asynccontextmanager
async def cluster_up(profile: Path, log_dir: Path, *options: str) -> AsyncIterator[ClusterUp]:
    """``hamq cluster up --profile <profile> --log-dir <log_dir> <options>``; every process
    it started (seen in /proc while it runs, or in its table) is killed by PID at the end."""
    stderr_path = log_dir.parent / "cluster-up.stderr"
    command = [*HAMQ, "cluster", "up", "--profile", str(profile), "--log-dir", str(log_dir)]
    with stderr_path.open("wb") as stderr:
        proc = await open_child([*command, *options], stderr=stderr)
    up = ClusterUp(proc, stderr_path)
    spawned: set[int] = set()

    async def note_children() -> None:
        while True:
            spawned.update(child_pids(proc.pid))
            await anyio.sleep(0.05)

    try:
        async with anyio.create_task_group() as group:
            group.start_soon(note_children)
            yield up
            group.cancel_scope.cancel()
    finally:
        with anyio.CancelScope(shield=True):
            spawned |= child_pids(proc.pid) | set(up.table_pids().values())
            await kill_and_reap(proc)
            for pid in spawned:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)


async def wait_gone(pids: list[int], timeout_s: float = 5) -> list[int]:
    """The pids still alive after ``timeout_s`` (children of ``up`` are reaped by it)."""
    with anyio.move_on_after(timeout_s):
        while True:
            if not any(alive(pid) for pid in pids):
                break
            await anyio.sleep(0.05)
    return [pid for pid in pids if alive(pid)]
