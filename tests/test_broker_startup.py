"""A broker that cannot start, or stops before it registered: a store directory another
process holds is named with the holder's PID (the ``hamq broker`` command, exit 2), and
no epoch is written for a start that failed or ended early.
"""

from __future__ import annotations

import socket
from functools import partial
from pathlib import Path

import pytest
import trio

from hamq.broker import BrokerNode
from hamq.ha import EpochFile
from hamq.ha.epoch import FILE_NAME as EPOCH_FILE_NAME
from tests.support.brokers import (
    broker_config,
    embedded_broker_process,
    running_broker,
    small_store_toml,
)
from tests.support.processes import hamq_command

pytestmark = pytest.mark.slow


async def test_a_store_directory_in_use_is_named_with_its_holder(tmp_path: Path) -> None:
    store = tmp_path / "data" / "broker-a-0"
    async with embedded_broker_process(tmp_path, "data/broker-a-0") as (holder, _):
        second = await hamq_command(
            "broker",
            *("-c", str(small_store_toml(tmp_path)), "--port", "0", "--namesrv-port", "0"),
            *("--store-dir", str(store)),
        )
    assert second.returncode == 2, second.stderr
    assert second.stderr.decode().splitlines() == [
        f"error: {store} is in use by process {holder.pid}"
    ]


def epochs_of(store_dir: Path) -> list[tuple[int, int]]:
    epochs = EpochFile(store_dir / EPOCH_FILE_NAME)
    epochs.load()
    return [(e.epoch, e.start_offset) for e in epochs.entries]


async def test_a_broker_that_cannot_start_writes_no_epoch(tmp_path: Path) -> None:
    store = tmp_path / "store"
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        for _ in range(3):
            node = BrokerNode(broker_config(store, listen_port=port, ha_listen_port=0))
            with pytest.raises(BaseException) as failed:
                async with trio.open_nursery() as nursery:
                    await nursery.start(node.run)
            assert isinstance(failed.value, OSError) or (
                isinstance(failed.value, BaseExceptionGroup) and failed.group_contains(OSError)
            ), failed.value
    assert epochs_of(store) == []
    async with running_broker(store):  # one that starts: one epoch
        pass
    async with running_broker(store):
        pass
    assert [epoch for epoch, _ in epochs_of(store)] == [1, 2]


async def test_a_broker_stopped_before_it_registered_writes_no_epoch(tmp_path: Path) -> None:
    """Its nameserver takes the connection and never answers: the broker is stopped
    while it waits to register."""
    registering = trio.Event()

    async def silent(stream: trio.SocketStream) -> None:
        registering.set()
        await trio.sleep_forever()

    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(partial(trio.serve_tcp, silent, 0, host="127.0.0.1"))
        port = listeners[0].socket.getsockname()[1]
        node = BrokerNode(
            broker_config(
                tmp_path / "store",
                namesrv_addrs=[f"127.0.0.1:{port}"],
                register_timeout_s=60.0,
            )
        )
        scope, stopped = trio.CancelScope(), trio.Event()

        async def serve() -> None:
            try:
                with scope:
                    await node.run()
            finally:
                stopped.set()

        nursery.start_soon(serve)
        with trio.fail_after(20):
            await registering.wait()
            scope.cancel()
            await stopped.wait()
        nursery.cancel_scope.cancel()
    assert epochs_of(tmp_path / "store") == []
