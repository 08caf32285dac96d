"""A remoting server killed with -9 while requests wait on it."""

from __future__ import annotations

import os
import signal

import trio
import trio.testing

from hamq.protocol import RemotingCommand
from hamq.remoting import RemotingClient, RemotingConnectionClosed
from tests.support.processes import running

HOLD = 5

SERVER = """
import trio
from hamq.remoting import Dispatcher, RemotingServer

async def hold(request, conn):
    await trio.sleep_forever()

async def main():
    dispatcher = Dispatcher()
    dispatcher.register_async(5, hold)
    dispatcher.register(1, lambda request, conn: request.response_to())
    server = RemotingServer(dispatcher, host="127.0.0.1", port=0)
    async with trio.open_nursery() as nursery:
        port = await nursery.start(server.run)
        print(port, flush=True)

trio.run(main)
"""


async def test_kill_9_fails_every_pending_request_at_once() -> None:
    async with running(SERVER) as (pid, port), RemotingClient() as client:
        addr = f"127.0.0.1:{port}"
        await client.invoke(addr, RemotingCommand.request(1), timeout_s=10)
        conn = client.connections[addr]
        failures: list[Exception] = []

        async def wait_on_server() -> None:
            try:
                await client.invoke(addr, RemotingCommand.request(HOLD), timeout_s=600)
            except RemotingConnectionClosed as exc:
                failures.append(exc)

        with trio.fail_after(20):  # the requests' own timeout is 600 s
            async with trio.open_nursery() as requests:
                for _ in range(20):
                    requests.start_soon(wait_on_server)
                await trio.testing.wait_all_tasks_blocked()
                assert conn.statistics().pending == 20
                os.kill(pid, signal.SIGKILL)
        assert len(failures) == 20
        assert all(addr in str(failure) for failure in failures)
