"""The producer's master watch (hamq/client/master_watch.py) with a real client
instance and a broker that hangs: a listener on loopback that takes connections and
never answers. A try waiting there past MASTER_CHECK_AFTER_S, while the route names
another master for its group, has its connection closed and fails at once; a try
whose route still names that broker, or no master at all, waits on.

The coroutine tests run on Trio, asyncio and uvloop (``anyio_backend``,
tests/conftest.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
import anyio.abc
import pytest

from hamq.client.config import client_config
from hamq.client.instance import ClientInstance
from hamq.client.master_watch import MASTER_CHECK_AFTER_S, MasterWatch
from hamq.protocol import RequestCode
from hamq.protocol.bodies import MessageQueue
from hamq.remoting import RemotingError
from tests.support.processes import free_ports

pytestmark = pytest.mark.anyio

QUEUE = MessageQueue("T", "broker-a", 0)


def test_the_watch_keeps_only_tries_under_way() -> None:
    watch = MasterWatch()
    first = watch.started("a:1", 10.0, QUEUE)
    second = watch.started("a:1", 12.0, QUEUE)
    other = watch.started("b:1", 11.0, MessageQueue("U", "broker-b", 1))
    assert watch.waiting_since(11.5) == [("a:1", "T", "broker-a"), ("b:1", "U", "broker-b")]
    watch.ended("a:1", first)
    watch.ended("b:1", other)
    watch.ended("b:1", other)  # (ending twice changes nothing)
    assert watch.waiting_since(11.5) == []
    assert watch.waiting_since(13.0) == [("a:1", "T", "broker-a")]
    watch.ended("a:1", second)
    assert watch.waiting_since(100.0) == []


class HungBroker:
    """A broker that takes connections and requests, and never answers."""

    def __init__(self) -> None:
        self.addr = ""
        #: set once a request's first bytes arrived: the client's connection is open
        self.asked = anyio.Event()

    async def _serve(self, stream: anyio.abc.SocketStream) -> None:
        async with stream:
            async for _ in stream:
                self.asked.set()


@asynccontextmanager
async def hung_broker() -> AsyncIterator[HungBroker]:
    broker = HungBroker()
    listener = await anyio.create_tcp_listener(local_host="127.0.0.1")
    async with listener, anyio.create_task_group() as tasks:
        broker.addr = f"127.0.0.1:{listener.extra(anyio.abc.SocketAttribute.local_port)}"
        tasks.start_soon(listener.serve, broker._serve)
        yield broker
        tasks.cancel_scope.cancel()


async def waiting_try(
    instance: ClientInstance, addr: str, failed: list[str], ended: anyio.Event
) -> None:
    request = instance.request(RequestCode.GET_BROKER_RUNTIME_INFO)
    try:
        await instance.invoke(addr, request, 30.0)
    except RemotingError as exc:
        failed.append(str(exc))
    finally:
        ended.set()


@pytest.mark.parametrize("route_names", ["another", "the same", "no master"])
async def test_a_try_on_a_master_the_route_no_longer_names_fails_at_once(
    route_names: str,
) -> None:
    (namesrv_port,) = free_ports(1)  # no nameserver there: lookups fail, the watch goes on
    config = client_config(f"127.0.0.1:{namesrv_port}", request_timeout_s=1.0)
    async with hung_broker() as broker, ClientInstance(config) as instance:
        old = broker.addr
        masters = {"another": {0: "127.0.0.1:1"}, "the same": {0: old}, "no master": {1: old}}
        instance.brokers["broker-a"] = masters[route_names]
        watch = MasterWatch()
        failed: list[str] = []
        ended = anyio.Event()
        with anyio.fail_after(20):
            async with anyio.create_task_group() as tasks:
                tasks.start_soon(waiting_try, instance, old, failed, ended)
                await broker.asked.wait()  # the try waits for its answer there
                since = instance.loop.current_time() - MASTER_CHECK_AFTER_S - 1
                key = watch.started(old, since, QUEUE)
                await watch.check(instance)
                if route_names == "another":
                    with anyio.fail_after(5):
                        await ended.wait()
                    assert watch.closed == 1
                    assert "no longer the master of broker-a" in failed[0]
                else:
                    assert watch.closed == 0
                    tasks.cancel_scope.cancel()  # (the try would wait its 30 s)
                watch.ended(old, key)
        if route_names != "another":
            assert failed == []
