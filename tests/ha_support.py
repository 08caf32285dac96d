"""A master/slave group of real ``hamq`` processes for tests (free ports, tmp stores)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import trio

from hamq.protocol import RemotingCommand, RequestCode
from hamq.remoting import RemotingClient
from tests.broker_support import SMALL_STORE
from tests.processes import hamq_server, write_toml


async def ha_status(addr: str) -> dict[str, Any]:
    async with RemotingClient() as client:
        response = await client.invoke(
            addr, RemotingCommand.request(RequestCode.GET_BROKER_HA_STATUS), 5
        )
    status: dict[str, Any] = json.loads(response.body)
    return status


def broker_addr(line: str) -> str:
    return line.split(" at ", 1)[1].split(",", 1)[0]


@asynccontextmanager
async def broker_group(
    tmp_path: Path, role: str, ha: dict[str, Any] | None = None
) -> AsyncIterator[tuple[str, tuple[trio.Process, str], tuple[trio.Process, str]]]:
    """(nameserver, (master process, address), (slave process, address))."""
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
            with trio.fail_after(30):
                while True:  # the slave connected and caught up
                    slaves = (await ha_status(master_addr))["master"]["slaves"]
                    if slaves and slaves[0]["in_sync"]:
                        break
                    await trio.sleep(0.05)
            yield ns, (master, master_addr), (slave, broker_addr(slave_line))


def log_prefix(store_dir: Path, length: int) -> bytes:
    """The first ``length`` bytes of a CommitLog, read from its segment files."""
    out = bytearray()
    for segment in sorted((store_dir / "commitlog").iterdir()):
        out += segment.read_bytes()[: length - len(out)]
        if len(out) >= length:
            break
    return bytes(out)
