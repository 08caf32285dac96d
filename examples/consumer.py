"""Consume example-topic as a member of a consumer group, until it has been idle a while.

    .venv/bin/python examples/producer.py   # something to consume
    .venv/bin/python examples/consumer.py

A PushConsumer: the broker tells it which queues are its share of the group; it
long-polls them, hands messages to ``handle``, and commits its offsets, so running it
again shows only what arrived in between. Start two at once to watch them split the
queues. HAMQ_NAMESRV sets the nameservers (default make run's two,
127.0.0.1:9876;127.0.0.1:9877).
"""

from __future__ import annotations

import os

import trio

from hamq.client import ConsumeResult, MessageExt, PushConsumer

NAMESRV = os.environ.get("HAMQ_NAMESRV", "127.0.0.1:9876;127.0.0.1:9877")
IDLE_EXIT_S = float(os.environ.get("IDLE_EXIT_S", "3"))


async def main() -> None:
    consumer = PushConsumer("example-consumers", NAMESRV, consume_from="FIRST_OFFSET")
    consumer.subscribe("example-topic", "even || odd")
    received = 0
    last = trio.current_time()

    async def handle(messages: list[MessageExt]) -> ConsumeResult:
        nonlocal received, last
        for m in messages:
            received += 1
            print(f"got {m.body.decode()!r} tags={m.tags} keys={m.keys} from queue {m.queue_id}")
        last = trio.current_time()
        return ConsumeResult.SUCCESS

    async with consumer.consuming(handle):
        print("consuming queues:", ", ".join(str(q) for q in consumer.assigned))
        quiet_until = last + IDLE_EXIT_S
        while quiet_until > trio.current_time():
            await trio.sleep_until(quiet_until)
            quiet_until = last + IDLE_EXIT_S  # later if messages came meanwhile
    print(f"consumed {received} message(s); offsets committed")


if __name__ == "__main__":
    trio.run(main)
