"""A delayed message: sent now, delivered after its delay level (level 2 = 5 s).

    .venv/bin/python examples/delayed.py

The broker keeps it in SCHEDULE_TOPIC_XXXX until it is due, then stores it under its
topic, where the consumer finds it. HAMQ_NAMESRV sets the nameserver.
"""

from __future__ import annotations

import os
import time
import uuid

import trio

from hamq.client import Message, MessageExt, Producer, PushConsumer

NAMESRV = os.environ.get("HAMQ_NAMESRV", "127.0.0.1:9876;127.0.0.1:9877")
LEVEL = 2  # 1s 5s 10s 30s 1m ... : level 2 is 5 seconds


async def main() -> None:
    run = uuid.uuid4().hex[:8]  # marks this run's message
    async with Producer("example-delayed-producer", NAMESRV) as producer:
        sent_at = time.time()
        message = Message("example-delayed", f"see you later {run}", delay_level=LEVEL)
        result = await producer.send(message)
    print(f"sent at {time.strftime('%X')} with delay level {LEVEL}: {result.status.value}")

    arrived = trio.Event()

    async def handle(messages: list[MessageExt]) -> None:
        if any(m.body.decode().endswith(run) for m in messages):
            arrived.set()

    consumer = PushConsumer(f"example-delayed-{run}", NAMESRV, consume_from="FIRST_OFFSET")
    consumer.subscribe("example-delayed")
    async with consumer.consuming(handle):
        with trio.move_on_after(30):
            await arrived.wait()
    if arrived.is_set():
        print(f"delivered at {time.strftime('%X')}, {time.time() - sent_at:.1f}s after sending")
    else:
        print("not delivered within 30 s")


if __name__ == "__main__":
    trio.run(main)
