"""RemotingServer and RemotingClient over real loopback sockets."""

from __future__ import annotations

import random
import struct

import anyio
import anyio.abc
import pytest
import trio
import trio.testing

from hamq.protocol import (
    HeaderError,
    RemotingCommand,
    RequestCode,
    RequestError,
    ResponseCode,
    SerializeType,
    encode_frame,
)
from hamq.protocol.headers import PullMessageRequestHeader
from hamq.remoting import (
    Connection,
    Dispatcher,
    RemotingClient,
    RemotingConfig,
    RemotingConnectError,
    RemotingConnectionClosed,
    RemotingFrameTooLarge,
    RemotingServer,
    RemotingTimeoutError,
)

ECHO = 1
SLOW_ECHO = 2
BOOM = 3
REFUSE = 4
HOLD = 5
PULL = RequestCode.PULL_MESSAGE


class Processors:
    """A processor table with one processor of each kind, and what they observed."""

    def __init__(self) -> None:
        self.dispatcher = Dispatcher()
        self.in_flight = 0
        self.max_in_flight = 0
        self.released = trio.Event()
        self.held = 0
        self._held_changed = trio.Event()
        self.oneways: list[RemotingCommand] = []
        d = self.dispatcher
        d.register(ECHO, self.echo)
        d.register_async(SLOW_ECHO, self.slow_echo)
        d.register(BOOM, lambda request, conn: 1 // 0)
        d.register(REFUSE, self.refuse)
        d.register_async(HOLD, self.hold)
        d.register(PULL, self.pull)

    def echo(self, request: RemotingCommand, conn: Connection) -> RemotingCommand | None:
        if request.is_oneway:
            self.oneways.append(request)
        return request.response_to(body=request.body, ext_fields=request.ext_fields)

    async def slow_echo(self, request: RemotingCommand, conn: Connection) -> RemotingCommand:
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            # answer out of order: later requests often overtake earlier ones
            await trio.sleep(random.random() / 100)
        finally:
            self.in_flight -= 1
        return request.response_to(body=request.body)

    def refuse(self, request: RemotingCommand, conn: Connection) -> RemotingCommand:
        raise RequestError(ResponseCode.TOPIC_NOT_EXIST, "topic T not exist")

    async def hold(self, request: RemotingCommand, conn: Connection) -> RemotingCommand:
        self.held += 1
        self._held_changed.set()
        self._held_changed = trio.Event()
        await self.released.wait()
        return request.response_to(remark="released")

    async def wait_held(self, count: int) -> None:
        """Wait until ``count`` HOLD requests are being held."""
        with trio.fail_after(10):
            while self.held < count:
                await self._held_changed.wait()

    def pull(self, request: RemotingCommand, conn: Connection) -> RemotingCommand:
        header = request.header(PullMessageRequestHeader)
        return request.response_to(remark=header.topic)


async def start_server(
    nursery: trio.Nursery, processors: Processors, config: RemotingConfig | None = None
) -> tuple[RemotingServer, str]:
    server = RemotingServer(processors.dispatcher, host="127.0.0.1", port=0, config=config)
    port = await nursery.start(server.run)
    assert port == server.port != 0
    return server, f"127.0.0.1:{port}"


@pytest.fixture
async def served(nursery: trio.Nursery) -> tuple[Processors, RemotingServer, str]:
    processors = Processors()
    server, addr = await start_server(nursery, processors)
    return processors, server, addr


async def test_echo_in_each_serialize_type(served: tuple[Processors, RemotingServer, str]) -> None:
    _, _, addr = served
    async with RemotingClient() as client:
        for serialize_type in SerializeType:
            request = RemotingCommand.request(
                ECHO, body=b"ping", ext_fields={"k": "v"}, serialize_type=serialize_type
            )
            response = await client.invoke(addr, request, timeout_s=5)
            assert response.code == ResponseCode.SUCCESS
            assert response.is_response
            assert response.opaque == request.opaque
            assert response.body == b"ping"
            assert response.ext_fields == {"k": "v"}
            # responses travel in the request's serialize type
            assert response.serialize_type == serialize_type


async def test_1000_concurrent_requests_from_10_clients(
    served: tuple[Processors, RemotingServer, str],
) -> None:
    processors, server, addr = served
    results: dict[bytes, bytes] = {}

    async def one(client: RemotingClient, tag: bytes) -> None:
        request = RemotingCommand.request(SLOW_ECHO, body=tag)
        response = await client.invoke(addr, request, timeout_s=30)
        assert response.code == ResponseCode.SUCCESS
        results[tag] = response.body

    async def client_task(n: int) -> None:
        async with RemotingClient() as client, trio.open_nursery() as requests:
            for i in range(100):
                requests.start_soon(one, client, f"{n}-{i}".encode())

    with trio.fail_after(60):
        async with trio.open_nursery() as clients:
            for n in range(10):
                clients.start_soon(client_task, n)
    assert len(results) == 1000
    assert all(tag == body for tag, body in results.items())  # each answer matched by opaque
    assert processors.max_in_flight > 10  # they really were in flight together
    stats = server.statistics()
    assert stats.connections_accepted == 10
    assert stats.requests_received == 1000


async def test_unknown_code_is_not_supported_with_the_same_opaque(
    served: tuple[Processors, RemotingServer, str],
) -> None:
    _, _, addr = served
    async with RemotingClient() as client:
        request = RemotingCommand.request(999)
        response = await client.invoke(addr, request, timeout_s=5)
    assert response.code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED
    assert response.opaque == request.opaque
    assert response.remark == " request type 999 not supported"


async def test_raising_processor_answers_system_error_and_the_connection_stays(
    served: tuple[Processors, RemotingServer, str],
) -> None:
    _, _, addr = served
    async with RemotingClient() as client:
        response = await client.invoke(addr, RemotingCommand.request(BOOM), timeout_s=5)
        assert response.code == ResponseCode.SYSTEM_ERROR
        assert response.remark == "ZeroDivisionError: integer division or modulo by zero"
        conn = client.connections[addr]
        after = await client.invoke(addr, RemotingCommand.request(ECHO, body=b"x"), timeout_s=5)
        assert after.code == ResponseCode.SUCCESS
        assert client.connections[addr] is conn


async def test_request_error_carries_its_code_and_message(
    served: tuple[Processors, RemotingServer, str],
) -> None:
    _, _, addr = served
    async with RemotingClient() as client:
        response = await client.invoke(addr, RemotingCommand.request(REFUSE), timeout_s=5)
        assert (response.code, response.remark) == (
            ResponseCode.TOPIC_NOT_EXIST,
            "topic T not exist",
        )
        bad_header = RemotingCommand.request(PULL, ext_fields={"topic": "T", "queueId": "zero"})
        response = await client.invoke(addr, bad_header, timeout_s=5)
    assert response.code == ResponseCode.INVALID_PARAMETER
    assert response.remark is not None
    assert "missing required field(s) consumerGroup" in response.remark
    assert "queueId='zero'" in response.remark
    assert issubclass(HeaderError, RequestError)


async def raw_connection(addr: str) -> trio.SocketStream:
    host, port = addr.rsplit(":", 1)
    return await trio.open_tcp_stream(host, int(port))


async def read_until_closed(stream: trio.SocketStream) -> bytes:
    received = b""
    with trio.fail_after(10):
        while chunk := await stream.receive_some():
            received += chunk
    return received


@pytest.mark.parametrize(
    "junk",
    [
        struct.pack(">iI", 2**30, 0),  # over the maximum frame length
        struct.pack(">i", -7),  # negative length
        b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",  # not our protocol at all
        struct.pack(">iI", 6, 2) + b"\xc1\xc1",  # msgpack header that does not parse
    ],
    ids=["oversized", "negative-length", "garbage", "bad-header"],
)
async def test_a_bad_frame_closes_that_connection_alone(nursery: trio.Nursery, junk: bytes) -> None:
    processors = Processors()
    server, addr = await start_server(
        nursery, processors, RemotingConfig(max_frame_length=64 * 1024)
    )
    async with RemotingClient() as client:
        await client.invoke(addr, RemotingCommand.request(ECHO), timeout_s=5)
        bad = await raw_connection(addr)
        good_frame = encode_frame(RemotingCommand(code=ECHO, opaque=1))
        await bad.send_all(good_frame + junk)
        received = await read_until_closed(bad)
        # the good frame before the junk was still answered, then the server hung up
        assert received.startswith(struct.pack(">i", len(received) - 4))
        await bad.aclose()
        # the other connection, and the server, carry on
        response = await client.invoke(addr, RemotingCommand.request(ECHO, body=b"ok"), timeout_s=5)
        assert response.body == b"ok"
    assert server.statistics().connections_accepted == 2


async def test_client_refuses_a_frame_over_the_maximum_and_sends_nothing(
    served: tuple[Processors, RemotingServer, str],
) -> None:
    _, _, addr = served
    async with RemotingClient(config=RemotingConfig(max_frame_length=1024)) as client:
        with pytest.raises(RemotingFrameTooLarge, match="over the maximum frame length 1024"):
            await client.invoke(addr, RemotingCommand.request(ECHO, body=b"x" * 2000), timeout_s=5)
        response = await client.invoke(addr, RemotingCommand.request(ECHO, body=b"y"), timeout_s=5)
        assert response.body == b"y"


async def test_connect_error_names_the_address() -> None:
    listener = (await trio.open_tcp_listeners(0, host="127.0.0.1"))[0]
    port = listener.socket.getsockname()[1]
    await listener.aclose()  # nothing listens there now
    async with RemotingClient() as client:
        with pytest.raises(RemotingConnectError, match=f"127.0.0.1:{port}: cannot connect"):
            await client.invoke(f"127.0.0.1:{port}", RemotingCommand.request(ECHO), timeout_s=5)
        with pytest.raises(RemotingConnectError, match="expected host:port"):
            await client.invoke("no-port-here", RemotingCommand.request(ECHO), timeout_s=5)


async def test_pending_requests_fail_at_once_when_the_server_goes_away(
    nursery: trio.Nursery,
) -> None:
    processors = Processors()
    server_scope = trio.CancelScope()

    async def run_server(*, task_status: trio.TaskStatus[int]) -> None:
        with server_scope:
            server = RemotingServer(processors.dispatcher)
            await server.run(task_status=task_status)

    port = await nursery.start(run_server)
    addr = f"127.0.0.1:{port}"
    failures: list[Exception] = []

    async def waiting_request(client: RemotingClient) -> None:
        try:
            await client.invoke(addr, RemotingCommand.request(HOLD), timeout_s=600)
        except RemotingConnectionClosed as exc:
            failures.append(exc)

    async with RemotingClient() as client:
        with trio.fail_after(10):  # far below the 600 s request timeout
            async with trio.open_nursery() as requests:
                for _ in range(5):
                    requests.start_soon(waiting_request, client)
                await processors.wait_held(5)
                server_scope.cancel()
    assert len(failures) == 5
    assert "connection closed before the response arrived" in str(failures[0])


async def test_in_flight_limit_answers_system_busy(nursery: trio.Nursery) -> None:
    processors = Processors()
    _, addr = await start_server(
        nursery, processors, RemotingConfig(max_in_flight_per_connection=2)
    )
    async with RemotingClient() as client, trio.open_nursery() as requests:
        for _ in range(2):
            requests.start_soon(client.invoke, addr, RemotingCommand.request(HOLD), 30)
        await processors.wait_held(2)
        busy = await client.invoke(addr, RemotingCommand.request(HOLD), timeout_s=5)
        assert busy.code == ResponseCode.SYSTEM_BUSY
        assert "limit 2" in (busy.remark or "")
        # inline processors are not in flight and still answer
        echo = await client.invoke(addr, RemotingCommand.request(ECHO), timeout_s=5)
        assert echo.code == ResponseCode.SUCCESS
        processors.released.set()


async def test_oneway_requests_get_no_response(
    served: tuple[Processors, RemotingServer, str],
) -> None:
    processors, server, addr = served
    async with RemotingClient() as client:
        await client.invoke_oneway(addr, RemotingCommand.request(ECHO, body=b"1"), timeout_s=5)
        # a normal request after it proves the oneway one was handled first
        await client.invoke(addr, RemotingCommand.request(ECHO), timeout_s=5)
        [server_conn] = server.connections
        assert server_conn.statistics().responses_sent == 1
        assert client.connections[addr].statistics().responses_received == 1
    assert [c.body for c in processors.oneways] == [b"1"]


async def test_server_sends_requests_to_its_client_over_the_same_connection(
    served: tuple[Processors, RemotingServer, str],
) -> None:
    _, server, addr = served
    client_dispatcher = Dispatcher()
    notified: list[str] = []

    def on_notify(request: RemotingCommand, conn: Connection) -> RemotingCommand:
        notified.append(request.ext_fields["consumerGroup"])
        return request.response_to()

    client_dispatcher.register(RequestCode.NOTIFY_CONSUMER_IDS_CHANGED, on_notify)
    async with RemotingClient(dispatcher=client_dispatcher) as client:
        await client.invoke(addr, RemotingCommand.request(ECHO), timeout_s=5)
        [server_conn] = server.connections
        notify = RemotingCommand.request(
            RequestCode.NOTIFY_CONSUMER_IDS_CHANGED, ext_fields={"consumerGroup": "G"}
        )
        response = await server_conn.invoke(notify, timeout_s=5)
    assert response.code == ResponseCode.SUCCESS
    assert notified == ["G"]


async def test_graceful_shutdown_answers_what_is_in_flight(nursery: trio.Nursery) -> None:
    processors = Processors()
    server = RemotingServer(processors.dispatcher)
    finished = trio.Event()

    async def run_server(*, task_status: trio.TaskStatus[int]) -> None:
        await server.run(task_status=task_status)
        finished.set()

    port = await nursery.start(run_server)
    addr = f"127.0.0.1:{port}"
    async with RemotingClient() as client:
        held: list[RemotingCommand] = []

        async def hold() -> None:
            held.append(await client.invoke(addr, RemotingCommand.request(HOLD), timeout_s=30))

        with trio.fail_after(20):
            async with trio.open_nursery() as requests:
                requests.start_soon(hold)
                await processors.wait_held(1)
                server.shutdown(grace_s=30)
                await trio.testing.wait_all_tasks_blocked()
                with pytest.raises(RemotingConnectError):  # no longer accepting
                    async with RemotingClient() as other:
                        await other.invoke(addr, RemotingCommand.request(ECHO), timeout_s=5)
                assert not finished.is_set()  # still waiting for the request in flight
                processors.released.set()
            await finished.wait()
    assert [r.remark for r in held] == ["released"]


async def test_client_reconnects_after_the_connection_drops(
    served: tuple[Processors, RemotingServer, str],
) -> None:
    _, server, addr = served
    async with RemotingClient() as client:
        await client.invoke(addr, RemotingCommand.request(ECHO), timeout_s=5)
        first = client.connections[addr]
        [server_conn] = server.connections
        closed = trio.Event()
        first.add_close_listener(lambda conn: closed.set())
        server_conn.close("test closes it")
        with trio.fail_after(5):
            await closed.wait()
        response = await client.invoke(addr, RemotingCommand.request(ECHO, body=b"again"), 5)
        assert response.body == b"again"
        assert client.connections[addr] is not first


async def test_concurrent_callers_share_one_connect_and_keep_their_timeouts(
    autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    attempts = []

    async def never_connects(host: str, port: int, **kwargs: object) -> anyio.abc.SocketStream:
        attempts.append((host, port))
        await trio.sleep_forever()
        raise AssertionError("unreachable")

    monkeypatch.setattr(anyio, "connect_tcp", never_connects)
    finished: list[tuple[float, str]] = []
    async with RemotingClient() as client:

        async def call() -> None:
            start = trio.current_time()
            try:
                await client.invoke("127.0.0.1:9", RemotingCommand.request(ECHO), timeout_s=1)
            except RemotingTimeoutError as exc:
                finished.append((trio.current_time() - start, str(exc)))

        async with trio.open_nursery() as callers:
            for _ in range(5):
                callers.start_soon(call)
    assert len(finished) == 5
    assert all(elapsed == pytest.approx(1) for elapsed, _ in finished)
    assert "not connected within 1s" in finished[0][1]
    assert len(attempts) == 1  # one attempt, shared


async def test_two_peers_pipelining_big_requests_at_each_other_do_not_stall(
    nursery: trio.Nursery,
) -> None:
    """Both readers keep reading while both sides have megabytes to send."""
    body = b"x" * (1 << 20)
    processors = Processors()
    server, addr = await start_server(nursery, processors)
    server_side: list[Connection] = []
    server.on_connect(server_side.append)
    client_dispatcher = Dispatcher()
    client_dispatcher.register(ECHO, lambda request, conn: request.response_to(body=request.body))
    done = 0

    async def calls(conn: Connection) -> None:
        nonlocal done
        for _ in range(3):
            response = await conn.invoke(RemotingCommand.request(ECHO, body=body), timeout_s=30)
            assert len(response.body) == len(body)
            done += 1

    async with RemotingClient(dispatcher=client_dispatcher) as client:
        client_conn = await client.connection(addr)
        await client.invoke(addr, RemotingCommand.request(ECHO), timeout_s=5)
        with trio.fail_after(60):
            async with trio.open_nursery() as callers:
                for _ in range(16):
                    callers.start_soon(calls, client_conn)
                    callers.start_soon(calls, server_side[0])
    assert done == 96


async def test_a_peer_that_never_reads_its_answers_is_disconnected(nursery: trio.Nursery) -> None:
    processors = Processors()
    server, addr = await start_server(
        nursery, processors, RemotingConfig(max_send_buffer_bytes=1 << 20)
    )
    reasons: list[str] = []
    closed = trio.Event()

    def on_close(conn: Connection) -> None:
        reasons.append(conn.close_reason)
        closed.set()

    server.on_close(on_close)
    peer = await raw_connection(addr)
    request = encode_frame(RemotingCommand(code=ECHO, body=b"y" * 65536))
    with trio.fail_after(30):
        try:
            while True:  # keep asking, never read a byte
                await peer.send_all(request * 16)
        except trio.BrokenResourceError:
            pass  # the server hung up on us
    await peer.aclose()
    with trio.fail_after(10):
        await closed.wait()
    [reason] = reasons
    assert reason.startswith("peer is not reading")
    assert "over max_send_buffer_bytes 1048576" in reason
