"""``hamq produce`` and ``hamq consume``: a producer and a push consumer at the terminal."""

from __future__ import annotations

import time
from typing import Annotated

import trio
import typer

from cli.common import DEFAULT_NAMESRV, NamesrvOption, fail, run
from hamq.client import (
    ConsumeFrom,
    InvalidArgumentError,
    Message,
    MessageExt,
    Producer,
    PushConsumer,
    SendResult,
)
from hamq.client.message import check_topic

#: above this many messages, produce prints a summary instead of every result
ECHO_EACH_UP_TO = 20


def produce(
    topic: Annotated[str, typer.Option("--topic", "-t", help="Topic to send to.")],
    body: Annotated[
        str | None,
        typer.Argument(help="Message body; '{i}' becomes the message's number."),
    ] = None,
    count: Annotated[int, typer.Option("--count", "-c", min=1, help="How many messages.")] = 1,
    tags: Annotated[str | None, typer.Option("--tags", help="Tag of every message.")] = None,
    keys: Annotated[
        str | None, typer.Option("--keys", help="Space-separated keys ('{i}' numbered).")
    ] = None,
    delay_level: Annotated[
        int, typer.Option("--delay-level", min=0, help="Deliver later: 1=1s 2=5s 3=10s ...")
    ] = 0,
    group: Annotated[str, typer.Option("--group", "-g", help="Producer group.")] = "hamq-cli",
    namesrv: NamesrvOption = DEFAULT_NAMESRV,
) -> None:
    """Send COUNT messages to TOPIC and report where they went."""
    text = body if body is not None else "hello from hamq #{i}"
    try:
        check_topic(topic)
        messages = [
            Message(
                topic,
                text.replace("{i}", str(i)),
                tags=tags,
                keys=keys.replace("{i}", str(i)) if keys else None,
                delay_level=delay_level,
            )
            for i in range(count)
        ]
    except InvalidArgumentError as exc:
        raise fail(str(exc), 2) from None

    async def main() -> None:
        per_queue: dict[str, int] = {}
        started = time.perf_counter()
        async with Producer(group, namesrv) as producer:
            for i, message in enumerate(messages):
                result: SendResult = await producer.send(message)
                per_queue[str(result.queue)] = per_queue.get(str(result.queue), 0) + 1
                if count <= ECHO_EACH_UP_TO:
                    typer.echo(
                        f"#{i} {result.status.value} {result.queue} offset {result.queue_offset} "
                        f"id {result.msg_id}"
                    )
        elapsed = time.perf_counter() - started
        typer.echo(
            f"sent {count} message(s) to {topic} in {elapsed:.2f}s "
            f"({count / elapsed:,.0f} msgs/s) over {len(per_queue)} queue(s): "
            + ", ".join(f"{q}={n}" for q, n in sorted(per_queue.items()))
        )

    run(main)


def consume(
    topic: Annotated[str, typer.Option("--topic", "-t", help="Topic to consume.")],
    group: Annotated[str, typer.Option("--group", "-g", help="Consumer group.")],
    expression: Annotated[
        str, typer.Option("--tags", help="Tag expression: '*', 'a', 'a || b'.")
    ] = "*",
    start: Annotated[
        str,
        typer.Option(
            "--from",
            help="Where a new group starts: first (everything kept), last (new messages only).",
        ),
    ] = "first",
    count: Annotated[
        int | None, typer.Option("--count", "-c", min=1, help="Stop after this many messages.")
    ] = None,
    idle_exit_s: Annotated[
        float | None,
        typer.Option("--idle-exit", min=0.1, help="Stop after this many seconds with nothing."),
    ] = None,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="Print only a summary.")] = False,
    namesrv: NamesrvOption = DEFAULT_NAMESRV,
) -> None:
    """Consume TOPIC as a member of GROUP, printing each message (Ctrl-C stops;
    offsets are committed)."""
    try:
        consume_from = ConsumeFrom[f"{start.upper()}_OFFSET"]
    except KeyError:
        raise fail(f"--from {start!r}: use first or last", 2) from None
    try:
        consumer = PushConsumer(group, namesrv, consume_from=consume_from)
        consumer.subscribe(topic, expression)
    except InvalidArgumentError as exc:
        raise fail(str(exc), 2) from None

    received = 0

    async def main() -> None:
        done = trio.Event()
        last_activity = trio.current_time()

        def handle(messages: list[MessageExt]) -> None:
            nonlocal received, last_activity
            for message in messages:
                received += 1
                if not quiet:
                    body = message.body.decode(errors="replace")
                    typer.echo(
                        f"{message.topic} q{message.queue_id} #{message.queue_offset} "
                        f"tags={message.tags or '-'} id={message.msg_id} {body}"
                    )
            last_activity = trio.current_time()
            if count is not None and received >= count:
                done.set()

        async with consumer.consuming(handle):
            typer.echo(
                f"consuming {topic} ({expression}) as {group}; queues: "
                + ", ".join(str(q) for q in consumer.assigned),
                err=True,
            )
            if idle_exit_s is None:
                await done.wait()
            while idle_exit_s is not None and not done.is_set():
                remaining = last_activity + idle_exit_s - trio.current_time()
                if remaining <= 0:
                    break
                with trio.move_on_after(remaining):
                    await done.wait()

    run(main)
    typer.echo(f"consumed {received} message(s) from {topic} as {group}", err=True)
