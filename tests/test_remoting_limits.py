"""Hostile peers against a remoting server: slowloris frames, too many connections,
accept() out of file descriptors, floods of malformed frames, JSON nested 100,000 deep;
and what operators see of them in a broker's metrics.

Real sockets on loopback with small limits; the hostile peers are raw sockets.
"""

from __future__ import annotations

import json
import logging
import struct
import textwrap
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import trio

from hamq.protocol import RemotingCommand, RequestCode, ResponseCode, encode_frame
from hamq.protocol.bodies import BodyError, HeartbeatData, decode_body
from hamq.protocol.headers import DeleteTopicRequestHeader, UnregisterBrokerRequestHeader
from hamq.ratelimit import MAX_LINE_CHARS, RateLimitedLog
from hamq.remoting import (
    Connection,
    Dispatcher,
    RemotingClient,
    RemotingConfig,
    RemotingError,
    RemotingServer,
)
from tests.support.acl import BROKER, acl_text, write_acl
from tests.support.brokers import running_broker
from tests.support.metrics import documented, scrape, value
from tests.support.processes import running
from tests.support.timing import wait_for

ECHO = 1


def echo(request: RemotingCommand, conn: Connection) -> RemotingCommand:
    return request.response_to(body=request.body)


@asynccontextmanager
async def serving(config: RemotingConfig) -> AsyncIterator[tuple[RemotingServer, int]]:
    dispatcher = Dispatcher()
    dispatcher.register(ECHO, echo)
    server = RemotingServer(dispatcher, config=config)
    async with trio.open_nursery() as nursery:
        port = await nursery.start(server.run)
        yield server, port
        nursery.cancel_scope.cancel()


async def echoed(port: int, body: bytes = b"ping") -> bytes:
    async with RemotingClient() as client:
        request = RemotingCommand.request(ECHO, body=body)
        response = await client.invoke(f"127.0.0.1:{port}", request, timeout_s=5)
    return response.body


async def closed_by_server(sock: trio.socket.SocketType) -> bool:
    """Whether the server has closed ``sock`` (EOF or reset), reading what is left."""
    try:
        while await sock.recv(65536):
            pass
    except ConnectionResetError:
        pass
    return True


async def connect(port: int) -> trio.socket.SocketType:
    sock = trio.socket.socket()
    await sock.connect(("127.0.0.1", port))
    return sock


# ---------------------------------------------------------------- slowloris
async def test_a_frame_trickled_a_byte_at_a_time_is_cut_after_frame_timeout() -> None:
    # idle timeout far away: a byte every 50 ms keeps the connection from ever being idle
    config = RemotingConfig(frame_timeout_s=0.5, idle_timeout_s=60)
    async with serving(config) as (server, port):
        frame = encode_frame(RemotingCommand.request(ECHO, body=b"x" * 100))
        with trio.socket.socket() as sock:
            await sock.connect(("127.0.0.1", port))
            cut = trio.Event()

            async def trickle() -> None:
                for byte in frame[:-1]:  # never the last one
                    try:
                        await sock.send(bytes([byte]))
                    except OSError:
                        return
                    await trio.sleep(0.05)

            async def watch() -> None:
                await closed_by_server(sock)
                cut.set()

            started = trio.current_time()
            with trio.fail_after(5):  # the frame alone would take 6 s to trickle
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(trickle)
                    await watch()
                    nursery.cancel_scope.cancel()
            assert cut.is_set()
            assert trio.current_time() - started >= 0.5
        # (the socket closes before the server's task has forgotten the connection)
        await wait_for(lambda: server.statistics().connections == 0, 5)


async def watchdog_pass(conn: Connection) -> None:
    """Until ``conn``'s watchdog has looked at it once more (from now on)."""
    passes = conn.statistics().watchdog_passes
    await wait_for(lambda: conn.statistics().watchdog_passes > passes)


async def received(conn: Connection, total: int) -> None:
    """Until ``conn`` has read ``total`` bytes."""
    await wait_for(lambda: conn.statistics().bytes_received >= total)


async def test_frames_completed_in_time_and_idle_pauses_are_not_cut() -> None:
    config = RemotingConfig(frame_timeout_s=1.0, idle_timeout_s=60)
    async with serving(config) as (server, port):
        with trio.socket.socket() as sock:
            await sock.connect(("127.0.0.1", port))
            await wait_for(lambda: len(server.connections) == 1)
            [conn] = server.connections
            sent = 0
            for _ in range(2):
                frame = encode_frame(RemotingCommand.request(ECHO, body=b"y" * 50))
                await sock.send(frame[:10])
                await received(conn, sent + 10)
                await watchdog_pass(conn)  # it saw the frame begun, well within its time
                await sock.send(frame[10:])
                sent += len(frame)
                with trio.fail_after(5):
                    assert await sock.recv(65536)
                # whole frames only: a pause longer than frame_timeout_s is no offence
                await trio.sleep(1.5)
                await watchdog_pass(conn)  # judged after the pause
                assert not conn.closed, conn.close_reason
            assert server.statistics().connections == 1


# ---------------------------------------------------------------- max_connections
async def test_max_connections_closes_the_excess_and_serves_again_when_they_leave(
    caplog: pytest.LogCaptureFixture,
) -> None:
    config = RemotingConfig(max_connections=3)
    async with serving(config) as (server, port):
        held = [await connect(port) for _ in range(3)]
        await wait_for(lambda: server.statistics().connections == 3)
        with trio.fail_after(5):
            extra = await connect(port)
            assert await closed_by_server(extra)  # closed at once, not served
            extra.close()
            with pytest.raises(RemotingError):
                await echoed(port)
        assert server.statistics().connections_refused >= 2
        assert "max_connections 3 are open" in caplog.text
        for sock in held[:1]:
            sock.close()
        await wait_for(lambda: server.statistics().connections == 2)
        with trio.fail_after(5):
            assert await echoed(port) == b"ping"
        for sock in held[1:]:
            sock.close()


# ---------------------------------------------------------------- EMFILE
EMFILE_SERVER = textwrap.dedent(
    """
    import logging, os, resource, sys, trio
    from hamq.remoting import Dispatcher, RemotingServer
    logging.basicConfig(filename=sys.argv[1], level=logging.INFO)

    async def main():
        dispatcher = Dispatcher()
        dispatcher.register(1, lambda request, conn: request.response_to(body=b"pong"))
        server = RemotingServer(dispatcher)
        async with trio.open_nursery() as nursery:
            port = await nursery.start(server.run)
            # a few descriptors to spare: the fourth peer or so meets EMFILE in accept()
            in_use = len(os.listdir("/proc/self/fd"))
            hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
            resource.setrlimit(resource.RLIMIT_NOFILE, (in_use + 3, hard))
            print(port, flush=True)
            said = 0
            while True:  # (for the test: how many accept failures were not logged)
                await trio.sleep(0.05)
                if server.warnings.suppressed.get("accept", 0) != said:
                    said = server.warnings.suppressed["accept"]
                    logging.info("%s %d", NOT_LOGGED, said)

    trio.run(main)
    """
)
#: the EMFILE server's line saying how many failed accepts it did not log
NOT_LOGGED = "accept failures not logged:"


@pytest.mark.slow
async def test_accept_out_of_file_descriptors_logs_a_few_lines_and_recovers(
    tmp_path: Path,
) -> None:
    log_file = tmp_path / "server.log"
    code = EMFILE_SERVER.replace("sys.argv[1]", repr(str(log_file)))
    code = code.replace("NOT_LOGGED", repr(NOT_LOGGED))

    def failed_accepts() -> int:
        """Accept failures so far: the lines logged and the count of those not logged."""
        lines = log_file.read_text().splitlines() if log_file.exists() else []
        counts = [int(line.split(NOT_LOGGED)[1]) for line in lines if NOT_LOGGED in line]
        return sum("EMFILE" in line for line in lines) + max(counts, default=0)

    async with running(code) as (_pid, port):
        peers = [await connect(port) for _ in range(12)]
        # a flood: 15 failed accepts (one try per 100 ms), 5 lines' worth and more
        await wait_for(lambda: failed_accepts() >= 15, 30)
        for sock in peers:
            sock.close()
        with trio.fail_after(10):
            while True:  # served again once descriptors are free
                try:
                    assert await echoed(port) == b"pong"
                    break
                except RemotingError:
                    await trio.sleep(0.1)
    lines = [line for line in log_file.read_text().splitlines() if "EMFILE" in line]
    assert 1 <= len(lines) <= 5, lines
    assert "Traceback" not in log_file.read_text()


# ---------------------------------------------------------------- rate-limited logs
async def test_a_flood_of_malformed_frames_logs_a_few_lines(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING)
    async with serving(RemotingConfig()) as (server, port):
        for _ in range(30):
            with trio.socket.socket() as sock:
                await sock.connect(("127.0.0.1", port))
                await sock.send(b"\x00\x00\x00\x02ab")  # a frame shorter than any header
                with trio.fail_after(5):
                    assert await closed_by_server(sock)
        await wait_for(lambda: server.statistics().connections == 0)
        assert await echoed(port) == b"ping"  # the server carries on
    warnings = [r for r in caplog.records if "closing connection with" in r.getMessage()]
    assert 1 <= len(warnings) <= 5
    assert server.warnings.suppressed["protocol"] == 30 - len(warnings)


async def test_a_warning_quoting_a_megabyte_of_the_peer_is_one_short_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING)
    key = "k" * 1_000_000
    header = json.dumps({"code": ECHO, "flag": 0, "opaque": 1, "extFields": {key: [1]}})
    frame = struct.pack(">ii", 4 + len(header), len(header)) + header.encode()
    async with serving(RemotingConfig(max_frame_length=2**24)) as (_, port):
        with trio.socket.socket() as sock:
            await sock.connect(("127.0.0.1", port))
            await sock.send(frame)
            with trio.fail_after(5):
                assert await closed_by_server(sock)
    [line] = [r.getMessage() for r in caplog.records if "closing connection with" in r.getMessage()]
    assert "extFields value for 'kkk" in line
    assert len(line) < MAX_LINE_CHARS + 100 and line.endswith("characters cut)")


def test_rate_limited_log_says_how_many_lines_it_held_back(
    caplog: pytest.LogCaptureFixture,
) -> None:
    now = [0.0]
    limited = RateLimitedLog(
        logging.getLogger("test.ratelimit"), interval_s=10, burst=2, clock=lambda: now[0]
    )
    caplog.set_level(logging.WARNING, "test.ratelimit")
    written = [limited.warning("bad", "bad frame %d", i) for i in range(5)]
    assert written == [True, True, False, False, False]
    assert limited.warning("other", "another kind")  # kinds are counted apart
    now[0] = 10.0
    assert limited.warning("bad", "bad frame %d", 5)
    messages = [r.getMessage() for r in caplog.records]
    assert messages == [
        "bad frame 0",
        "bad frame 1",
        "another kind",
        "bad frame 5 (3 more like this not logged before it)",
    ]


# ---------------------------------------------------------------- deep JSON
def test_a_body_nested_100000_deep_is_a_body_error() -> None:
    for body in (b"[" * 100_000, b"{0:" * 100_000):  # JSON, and fastjson's map syntax
        with pytest.raises(BodyError, match="nested too deeply"):
            decode_body(HeartbeatData, body)


async def test_a_deeply_nested_body_gets_one_clean_answer(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async with running_broker(tmp_path) as node, RemotingClient() as client:
        for _ in range(3):
            request = RemotingCommand.request(RequestCode.HEART_BEAT, body=b"[" * 100_000)
            response = await client.invoke(node.address, request, timeout_s=5)
            assert response.code == ResponseCode.INVALID_PARAMETER
            assert response.remark == "HeartbeatData body is nested too deeply"
    assert not [r for r in caplog.records if r.exc_info or "RecursionError" in r.getMessage()]


# ---------------------------------------------------------------- what operators see
async def test_what_hostile_peers_did_shows_in_the_broker_metrics(tmp_path: Path) -> None:
    """A broker with ACL on, an HA secret and max_connections 3, and its embedded
    nameserver: an unsigned request to each, a stranger on the HA port, both listeners
    filled past their cap. The broker's metrics count each of them, by listener and by
    reason, and the README names every family."""
    acl = write_acl(tmp_path / "plain_acl.yml", acl_text())
    async with (
        running_broker(
            tmp_path / "store",
            acl_enable=True,
            acl_file=str(acl),
            access_key=BROKER.access_key,
            secret_key=BROKER.secret_key,
            ha={"secret": "a-long-random-secret-of-group-a", "connect_timeout_s": 30},
            remoting={"max_connections": 3},
            metrics_port=0,
        ) as node,
        RemotingClient() as client,
    ):
        assert node.metrics_port is not None and node.ha_service is not None
        ha = node.ha_service
        unsigned = RemotingCommand.request(
            RequestCode.DELETE_TOPIC_IN_BROKER, DeleteTopicRequestHeader("Demo")
        )
        assert (await client.invoke(node.address, unsigned, 5)).code == ResponseCode.NO_PERMISSION
        register = RemotingCommand.request(
            RequestCode.UNREGISTER_BROKER,
            UnregisterBrokerRequestHeader("broker-a", node.address, "DefaultCluster", 0),
        )
        answer = await client.invoke(node.namesrv_addrs[0], register, 5)
        assert answer.code == ResponseCode.NO_PERMISSION
        ha_host, ha_port = ha.address.rsplit(":", 1)
        with trio.socket.socket() as stranger:
            await stranger.connect((ha_host, int(ha_port)))
            await stranger.send(struct.pack(">q", 0))  # a report, not the secret's proof
            await wait_for(lambda: ha.refused_peers == 1)
        held = []
        try:
            for port in (node.ctx.port, int(ha_port)):  # each listener full, and one more
                open_now = 1 if port == node.ctx.port else 0  # (the client's connection)
                held += [await connect(port) for _ in range(3 - open_now)]
                with trio.fail_after(5):
                    assert await closed_by_server(await connect(port))
            await wait_for(lambda: ha.statistics().connections_refused >= 1)
            shown = await scrape(node.metrics_port)
        finally:
            for sock in held:
                sock.close()
    broker = "hamq_broker_"
    assert value(shown, broker + "connections_refused", "_total", listener="remoting") >= 1
    assert value(shown, broker + "connections_refused", "_total", listener="ha") >= 1
    assert value(shown, broker + "tls_handshake_failures", "_total", listener="ha") == 0
    assert value(shown, broker + "ha_peers_refused", "_total") == 1
    assert value(shown, broker + "acl_refused", "_total", reason="unsigned") == 1
    assert value(shown, "hamq_nameserver_acl_refused", "_total", reason="unsigned") == 1
    assert value(shown, "hamq_nameserver_connections_refused", "_total") == 0
    assert documented(shown) == []
