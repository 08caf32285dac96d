"""Transactional messages: a message goes out only if the local transaction commits.

    .venv/bin/python examples/transaction.py

Three orders are written to a local "database" (a dict here) and announced with
``send_in_transaction``. The broker keeps each message invisible until the producer
says what became of its local transaction:
- order A commits: the message is delivered;
- order B rolls back: it never is;
- order C does not know yet (UNKNOW: say the database did not answer in time). The
  broker asks the producer later (a check-back, once the message is older than the
  broker's transaction_timeout_s, 6 s, at its next check pass: every 5 s with
  ``make run``'s brokers, 30 s by default); ``check`` finds the order in the
  database, and the message is delivered then.

A consumer prints what arrives. HAMQ_NAMESRV sets the nameserver.
"""

from __future__ import annotations

import os
import time
import uuid
from typing import Any

import trio

from hamq.client import (
    LocalTransactionState,
    Message,
    MessageExt,
    PushConsumer,
    TransactionProducer,
)

NAMESRV = os.environ.get("HAMQ_NAMESRV", "127.0.0.1:9876;127.0.0.1:9877")
TOPIC = "example-transactions"
COMMIT = LocalTransactionState.COMMIT_MESSAGE
ROLLBACK = LocalTransactionState.ROLLBACK_MESSAGE
UNKNOW = LocalTransactionState.UNKNOW


class Orders:
    """The local transactions: orders written to a database (a dict)."""

    def __init__(self) -> None:
        self.database: dict[str, str] = {}

    async def execute(self, message: Message, arg: Any) -> LocalTransactionState:
        order, outcome = arg
        if outcome == "fail":
            return ROLLBACK  # nothing written: the message must never go out
        self.database[order] = message.body.decode()
        return COMMIT if outcome == "commit" else UNKNOW

    async def check(self, message: MessageExt) -> LocalTransactionState:
        order = message.keys[0]
        answer = COMMIT if order in self.database else ROLLBACK
        print(f"{time.strftime('%X')} broker asks about {order}: answered {answer.name}")
        return answer


async def main() -> None:
    run = uuid.uuid4().hex[:8]  # marks this run's orders
    orders = {f"A-{run}": "commit", f"B-{run}": "fail", f"C-{run}": "unsure"}
    arrived: list[str] = []
    all_in = trio.Event()

    async def handle(messages: list[MessageExt]) -> None:
        for m in messages:
            if m.keys and m.keys[0] in orders:
                print(f"{time.strftime('%X')} delivered: {m.body.decode()}")
                arrived.append(m.keys[0])
        if sorted(arrived) == [f"A-{run}", f"C-{run}"]:
            all_in.set()

    consumer = PushConsumer(f"example-tx-{run}", NAMESRV, consume_from="FIRST_OFFSET")
    consumer.subscribe(TOPIC)
    async with (
        TransactionProducer("example-tx-producer", NAMESRV, Orders()) as producer,
        consumer.consuming(handle),
    ):
        for order, outcome in orders.items():
            message = Message(TOPIC, f"order {order}", keys=order)
            result = await producer.send_in_transaction(message, (order, outcome))
            print(f"{time.strftime('%X')} {order}: {result.local_transaction_state.name}")
        with trio.move_on_after(60):
            await all_in.wait()
        await trio.sleep(1)  # (anything more would show up now)
    if all_in.is_set() and len(arrived) == 2:
        print("delivered: the committed order, and the unsure one once checked; not the failed one")
    else:
        print(f"delivered {sorted(arrived)} within 60 s")


if __name__ == "__main__":
    trio.run(main)
