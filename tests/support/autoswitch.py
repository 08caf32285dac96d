"""An automatic-failover cluster of real ``hamq`` processes on loopback, for tests and
benchmarks/failover.py: 3 nameservers embedding the controllers (Raft between them)
and one group of brokers in controller mode, on ports chosen free at run time.

Every process can be killed (SIGKILL, by PID) and started again on the same ports and
store; every wait is bounded; ``autoswitch_cluster`` kills whatever is left at the end.
Each process's stderr (its log) goes to a file under the cluster's directory. All of it
is on AnyIO (AnyIO processes, task groups; the remoting client is AnyIO's too): the
tests drive the cluster from Trio or from asyncio.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import attrs
from anyio.abc import Process

from hamq.protocol import RemotingCommand, RequestCode
from hamq.remoting import RemotingClient, RemotingError
from tests.support.brokers import SMALL_STORE
from tests.support.processes import (
    HAMQ,
    free_ports,
    hamq_command,
    kill_and_reap,
    open_child,
    read_ready_line,
    write_toml,
)
from tests.support.timing import wait_for

READY_S = 30
#: the logs say what happened (elections, role changes, truncations)
HAMQ_INFO = [*HAMQ[:-1], "info"]


@attrs.define
class Server:
    name: str
    args: list[str]
    log_path: Path
    address: str
    proc: Process | None = None
    starts: int = 0
    #: what runs the command (tests/support/netns.py: ``ip netns exec`` a host)
    prefix: list[str] = attrs.field(factory=list)
    #: the environment of the next start (None: this process's)
    env: dict[str, str] | None = None
    #: where a broker serves its metrics (``autoswitch_cluster(metrics=True)``)
    metrics_port: int | None = None
    #: where a broker serves gRPC (``autoswitch_cluster(grpc=True)``)
    grpc_port: int | None = None

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.returncode is None

    async def start(self) -> None:
        self.starts += 1
        with self.log_path.open("ab") as log:
            log.write(f"---- start {self.starts}\n".encode())
            log.flush()
            proc = await open_child(
                [*self.prefix, *HAMQ_INFO, *self.args], stderr=log, env=self.env
            )
        self.proc = proc
        await read_ready_line(proc, f"{self.name} (log: {self.log_path})", READY_S)

    def send_signal(self, sig: int) -> None:
        assert self.proc is not None and self.proc.returncode is None, f"{self.name} is down"
        os.kill(self.proc.pid, sig)

    async def kill(self, sig: int = signal.SIGKILL) -> None:
        """``sig`` by PID, then wait (bounded) for the exit; SIGKILLed and reaped
        whatever happens (a ``sig`` that did not end it in time, a cancellation)."""
        proc = self.proc
        if proc is None:
            return
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):  # (ended meanwhile)
                os.kill(proc.pid, sig)
        try:
            with anyio.fail_after(30):
                await proc.wait()
        finally:
            await kill_and_reap(proc)
            self.proc = None

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


@attrs.define
class AutoswitchCluster:
    root: Path
    nameservers: list[Server]
    brokers: list[Server]
    broker_stores: list[Path]

    @property
    def namesrv(self) -> str:
        return ";".join(s.address for s in self.nameservers)

    async def ask(self, code: RequestCode, body: bytes = b"") -> RemotingCommand:
        """A controller request to the first running nameserver that answers it."""
        problems = []
        async with RemotingClient() as client:
            for server in self.nameservers:
                if not server.running:
                    continue
                try:
                    return await client.invoke(
                        server.address, RemotingCommand.request(code, body=body), 5
                    )
                except RemotingError as exc:
                    problems.append(f"{server.address}: {exc}")
        raise RuntimeError(f"no controller answered: {problems}")

    async def group_state(self) -> dict[str, Any]:
        response = await self.ask(RequestCode.CONTROLLER_GET_SYNC_STATE_DATA)
        table: dict[str, Any] = json.loads(response.body)["replicasInfoTable"]
        return table.get("broker-a", {})

    def broker_stored(self, offset_msg_id: str) -> Server | None:
        """The broker whose store a send's offset message id names (§6.4: IPv4 + port)."""
        port = int(offset_msg_id[8:16], 16)
        return self.broker_at(f"127.0.0.1:{port}")

    def broker_at(self, address: str | None) -> Server | None:
        return next((b for b in self.brokers if b.address == address), None)

    async def master(self) -> Server | None:
        state = await self.group_state()
        return self.broker_at(state.get("masterAddress")) if state else None

    async def wait_until(self, what: str, check: Any, timeout_s: float = 30) -> Any:
        """Poll ``await check()`` until it is truthy (bounded); its value. A check that
        finds no controller answering (a nameserver is down) counts as not yet."""

        async def tolerant() -> Any:
            try:
                return await check()
            except (RuntimeError, RemotingError):
                return None

        return await wait_for(tolerant, timeout_s, every_s=0.05, what=what)

    async def wait_in_sync(self, members: int, timeout_s: float = 30) -> dict[str, Any]:
        """Until the group has a master and ``members`` brokers in its SyncStateSet."""

        async def check() -> dict[str, Any] | None:
            state = await self.group_state()
            if state.get("masterAddress") and len(state.get("inSyncReplicas", [])) >= members:
                return state
            return None

        result: dict[str, Any] = await self.wait_until(
            f"{members} brokers in sync", check, timeout_s
        )
        return result

    async def leader_nameserver(self) -> Server:
        response = await self.ask(RequestCode.CONTROLLER_GET_METADATA_INFO)
        leader = json.loads(response.body)["leader"]
        for server in self.nameservers:
            raft = server.args[server.args.index("--raft-address") + 1]
            if raft == leader:
                return server
        raise RuntimeError(f"no nameserver runs the Raft leader {leader}")


async def hamq_admin(*args: str) -> tuple[int, str, str]:
    """``hamq admin <args>`` to the end (bounded): (exit code, stdout, stderr)."""
    done = await hamq_command("admin", *args, timeout_s=30)
    return done.returncode, done.stdout.decode(), done.stderr.decode()


async def sync_state(controller: str) -> dict[str, Any]:
    """``hamq admin sync-state-set --json``'s replicasInfoTable: group -> its entry."""
    code, out, err = await hamq_admin("sync-state-set", "--controller", controller, "--json")
    assert code == 0, err
    table: dict[str, Any] = json.loads(out)["replicasInfoTable"]
    return table


async def sync_state_when(
    controller: str, group: str, until: Callable[[dict[str, Any]], bool], timeout_s: float = 60
) -> dict[str, Any]:
    """``group``'s entry of ``sync_state`` once ``until(entry)`` holds (polled, bounded);
    the last entry seen is in the failure."""
    seen: dict[str, Any] = {}

    async def wanted() -> dict[str, Any] | None:
        nonlocal seen
        seen = (await sync_state(controller)).get(group, {})
        return seen if seen and until(seen) else None

    entry: dict[str, Any] = await wait_for(
        wanted, timeout_s, every_s=0.3, what=lambda: f"{group}'s entry as wanted; last: {seen}"
    )
    return entry


def controller_server(
    name: str,
    root: Path,
    *,
    host: str,
    port: int,
    raft_port: int,
    peers: str,
    secret: Path,
    prefix: list[str] | None = None,
) -> Server:
    """``hamq nameserver --controller`` at ``host:port`` (Raft on ``raft_port``, with
    ``peers``, the shared ``secret``'s file), its data and log under ``root``."""
    args = [
        "nameserver", "--host", host, "--port", str(port), "--controller",
        "--raft-address", f"{host}:{raft_port}", "--raft-peers", peers,
        "--raft-secret-file", str(secret), "--controller-dir", str(root / f"{name}-data"),
    ]  # fmt: skip
    return Server(name, args, root / f"{name}.log", f"{host}:{port}", prefix=prefix or [])


def controller_mode_broker(
    name: str,
    root: Path,
    *,
    host: str,
    port: int,
    ha_port: int,
    controllers: list[str],
    store: Path,
    group: str = "broker-a",
    settings: dict[str, Any] | None = None,
    prefix: list[str] | None = None,
) -> Server:
    """A controller-mode broker of ``group`` at ``host:port`` (``settings`` on top of its
    configuration, small store files), its configuration and log under ``root``."""
    config = write_toml(
        root / f"{name}.toml",
        {
            "broker_name": group,
            "listen_host": host,
            "listen_port": port,
            "ha_listen_port": ha_port,
            "namesrv_addrs": controllers,
            "enable_controller_mode": True,
            "controller_addrs": controllers,
            **(settings or {}),
            "store": {"store_dir": str(store), **SMALL_STORE},
        },
    )
    return Server(
        name,
        ["broker", "-c", str(config)],
        root / f"{name}.log",
        f"{host}:{port}",
        prefix=prefix or [],
    )


@asynccontextmanager
async def autoswitch_cluster(
    root: Path,
    *,
    brokers: int = 3,
    broker_config: dict[str, Any] | None = None,
    metrics: bool = False,
    grpc: bool = False,
) -> AsyncIterator[AutoswitchCluster]:
    """3 controllers (nameservers) and ``brokers`` controller-mode brokers of broker-a,
    each broker with ``broker_config`` and, with ``metrics``, a metrics port of its own
    (``Server.metrics_port``), with ``grpc`` a gRPC port (``Server.grpc_port``)."""
    await anyio.Path(root).mkdir(parents=True, exist_ok=True)
    extra = (1 if metrics else 0) + (1 if grpc else 0)
    ports = free_ports(6 + (2 + extra) * brokers)
    ns_ports, raft_ports = ports[:3], ports[3:6]
    broker_ports = ports[6 : 6 + 2 * brokers]
    more = ports[6 + 2 * brokers :]
    metrics_ports = more[:brokers] if metrics else []
    grpc_ports = more[-brokers:] if grpc else []
    peers = ";".join(f"127.0.0.1:{p}" for p in raft_ports)
    secret = root / "raft.secret"
    await anyio.Path(secret).write_text("autoswitch-test-secret\n")
    nameservers = [
        controller_server(
            f"nameserver-{i}",
            root,
            host="127.0.0.1",
            port=ns_ports[i],
            raft_port=raft_ports[i],
            peers=peers,
            secret=secret,
        )
        for i in range(3)
    ]
    addrs = [s.address for s in nameservers]
    stores = [root / f"broker-{i}" for i in range(brokers)]
    servers = [
        controller_mode_broker(
            f"broker-{i}",
            root,
            host="127.0.0.1",
            port=broker_ports[2 * i],
            ha_port=broker_ports[2 * i + 1],
            controllers=addrs,
            store=stores[i],
            settings={
                **(broker_config or {}),
                **({"metrics_port": metrics_ports[i]} if metrics else {}),
                **({"grpc_port": grpc_ports[i]} if grpc else {}),
            },
        )
        for i in range(brokers)
    ]
    for server, port in zip(servers, metrics_ports, strict=False):
        server.metrics_port = port
    for server, port in zip(servers, grpc_ports, strict=False):
        server.grpc_port = port
    cluster = AutoswitchCluster(root, nameservers, servers, stores)
    try:
        async with anyio.create_task_group() as group:
            for server in nameservers:
                group.start_soon(server.start)
        async with anyio.create_task_group() as group:
            for server in servers:
                group.start_soon(server.start)
        yield cluster
    finally:
        with anyio.CancelScope(shield=True):
            for server in [*servers, *nameservers]:
                if server.running:
                    server.send_signal(signal.SIGCONT)  # (a test may have stopped it)
                with contextlib.suppress(Exception):
                    await server.kill()
