"""Drives RocketMQ's official Python 5.x client (PyPI ``rocketmq-python-client``: gRPC,
grpcio) for tests, in the virtualenv tests/support/rocketmq5.py makes for it (its
``rocketmq`` package would shadow the 4.x client's of the same name in .venv).

    python rocketmq5_driver.py <command> --endpoints 127.0.0.1:8081 ...

Every result is one JSON object per line on stdout, flushed at once; the last is
``{"done": ...}``. It never imports hamq. Commands:

- ``produce``: ``--count`` messages of ``--type`` normal, fifo (``--group``: the message
  group, ``{i}`` filled in), delay (``--deliver-after-s``) or transaction (``--end``
  commit, rollback or none; ``--check`` the TransactionChecker's answer, ``--linger-s``
  how long to stay for check-backs; ``--for-s``: stop sending after that long):
  ``{"sent": i, "message_id": ...}`` each, or
  ``{"error": ...}`` with ``--keep-going``; ``{"checked": message_id}`` per check-back.
- ``simple``: a SimpleConsumer receiving until ``--count`` messages were acked (or
  ``--timeout-s``): ``{"received": ...}`` per message; ``--nack-first``: the first
  delivery of each message gets ``change_invisible_duration(--nack-s)`` instead of an ack;
  ``--no-ack``: nothing acked (they come back after ``--invisible-s``).
- ``push``: a PushConsumer until ``--count`` successes; ``--fail-first``: the first
  delivery of each message is FAILURE.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from typing import Any

from rocketmq import (
    ClientConfiguration,
    ConsumeResult,
    Credentials,
    FilterExpression,
    Message,
    MessageListener,
    Producer,
    PushConsumer,
    SimpleConsumer,
    TransactionChecker,
    TransactionResolution,
)

_lock = threading.Lock()


def emit(record: dict[str, Any]) -> None:
    with _lock:
        sys.stdout.write(json.dumps(record) + "\n")
        sys.stdout.flush()


def received(message: Any) -> dict[str, Any]:
    return {
        "message_id": message.message_id,
        "topic": message.topic,
        "tag": message.tag,
        "keys": sorted(message.keys or []),
        "body": (message.body or b"").decode("latin-1"),
        "properties": dict(message.properties or {}),
        "message_group": message.message_group,
        "delivery_timestamp": message.delivery_timestamp,
        "delivery_attempt": message.delivery_attempt,
        "at_ms": int(time.time() * 1000),
    }


def configuration(args: argparse.Namespace) -> ClientConfiguration:
    credentials = (
        Credentials(args.access_key, args.secret_key) if args.access_key else Credentials()
    )
    return ClientConfiguration(args.endpoints, credentials, request_timeout=args.request_timeout_s)


class Checker(TransactionChecker):
    def __init__(self, answer: str) -> None:
        self.answer = answer

    def check(self, message: Message) -> TransactionResolution:
        emit({"checked": message.message_id, "body": (message.body or b"").decode("latin-1")})
        return (
            TransactionResolution.COMMIT
            if self.answer == "commit"
            else TransactionResolution.ROLLBACK
        )


def produce(args: argparse.Namespace) -> None:
    checker = Checker(args.check) if args.type == "transaction" else None
    producer = Producer(configuration(args), (args.topic,), checker=checker, tls_enable=args.tls)
    producer.startup()
    try:
        stop_at = time.monotonic() + args.for_s if args.for_s else None
        sent = 0
        for i in range(args.count):
            if stop_at is not None and time.monotonic() >= stop_at:
                break
            message = Message()
            message.topic = args.topic
            message.body = args.body.replace("{i}", str(i)).encode()
            if args.tag:
                message.tag = args.tag
            if args.keys:
                message.keys = args.keys.replace("{i}", str(i))
            for pair in args.prop:
                key, _, value = pair.partition("=")
                message.add_property(key, value.replace("{i}", str(i)))
            if args.type == "fifo":
                message.message_group = args.group.replace("{i}", str(i % args.groups))
            if args.type == "delay":
                # (the client puts this number in Timestamp.seconds)
                message.delivery_timestamp = int(time.time() + args.deliver_after_s)
            try:
                if args.type == "transaction":
                    transaction = producer.begin_transaction()
                    receipt = producer.send(message, transaction)
                    if args.end == "commit":
                        transaction.commit()
                    elif args.end == "rollback":
                        transaction.rollback()
                else:
                    receipt = producer.send(message)
            except Exception as exc:
                if not args.keep_going:
                    raise
                emit({"error": f"{type(exc).__name__}: {exc}", "i": i})
                time.sleep(args.pause_s)
                continue
            sent += 1
            emit({"sent": i, "message_id": receipt.message_id, "at_ms": int(time.time() * 1000)})
            if args.pause_s:
                time.sleep(args.pause_s)
        if args.linger_s:
            time.sleep(args.linger_s)
    finally:
        producer.shutdown()
    emit({"done": sent})


def simple(args: argparse.Namespace) -> None:
    consumer = SimpleConsumer(
        configuration(args),
        args.group,
        {args.topic: FilterExpression(args.tag or "*")},
        await_duration=args.wait_s,
        tls_enable=args.tls,
    )
    consumer.startup()
    done = 0
    seen: set[str] = set()
    deadline = time.monotonic() + args.timeout_s
    try:
        while done < args.count and time.monotonic() < deadline:
            try:
                messages = consumer.receive(args.batch, args.invisible_s)
            except Exception as exc:
                emit({"error": f"{type(exc).__name__}: {exc}"})
                time.sleep(0.5)
                continue
            for message in messages:
                emit({"received": received(message)})
                if args.no_ack:
                    done += 1
                    continue
                if args.nack_first and message.message_id not in seen:
                    seen.add(message.message_id)
                    consumer.change_invisible_duration(message, args.nack_s)
                    emit({"nacked": message.message_id})
                    continue
                try:
                    consumer.ack(message)
                except Exception as exc:
                    emit({"error": f"ack: {type(exc).__name__}: {exc}"})
                    continue
                emit({"acked": message.message_id})
                done += 1
    finally:
        consumer.shutdown()
    emit({"done": done})


class Listener(MessageListener):
    def __init__(self, fail_first: bool) -> None:
        self.fail_first = fail_first
        self.seen: set[str] = set()
        self.successes = 0

    def consume(self, message: Message) -> ConsumeResult:
        emit({"received": received(message)})
        with _lock:
            first = message.message_id not in self.seen
            self.seen.add(message.message_id)
        if self.fail_first and first:
            return ConsumeResult.FAILURE
        with _lock:
            self.successes += 1
        return ConsumeResult.SUCCESS


def push(args: argparse.Namespace) -> None:
    listener = Listener(args.fail_first)
    consumer = PushConsumer(
        configuration(args),
        args.group,
        listener,
        {args.topic: FilterExpression(args.tag or "*")},
        tls_enable=args.tls,
    )
    consumer.startup()
    deadline = time.monotonic() + args.timeout_s
    try:
        while listener.successes < args.count and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        consumer.shutdown()
    emit({"done": listener.successes})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    for name in ("produce", "simple", "push"):
        command = commands.add_parser(name)
        command.add_argument("--endpoints", required=True)
        command.add_argument("--topic", required=True)
        command.add_argument("--access-key", default="")
        command.add_argument("--secret-key", default="")
        command.add_argument("--tls", action="store_true")
        command.add_argument("--request-timeout-s", type=int, default=3)
        command.add_argument("--tag", default="")
        command.add_argument("--count", type=int, default=1)
        command.add_argument("--timeout-s", type=float, default=60)
        command.add_argument("--group", default="")
    produce_parser = commands.choices["produce"]
    produce_parser.add_argument("--body", default="body {i}")
    produce_parser.add_argument("--keys", default="")
    produce_parser.add_argument("--prop", action="append", default=[])
    produce_parser.add_argument(
        "--type", choices=("normal", "fifo", "delay", "transaction"), default="normal"
    )
    produce_parser.add_argument("--groups", type=int, default=1)
    produce_parser.add_argument("--deliver-after-s", type=float, default=0)
    produce_parser.add_argument("--end", choices=("commit", "rollback", "none"), default="commit")
    produce_parser.add_argument("--check", choices=("commit", "rollback"), default="commit")
    produce_parser.add_argument("--linger-s", type=float, default=0)
    produce_parser.add_argument("--pause-s", type=float, default=0)
    produce_parser.add_argument("--keep-going", action="store_true")
    produce_parser.add_argument("--for-s", type=float, default=0, help="stop sending after")
    simple_parser = commands.choices["simple"]
    simple_parser.add_argument("--batch", type=int, default=16)
    simple_parser.add_argument("--invisible-s", type=int, default=30)
    simple_parser.add_argument("--wait-s", type=int, default=2)
    simple_parser.add_argument("--no-ack", action="store_true")
    simple_parser.add_argument("--nack-first", action="store_true")
    simple_parser.add_argument("--nack-s", type=int, default=2)
    commands.choices["push"].add_argument("--fail-first", action="store_true")
    args = parser.parse_args()
    {"produce": produce, "simple": simple, "push": push}[args.command](args)


if __name__ == "__main__":
    main()
