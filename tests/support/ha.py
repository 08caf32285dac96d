"""HA test support: a master/slave group of real ``hamq`` processes (free ports, tmp
stores; AnyIO processes, for tests on any backend), and ``FakeSlave``, a hostile peer on
a master's HA port (Trio sockets: the HA tests that use it run on Trio)."""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import struct
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import trio
from anyio.abc import Process

from hamq.protocol import RemotingCommand, RequestCode
from hamq.remoting import RemotingClient
from tests.support.brokers import SMALL_STORE
from tests.support.processes import hamq_server, write_toml
from tests.support.timing import wait_for


async def ha_status(addr: str) -> dict[str, Any]:
    async with RemotingClient() as client:
        response = await client.invoke(
            addr, RemotingCommand.request(RequestCode.GET_BROKER_HA_STATUS), 5
        )
    status: dict[str, Any] = json.loads(response.body)
    return status


async def first_slave_in_sync(master_addr: str) -> bool:
    """Whether the master's (first) slave is connected and in sync: from then on a
    SYNC_MASTER's sends are acknowledged."""
    slaves = (await ha_status(master_addr))["master"]["slaves"]
    return bool(slaves and slaves[0]["in_sync"])


def broker_addr(line: str) -> str:
    return line.split(" at ", 1)[1].split(",", 1)[0]


@asynccontextmanager
async def broker_group(
    tmp_path: Path, role: str, ha: dict[str, Any] | None = None
) -> AsyncIterator[tuple[str, tuple[Process, str], tuple[Process, str]]]:
    """(nameserver, (master process, address), (slave process, address)), once the
    slave is in sync."""
    async with hamq_server("nameserver", "--port", "0") as (_, ns_line):
        ns = ns_line.rsplit(" ", 1)[1]
        configs = {}
        for name, broker_id, broker_role in (("master", 0, role), ("slave", 1, "SLAVE")):
            configs[name] = write_toml(
                tmp_path / f"{name}.toml",
                {
                    "broker_name": "broker-a",
                    "broker_id": broker_id,
                    "listen_port": 0,
                    "namesrv_addrs": [ns],
                    "store": {
                        "store_dir": str(tmp_path / name),
                        "role": broker_role,
                        **SMALL_STORE,
                    },
                    "ha": ha or {},
                },
            )
        async with (
            hamq_server("broker", "-c", str(configs["master"])) as (master, master_line),
            hamq_server("broker", "-c", str(configs["slave"])) as (slave, slave_line),
        ):
            master_addr = broker_addr(master_line)
            await wait_for(
                lambda: first_slave_in_sync(master_addr), 30, every_s=0.05, what="slave in sync"
            )
            yield ns, (master, master_addr), (slave, broker_addr(slave_line))


def log_prefix(store_dir: Path, length: int) -> bytes:
    """The first ``length`` bytes of a CommitLog, read from its segment files."""
    out = bytearray()
    for segment in sorted((store_dir / "commitlog").iterdir()):
        out += segment.read_bytes()[: length - len(out)]
        if len(out) >= length:
            break
    return bytes(out)


class FakeSlave:
    """A peer on a master's HA port that says whatever a test wants, written from the
    wire layouts (docs/PROTOCOL.md#ha-wire, hamq/protocol/ha_wire.py's docstring) with
    struct and hmac alone: hamq's HA code is not used, so it cannot agree with the
    master by sharing a bug. ``received`` is every byte the master sent it;
    ``closed`` is set when the master closed the connection."""

    AUTH_MAGIC = b"\xfeHA\x01"

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        host, port = stream.socket.getsockname()[:2]
        #: where it connects from, as the master names it in its log
        self.address = f"{host}:{port}"
        self.received = bytearray()
        self.closed = trio.Event()

    @classmethod
    @asynccontextmanager
    async def connect(
        cls, address: str, *, receive_buffer: int | None = None
    ) -> AsyncIterator[FakeSlave]:
        """Connected to ``address``; ``receive_buffer``: a small SO_RCVBUF, so that a
        slave that stops reading soon stops the master's sends."""
        host, port = address.rsplit(":", 1)
        sock = trio.socket.socket()
        if receive_buffer is not None:
            sock.setsockopt(trio.socket.SOL_SOCKET, trio.socket.SO_RCVBUF, receive_buffer)
        stream = trio.SocketStream(sock)
        try:
            with trio.fail_after(10):
                await sock.connect((host, int(port)))
            yield cls(stream)
        finally:
            await trio.aclose_forcefully(stream)

    # ---- what it sends
    async def send(self, data: bytes) -> None:
        try:
            await self.stream.send_all(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            self.closed.set()

    async def report_classic(self, offset: int) -> None:
        await self.send(struct.pack(">q", offset))

    async def handshake(self, broker_id: int) -> None:
        """The auto-switch HANDSHAKE: syncFromLastFile, not a learner, ``broker_id``."""
        await self.send(struct.pack(">ihhq", 1, 1, 0, broker_id))

    async def report_autoswitch(self, offset: int) -> None:
        await self.send(struct.pack(">iq", 2, offset))

    async def prove_secret(self, secret: str, broker_name: str) -> bool:
        """Answer the master's challenge with ``secret``; True if it accepted."""
        challenge = await self.receive_exactly(36)
        assert challenge[:4] == self.AUTH_MAGIC, challenge.hex()
        slave_nonce = os.urandom(32)
        message = b"hamq-ha slave\0" + broker_name.encode() + b"\0" + challenge[4:] + slave_nonce
        mac = hmac.new(secret.encode(), message, hashlib.sha256).digest()
        await self.send(self.AUTH_MAGIC + slave_nonce + mac)
        result = await self.receive_exactly(37)
        return result[:4] == self.AUTH_MAGIC and result[4] == 1

    # ---- what it receives
    async def receive_exactly(self, size: int) -> bytes:
        data = bytearray()
        with trio.fail_after(10):
            while len(data) < size:
                chunk = await self.stream.receive_some(size - len(data))
                if not chunk:
                    self.closed.set()
                    raise EOFError(f"closed after {len(data)} of {size} bytes")
                data += chunk
        self.received += data
        return bytes(data)

    async def master_handshake(self) -> tuple[int, int]:
        """The auto-switch HANDSHAKE answer: (master max offset, last epoch)."""
        state, size, max_offset, last_epoch = struct.unpack(">iiqi", await self.receive_exactly(20))
        assert state == 1, state
        await self.receive_exactly(size)
        return max_offset, last_epoch

    async def drain(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Read everything the master sends into ``received`` until it closes."""
        task_status.started()
        try:
            while data := await self.stream.receive_some(65536):
                self.received += data
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        self.closed.set()

    async def keep_reporting(self, report: Any, offset: int, every_s: float = 0.05) -> None:
        """``report(offset)`` again and again (a liar keeps lying) until closed."""
        while not self.closed.is_set():
            await report(offset)
            await trio.sleep(every_s)


@asynccontextmanager
async def in_sync_fake_slave(master: Any, secret: str, group: str) -> AsyncIterator[FakeSlave]:
    """A ``FakeSlave`` of ``master``'s group (a BrokerNode in this process): it proves
    ``secret``, drains what it is sent, reports offset 0, and is in sync (the master's
    replica gate says so) when the block starts; it reports nothing more by itself."""
    service = master.ha_service
    assert service is not None
    async with FakeSlave.connect(service.address) as fake, trio.open_nursery() as nursery:
        assert await fake.prove_secret(secret, group)
        await nursery.start(fake.drain)
        await fake.report_classic(0)
        await wait_for(service.transfer.available)
        yield fake
        nursery.cancel_scope.cancel()
