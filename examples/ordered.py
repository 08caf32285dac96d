"""Ordered messages: every order's steps go to one queue, and arrive in order.

    .venv/bin/python examples/ordered.py

The producer picks the queue by the order id (``hash_selector``); the consumer runs in
orderly mode, locking each queue it consumes, so each order's steps are handled one
after another, in the order they were sent. HAMQ_NAMESRV sets the nameserver.
"""

from __future__ import annotations

import os
import uuid

import trio

from hamq.client import ConsumeResult, Message, MessageExt, Producer, PushConsumer, hash_selector

NAMESRV = os.environ.get("HAMQ_NAMESRV", "127.0.0.1:9876;127.0.0.1:9877")
STEPS = ("created", "paid", "shipped", "delivered")


async def main() -> None:
    run = uuid.uuid4().hex[:8]  # a fresh group and order ids each run
    orders = [f"order-{run}-{n}" for n in range(4)]
    async with Producer("example-ordered-producer", NAMESRV) as producer:
        for step in STEPS:
            for order in orders:
                result = await producer.send(
                    Message("example-orders", f"{order} {step}", keys=[order]), hash_selector, order
                )
                print(f"sent {order} {step} -> queue {result.queue.queue_id}")

    seen: dict[str, list[str]] = {order: [] for order in orders}
    done = trio.Event()

    async def handle(messages: list[MessageExt]) -> ConsumeResult:
        for m in messages:
            order, step = m.body.decode().split()
            if order in seen:
                seen[order].append(step)
        if all(len(steps) == len(STEPS) for steps in seen.values()):
            done.set()
        return ConsumeResult.SUCCESS

    consumer = PushConsumer(
        f"example-ordered-{run}", NAMESRV, consume_from="FIRST_OFFSET", orderly=True
    )
    consumer.subscribe("example-orders")
    async with consumer.consuming(handle):
        with trio.move_on_after(30):
            await done.wait()
    for order, steps in seen.items():
        verdict = "in order" if steps == list(STEPS) else "OUT OF ORDER"
        print(f"{order}: {' -> '.join(steps)} ({verdict})")


if __name__ == "__main__":
    trio.run(main)
