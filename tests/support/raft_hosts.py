"""Controllers and brokers each on a host of their own (a network namespace, netns.py),
for tests and benchmarks of the controllers across partitions.

``controller_hosts`` starts 3 ``hamq nameserver --controller`` processes on hosts c0, c1,
c2 (each bound to its host's address: nameserver port 9876, Raft port 9877 — inside a
namespace every port is free), optionally ``brokers`` controller-mode brokers of group
``broker-a`` on hosts b0, b1, ..., and puts the calling thread on host ``t`` (the test's
own: its sockets reach the others across the bridge). Links are cut and healed with
``hosts.net``. Each process's log is a file under the root directory; every process is
killed by PID at the end and every namespace removed.

Call it from the thread that runs the event loop, which stays on host ``t`` until the end.
"""

from __future__ import annotations

import contextlib
import json
import signal
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import attrs

from hamq.protocol import RemotingCommand, RequestCode, ResponseCode
from hamq.protocol.headers import ApplyBrokerIdRequestHeader
from hamq.remoting import RemotingClient, RemotingError
from tests.support.autoswitch import Server, controller_mode_broker, controller_server
from tests.support.netns import Network, entered

NAMESERVER_PORT = 9876
RAFT_PORT = 9877
BROKER_PORT = 10911
BROKER_HA_PORT = 10912


@attrs.define
class ControllerHosts:
    net: Network
    controllers: list[Server]
    brokers: list[Server]

    @property
    def controller_addrs(self) -> list[str]:
        return [c.address for c in self.controllers]

    async def ask(
        self, address: str, code: RequestCode, header: object = None, timeout_s: float = 5
    ) -> RemotingCommand:
        async with RemotingClient() as client:
            request = RemotingCommand.request(code, header)
            return await client.invoke(address, request, timeout_s)

    async def commit(self, address: str, timeout_s: float = 5) -> bool:
        """Whether the controller at ``address`` gets a change committed (a Raft quorum
        with a leader), asking within ``timeout_s``."""
        header = ApplyBrokerIdRequestHeader("probe", "probe", 1, "probe")
        try:
            response = await self.ask(
                address, RequestCode.CONTROLLER_APPLY_BROKER_ID, header, timeout_s
            )
        except RemotingError:
            return False
        return response.code == ResponseCode.SUCCESS

    async def group_state(self, address: str) -> dict[str, Any]:
        """What the controller at ``address`` says of broker-a ({} if nothing)."""
        response = await self.ask(address, RequestCode.CONTROLLER_GET_SYNC_STATE_DATA)
        table: dict[str, Any] = json.loads(response.body)["replicasInfoTable"]
        return table.get("broker-a", {})


@asynccontextmanager
async def controller_hosts(root: Path, *, brokers: int = 0) -> AsyncIterator[ControllerHosts]:
    """The hosts and processes (module docstring); everything removed at the end."""
    await anyio.Path(root).mkdir(parents=True, exist_ok=True)
    net = Network.create()
    servers: list[Server] = []
    try:
        hosts = [net.add(f"c{i}") for i in range(3)]
        broker_hosts = [net.add(f"b{i}") for i in range(brokers)]
        here = net.add("t")
        secret = root / "raft.secret"
        await anyio.Path(secret).write_text("raft-hosts-test-secret\n")
        peers = ";".join(f"{h.ip}:{RAFT_PORT}" for h in hosts)
        controllers = [
            controller_server(
                f"controller-{i}",
                root,
                host=host.ip,
                port=NAMESERVER_PORT,
                raft_port=RAFT_PORT,
                peers=peers,
                secret=secret,
                prefix=host.command([]),
            )
            for i, host in enumerate(hosts)
        ]
        addrs = [c.address for c in controllers]
        broker_servers = [
            controller_mode_broker(
                f"broker-{i}",
                root,
                host=host.ip,
                port=BROKER_PORT,
                ha_port=BROKER_HA_PORT,
                controllers=addrs,
                store=root / f"broker-{i}",
                prefix=host.command([]),
            )
            for i, host in enumerate(broker_hosts)
        ]
        servers = [*controllers, *broker_servers]
        with entered(here):
            async with anyio.create_task_group() as group:
                for server in controllers:
                    group.start_soon(server.start)
            for server in broker_servers:  # (one by one: the first becomes the master)
                await server.start()
            yield ControllerHosts(net, controllers, broker_servers)
    finally:
        with anyio.CancelScope(shield=True):
            for server in servers:
                if server.running:
                    server.send_signal(signal.SIGCONT)
                with contextlib.suppress(Exception):
                    await server.kill()
            net.close()
