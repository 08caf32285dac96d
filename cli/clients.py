"""``hamq produce`` and ``hamq consume``: a producer and a push consumer at the terminal.

produce: ``--concurrency`` tasks (1) send requests of ``--batch`` messages (1: one
message a request; more: SEND_BATCH_MESSAGE, a batch stored in one queue), numbered
0 to COUNT - 1 and taken in turn, each task one request at a time. Each request may
take ``--send-timeout`` (30 s), retries and a master failover included, a single try
at most ``--attempt-timeout`` (ATTEMPT_TIMEOUT_S: a master that hangs is given up for the
next try, on a fresh route). The command ends with one summary line on stdout (how many were sent,
how many acknowledged SEND_OK: counted per answered request, so exact whatever the
concurrency) whether it finished, gave up on a request (then no new request starts,
those under way end, and one ``error:`` line follows, exit code 1) or was
interrupted (exit code 130); exit code 1 too when a message was stored short of
SEND_OK. A batch too large for the broker (``max_message_size``) is refused before
anything is sent.

consume: prints each message as it is handled, and commits only what it printed:
with ``--count N`` exactly N, the next run of the group starts right after them. A
topic no nameserver knows is said once on stderr; the consumer waits for it. A
closed stdout ends it (cli/common.py). It ends with a summary line on stderr.

Both draw their count and rate live on stderr when it is a terminal (LiveCount).
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from typing import Annotated, Any

import attrs
import trio
import typer

from cli.common import (
    DEFAULT_NAMESRV,
    CommandError,
    NamesrvOption,
    client_options,
    fail,
    run,
)
from cli.progress import LiveCount
from hamq.client import (
    AdminClient,
    ConsumeFrom,
    InvalidArgumentError,
    Message,
    MessageExt,
    NoRouteError,
    Producer,
    PushConsumer,
    SendError,
    SendResult,
    SendStatus,
)
from hamq.client.message import DEFAULT_MAX_MESSAGE_SIZE, check_message, check_topic
from hamq.protocol import send_timing

log = logging.getLogger(__name__)

#: above this many messages, produce prints a summary instead of every result
ECHO_EACH_UP_TO = 20
#: the most tasks ``produce --concurrency`` runs, and messages one ``--batch`` holds
MAX_CONCURRENCY = 1024
MAX_BATCH = 1024
#: RocketMQ's delay levels by default (messageDelayLevel): 1=1s 2=5s 3=10s ... 18=2h
MAX_DELAY_LEVEL = 18
#: how long one message may take, retries and a failover included, and how long one try
#: may wait for the broker: the producer's defaults, which keep the rule of
#: hamq/protocol/send_timing.py (a try outlasts the longest a broker waits before it
#: answers, so that only a broker that hangs is left for another try)
SEND_TIMEOUT_S = send_timing.SEND_TIMEOUT_S
ATTEMPT_TIMEOUT_S = send_timing.SEND_ATTEMPT_TIMEOUT_S


@attrs.define
class _Tally:
    """What produce has sent so far."""

    count: int
    statuses: Counter[SendStatus] = attrs.field(factory=Counter)
    per_queue: Counter[str] = attrs.field(factory=Counter)
    elapsed_s: float = 0.0

    @property
    def sent(self) -> int:
        return sum(self.statuses.values())

    @property
    def acknowledged(self) -> int:
        return self.statuses[SendStatus.SEND_OK]

    def add(self, result: SendResult, messages: int = 1) -> None:
        """The answer to a request of ``messages`` messages (a batch has one status)."""
        self.statuses[result.status] += messages
        self.per_queue[str(result.queue)] += messages

    def short_of_ok(self) -> str:
        return ", ".join(
            f"{n} {status.value}"
            for status, n in sorted(self.statuses.items(), key=lambda item: item[0].value)
            if status is not SendStatus.SEND_OK
        )

    def summary(self, topic: str) -> str:
        of = "" if self.sent == self.count else f" of {self.count}"
        rate = self.sent / self.elapsed_s if self.elapsed_s > 0 else 0.0
        short = self.short_of_ok()
        queues = ", ".join(f"{q}={n}" for q, n in sorted(self.per_queue.items()))
        return (
            f"sent {self.sent}{of} message(s) to {topic} in {self.elapsed_s:.2f}s "
            f"({rate:,.0f} msgs/s); {self.acknowledged} acknowledged (SEND_OK)"
            + (f", {short}" if short else "")
            + (f"; over {len(self.per_queue)} queue(s): {queues}" if queues else "")
        )


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
        int,
        typer.Option(
            "--delay-level",
            min=0,
            max=MAX_DELAY_LEVEL,
            help=f"Deliver later: 1=1s 2=5s 3=10s ... {MAX_DELAY_LEVEL}=2h (0: at once).",
        ),
    ] = 0,
    group: Annotated[str, typer.Option("--group", "-g", help="Producer group.")] = "hamq-cli",
    send_timeout_s: Annotated[
        float,
        typer.Option(
            "--send-timeout",
            min=0.1,
            help="Seconds one message (or batch) may take, retries and a master failover included.",
        ),
    ] = SEND_TIMEOUT_S,
    attempt_timeout_s: Annotated[
        float,
        typer.Option(
            "--attempt-timeout",
            min=0.1,
            help="Seconds one try may wait for a broker before the next try (default "
            f"{ATTEMPT_TIMEOUT_S:g}): keep it above the brokers' sync_flush_timeout_s and "
            "[ha] sync_timeout_s.",
        ),
    ] = ATTEMPT_TIMEOUT_S,
    concurrency: Annotated[
        int,
        typer.Option(
            "--concurrency",
            min=1,
            max=MAX_CONCURRENCY,
            help="How many requests are under way at once (COUNT stays the total).",
        ),
    ] = 1,
    batch: Annotated[
        int,
        typer.Option(
            "--batch",
            min=1,
            max=MAX_BATCH,
            help="Messages per request, sent as one batch to one queue (1: no batching).",
        ),
    ] = 1,
    namesrv: NamesrvOption = DEFAULT_NAMESRV,
) -> None:
    """Send COUNT messages to TOPIC and report where they went (Ctrl-C stops; the
    summary says how many were sent)."""
    text = body if body is not None else "hello from hamq #{i}"

    def message(i: int) -> Message:
        return Message(
            topic,
            text.replace("{i}", str(i)),
            tags=tags,
            keys=keys.replace("{i}", str(i)) if keys else None,
            delay_level=delay_level,
        )

    requests = range(0, count, batch)  # the first message of each
    if batch > 1 and delay_level > 0:
        raise fail("--batch cannot be used with --delay-level (a batch has no delay level)", 2)
    try:
        check_topic(topic)
        # '{i}' grows with i: the last message is the longest, the last two requests
        # hold the largest batch
        for i in (0, count - 1):
            check_message(message(i), DEFAULT_MAX_MESSAGE_SIZE)
        producer = Producer(
            group,
            namesrv,
            send_timeout_s=send_timeout_s,
            send_attempt_timeout_s=min(attempt_timeout_s, send_timeout_s),
            **client_options(),
        )
    except InvalidArgumentError as exc:
        raise fail(str(exc), 2) from None
    try:
        for first in requests[-2:] if batch > 1 else ():
            producer.check_batch([message(i) for i in range(first, min(first + batch, count))])
    except InvalidArgumentError as exc:
        raise fail(f"--batch {batch}: {exc}", 2) from None
    tally = _Tally(count)
    meter = LiveCount(f"produce {topic}", total=count)

    async def main() -> None:
        async with producer:
            # the route first: a nameserver that is not there ends the command here
            await producer.queues(topic)
            failure: str | None = None
            next_request = iter(requests)  # shared by the senders: each request goes once

            async def sender() -> None:
                nonlocal failure
                for first in next_request:
                    if failure is not None:
                        return
                    numbers = range(first, min(first + batch, count))
                    try:
                        if batch == 1:
                            result = await producer.send(message(first))
                        else:
                            result = await producer.send_batch([message(i) for i in numbers])
                    except SendError as exc:
                        if failure is None:
                            what = f"message #{first}"
                            if batch > 1:
                                what = f"the batch of messages #{first}-#{numbers[-1]}"
                            last = f"; the last: {exc.attempts[-1]}" if exc.attempts else ""
                            failure = (
                                f"gave up on {what}: not sent within {send_timeout_s:g}s "
                                f"({len(exc.attempts)} attempt(s){last})"
                            )
                        return
                    tally.add(result, len(numbers))
                    meter.add(len(numbers))
                    if count <= ECHO_EACH_UP_TO:
                        _echo_sent(meter, result, numbers)

            started = time.perf_counter()
            try:
                with meter:
                    async with trio.open_nursery() as nursery:
                        for _ in range(min(concurrency, len(requests))):
                            nursery.start_soon(sender)
            finally:
                tally.elapsed_s = time.perf_counter() - started
                typer.echo(tally.summary(topic))
            if failure is not None:
                raise CommandError(failure)

    run(main, interruptible=True)
    if tally.acknowledged < count:
        raise fail(
            f"{count - tally.acknowledged} of {count} message(s) stored short of "
            f"SEND_OK: {tally.short_of_ok()}"
        )


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
    offsets of the printed messages are committed)."""
    try:
        consume_from = ConsumeFrom[f"{start.upper()}_OFFSET"]
    except KeyError:
        raise fail(f"--from {start!r}: use first or last", 2) from None
    try:
        # one message per handler call (the default): --count can stop between any two
        consumer = PushConsumer(
            group, namesrv, consume_from=consume_from, consume_batch_size=1, **client_options()
        )
        consumer.subscribe(topic, expression)
    except InvalidArgumentError as exc:
        raise fail(str(exc), 2) from None

    printed = 0
    stdout_closed = False
    meter = LiveCount(f"consume {topic}", total=count)

    async def main() -> None:
        nonlocal stdout_closed
        if not await _topic_known(namesrv, topic, client_options()):
            typer.echo(f"topic {topic} does not exist (yet); waiting for it", err=True)
        done = trio.Event()
        last_activity = trio.current_time()

        async def handle(messages: list[MessageExt]) -> None:
            # A message is printed, then handled (its offset may be committed), or it
            # waits here until the consumer stops: past --count, or with stdout gone,
            # it is neither printed nor committed (the group's next run gets it).
            nonlocal printed, last_activity, stdout_closed
            for message in messages:
                if done.is_set():
                    await trio.sleep_forever()
                if not quiet:
                    body = message.body.decode(errors="replace")
                    try:
                        meter.echo(
                            f"{message.topic} q{message.queue_id} #{message.queue_offset} "
                            f"tags={message.tags or '-'} id={message.msg_id} {body}"
                        )
                    except BrokenPipeError:
                        stdout_closed = True
                        done.set()
                        await trio.sleep_forever()
                printed += 1
                meter.add()
                if count is not None and printed >= count:
                    done.set()
            last_activity = trio.current_time()

        with meter:
            async with consumer.consuming(handle):
                log.info(
                    "consuming %s (%s) as %s; queues: %s",
                    topic,
                    expression,
                    group,
                    ", ".join(str(q) for q in consumer.assigned),
                )
                if idle_exit_s is None:
                    await done.wait()
                while idle_exit_s is not None and not done.is_set():
                    remaining = last_activity + idle_exit_s - trio.current_time()
                    if remaining <= 0:
                        break
                    with trio.move_on_after(remaining):
                        await done.wait()
        if stdout_closed:
            raise BrokenPipeError("stdout was closed")

    run(main, watch_stdout=True)
    typer.echo(
        f"consumed {printed} message(s) from {topic} as {group} in {meter.elapsed_s:.2f}s "
        f"({meter.rate():,.0f} msgs/s)",
        err=True,
    )


def _echo_sent(meter: LiveCount, result: SendResult, numbers: range) -> None:
    """One line per message of a request: a batch's are stored one after the other."""
    ids = result.msg_id.split(",") if len(numbers) > 1 else [result.msg_id]
    for k, i in enumerate(numbers):
        msg_id = ids[k] if k < len(ids) else "?"
        meter.echo(
            f"#{i} {result.status.value} {result.queue} offset {result.queue_offset + k} "
            f"id {msg_id}"
        )


async def _topic_known(namesrv: str, topic: str, options: dict[str, Any]) -> bool:
    """Whether a nameserver knows ``topic``; NameServerUnavailableError if none answers."""
    async with AdminClient(namesrv, **options) as admin:
        try:
            await admin.topic_route(topic)
        except NoRouteError:
            return False
    return True
