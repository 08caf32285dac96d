"""Send JSON order events to the topic "orders" (input of examples/spark_pipeline.py).

    make run                                   # in one terminal: the broker group
    .venv/bin/python examples/produce_orders.py --count 5000

Each order is ``{"order_id", "product", "quantity", "price", "ts"}``, ``ts`` its event
time in milliseconds, spread over the last ``--minutes`` minutes; the key is the order
id and the tag the product. The nameserver address comes from HAMQ_NAMESRV (default
127.0.0.1:9876).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import time

import trio

from hamq.client import AdminClient, Message, Producer, SendStatus

NAMESRV = os.environ.get("HAMQ_NAMESRV", "127.0.0.1:9876;127.0.0.1:9877")
TOPIC = "orders"
PRODUCTS = {"apple": 0.5, "bread": 2.25, "cheese": 7.8, "dates": 4.1, "eggs": 3.2}
BATCH = 100


def orders(count: int, minutes: int, seed: int) -> list[dict[str, object]]:
    rng = random.Random(seed)
    now_ms = int(time.time() * 1000)
    made = []
    for n in range(count):
        product = rng.choice(sorted(PRODUCTS))
        made.append(
            {
                "order_id": f"o-{seed}-{n}",
                "product": product,
                "quantity": rng.randint(1, 5),
                "price": PRODUCTS[product],
                "ts": now_ms - rng.randrange(minutes * 60_000),
            }
        )
    return made


async def main(count: int, minutes: int, seed: int) -> None:
    async with AdminClient(NAMESRV) as admin:
        await admin.create_topic(TOPIC, 4)  # or change it: creating is idempotent
    events = orders(count, minutes, seed)
    async with Producer("orders-producer", NAMESRV) as producer:
        for first in range(0, count, BATCH):
            batch = [
                Message(TOPIC, json.dumps(e), keys=[str(e["order_id"])], tags=str(e["product"]))
                for e in events[first : first + BATCH]
            ]
            result = await producer.send_batch(batch)
            if result.status is not SendStatus.SEND_OK:
                print(f"a batch was {result.status.value}")
    quantity = sum(int(str(e["quantity"])) for e in events)
    print(f"sent {count} orders to {TOPIC} ({quantity} items over the last {minutes} minutes)")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=2000, help="orders to send")
    parser.add_argument("--minutes", type=int, default=5, help="event times span this long")
    parser.add_argument("--seed", type=int, default=int(time.time()))
    args = parser.parse_args()
    trio.run(main, args.count, args.minutes, args.seed)
