"""Send ten messages with tags and keys, and show where each one went.

    make run                          # in one terminal: a master and its slave
    .venv/bin/python examples/producer.py

The nameserver addresses come from HAMQ_NAMESRV (default make run's two,
127.0.0.1:9876;127.0.0.1:9877).
"""

from __future__ import annotations

import os

import trio

from hamq.client import Message, Producer

NAMESRV = os.environ.get("HAMQ_NAMESRV", "127.0.0.1:9876;127.0.0.1:9877")


async def main() -> None:
    async with Producer("example-producer", NAMESRV) as producer:
        for i in range(10):
            message = Message(
                "example-topic",
                f"hello #{i}",
                tags="even" if i % 2 == 0 else "odd",
                keys=[f"order-{i}"],
                properties={"source": "examples/producer.py"},
            )
            result = await producer.send(message)
            print(
                f"sent #{i}: {result.status.value} to {result.queue} "
                f"at offset {result.queue_offset}, id {result.msg_id}"
            )


if __name__ == "__main__":
    trio.run(main)
