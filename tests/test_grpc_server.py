"""hamq/grpc/server.py: gRPC over HTTP/2 on Trio, against grpcio's own client (in a
thread) and a raw h2 client for what grpcio would never send.

The methods served here use protobuf's well-known StringValue, so the transport is
tested apart from RocketMQ's messages. Loopback, ports free at run time.
"""

from __future__ import annotations

import socket
import urllib.parse
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import grpc
import h2.config
import h2.connection
import h2.events
import pytest
import trio
from google.protobuf.wrappers_pb2 import StringValue

from hamq.grpc import Call, GrpcConfig, GrpcError, GrpcServer, Method, MethodKind, Status
from hamq.grpc.server import parse_timeout
from hamq.remoting import RemotingConfig
from hamq.remoting.tls import TlsConfig
from tests.support.timing import wait_for
from tests.support.tls import server_files

pytestmark = [pytest.mark.slow]


class Served:
    """The test's methods, and what they saw."""

    def __init__(self) -> None:
        self.cancelled = trio.Event()
        self.started = trio.Event()
        self.release = trio.Event()
        self.metadata: dict[str, str] = {}
        #: the Later calls held for the test to answer
        self.held: list[tuple[StringValue, Call]] = []
        self.held_one = trio.Event()

    async def echo(self, request: StringValue, call: Call) -> StringValue:
        self.metadata = call.metadata
        if request.value == "refuse":
            raise GrpcError(Status.PERMISSION_DENIED, "not you: 100% sure")
        if request.value == "crash":
            raise RuntimeError("boom")
        return StringValue(value=f"echo {request.value}")

    async def count(self, request: StringValue, call: Call) -> None:
        for i in range(int(request.value)):
            await call.send(StringValue(value=str(i)))

    async def chat(self, _request: None, call: Call) -> None:
        while (message := await call.receive()) is not None:
            await call.send(StringValue(value=message.value.upper()))

    async def hang(self, _request: StringValue, _call: Call) -> None:
        self.started.set()
        try:
            await trio.sleep_forever()
        finally:
            self.cancelled.set()

    async def slow(self, _request: StringValue, call: Call) -> None:
        await call.send(StringValue(value="0"))
        await self.release.wait()
        await call.send(StringValue(value="1"))

    async def big(self, request: StringValue, _call: Call) -> StringValue:
        return StringValue(value="x" * int(request.value))

    def later(self, request: StringValue, call: Call) -> None:
        """(UNARY_CALLBACK) answered here, or refused, or held for the test."""
        if request.value == "refuse":
            raise GrpcError(Status.PERMISSION_DENIED, "not you either")
        if request.value == "crash":
            raise RuntimeError("boom later")
        if request.value.startswith("now"):
            call.answer(StringValue(value=f"at once {request.value}"))
        elif request.value == "at the read's end":
            call.at_read_end(lambda: call.answer(StringValue(value="after the read")))
        elif request.value.isdigit():
            call.answer(StringValue(value="z" * int(request.value)))
        else:
            self.held.append((request, call))
            self.held_one.set()

    def methods(self) -> dict[str, Method]:
        def method(kind: MethodKind, fn: Callable[..., Any]) -> Method:
            return Method(kind, StringValue, fn)

        return {
            "/t.T/Echo": method(MethodKind.UNARY, self.echo),
            "/t.T/Count": method(MethodKind.SERVER_STREAMING, self.count),
            "/t.T/Chat": method(MethodKind.BIDI, self.chat),
            "/t.T/Hang": method(MethodKind.SERVER_STREAMING, self.hang),
            "/t.T/Big": method(MethodKind.UNARY, self.big),
            "/t.T/Slow": method(MethodKind.SERVER_STREAMING, self.slow),
            "/t.T/Later": method(MethodKind.UNARY_CALLBACK, self.later),
        }


@asynccontextmanager
async def serving(
    config: GrpcConfig | None = None,
) -> AsyncIterator[tuple[GrpcServer, Served, str]]:
    served = Served()
    server = GrpcServer(served.methods(), config=config)
    async with trio.open_nursery() as nursery:
        port = await nursery.start(server.run)
        try:
            yield server, served, f"127.0.0.1:{port}"
        finally:
            nursery.cancel_scope.cancel()


def _encode(message: StringValue) -> bytes:
    return message.SerializeToString()


def stub(channel: grpc.Channel, path: str, kind: str = "unary_unary") -> Any:
    factory = getattr(channel, kind)
    return factory(path, request_serializer=_encode, response_deserializer=StringValue.FromString)


async def in_thread(fn: Callable[[], Any]) -> Any:
    return await trio.to_thread.run_sync(fn, abandon_on_cancel=True)


def test_grpc_timeout_reads_every_unit() -> None:
    assert parse_timeout("5S") == 5.0
    assert parse_timeout("250m") == 0.25
    assert parse_timeout("2M") == 120.0
    assert parse_timeout("1H") == 3600.0
    assert parse_timeout("100u") == pytest.approx(1e-4)
    for bad in ("", "5", "S", "123456789S", "5s", "-1S"):
        with pytest.raises(ValueError, match="grpc-timeout"):
            parse_timeout(bad)


async def test_unary_streaming_and_bidi_calls_are_answered() -> None:
    async with serving() as (_server, served, address):

        def calls() -> tuple[Any, ...]:
            with grpc.insecure_channel(address) as channel:
                echo = stub(channel, "/t.T/Echo")(
                    StringValue(value="hi"), metadata=[("x-mq-client-id", "c1")], timeout=10
                )
                counted = [
                    m.value
                    for m in stub(channel, "/t.T/Count", "unary_stream")(
                        StringValue(value="5"), timeout=10
                    )
                ]
                chatted = [
                    m.value
                    for m in stub(channel, "/t.T/Chat", "stream_stream")(
                        iter([StringValue(value="a"), StringValue(value="b")]), timeout=10
                    )
                ]
                return echo.value, counted, chatted

        echo, counted, chatted = await in_thread(calls)
    assert echo == "echo hi"
    assert served.metadata["x-mq-client-id"] == "c1"
    assert counted == ["0", "1", "2", "3", "4"]
    assert chatted == ["A", "B"]


async def test_errors_come_back_as_statuses_and_the_connection_carries_on() -> None:
    async with serving() as (_server, _served, address):

        def calls() -> list[tuple[grpc.StatusCode, str]]:
            seen = []
            with grpc.insecure_channel(address) as channel:
                for path, value in [
                    ("/t.T/Echo", "refuse"),
                    ("/t.T/Echo", "crash"),
                    ("/t.T/Nope", "x"),
                ]:
                    with pytest.raises(grpc.RpcError) as caught:
                        stub(channel, path)(StringValue(value=value), timeout=10)
                    seen.append((caught.value.code(), caught.value.details()))
                raw = channel.unary_unary(
                    "/t.T/Echo", request_serializer=None, response_deserializer=None
                )
                with pytest.raises(grpc.RpcError) as caught:
                    raw(b"\xff\xff\xff", timeout=10)  # (not a StringValue)
                seen.append((caught.value.code(), caught.value.details()))
                seen.append(
                    (
                        grpc.StatusCode.OK,
                        stub(channel, "/t.T/Echo")(StringValue(value="still"), timeout=10).value,
                    )
                )
            return seen

        seen = await in_thread(calls)
    assert seen[0] == (grpc.StatusCode.PERMISSION_DENIED, "not you: 100% sure")
    assert seen[1][0] == grpc.StatusCode.INTERNAL and "boom" in seen[1][1]
    assert seen[2] == (grpc.StatusCode.UNIMPLEMENTED, "unknown method /t.T/Nope")
    assert seen[3][0] == grpc.StatusCode.INVALID_ARGUMENT
    assert "google.protobuf.StringValue" in seen[3][1]
    assert seen[4] == (grpc.StatusCode.OK, "echo still")


async def test_a_deadline_and_a_cancel_end_the_call_on_the_server() -> None:
    async with serving() as (_server, served, address):

        def past_deadline() -> grpc.StatusCode:
            with grpc.insecure_channel(address) as channel:
                responses = stub(channel, "/t.T/Hang", "unary_stream")(
                    StringValue(value=""), timeout=0.5
                )
                with pytest.raises(grpc.RpcError) as caught:
                    list(responses)
                return caught.value.code()

        assert await in_thread(past_deadline) == grpc.StatusCode.DEADLINE_EXCEEDED
        with trio.fail_after(10):
            await served.cancelled.wait()

        served.cancelled = trio.Event()
        served.started = trio.Event()
        with grpc.insecure_channel(address) as channel:
            responses = stub(channel, "/t.T/Hang", "unary_stream")(StringValue(value=""))
            with trio.fail_after(10):
                await served.started.wait()
            responses.cancel()  # (RST_STREAM)
            with trio.fail_after(10):
                await served.cancelled.wait()


async def test_a_method_answered_by_callback() -> None:
    async with serving() as (server, served, address):
        with grpc.insecure_channel(address) as channel:
            later = stub(channel, "/t.T/Later")

            def refused(value: str) -> tuple[grpc.StatusCode, str]:
                with pytest.raises(grpc.RpcError) as caught:
                    later(StringValue(value=value), timeout=10)
                return caught.value.code(), caught.value.details()

            assert await in_thread(lambda: later(StringValue(value="now"), timeout=10).value) == (
                "at once now"
            )
            assert await in_thread(lambda: refused("refuse")) == (
                grpc.StatusCode.PERMISSION_DENIED,
                "not you either",
            )
            code, details = await in_thread(lambda: refused("crash"))
            assert code == grpc.StatusCode.INTERNAL and "boom later" in details
            # an answer past the stream's flow-control window (65,535 bytes): it waits
            # in a task for the client to open the window
            big = await in_thread(lambda: later(StringValue(value="300000"), timeout=10).value)
            assert big == "z" * 300_000

            # answered once the read that brought the request is handled
            at_end = StringValue(value="at the read's end")
            assert await in_thread(lambda: later(at_end, timeout=10).value) == "after the read"

            # answered later, from another task (outside a read: at_read_end at once)
            future = later.future(StringValue(value="hold"), timeout=10)
            with trio.fail_after(10):
                await served.held_one.wait()
            request, call = served.held.pop()
            assert request.value == "hold" and call.active
            call.at_read_end(lambda: call.answer(StringValue(value="from elsewhere")))
            assert (await in_thread(lambda: future.result(10))).value == "from elsewhere"

            # the client gives up first: the answer is dropped, the connection goes on
            served.held_one = trio.Event()
            with pytest.raises(grpc.RpcError) as caught:
                await in_thread(lambda: later(StringValue(value="hold"), timeout=0.5))
            assert caught.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
            _request, call = served.held.pop()
            await wait_for(lambda: not call.active, what="the reset reaching the call")
            call.answer(StringValue(value="too late"))
            assert await in_thread(lambda: later(StringValue(value="now 2"), timeout=10).value) == (
                "at once now 2"
            )
        assert server.statistics().calls_open == 0


async def test_a_callback_request_longer_than_a_read_waits_for_its_end() -> None:
    config = GrpcConfig(remoting=RemotingConfig(frame_timeout_s=0.5))
    async with serving(config) as (server, _served, address):
        client = RawClient(address)
        stream_id = client.open_stream("/t.T/Later")
        payload = StringValue(value="now split").SerializeToString()
        message = b"\0" + len(payload).to_bytes(4, "big") + payload
        client.h2.send_data(stream_id, message[:7])
        client.flush()
        await wait_for(lambda: server.statistics().calls == 1, what="the call begun")
        client.h2.send_data(stream_id, message[7:], end_stream=True)
        client.flush()
        assert (await in_thread(lambda: client.trailers(stream_id)))["grpc-status"] == "0"
        # one that never ends is answered DEADLINE_EXCEEDED after frame_timeout_s
        never = client.open_stream("/t.T/Later")
        client.h2.send_data(never, message[:7])
        client.flush()
        found = await in_thread(lambda: client.trailers(never))
        client.sock.close()
    assert found["grpc-status"] == str(int(Status.DEADLINE_EXCEEDED)), found
    assert "not complete" in urllib.parse.unquote(found["grpc-message"])


async def test_oversized_messages_end_their_call_alone() -> None:
    config = GrpcConfig(max_message_bytes=4096)
    async with serving(config) as (_server, _served, address):

        def calls() -> list[grpc.StatusCode]:
            codes = []
            with grpc.insecure_channel(address) as channel:
                for path, value in [("/t.T/Echo", "y" * 10_000), ("/t.T/Big", "10000")]:
                    with pytest.raises(grpc.RpcError) as caught:
                        stub(channel, path)(StringValue(value=value), timeout=10)
                    codes.append(caught.value.code())
                ok = stub(channel, "/t.T/Echo")(StringValue(value="small"), timeout=10)
                assert ok.value == "echo small"
            return codes

        codes = await in_thread(calls)
    assert codes == [grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.RESOURCE_EXHAUSTED]


def closed_by_peer(sock: socket.socket, timeout_s: float = 10.0) -> bool:
    sock.settimeout(timeout_s)
    try:
        while sock.recv(65536):
            pass
    except TimeoutError:
        return False
    except OSError:
        return True
    return True


@pytest.mark.parametrize(
    "junk",
    [
        b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
        b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + bytes(64),  # a TLS ClientHello
        bytes(range(256)),
    ],
)
async def test_bytes_that_are_not_http2_end_their_connection_alone(junk: bytes) -> None:
    async with serving() as (server, _served, address):
        host, port = address.split(":")
        with socket.create_connection((host, int(port)), timeout=10) as sock:
            sock.sendall(junk)
            assert await in_thread(lambda: closed_by_peer(sock))

        def echo() -> str:
            with grpc.insecure_channel(address) as channel:
                return str(stub(channel, "/t.T/Echo")(StringValue(value="ok"), timeout=10).value)

        assert await in_thread(echo) == "echo ok"
        assert server.statistics().protocol_errors == 1


class RawClient:
    """An HTTP/2 client that does what it is told, limits or not."""

    def __init__(self, address: str) -> None:
        host, port = address.split(":")
        self.sock = socket.create_connection((host, int(port)), timeout=10)
        self.h2 = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
        self.h2.initiate_connection()
        self.sock.sendall(self.h2.data_to_send())
        #: stream id -> the headers that ended it
        self.ended: dict[int, dict[str, str]] = {}

    def open_stream(
        self, path: str = "/t.T/Hang", content_type: str = "application/grpc", method: str = "POST"
    ) -> int:
        stream_id = self.h2.get_next_available_stream_id()
        self.h2.send_headers(
            stream_id,
            [
                (":method", method),
                (":scheme", "http"),
                (":path", path),
                (":authority", "x"),
                ("content-type", content_type),
            ],
        )
        return stream_id

    def trailers(self, stream_id: int) -> dict[str, str]:
        """The headers that end ``stream_id`` (its trailers, or a Trailers-Only answer)."""
        for _ in range(50):
            if stream_id in self.ended:
                return self.ended[stream_id]
            for event in self.events():
                kinds = h2.events.ResponseReceived | h2.events.TrailersReceived
                if isinstance(event, kinds):
                    found = {k.decode(): v.decode() for k, v in event.headers}
                    if "grpc-status" in found:
                        self.ended[event.stream_id] = found
        return {}

    def flush(self) -> None:
        self.sock.sendall(self.h2.data_to_send())

    def events(self) -> list[h2.events.Event]:
        data = self.sock.recv(65536)
        if not data:
            return [h2.events.ConnectionTerminated()]
        return list(self.h2.receive_data(data))


async def test_too_many_streams_end_that_connection_with_a_goaway() -> None:
    config = GrpcConfig(max_concurrent_streams=4)
    async with serving(config) as (_server, _served, address):
        client = RawClient(address)
        # (told the limit, the client's state machine would refuse: lift it)
        client.h2.remote_settings.max_concurrent_streams = 100
        for _ in range(5):
            client.open_stream()
        client.flush()

        def goaway() -> bool:
            for _ in range(50):
                for event in client.events():
                    if isinstance(event, h2.events.ConnectionTerminated):
                        return True
            return False

        assert await in_thread(goaway)
        client.sock.close()


async def test_a_request_that_never_ends_is_answered_deadline_exceeded() -> None:
    config = GrpcConfig(remoting=RemotingConfig(frame_timeout_s=0.5))
    async with serving(config) as (_server, _served, address):
        client = RawClient(address)
        stream_id = client.open_stream("/t.T/Echo")
        client.flush()  # (headers, and never a message or END_STREAM)

        found = await in_thread(lambda: client.trailers(stream_id))
        client.sock.close()
    assert found["grpc-status"] == str(int(Status.DEADLINE_EXCEEDED))


async def test_a_wrong_content_type_or_method_ends_its_stream_alone() -> None:
    async with serving() as (_server, _served, address):
        client = RawClient(address)
        text = client.open_stream("/t.T/Echo", content_type="text/plain")
        get = client.open_stream("/t.T/Echo", method="GET")
        client.flush()
        by_text = await in_thread(lambda: client.trailers(text))
        by_get = await in_thread(lambda: client.trailers(get))
        assert by_text["grpc-status"] == str(int(Status.UNKNOWN)), by_text
        assert "text/plain" in by_text["grpc-message"]
        assert by_get["grpc-status"] == str(int(Status.UNIMPLEMENTED)), by_get
        # the connection carries on: a good call on it is answered
        good = client.open_stream("/t.T/Echo")
        payload = StringValue(value="after").SerializeToString()
        client.h2.send_data(
            good, b"\0" + len(payload).to_bytes(4, "big") + payload, end_stream=True
        )
        client.flush()
        assert (await in_thread(lambda: client.trailers(good)))["grpc-status"] == "0"
        client.sock.close()


async def test_an_idle_connection_is_closed() -> None:
    config = GrpcConfig(remoting=RemotingConfig(idle_timeout_s=0.5))
    async with serving(config) as (server, _served, address):
        client = RawClient(address)
        assert await in_thread(lambda: closed_by_peer(client.sock))
        client.sock.close()
        await wait_for(lambda: server.statistics().connections == 0)


async def test_shutdown_lets_the_call_under_way_finish_and_refuses_new_ones() -> None:
    async with serving() as (server, served, address):
        host, port = address.split(":")
        with grpc.insecure_channel(address) as channel:
            streaming = stub(channel, "/t.T/Slow", "unary_stream")(StringValue(value=""))
            assert await in_thread(lambda: next(streaming).value) == "0"
            server.shutdown(grace_s=10)
            # the listener is closed at once: a new peer is refused
            await wait_for(lambda: _refused(host, int(port)))
            served.release.set()
            rest = await in_thread(lambda: [m.value for m in streaming])
        assert rest == ["1"]
        await wait_for(lambda: server.statistics().connections == 0)


def _refused(host: str, port: int) -> bool:
    try:
        socket.create_connection((host, port), timeout=1).close()
    except ConnectionRefusedError:
        return True
    return False


async def test_tls_with_alpn_h2(tmp_path: Path) -> None:
    files = server_files(tmp_path)
    tls = TlsConfig(cert_file=files.cert, key_file=files.key)
    config = GrpcConfig(remoting=RemotingConfig(tls=tls))
    async with serving(config) as (server, _served, address):
        assert server.tls

        def echo() -> str:
            credentials = grpc.ssl_channel_credentials(root_certificates=files.ca.read_bytes())
            with grpc.secure_channel(address, credentials) as channel:
                return str(stub(channel, "/t.T/Echo")(StringValue(value="tls"), timeout=10).value)

        assert await in_thread(echo) == "echo tls"
