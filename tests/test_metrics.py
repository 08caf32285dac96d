"""The metrics endpoint: scraped over real HTTP on loopback and parsed with
prometheus-client's own parser; requests a stranger could send are bounded."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
import trio
from prometheus_client import Counter
from prometheus_client.metrics_core import GaugeMetricFamily, Metric
from prometheus_client.parser import text_string_to_metric_families

from hamq.metrics import MetricsServer, Snapshot, new_registry
from hamq.metrics.server import MAX_CONNECTIONS, BadRequest, parse_request


@asynccontextmanager
async def serving(server: MetricsServer) -> AsyncIterator[int]:
    async with trio.open_nursery() as nursery:
        port = await nursery.start(server.run)
        yield port
        nursery.cancel_scope.cancel()


async def http(port: int, request: bytes, host: str = "127.0.0.1") -> bytes:
    """Send ``request`` raw; the whole answer (the server closes after one)."""
    with trio.fail_after(10):
        stream = await trio.open_tcp_stream(host, port)
        async with stream:
            await stream.send_all(request)
            answer = b""
            while chunk := await stream.receive_some(65536):
                answer += chunk
    return answer


def families(answer: bytes) -> dict[str, Metric]:
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 OK"), head
    return {f.name: f for f in text_string_to_metric_families(body.decode())}


async def test_a_scrape_shows_what_was_registered_at_scrape_time() -> None:
    registry = new_registry()
    sent = Counter("hamq_test_sent", "Messages sent", ["topic"], registry=registry)
    depth = [3]

    def snapshot() -> list[Metric]:
        gauge = GaugeMetricFamily("hamq_test_depth", "Depth now", labels=["queue"])
        gauge.add_metric(["0"], depth[0])
        return [gauge]

    registry.register(Snapshot(snapshot))
    server = MetricsServer(registry, "127.0.0.1", 0)
    async with serving(server) as port:
        sent.labels("T").inc(5)
        first = families(await http(port, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"))
        assert first["hamq_test_sent"].samples[0].value == 5
        assert first["hamq_test_sent"].samples[0].labels == {"topic": "T"}
        assert first["hamq_test_depth"].samples[0].value == 3
        assert "process_open_fds" in first  # the process's own figures
        sent.labels("T").inc()
        depth[0] = 7
        second = families(await http(port, b"GET /metrics HTTP/1.0\r\n\r\n"))
        assert second["hamq_test_sent"].samples[0].value == 6
        assert second["hamq_test_depth"].samples[0].value == 7
    assert server.scrapes == 2


async def test_openmetrics_when_asked_and_head_without_a_body() -> None:
    server = MetricsServer(new_registry(), "127.0.0.1", 0)
    async with serving(server) as port:
        open_metrics = await http(
            port, b"GET /metrics HTTP/1.1\r\nAccept: application/openmetrics-text\r\n\r\n"
        )
        assert b"Content-Type: application/openmetrics-text" in open_metrics
        assert open_metrics.rstrip().endswith(b"# EOF")
        head = await http(port, b"HEAD /metrics HTTP/1.1\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200 OK") and head.endswith(b"\r\n\r\n")


@pytest.mark.parametrize(
    ("request_bytes", "status"),
    [
        (b"GET /nothing HTTP/1.1\r\n\r\n", b"404"),
        (b"POST /metrics HTTP/1.1\r\n\r\n", b"405"),
        (b"hello\r\n\r\n", b"400"),
        (b"GET /metrics HTTP/1.1\r\nno colon here\r\n\r\n", b"400"),
        (b"GET /metrics HTTP/1.1\r\n" + b"X: " + b"y" * 10_000 + b"\r\n\r\n", b"431"),
    ],
)
async def test_what_is_not_a_scrape_gets_a_status_and_a_closed_connection(
    request_bytes: bytes, status: bytes
) -> None:
    server = MetricsServer(new_registry(), "127.0.0.1", 0)
    async with serving(server) as port:
        answer = await http(port, request_bytes)
    assert answer.split(b" ")[1] == status
    assert server.scrapes == 0


async def test_connections_over_the_limit_are_closed_at_once_and_others_still_served() -> None:
    server = MetricsServer(new_registry(), "127.0.0.1", 0)
    async with serving(server) as port:
        idle = [await trio.open_tcp_stream("127.0.0.1", port) for _ in range(MAX_CONNECTIONS)]
        try:
            with trio.fail_after(10):
                while server.refused == 0:  # the server sees each idle one in turn
                    extra = await trio.open_tcp_stream("127.0.0.1", port)
                    async with extra:
                        assert await extra.receive_some(10) == b""  # closed at once
        finally:
            for stream in idle:
                await stream.aclose()
        with trio.fail_after(10):
            while True:  # the idle ones' places come free
                answer = await http(port, b"GET /metrics HTTP/1.1\r\n\r\n")
                if answer:
                    break
        assert answer.startswith(b"HTTP/1.1 200 OK")


async def test_the_server_binds_only_the_host_it_is_given() -> None:
    server = MetricsServer(new_registry(), "127.0.0.2", 0)
    async with serving(server) as port:
        answer = await http(port, b"GET / HTTP/1.1\r\n\r\n", host="127.0.0.2")
        assert answer.startswith(b"HTTP/1.1 200 OK")
        with pytest.raises(OSError):
            await trio.open_tcp_stream("127.0.0.1", port)


def test_request_heads_are_parsed_strictly() -> None:
    assert parse_request(b"GET /metrics?x=1 HTTP/1.1\r\nAccept: text/plain") == (
        "GET",
        "/metrics",
        {"accept": "text/plain"},
    )
    for bad in (b"", b"GET /metrics", b"GET / HTTP/1.1\r\n: empty name"):
        with pytest.raises(BadRequest):
            parse_request(bad)
