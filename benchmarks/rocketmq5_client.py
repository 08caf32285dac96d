"""The gRPC rows of produce_consume.py: RocketMQ's official Python 5.x client
(``rocketmq-python-client``) sending or receiving, run in its own virtualenv
(tests/support/rocketmq5.py) as a child of the benchmark; it never imports hamq.

    python rocketmq5_client.py send --endpoints H:P --topic T --count N --in-flight 64
    python rocketmq5_client.py receive --endpoints H:P --topic T --group G --count N

One JSON line at the end: messages, seconds (from the first send or receive to the
last answer), latencies (per send; none for receives) and this process's CPU seconds
over that time (its threads and grpcio's included).
"""

from __future__ import annotations

import argparse
import json
import time
from collections import deque

from rocketmq import (
    ClientConfiguration,
    Credentials,
    FilterExpression,
    Message,
    Producer,
    SimpleConsumer,
)

BODY = b"x" * 1024


def send(args: argparse.Namespace, config: ClientConfiguration) -> dict[str, object]:
    producer = Producer(config, (args.topic,))
    producer.startup()
    latencies: list[float] = []

    def one() -> object:
        message = Message()
        message.topic, message.body = args.topic, BODY
        started = time.perf_counter()
        future = producer.send_async(message)
        future.add_done_callback(lambda _f: latencies.append(time.perf_counter() - started))
        return future

    try:
        for _ in range(args.in_flight):  # (warm up: routes, the connection, settings)
            one().result()  # type: ignore[attr-defined]
        latencies.clear()
        cpu, start = time.process_time(), time.perf_counter()
        pending: deque[object] = deque()
        for _ in range(args.count):
            if len(pending) >= args.in_flight:
                pending.popleft().result()  # type: ignore[attr-defined]
            pending.append(one())
        while pending:
            pending.popleft().result()  # type: ignore[attr-defined]
        seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
    finally:
        producer.shutdown()
    return {"messages": args.count, "seconds": seconds, "cpu": cpu, "latencies": latencies}


def receive(args: argparse.Namespace, config: ClientConfiguration) -> dict[str, object]:
    consumer = SimpleConsumer(
        config, args.group, {args.topic: FilterExpression("*")}, await_duration=1
    )
    consumer.startup()
    got = 0
    try:
        cpu, start = time.process_time(), time.perf_counter()
        while got < args.count:
            messages = consumer.receive(32, 30)
            for message in messages:
                # (one at a time: the client's ack_async returns no future, 5.1.2)
                consumer.ack(message)
            got += len(messages)
        seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
    finally:
        consumer.shutdown()
    return {"messages": got, "seconds": seconds, "cpu": cpu, "latencies": []}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("command", choices=("send", "receive"))
    parser.add_argument("--endpoints", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--group", default="bench-grpc")
    parser.add_argument("--count", type=int, required=True)
    parser.add_argument("--in-flight", type=int, default=64)
    args = parser.parse_args()
    config = ClientConfiguration(args.endpoints, Credentials())
    result = (send if args.command == "send" else receive)(args, config)
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
