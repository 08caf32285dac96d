"""Drives RocketMQ's official client (PyPI ``rocketmq`` 0.4.4: the C++ core) for tests.

Run as a separate process so that the C++ library's threads, logs and any crash stay
out of pytest: ``python tests/support/rocketmq_driver.py <command> --namesrv host:port ...``.
Every result is one JSON object per line on stdout; the last line is
``{"done": ...}``. Bodies travel as latin-1 text so that any byte survives.
``--access-key`` / ``--secret-key``: the client signs with these session credentials
(RocketMQ ACL 1.0); ``--keep-going``: a send that fails is reported as ``{"error": ...}``
and the next one is tried.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from typing import Any

from rocketmq.client import Message, Producer, PullConsumer, PushConsumer, RecvMessage


def emit(record: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(record) + "\n")
    sys.stdout.flush()


def received(message: RecvMessage, *properties: str) -> dict[str, Any]:
    return {
        "id": message.id,
        "topic": message.topic,
        "tags": message.tags.decode(),
        "keys": message.keys.decode(),
        "body": message.body.decode("latin-1"),
        "queue_id": message.queue_id,
        "queue_offset": message.queue_offset,
        "reconsume_times": message.reconsume_times,
        "properties": {p: (message.get_property(p) or b"").decode() for p in properties},
    }


def make_message(args: argparse.Namespace, i: int) -> Message:
    message = Message(args.topic)
    body = args.body.replace("{i}", str(i))
    if args.body_size:
        body = (body * (args.body_size // max(len(body), 1) + 1))[: args.body_size]
    message.set_body(body)
    if args.tags:
        message.set_tags(args.tags)
    if args.keys:
        message.set_keys(args.keys.replace("{i}", str(i)))
    for pair in args.prop:
        key, _, value = pair.partition("=")
        message.set_property(key, value.replace("{i}", str(i)))
    return message


def credentials(client: Producer | PullConsumer | PushConsumer, args: argparse.Namespace) -> None:
    if args.access_key:
        client.set_session_credentials(args.access_key, args.secret_key, args.channel)


def send(args: argparse.Namespace) -> None:
    producer = Producer(args.group)
    producer.set_namesrv_addr(args.namesrv)
    credentials(producer, args)
    producer.start()
    try:
        if args.mode == "batch":
            result = producer.send_batch([make_message(args, i) for i in range(args.count)])
            emit({"status": result.status.name, "msg_id": result.msg_id, "offset": result.offset})
        for i in range(args.count if args.mode != "batch" else 0):
            message = make_message(args, i)
            if args.mode == "sync" and args.keep_going:
                try:
                    result = producer.send_sync(message)
                except Exception as exc:  # (the C++ client's refusal, as text)
                    emit({"error": f"{type(exc).__name__}: {exc}"})
                    continue
            elif args.mode == "sync":
                result = producer.send_sync(message)
            elif args.mode == "orderly":
                result = producer.send_orderly(message, args.arg)
            else:
                producer.send_oneway(message)
                emit({"status": "ONEWAY"})
                continue
            emit(
                {
                    "status": result.status.name,
                    "msg_id": result.msg_id,
                    "offset": result.offset,
                    "i": i,
                    "at": time.monotonic(),  # (the system's monotonic clock: comparable)
                }
            )
    finally:
        producer.shutdown()
    emit({"done": args.count})


def pull(args: argparse.Namespace) -> None:
    consumer = PullConsumer(args.group)
    consumer.set_namesrv_addr(args.namesrv)
    credentials(consumer, args)
    consumer.start()
    count = 0
    try:
        for message in consumer.pull(args.topic, args.expression):
            count += 1
            emit(received(message, *args.show))
    finally:
        consumer.shutdown()
    emit({"done": count})


def push(args: argparse.Namespace) -> None:
    lock = threading.Lock()
    count = 0
    failed: set[str] = set()

    def handle(message: RecvMessage) -> None:
        nonlocal count
        body = message.body.decode("latin-1")
        with lock:
            if args.fail_once and body == args.fail_once and message.id not in failed:
                failed.add(message.id)
                emit({"failed": received(message)})
                raise RuntimeError("failing once on purpose")
            count += 1
            emit(received(message, *args.show))

    consumer = PushConsumer(args.group, orderly=args.orderly)
    consumer.set_namesrv_addr(args.namesrv)
    credentials(consumer, args)
    consumer.subscribe(args.topic, handle, args.expression)
    consumer.start()
    deadline = time.monotonic() + args.timeout
    try:
        while time.monotonic() < deadline:
            with lock:
                if count >= args.count:
                    break
            time.sleep(0.05)
    finally:
        consumer.shutdown()
    emit({"done": count})


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("command", choices=["send", "pull", "push"])
    parser.add_argument("--namesrv", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--group", default="CPP_GROUP")
    parser.add_argument("--count", type=int, default=1)
    parser.add_argument("--mode", choices=["sync", "oneway", "orderly", "batch"], default="sync")
    parser.add_argument("--arg", type=int, default=0, help="send_orderly's sharding key")
    parser.add_argument("--body", default="body {i}")
    parser.add_argument("--body-size", type=int, default=0)
    parser.add_argument("--tags", default="")
    parser.add_argument("--keys", default="")
    parser.add_argument("--prop", action="append", default=[], help="key=value")
    parser.add_argument("--show", action="append", default=[], help="property to report")
    parser.add_argument("--expression", default="*")
    parser.add_argument("--orderly", action="store_true")
    parser.add_argument("--fail-once", default="", help="a body whose first delivery fails")
    parser.add_argument("--timeout", type=float, default=60.0)
    parser.add_argument("--access-key", default="", help="session credentials (ACL)")
    parser.add_argument("--secret-key", default="")
    parser.add_argument("--channel", default="ALIYUN", help="the credentials' auth channel")
    parser.add_argument("--keep-going", action="store_true", help="report failed sends")
    args = parser.parse_args()
    {"send": send, "pull": pull, "push": push}[args.command](args)


if __name__ == "__main__":
    main()
