"""An echo service on hamq's remoting layer: a server and a client in one Trio nursery.

    .venv/bin/python examples/remoting_echo.py

The server answers request code 1 inline (the fast path) and request code 2 from a task
of its own after a short wait; the client sends both, with MSGPACK and JSON headers.
"""

from __future__ import annotations

import trio

from hamq.protocol import RemotingCommand, SerializeType
from hamq.remoting import Connection, Dispatcher, RemotingClient, RemotingServer

ECHO, SLOW_ECHO = 1, 2


def echo(request: RemotingCommand, conn: Connection) -> RemotingCommand:
    return request.response_to(body=request.body, remark=f"echo to {conn.peer}")


async def slow_echo(request: RemotingCommand, conn: Connection) -> RemotingCommand:
    await trio.sleep(0.1)
    return request.response_to(body=request.body.upper())


async def main() -> None:
    dispatcher = Dispatcher()
    dispatcher.register(ECHO, echo)
    dispatcher.register_async(SLOW_ECHO, slow_echo)
    server = RemotingServer(dispatcher, host="127.0.0.1", port=0)
    async with trio.open_nursery() as nursery:
        port = await nursery.start(server.run)
        addr = f"127.0.0.1:{port}"
        print(f"server listening on {addr}")
        async with RemotingClient() as client:
            for code in (ECHO, SLOW_ECHO):
                for serialize_type in (SerializeType.MSGPACK, SerializeType.JSON):
                    request = RemotingCommand.request(
                        code, body=b"hello hamq", serialize_type=serialize_type
                    )
                    response = await client.invoke(addr, request, timeout_s=3)
                    print(
                        f"code {code} {serialize_type.name:7}: response code {response.code}"
                        f" body {response.body!r} remark {response.remark!r}"
                    )
        server.shutdown(grace_s=1)


if __name__ == "__main__":
    trio.run(main)
