"""The producer follows a master that moved, against a nameserver and two
brokers on loopback whose answers the test sets: broker group ``broker-a``'s master is
at A, then the route names B (as after a failover).

- an answer short of SEND_OK (FLUSH_SLAVE_TIMEOUT: what a master cut off from its
  replicas answers) makes the next send look the route up again;
- a try waiting on a master that answers nothing (stopped) goes to the new master as
  soon as the route names it, not after its own time out;
- a master that refuses sends (SERVICE_NOT_AVAILABLE: it lost its lease) while the
  nameserver in use still names it (cut off with it) has the route asked of the other
  nameservers, and the one that names the new master is used.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import attrs
import pytest
import trio

from hamq.client import Message, MessageQueue, Producer, SendStatus
from hamq.protocol import RemotingCommand, RequestCode, ResponseCode
from hamq.protocol.bodies import BrokerData, QueueData, TopicRouteData, encode_body
from hamq.protocol.headers import SendMessageResponseHeader
from hamq.protocol.send_fields import send_response_fields
from hamq.remoting import Connection, Dispatcher, RemotingServer
from tests.support.timing import wait_for

TOPIC = "moving"


@attrs.define
class FakeBroker:
    """Answers sends with ``answer`` (a response code), or never (``hang``)."""

    answer: ResponseCode = ResponseCode.SUCCESS
    hang: bool = False
    #: (nameserver, address): the route names this master before the answer goes
    elect_before_answering: tuple[FakeNameserver, str] | None = None
    sends: int = 0
    received: trio.Event = attrs.field(factory=trio.Event)
    address: str = ""

    async def send(self, request: RemotingCommand, conn: Connection) -> RemotingCommand:
        self.sends += 1
        self.received.set()
        if self.hang:
            await trio.sleep_forever()
        if self.elect_before_answering is not None:
            nameserver, master = self.elect_before_answering
            nameserver.master = master
        header = SendMessageResponseHeader(f"{self.address}-{self.sends}", 0, self.sends)
        return request.response_to(self.answer, ext_fields=send_response_fields(header))


@attrs.define
class FakeNameserver:
    master: str = ""
    lookups: int = 0
    #: False: it answers TOPIC_NOT_EXIST (just restarted, nobody registered yet)
    knows: bool = True
    #: the id ``master`` is named under (not 0: a fenced master registered as itself)
    master_id: int = 0

    def route(self, request: RemotingCommand, conn: Connection) -> RemotingCommand:
        self.lookups += 1
        if not self.knows:
            return request.response_to(ResponseCode.TOPIC_NOT_EXIST, "no route")
        route = TopicRouteData(
            queue_datas=[QueueData("broker-a", 1, 1, 6)],
            broker_datas=[BrokerData("C", "broker-a", {self.master_id: self.master})],
        )
        return request.response_to(body=encode_body(route))


@attrs.frozen
class Group:
    nameservers: list[FakeNameserver]
    namesrvs: list[str]
    a: FakeBroker
    b: FakeBroker

    @property
    def nameserver(self) -> FakeNameserver:
        return self.nameservers[0]

    @property
    def namesrv(self) -> list[str]:
        return self.namesrvs


async def serve(nursery: trio.Nursery, dispatcher: Dispatcher) -> str:
    server = RemotingServer(dispatcher, host="127.0.0.1", port=0)
    port = await nursery.start(server.run)
    return f"127.0.0.1:{port}"


@asynccontextmanager
async def moving_master(nameservers: int = 1) -> AsyncIterator[Group]:
    async with trio.open_nursery() as nursery:
        brokers = []
        for _ in range(2):
            broker = FakeBroker()
            dispatcher = Dispatcher()
            dispatcher.register_async(RequestCode.SEND_MESSAGE_V2, broker.send)
            broker.address = await serve(nursery, dispatcher)
            brokers.append(broker)
        servers, addrs = [], []
        for _ in range(nameservers):
            nameserver = FakeNameserver(brokers[0].address)
            dispatcher = Dispatcher()
            dispatcher.register(RequestCode.GET_ROUTEINFO_BY_TOPIC, nameserver.route)
            addrs.append(await serve(nursery, dispatcher))
            servers.append(nameserver)
        yield Group(servers, addrs, brokers[0], brokers[1])
        nursery.cancel_scope.cancel()


QUEUE = MessageQueue(TOPIC, "broker-a", 0)


@pytest.mark.parametrize("queue", [None, QUEUE], ids=["from-the-route", "given"])
async def test_a_send_short_of_send_ok_has_the_route_looked_up_again(
    queue: MessageQueue | None,
) -> None:
    """A answers FLUSH_SLAVE_TIMEOUT (cut off from its replicas), and B was elected
    master meanwhile: the producer looks the route up again and sends to B next."""
    async with (
        moving_master() as group,
        Producer("g", group.namesrv, send_timeout_s=10, auto_batch=False) as producer,
    ):
        group.a.answer = ResponseCode.FLUSH_SLAVE_TIMEOUT
        group.a.elect_before_answering = (group.nameserver, group.b.address)
        first = await producer.send(Message(TOPIC, b"1"), queue=queue)
        assert first.status is SendStatus.FLUSH_SLAVE_TIMEOUT
        await wait_for(lambda: producer.instance.broker_addr("broker-a") == group.b.address)
        second = await producer.send(Message(TOPIC, b"2"), queue=queue)
        assert second.status is SendStatus.SEND_OK
        assert second.offset_msg_id.startswith(group.b.address)
        assert (group.a.sends, group.b.sends) == (1, 1)


async def test_a_lookup_in_the_background_keeps_the_route_a_nameserver_does_not_know() -> None:
    """A nameserver that has just restarted knows no topic until the brokers register
    with it again: the lookups made in the background (after FLUSH_SLAVE_TIMEOUT, by
    the master watch) keep the route the producer has; one a send makes because it has
    no route (the default) drops it, as before."""
    async with (
        moving_master() as group,
        Producer("g", group.namesrv, send_timeout_s=10, auto_batch=False) as producer,
    ):
        assert (await producer.send(Message(TOPIC, b"1"))).status is SendStatus.SEND_OK
        group.nameserver.knows = False
        instance = producer.instance
        lookups = group.nameserver.lookups
        await instance.refresh_route_after_failure(TOPIC, keep_known=True)
        assert group.nameserver.lookups == lookups + 1
        assert instance.cached_publish_info(TOPIC) is not None
        assert (await producer.send(Message(TOPIC, b"2"))).status is SendStatus.SEND_OK
        await instance.update_route(TOPIC)
        assert instance.cached_publish_info(TOPIC) is None


async def test_a_try_waiting_on_a_master_that_moved_goes_to_the_new_one() -> None:
    """A stopped master answers nothing: the try would wait its whole minute. Once the
    route names another master, the producer closes its connection to the old one and
    the send goes again to the new one."""
    async with (
        moving_master() as group,
        Producer(
            "g", group.namesrv, send_timeout_s=60, send_attempt_timeout_s=60, auto_batch=False
        ) as producer,
    ):
        group.a.hang = True
        results = []

        async def send() -> None:
            results.append(await producer.send(Message(TOPIC, b"x"), queue=QUEUE))

        with trio.fail_after(20):  # (a bound: the try alone would wait 60 s)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(send)
                await group.a.received.wait()
                lookups = group.nameserver.lookups
                group.nameserver.master = group.b.address
        assert results[0].status is SendStatus.SEND_OK
        assert results[0].offset_msg_id.startswith(group.b.address)
        assert producer.master_watch.closed == 1
        assert group.nameserver.lookups > lookups


@pytest.mark.parametrize("old_master_id", [0, 1], ids=["as-master", "as-itself"])
async def test_a_nameserver_cut_off_with_a_refusing_master_is_left_for_one_that_is_not(
    old_master_id: int,
) -> None:
    """The nameserver in use is cut off with the old master A, which has lost its lease
    and still registers there: as the master (its registration as itself did not get
    through) or under its own id (no master then: sends never go to a slave); the other
    names the new master B. The producer asks the other nameserver and sends to B, and
    keeps using that nameserver."""
    async with (
        moving_master(nameservers=2) as group,
        Producer("g", group.namesrv, send_timeout_s=20, auto_batch=False) as producer,
    ):
        first = await producer.send(Message(TOPIC, b"1"), queue=QUEUE)
        assert first.status is SendStatus.SEND_OK
        in_use = producer.instance.namesrv_addr
        stale = group.nameservers[group.namesrvs.index(in_use)]
        (fresh,) = (n for n in group.nameservers if n is not stale)
        stale.master_id = old_master_id
        fresh.master = group.b.address
        group.a.answer = ResponseCode.SERVICE_NOT_AVAILABLE
        with trio.fail_after(15):  # (without the other nameserver: SendError after 20 s)
            result = await producer.send(Message(TOPIC, b"2"), queue=QUEUE)
        assert result.status is SendStatus.SEND_OK
        assert result.offset_msg_id.startswith(group.b.address)
        assert producer.instance.namesrv_addr != in_use
        assert group.a.sends == 2  # (the one refused: then the producer looked again)
