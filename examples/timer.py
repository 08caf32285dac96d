"""A timer message: sent now, delivered at the time it names (RocketMQ 5's delivery
time: any time up to the broker's timer_max_delay_s, 3 days by default).

    .venv/bin/python examples/timer.py

The broker keeps it in rmq_sys_wheel_timer until it is due, then stores it under its
topic, where the consumer finds it: not before that time, within a second after.
HAMQ_NAMESRV sets the nameserver.
"""

from __future__ import annotations

import os
import time
import uuid
from datetime import UTC, datetime, timedelta

import trio

from hamq.client import Message, MessageExt, Producer, PushConsumer

NAMESRV = os.environ.get("HAMQ_NAMESRV", "127.0.0.1:9876;127.0.0.1:9877")
AFTER = timedelta(seconds=3)


async def main() -> None:
    run = uuid.uuid4().hex[:8]  # marks this run's message
    async with Producer("example-timer-producer", NAMESRV) as producer:
        sent_at = time.time()
        deliver_at = datetime.fromtimestamp(sent_at, UTC) + AFTER
        message = Message(
            "example-timer", f"see you at {deliver_at:%X} {run}", deliver_at=deliver_at
        )
        result = await producer.send(message)
    print(f"sent at {time.strftime('%X')} for {deliver_at.astimezone():%X}: {result.status.value}")

    arrived = trio.Event()

    async def handle(messages: list[MessageExt]) -> None:
        if any(m.body.decode().endswith(run) for m in messages):
            arrived.set()

    consumer = PushConsumer(f"example-timer-{run}", NAMESRV, consume_from="FIRST_OFFSET")
    consumer.subscribe("example-timer")
    async with consumer.consuming(handle):
        with trio.move_on_after(30):
            await arrived.wait()
    if arrived.is_set():
        print(f"delivered at {time.strftime('%X')}, {time.time() - sent_at:.1f}s after sending")
    else:
        print("not delivered within 30 s")


if __name__ == "__main__":
    trio.run(main)
