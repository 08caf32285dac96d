"""Prometheus metrics over HTTP: ``GET /metrics`` on a port of the process's own.

One ``CollectorRegistry`` per server (never prometheus-client's global one): what it
shows is what the process's parts registered with it, read at scrape time.

The HTTP side is the least a scraper needs, and a stranger cannot make it spend much:
- it binds only the host it is given;
- a request is its request line and headers, at most ``MAX_REQUEST_BYTES`` (8 KiB),
  complete within ``REQUEST_DEADLINE_S`` (10 s), or the connection is closed;
- at most ``MAX_CONNECTIONS`` (16) connections at once; one more is closed at once,
  counted (``refused``) and logged at most 5 lines per 10 s (a RateLimitedLog: a
  scraper gone wild, or a stranger, would otherwise write a line per connection);
- one answer per connection (``Connection: close``): ``GET /metrics`` (or ``/``) gives
  the text format (OpenMetrics when the ``Accept`` header asks for it), a HEAD the same
  headers, any other path 404, any other method 405, a request that does not parse 400,
  a collector that fails 500 (logged): nothing a scraper sends stops the server.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable

import trio
from prometheus_client import CollectorRegistry, ProcessCollector
from prometheus_client.exposition import choose_encoder
from prometheus_client.metrics_core import Metric

from hamq.ratelimit import RateLimitedLog

log = logging.getLogger(__name__)

MAX_REQUEST_BYTES = 8 * 1024
REQUEST_DEADLINE_S = 10.0
MAX_CONNECTIONS = 16
METRICS_PATHS = frozenset({"/metrics", "/"})


class BadRequest(Exception):
    """The bytes a peer sent are not an HTTP request this server answers."""


def parse_request(head: bytes) -> tuple[str, str, dict[str, str]]:
    """(method, path, headers with lower-case names) of a request's head (the bytes
    before the blank line). BadRequest names what is wrong."""
    try:
        text = head.decode("latin-1")
    except UnicodeDecodeError as exc:  # pragma: no cover - latin-1 decodes every byte
        raise BadRequest("not text") from exc
    lines = text.split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/"):
        raise BadRequest(f"bad request line {lines[0][:80]!r}")
    method, target, _version = parts
    headers = {}
    for line in lines[1:]:
        name, colon, value = line.partition(":")
        if not colon or not name or name != name.strip():
            raise BadRequest(f"bad header line {line[:80]!r}")
        headers[name.lower()] = value.strip()
    return method, target.split("?", 1)[0], headers


def _response(status: str, content_type: str, body: bytes, *, head_only: bool = False) -> bytes:
    header = (
        f"HTTP/1.1 {status}\r\n"
        f"Content-Type: {content_type}\r\n"
        f"Content-Length: {len(body)}\r\n"
        "Connection: close\r\n\r\n"
    ).encode("latin-1")
    return header if head_only else header + body


class MetricsServer:
    """Serves ``registry`` on ``host:port`` (port 0: a free one, given to ``started``)."""

    def __init__(self, registry: CollectorRegistry, host: str, port: int) -> None:
        self.registry = registry
        self.host = host
        self.port = port
        self._connections = trio.CapacityLimiter(MAX_CONNECTIONS)
        self.scrapes = 0
        self.refused = 0
        self.warnings = RateLimitedLog(log)

    async def run(self, *, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
        listeners = await trio.open_tcp_listeners(self.port, host=self.host)
        port = listeners[0].socket.getsockname()[1]
        log.info("metrics on http://%s:%d/metrics", self.host, port)
        async with trio.open_nursery() as nursery:
            await nursery.start(trio.serve_listeners, self._serve, listeners)
            task_status.started(port)

    async def _serve(self, stream: trio.SocketStream) -> None:
        try:
            self._connections.acquire_nowait()
        except trio.WouldBlock:
            self.refused += 1
            self.warnings.warning(
                "refused", "metrics: over %d connections; closing one at once", MAX_CONNECTIONS
            )
            await stream.aclose()
            return
        try:
            with trio.move_on_after(REQUEST_DEADLINE_S):
                await stream.send_all(await self._answer(stream))
        except trio.BrokenResourceError:
            pass
        finally:
            self._connections.release()
            await trio.aclose_forcefully(stream)

    async def _answer(self, stream: trio.SocketStream) -> bytes:
        received = b""
        while (end := received.find(b"\r\n\r\n")) < 0 and len(received) <= MAX_REQUEST_BYTES:
            chunk = await stream.receive_some(MAX_REQUEST_BYTES)
            if not chunk:
                return b""
            received += chunk
        if end < 0 or end > MAX_REQUEST_BYTES:
            return _response("431 Request Header Fields Too Large", "text/plain", b"")
        try:
            method, path, headers = parse_request(received[:end])
        except BadRequest as exc:
            return _response("400 Bad Request", "text/plain", f"{exc}\n".encode())
        if method not in ("GET", "HEAD"):
            return _response("405 Method Not Allowed", "text/plain", b"GET or HEAD only\n")
        if path not in METRICS_PATHS:
            return _response("404 Not Found", "text/plain", b"metrics are at /metrics\n")
        try:
            encoder, content_type = choose_encoder(headers.get("accept", ""))
        except Exception:  # (prometheus-client chokes on some Accept parameters)
            encoder, content_type = choose_encoder("")
        try:
            body = encoder(self.registry)
        except Exception:
            log.exception("metrics: a scrape failed")
            return _response("500 Internal Server Error", "text/plain", b"scrape failed\n")
        self.scrapes += 1
        return _response("200 OK", content_type, body, head_only=method == "HEAD")


def new_registry() -> CollectorRegistry:
    """A registry of this server's own, with the process's CPU, memory and open fds."""
    registry = CollectorRegistry(auto_describe=True)
    ProcessCollector(registry=registry)
    return registry


class Snapshot:
    """A collector whose metric families ``collect()`` builds at scrape time, from the
    ``statistics()`` of the services it was given (habit 14: metrics read those)."""

    def __init__(self, collect: Callable[[], Iterable[Metric]]) -> None:
        self._collect = collect

    def collect(self) -> Iterable[Metric]:
        return self._collect()
