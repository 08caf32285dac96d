"""The client from code that is not async: hamq.client.blocking.

    .venv/bin/python examples/blocking_producer.py

Same classes and arguments as the Trio API, ordinary calls; a Trio loop runs them in a
background thread. HAMQ_NAMESRV sets the nameservers (default make run's two,
127.0.0.1:9876;127.0.0.1:9877).
"""

from __future__ import annotations

import os

from hamq.client import Message
from hamq.client.blocking import Producer

NAMESRV = os.environ.get("HAMQ_NAMESRV", "127.0.0.1:9876;127.0.0.1:9877")


def main() -> None:
    with Producer("example-blocking-producer", NAMESRV) as producer:
        for i in range(5):
            result = producer.send(Message("example-topic", f"from plain code #{i}", tags="even"))
            print(
                f"sent #{i}: {result.status.value} to {result.queue} offset {result.queue_offset}"
            )
        batch = producer.send_batch([Message("example-topic", f"batch #{i}") for i in range(3)])
        print(f"sent a batch of 3: {batch.status.value} to {batch.queue}")


if __name__ == "__main__":
    main()
