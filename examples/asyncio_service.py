"""An asyncio web service: a message sent per request, and a consumer in the same loop.

    make run                                    # in one terminal: the broker group
    .venv/bin/python examples/asyncio_service.py --port 8080
    curl -X POST --data 'two apples' http://127.0.0.1:8080/orders
    curl 'http://127.0.0.1:8080/send?text=hello'
    curl http://127.0.0.1:8080/recent

A tiny HTTP/1.1 server on asyncio's own streams (``asyncio.start_server``; one request
per connection), a hamq Producer shared by every request, and a PushConsumer whose
async handler runs as a coroutine of the same event loop, keeping the last messages
it consumed:

  POST /orders         the request body becomes a message (tag "order")
  GET  /send?text=...  the text becomes a message (tag "text")
                       both answer the send: {"status", "msg_id", "queue", "queue_offset"}
  GET  /recent         the last --recent messages consumed from --topic, newest first

The topic is created at start (creating is idempotent); the consumer group
(--group) starts with the messages sent from then on, and after a restart goes on
where it stopped. Ctrl-C (or SIGTERM) stops it cleanly: no new connections, the
requests under way answered, the consumer's offsets committed.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import signal
import sys
import time
from http import HTTPStatus
from typing import Any
from urllib.parse import parse_qs, urlsplit

import attrs

from hamq.client import (
    AdminClient,
    ClientError,
    InvalidArgumentError,
    Message,
    MessageExt,
    NoRouteError,
    Producer,
    PushConsumer,
)

#: a request's line and headers, and its body, must arrive within this time
REQUEST_TIMEOUT_S = 10.0
MAX_BODY = 1024 * 1024
MAX_HEADERS = 100
#: how long a stop waits for the requests under way
GRACE_S = 5.0


class HttpError(Exception):
    """A request we answer with ``status`` and a reason, not with a send."""

    def __init__(self, status: HTTPStatus, reason: str) -> None:
        super().__init__(reason)
        self.status = status


@attrs.frozen
class Request:
    method: str
    path: str
    query: dict[str, list[str]]
    body: bytes


@attrs.define
class Service:
    """What the requests share: the producer, the topic, and what the consumer saw."""

    producer: Producer
    topic: str
    recent: collections.deque[dict[str, Any]]

    async def respond(self, request: Request) -> tuple[HTTPStatus, Any]:
        routes = {"/orders": "POST", "/send": "GET", "/recent": "GET"}
        if request.path not in routes:
            raise HttpError(HTTPStatus.NOT_FOUND, f"no such path: {request.path}")
        if request.method != routes[request.path]:
            raise HttpError(
                HTTPStatus.METHOD_NOT_ALLOWED, f"{request.path} takes {routes[request.path]}"
            )
        if request.path == "/recent":
            return HTTPStatus.OK, list(reversed(self.recent))
        if request.path == "/orders":
            return await self.publish(request.body, "order")
        text = (request.query.get("text") or [""])[-1]
        if not text:
            raise HttpError(HTTPStatus.BAD_REQUEST, "GET /send needs ?text=...")
        return await self.publish(text.encode(), "text")

    async def publish(self, body: bytes, tags: str) -> tuple[HTTPStatus, Any]:
        try:
            result = await self.producer.send(Message(self.topic, body, tags=tags))
        except InvalidArgumentError as exc:  # an empty or too large body
            raise HttpError(HTTPStatus.BAD_REQUEST, str(exc)) from None
        except ClientError as exc:  # no broker took it (every attempt is in the text)
            raise HttpError(HTTPStatus.SERVICE_UNAVAILABLE, str(exc)) from None
        return HTTPStatus.OK, {
            "status": result.status.value,
            "msg_id": result.msg_id,
            "queue": str(result.queue),
            "queue_offset": result.queue_offset,
        }

    async def consumed(self, messages: list[MessageExt]) -> None:
        """The PushConsumer's handler: a coroutine of this loop, so it may touch
        ``recent`` without a lock (a plain function would run in a worker thread)."""
        for m in messages:
            self.recent.append(
                {
                    "msg_id": m.msg_id,
                    "topic": m.topic,
                    "queue_id": m.queue_id,
                    "queue_offset": m.queue_offset,
                    "tags": m.tags,
                    "body": m.body.decode(errors="replace"),
                    "stored_at": time.strftime("%X", time.localtime(m.store_timestamp / 1000)),
                }
            )


# ------------------------------------------------------------------ HTTP


async def read_request(reader: asyncio.StreamReader) -> Request:
    """One request: its line, its headers, its body (Content-Length only)."""
    try:
        line = (await reader.readline()).decode("latin-1").rstrip("\r\n")
        method, target, version = line.split(" ")
        if not version.startswith("HTTP/1."):
            raise ValueError(version)
        headers: dict[str, str] = {}
        while header := (await reader.readline()).decode("latin-1").rstrip("\r\n"):
            name, _, value = header.partition(":")
            headers[name.strip().lower()] = value.strip()
            if len(headers) > MAX_HEADERS:
                raise ValueError("too many headers")
        length = int(headers.get("content-length", "0"))
    except (ValueError, asyncio.LimitOverrunError) as exc:  # a line over 64 KiB is one
        raise HttpError(HTTPStatus.BAD_REQUEST, "not an HTTP/1.x request") from exc
    if not 0 <= length <= MAX_BODY:
        raise HttpError(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, f"bodies are 0..{MAX_BODY} bytes")
    url = urlsplit(target)
    body = await reader.readexactly(length)
    return Request(method, url.path, parse_qs(url.query), body)


def response(status: HTTPStatus, payload: Any) -> bytes:
    body = json.dumps(payload).encode() + b"\n"
    head = (
        f"HTTP/1.1 {status.value} {status.phrase}\r\n"
        "Content-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n"
        "Connection: close\r\n\r\n"
    )
    return head.encode() + body


async def serve_connection(
    service: Service, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
) -> None:
    try:
        try:
            async with asyncio.timeout(REQUEST_TIMEOUT_S):
                request = await read_request(reader)
            status, payload = await service.respond(request)
        except HttpError as exc:
            status, payload = exc.status, {"error": str(exc)}
        except TimeoutError:
            status, payload = HTTPStatus.REQUEST_TIMEOUT, {"error": "the request came too slowly"}
        writer.write(response(status, payload))
        await writer.drain()
    except (ConnectionError, asyncio.IncompleteReadError):
        pass  # the client went away
    finally:
        writer.close()


# ------------------------------------------------------------------ the service


async def create_topic(namesrv: str, topic: str) -> None:
    """``topic`` created, and known to the nameserver (so the consumer finds it at once)."""
    async with AdminClient(namesrv) as admin:
        await admin.create_topic(topic, 4)
        async with asyncio.timeout(10):
            while True:
                try:
                    await admin.topic_route(topic)
                    return
                except NoRouteError:
                    await asyncio.sleep(0.1)


async def main(args: argparse.Namespace) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            loop.add_signal_handler(sig, stop.set)
        except NotImplementedError:  # Windows: Ctrl-C raises KeyboardInterrupt there
            pass

    await create_topic(args.namesrv, args.topic)
    consumer = PushConsumer(args.group, args.namesrv)
    consumer.subscribe(args.topic)
    async with Producer(f"{args.group}-producer", args.namesrv) as producer:
        service = Service(producer, args.topic, collections.deque(maxlen=args.recent))
        async with consumer.consuming(service.consumed):
            requests: set[asyncio.Task[None]] = set()

            async def connected(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
                task = asyncio.current_task()
                assert task is not None
                requests.add(task)
                try:
                    await serve_connection(service, reader, writer)
                finally:
                    requests.discard(task)

            server = await asyncio.start_server(connected, args.host, args.port)
            host, port = server.sockets[0].getsockname()[:2]
            print(f"listening on http://{host}:{port} (topic {args.topic})", flush=True)
            await stop.wait()
            server.close()
            if requests:
                await asyncio.wait(requests, timeout=GRACE_S)
    print(f"stopped; consumed {consumer.consumed} message(s)", flush=True)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--namesrv",
        default=os.environ.get("HAMQ_NAMESRV", "127.0.0.1:9876;127.0.0.1:9877"),
        help="nameservers, ;-separated (default: HAMQ_NAMESRV, else make run's two)",
    )
    parser.add_argument("--topic", default="example-web", help="where requests send to")
    parser.add_argument("--group", default="example-web-service", help="the consumer group")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on")
    parser.add_argument("--port", type=int, default=8080, help="port (0: any free one)")
    parser.add_argument("--recent", type=int, default=20, help="messages GET /recent shows")
    args = parser.parse_args()
    if not 0 <= args.port <= 65535:
        parser.error(f"--port {args.port} is not in 0..65535")
    if args.recent < 1:
        parser.error(f"--recent {args.recent}: must be at least 1")
    return args


if __name__ == "__main__":
    arguments = parse_args()
    try:
        asyncio.run(main(arguments))
    except (ClientError, OSError) as exc:  # at start: no nameserver, a port in use ...
        sys.exit(f"asyncio_service: {exc}")
