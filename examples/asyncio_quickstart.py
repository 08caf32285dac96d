"""The client in an asyncio program: create a topic, send, pull, and consume (push).

    make run                          # in one terminal: a master and its slave
    .venv/bin/python examples/asyncio_quickstart.py

hamq.client runs natively on asyncio as well as on Trio: the classes and calls are the
ones of the Trio examples (produce_orders.py's AdminClient, producer.py's Producer,
consumer.py's PushConsumer); only the runner (``asyncio.run``) and asyncio's own Event
and timeout differ. An async handler runs as a coroutine of the program's event loop;
a plain function would run in a worker thread. HAMQ_NAMESRV sets the nameservers
(default make run's two, 127.0.0.1:9876;127.0.0.1:9877).
"""

from __future__ import annotations

import asyncio
import os
import uuid

from hamq.client import (
    AdminClient,
    ConsumeResult,
    Message,
    MessageExt,
    Producer,
    PullConsumer,
    PullStatus,
    PushConsumer,
    SendResult,
)

NAMESRV = os.environ.get("HAMQ_NAMESRV", "127.0.0.1:9876;127.0.0.1:9877")
TOPIC = "example-asyncio"
COUNT = 5


async def admin() -> None:
    """The topic created (creating is idempotent), and the clusters that serve it."""
    async with AdminClient(NAMESRV) as client:
        brokers = await client.create_topic(TOPIC, 4)
        clusters = await client.cluster_info()
    print(f"topic {TOPIC} on {', '.join(brokers)}")
    for cluster, names in sorted(clusters.cluster_addr_table.items()):
        print(f"cluster {cluster}: broker group(s) {', '.join(sorted(names))}")


async def send(run: str) -> list[SendResult]:
    async with Producer("example-asyncio-producer", NAMESRV) as producer:
        results = []
        for i in range(COUNT):
            message = Message(TOPIC, f"{run} hello #{i}", tags="asyncio", keys=[f"{run}-{i}"])
            result = await producer.send(message)
            print(f"sent #{i}: {result.status.value} to {result.queue} at {result.queue_offset}")
            results.append(result)
    return results


async def pull(sent: list[SendResult]) -> None:
    """Each message read back where its send said it went (a PullConsumer keeps no
    offsets of its own: the caller says where to read)."""
    async with PullConsumer("example-asyncio-puller", NAMESRV) as consumer:
        for result in sent:
            found = await consumer.pull(result.queue, result.queue_offset, max_nums=1)
            assert found.status is PullStatus.FOUND, found.status
            print(f"pulled {found.messages[0].body.decode()!r} from {result.queue}")


async def push(run: str) -> None:
    """A consumer group of its own (so it starts from the first offset) until it has
    handled this run's messages."""
    loop = asyncio.get_running_loop()
    received: list[str] = []
    all_here = asyncio.Event()

    async def handle(messages: list[MessageExt]) -> ConsumeResult:
        in_loop = asyncio.get_running_loop() is loop  # a coroutine of this program's loop
        for m in messages:
            if m.body.decode().startswith(run):
                received.append(m.body.decode())
                print(f"pushed {m.body.decode()!r} (handled on the program's loop: {in_loop})")
        if len(received) >= COUNT:
            all_here.set()
        return ConsumeResult.SUCCESS

    consumer = PushConsumer(f"example-asyncio-{run}", NAMESRV, consume_from="FIRST_OFFSET")
    consumer.subscribe(TOPIC, "asyncio")
    async with consumer.consuming(handle):
        try:
            async with asyncio.timeout(30):
                await all_here.wait()
        except TimeoutError:
            print(f"only {len(received)} of {COUNT} messages within 30 s")
    print(f"consumed {len(received)} message(s) of this run")


async def main() -> None:
    run = uuid.uuid4().hex[:8]  # marks this run's messages
    await admin()
    sent = await send(run)
    await pull(sent)
    await push(run)


if __name__ == "__main__":
    asyncio.run(main())
