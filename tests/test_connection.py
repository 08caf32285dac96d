"""Connection on in-memory streams: timers under a mock clock, backpressure, deferral.

These tests run in virtual time (``autojump_clock``): a 120 s idle timeout takes no
real time, and nothing depends on how fast the machine is.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator

import attrs
import pytest
import trio
import trio.testing

from hamq.protocol import (
    FrameDecoder,
    RemotingCommand,
    ResponseCode,
    SerializeType,
    encode_frame,
)
from hamq.remoting import (
    Connection,
    Dispatcher,
    RemotingConfig,
    RemotingConnectionClosed,
    RemotingTimeoutError,
    Responder,
)
from hamq.remoting.pending import Pending, RequestDeadlines
from hamq.remoting.trio_stream import TrioByteStream
from tests.support.timing import wait_for

ECHO = 1
NEVER = 2
DEFER = 3
BOOM_ASYNC = 4


class Pair:
    """Two connected Connections: ``client`` and ``server``, each running."""

    def __init__(self, client: Connection, server: Connection) -> None:
        self.client = client
        self.server = server


def server_dispatcher(deferred: list[Responder]) -> Dispatcher:
    dispatcher = Dispatcher()
    dispatcher.register(ECHO, lambda request, conn: request.response_to(body=request.body))

    async def never(request: RemotingCommand, conn: Connection) -> RemotingCommand:
        await trio.sleep_forever()
        raise AssertionError("unreachable")

    def defer(request: RemotingCommand, conn: Connection) -> None:
        deferred.append(conn.defer(request))

    async def boom(request: RemotingCommand, conn: Connection) -> RemotingCommand:
        await trio.sleep(1)
        raise KeyError("no such queue")

    dispatcher.register_async(NEVER, never)
    dispatcher.register(DEFER, defer)
    dispatcher.register_async(BOOM_ASYNC, boom)
    return dispatcher


async def open_pair(
    nursery: trio.Nursery,
    deferred: list[Responder],
    config: RemotingConfig | None = None,
) -> Pair:
    config = config or RemotingConfig()
    a, b = trio.testing.memory_stream_pair()
    # only the server side times out idle connections, so it is always the one to close
    client_config = attrs.evolve(config, idle_timeout_s=None)
    client = Connection(
        TrioByteStream(a), peer="server", dispatcher=Dispatcher(), config=client_config
    )
    server = Connection(
        TrioByteStream(b), peer="client", dispatcher=server_dispatcher(deferred), config=config
    )
    await nursery.start(client.run)
    await nursery.start(server.run)
    return Pair(client, server)


@pytest.fixture
async def deferred() -> AsyncIterator[list[Responder]]:
    yield []


async def test_client_timeout_names_the_request(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock, deferred: list[Responder]
) -> None:
    pair = await open_pair(nursery, deferred)
    start = trio.current_time()
    with pytest.raises(RemotingTimeoutError, match=r"no response to request code 2 .* within 3s"):
        await pair.client.invoke(RemotingCommand.request(NEVER), timeout_s=3)
    assert trio.current_time() - start == pytest.approx(3)
    # the late answer would be dropped; the connection itself is fine
    response = await pair.client.invoke(RemotingCommand.request(ECHO, body=b"x"), timeout_s=3)
    assert response.body == b"x"
    assert pair.client.statistics().pending == 0


async def test_requests_with_other_timeouts_each_time_out_at_their_own_deadline(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock, deferred: list[Responder]
) -> None:
    """Waits are timed by the connection's expiry task, not a scope each: requests with
    long, short and middle timeouts in flight at once each end at their own deadline,
    the answered ones are not touched, and nothing is kept once all are over."""
    pair = await open_pair(nursery, deferred)
    start = trio.current_time()
    ended: dict[float, float] = {}

    async def never(timeout_s: float) -> None:
        with pytest.raises(RemotingTimeoutError, match=f"within {timeout_s:g}s"):
            await pair.client.invoke(RemotingCommand.request(NEVER), timeout_s=timeout_s)
        ended[timeout_s] = trio.current_time() - start

    async with trio.open_nursery() as waits:
        for timeout_s in (9.0, 2.0, 5.0):
            waits.start_soon(never, timeout_s)
        answered = await pair.client.invoke(RemotingCommand.request(ECHO, body=b"y"), 1.0)
        assert answered.body == b"y"
    assert ended == pytest.approx({9.0: 9.0, 2.0: 2.0, 5.0: 5.0})
    assert pair.client.statistics().pending == 0
    assert len(pair.client._deadlines) == 0


def test_request_deadlines_give_what_is_due_in_order_and_drop_what_is_over() -> None:
    deadlines = RequestDeadlines()
    waits = [Pending(trio.Event) for _ in range(4)]
    deadlines.add(waits[0], 10.0)
    deadlines.add(waits[1], 12.0)
    assert deadlines.earliest() == 10.0
    deadlines.add(waits[2], 5.0)  # a shorter timeout: out of order, the earliest
    deadlines.add(waits[3], 11.0)
    assert deadlines.earliest() == 5.0
    waits[2].settled = True  # answered
    deadlines.drop_settled()
    assert deadlines.earliest() == 10.0
    assert deadlines.due(10.5) == [waits[0]]
    assert deadlines.due(11.5) == [waits[3]]
    waits[1].settled = True
    assert deadlines.due(100.0) == []
    assert len(deadlines) == 0 and deadlines.earliest() == math.inf


async def test_idle_connection_closes_after_the_idle_timeout(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock, deferred: list[Responder]
) -> None:
    pair = await open_pair(nursery, deferred, RemotingConfig(idle_timeout_s=120))
    closed_at: list[float] = []
    closed = trio.Event()

    def on_close(conn: Connection) -> None:
        closed_at.append(trio.current_time())
        closed.set()

    pair.server.add_close_listener(on_close)
    start = trio.current_time()
    await trio.sleep(100)
    await pair.client.invoke(RemotingCommand.request(ECHO), timeout_s=3)  # activity
    await trio.sleep(110)
    assert not pair.server.closed  # 110 s since the last request
    with trio.fail_after(100):
        await closed.wait()
    quiet = closed_at[0] - (start + 100)
    assert 120 <= quiet <= 150
    assert "nothing received for 120s" in pair.server.close_reason


async def test_deferred_answer_arrives_when_the_processor_sends_it(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock, deferred: list[Responder]
) -> None:
    pair = await open_pair(nursery, deferred)
    answers: list[RemotingCommand] = []

    async def ask() -> None:
        answers.append(await pair.client.invoke(RemotingCommand.request(DEFER), timeout_s=30))

    nursery.start_soon(ask)
    await trio.testing.wait_all_tasks_blocked()
    [responder] = deferred
    assert pair.server.in_flight == 1
    await trio.sleep(10)  # a long poll holds the request
    assert responder.send(responder.request.response_to(remark="found"))
    assert not responder.send(responder.request.response_to())  # only once
    await trio.testing.wait_all_tasks_blocked()
    assert [a.remark for a in answers] == ["found"]
    assert pair.server.in_flight == 0


async def test_async_processor_failure_is_a_system_error(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock, deferred: list[Responder]
) -> None:
    pair = await open_pair(nursery, deferred)
    response = await pair.client.invoke(RemotingCommand.request(BOOM_ASYNC), timeout_s=5)
    assert response.code == ResponseCode.SYSTEM_ERROR
    assert response.remark == "KeyError: 'no such queue'"
    assert pair.server.in_flight == 0


async def test_peer_that_stops_reading_pushes_back_on_senders(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock, deferred: list[Responder]
) -> None:
    config = RemotingConfig(write_buffer_high_water_bytes=64 * 1024)
    a, _never_read = trio.testing.lockstep_stream_pair()
    conn = Connection(TrioByteStream(a), peer="stuck", dispatcher=Dispatcher(), config=config)
    await nursery.start(conn.run)
    body = b"x" * 16 * 1024
    sent = 0
    with pytest.raises(RemotingTimeoutError, match="not sent within 5s"):
        for _ in range(100):
            await conn.invoke_oneway(RemotingCommand.request(ECHO, body=body), timeout_s=5)
            sent += 1
    # the buffer stopped growing at the high-water mark instead of taking all 100
    assert sent < 10
    assert conn.statistics().send_buffer_bytes <= 64 * 1024 + 3 * len(body)
    assert not conn.closed  # giving up while waiting for room leaves the stream intact


async def test_closing_fails_waiters_and_refuses_new_requests(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock, deferred: list[Responder]
) -> None:
    pair = await open_pair(nursery, deferred)
    errors: list[Exception] = []

    async def wait_forever() -> None:
        try:
            await pair.client.invoke(RemotingCommand.request(NEVER), timeout_s=1000)
        except RemotingConnectionClosed as exc:
            errors.append(exc)

    nursery.start_soon(wait_forever)
    await trio.testing.wait_all_tasks_blocked()
    start = trio.current_time()
    pair.client.close("shutting down")
    await trio.testing.wait_all_tasks_blocked()
    assert trio.current_time() == start  # failed at once, no timeout waited out
    assert len(errors) == 1
    assert "shutting down" in str(errors[0])
    with pytest.raises(RemotingConnectionClosed):
        await pair.client.invoke(RemotingCommand.request(ECHO), timeout_s=1)


async def test_drain_answers_in_flight_then_closes(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock, deferred: list[Responder]
) -> None:
    pair = await open_pair(nursery, deferred)
    answers: list[RemotingCommand] = []

    async def ask() -> None:
        answers.append(await pair.client.invoke(RemotingCommand.request(DEFER), timeout_s=60))

    nursery.start_soon(ask)
    await trio.testing.wait_all_tasks_blocked()
    pair.server.drain()
    await trio.sleep(5)
    assert not pair.server.closed  # still owes an answer
    deferred[0].send(deferred[0].request.response_to(remark="last"))
    await trio.testing.wait_all_tasks_blocked()
    assert pair.server.closed
    assert [a.remark for a in answers] == ["last"]
    assert pair.server.close_reason == "drained"


async def test_drain_right_after_data_arrives_still_answers_it(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    client_side, server_side = trio.testing.memory_stream_pair()
    dispatcher = Dispatcher()
    dispatcher.register(ECHO, lambda request, conn: request.response_to(body=b"pong"))
    conn = Connection(
        TrioByteStream(server_side), peer="p", dispatcher=dispatcher, config=RemotingConfig()
    )
    await nursery.start(conn.run)
    await trio.testing.wait_all_tasks_blocked()  # the reader waits in receive_some
    request = RemotingCommand(code=ECHO, opaque=7)
    server_side.receive_stream.put_data(encode_frame(request))  # wakes the reader...
    conn.drain()  # ...and the drain comes before it runs
    received = b""
    with trio.fail_after(10):
        while chunk := await client_side.receive_some():
            received += chunk
    decoder = FrameDecoder()
    decoder.feed(received)
    assert [(c.opaque, c.body) for c in decoder.commands()] == [(7, b"pong")]
    assert conn.close_reason == "drained"


async def test_a_closed_connection_is_closed_at_once_even_if_a_task_is_slow_to_finish(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    dispatcher = Dispatcher()

    async def slow_cleanup(request: RemotingCommand, conn: Connection) -> RemotingCommand:
        with trio.CancelScope(shield=True):  # like an fsync in a worker thread
            await trio.sleep(30)
        return request.response_to()

    dispatcher.register_async(NEVER, slow_cleanup)
    a, b = trio.testing.memory_stream_pair()
    conn = Connection(
        TrioByteStream(a), peer="peer", dispatcher=dispatcher, config=RemotingConfig()
    )
    peer = Connection(
        TrioByteStream(b), peer="me", dispatcher=server_dispatcher([]), config=RemotingConfig()
    )
    await nursery.start(conn.run)
    await nursery.start(peer.run)
    await peer.invoke_oneway(RemotingCommand.request(NEVER), 1)
    await trio.testing.wait_all_tasks_blocked()
    errors: list[Exception] = []

    async def waiting() -> None:
        try:  # the peer never answers this one
            await conn.invoke(RemotingCommand.request(NEVER), timeout_s=100)
        except RemotingConnectionClosed as exc:
            errors.append(exc)

    nursery.start_soon(waiting)
    await trio.testing.wait_all_tasks_blocked()
    start = trio.current_time()
    peer.close("peer gone")
    await trio.testing.wait_all_tasks_blocked()
    assert conn.closed  # although slow_cleanup still runs
    assert len(errors) == 1 and trio.current_time() == start  # failed at once
    with pytest.raises(RemotingConnectionClosed):
        await conn.invoke(RemotingCommand.request(ECHO), timeout_s=1)


async def test_drain_fails_our_own_waiting_requests_at_once(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock, deferred: list[Responder]
) -> None:
    pair = await open_pair(nursery, deferred)
    errors: list[Exception] = []

    async def ask() -> None:
        try:  # the answer could only come through the reading that drain() stops
            await pair.client.invoke(RemotingCommand.request(NEVER), timeout_s=100)
        except RemotingConnectionClosed as exc:
            errors.append(exc)

    nursery.start_soon(ask)
    await trio.testing.wait_all_tasks_blocked()
    pair.client.drain()
    await trio.testing.wait_all_tasks_blocked()
    assert len(errors) == 1
    assert "draining" in str(errors[0])
    with pytest.raises(RemotingConnectionClosed, match=r"draining|drained"):
        await pair.client.invoke(RemotingCommand.request(ECHO), timeout_s=5)


async def test_an_unencodable_response_becomes_a_system_error(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    dispatcher = Dispatcher()
    # an int where RocketMQ's binary header needs a string: a processor bug
    dispatcher.register(
        ECHO,
        lambda request, conn: request.response_to(ext_fields={"queueId": 0}),  # type: ignore[dict-item]
    )
    left, right = trio.socket.socketpair()  # (a real socket: one write, one read)
    a, b = trio.SocketStream(left), trio.SocketStream(right)
    server = Connection(
        TrioByteStream(b), peer="client", dispatcher=dispatcher, config=RemotingConfig()
    )
    client = Connection(
        TrioByteStream(a), peer="server", dispatcher=Dispatcher(), config=RemotingConfig()
    )
    await nursery.start(server.run)
    await nursery.start(client.run)
    request = RemotingCommand.request(ECHO, serialize_type=SerializeType.ROCKETMQ)
    response = await client.invoke(request, timeout_s=5)
    assert response.code == ResponseCode.SYSTEM_ERROR
    assert "could not be encoded (AttributeError)" in (response.remark or "")
    assert not server.closed


async def test_invoke_clears_a_oneway_bit_left_on_the_request(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock, deferred: list[Responder]
) -> None:
    pair = await open_pair(nursery, deferred)
    request = RemotingCommand.request(ECHO, body=b"x", oneway=True)
    response = await pair.client.invoke(request, timeout_s=5)
    assert response.body == b"x"


async def test_a_burst_of_requests_lets_other_tasks_run_as_it_is_handled() -> None:
    """64 requests read at once are handled inline, but other tasks run every
    YIELD_EVERY_COMMANDS of them: a master's HA writer ships the first sends of a burst
    while the rest are appended (no lockstep)."""
    from hamq.remoting.connection import YIELD_EVERY_COMMANDS

    seen: list[str] = []
    first, all_seen = trio.Event(), trio.Event()

    def record(request: RemotingCommand, conn: Connection) -> None:
        seen.append(f"request {request.body.decode()}")
        first.set()
        if len(seen) == 65:
            all_seen.set()

    dispatcher = Dispatcher()
    dispatcher.register(ECHO, record)
    left, right = trio.socket.socketpair()  # (a real socket: one write, one read)
    a, b = trio.SocketStream(left), trio.SocketStream(right)
    server = Connection(
        TrioByteStream(b), peer="client", dispatcher=dispatcher, config=RemotingConfig()
    )
    frames = [
        encode_frame(RemotingCommand.request(ECHO, body=str(i).encode(), oneway=True))
        for i in range(64)
    ]

    async def other_task() -> None:
        await first.wait()
        seen.append("other task")
        if len(seen) == 65:
            all_seen.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(other_task)
        await nursery.start(server.run)
        await a.send_all(b"".join(frames))  # (one write: one read on the other side)
        with trio.fail_after(5):
            await all_seen.wait()
        nursery.cancel_scope.cancel()
    # (Trio runs the two in either order after a checkpoint: the other task within two)
    assert seen.index("other task") <= 2 * YIELD_EVERY_COMMANDS < 64, seen


def socket_pair(deferred: list[Responder]) -> tuple[Connection, Connection]:
    """A client and a server connection over a real socket pair (not yet running)."""
    left, right = trio.socket.socketpair()
    client = Connection(
        TrioByteStream(trio.SocketStream(left)),
        peer="server",
        dispatcher=Dispatcher(),
        config=RemotingConfig(),
    )
    server = Connection(
        TrioByteStream(trio.SocketStream(right)),
        peer="client",
        dispatcher=server_dispatcher(deferred),
        config=RemotingConfig(),
    )
    return client, server


async def test_the_requests_of_one_loop_turn_after_the_first_leave_in_one_write(
    deferred: list[Responder],
) -> None:
    """Tasks that send in the same loop turn (64 senders woken by one chunk of answers):
    the first request is written by its caller, the rest together by the writer, whole
    and in the order they were sent; the server answers each."""
    client, server = socket_pair(deferred)
    answers: list[bytes] = []

    async def echo(i: int) -> None:
        response = await client.invoke(RemotingCommand.request(ECHO, body=b"%d" % i), 5.0)
        answers.append(response.body)

    async with trio.open_nursery() as nursery:
        await nursery.start(client.run)
        await nursery.start(server.run)
        writes = client.statistics().writes
        async with trio.open_nursery() as senders:
            for i in range(20):
                senders.start_soon(echo, i)
        assert sorted(answers) == sorted(b"%d" % i for i in range(20))
        assert client.statistics().requests_sent == 20
        assert client.statistics().writes - writes == 2  # the first, then the other 19
        nursery.cancel_scope.cancel()


async def test_requests_and_later_answers_leave_from_the_caller_not_the_writers_turn(
    deferred: list[Responder],
) -> None:
    """Over a socket, a request and an answer given outside the reader's batch (a
    slave's ack answering SYNC_MASTER sends) are with the kernel when the call returns:
    no waiting for the writer task's turn, which under load comes rounds later."""
    client, server = socket_pair(deferred)
    async with trio.open_nursery() as nursery:
        await nursery.start(client.run)
        await nursery.start(server.run)
        request = RemotingCommand.request(ECHO, body=b"now", oneway=True)
        await client.invoke_oneway(request, timeout_s=5)  # (no checkpoint on its way)
        assert client.statistics().bytes_sent == len(encode_frame(request))
        nursery.start_soon(client.invoke, RemotingCommand.request(DEFER), 5.0)
        await wait_for(lambda: bool(deferred))
        [responder] = deferred
        assert server.statistics().bytes_sent == 0
        assert responder.send(responder.request.response_to(remark="found"))
        assert server.statistics().bytes_sent > 0
        nursery.cancel_scope.cancel()
