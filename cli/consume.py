"""``hamq consume``: a push consumer at the terminal.

It prints each message as it is handled, and commits only what it printed: with
``--count N`` exactly N, the next run of the group starts right after them. With
``--pop`` it pops (a SimpleConsumer) and acks each message it printed; one received and
not printed (past --count, stdout gone) comes back to the group after ``--invisible``. A topic no
nameserver knows is said once on stderr; the consumer waits for it. A closed stdout
ends it (cli/common.py). It ends with a summary line on stderr, and draws its count and
rate live on stderr when that is a terminal (LiveCount).
"""

from __future__ import annotations

import logging
from typing import Annotated, Any

import attrs
import trio
import typer

from cli.common import DEFAULT_NAMESRV, NamesrvOption, client_options, fail, run
from cli.progress import LiveCount
from hamq.client import (
    AdminClient,
    ConsumeFrom,
    InvalidArgumentError,
    MessageExt,
    NoRouteError,
    PushConsumer,
    SimpleConsumer,
)
from hamq.protocol.pop import MAX_POP_MESSAGES

log = logging.getLogger(__name__)

#: how long one receive of consume --pop waits for messages
POP_WAIT_S = 5.0


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
    pop: Annotated[
        bool,
        typer.Option(
            "--pop",
            help="Pop the messages (RocketMQ 5's SimpleConsumer): each printed one is acked; "
            "one not printed comes back to the group after --invisible.",
        ),
    ] = False,
    invisible_s: Annotated[
        float,
        typer.Option("--invisible", min=0.1, help="With --pop: seconds a message stays invisible."),
    ] = 30.0,
    namesrv: NamesrvOption = DEFAULT_NAMESRV,
) -> None:
    """Consume TOPIC as a member of GROUP, printing each message (Ctrl-C stops;
    offsets of the printed messages are committed, or with --pop each is acked)."""
    common: dict[str, Any] = {
        "topic": topic,
        "expression": expression,
        "group": group,
        "namesrv": namesrv,
        "quiet": quiet,
        "count": count,
        "idle_exit_s": idle_exit_s,
        "meter": LiveCount(f"consume {topic}", total=count),
    }
    consuming: _Consuming | _Popping
    if pop:
        popping = _popping_consumer(topic, group, expression, start, namesrv)
        consuming = _Popping(popping, invisible_s=invisible_s, **common)
    else:
        consumer = _subscribed_consumer(topic, group, expression, start, namesrv)
        consuming = _Consuming(consumer, **common)
    run(consuming.main, watch_stdout=True)
    typer.echo(
        f"consumed {consuming.printed} message(s) from {topic} as {group} in "
        f"{consuming.meter.elapsed_s:.2f}s ({consuming.meter.rate():,.0f} msgs/s)",
        err=True,
    )


def _popping_consumer(
    topic: str, group: str, expression: str, start: str, namesrv: str
) -> SimpleConsumer:
    """consume --pop's consumer, subscribed: bad input ends the command here (exit 2)."""
    if start not in ("first", "last"):
        raise fail(f"--from {start!r}: use first or last", 2)
    try:
        consumer = SimpleConsumer(
            group, namesrv, from_last=start == "last", await_s=POP_WAIT_S, **client_options()
        )
        consumer.subscribe(topic, expression)
    except InvalidArgumentError as exc:
        raise fail(str(exc), 2) from None
    return consumer


def _subscribed_consumer(
    topic: str, group: str, expression: str, start: str, namesrv: str
) -> PushConsumer:
    """consume's consumer, subscribed: bad input ends the command here (exit code 2)."""
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
    return consumer


@attrs.define(kw_only=True)
class _Run:
    """What a run of consume is given, and how many messages it printed."""

    topic: str
    expression: str
    group: str
    namesrv: str
    quiet: bool
    count: int | None
    idle_exit_s: float | None
    meter: LiveCount
    printed: int = 0


@attrs.define(kw_only=True)
class _Consuming(_Run):
    """consume's run: the consumer's handler prints each message and counts it, until
    ``count`` were printed (``done``), stdout's reader left, or ``idle_exit_s`` passed
    with nothing to handle."""

    consumer: PushConsumer = attrs.field(kw_only=False)
    stdout_closed: bool = False
    done: trio.Event = attrs.field(factory=trio.Event)
    last_activity: float = 0.0

    async def main(self) -> None:
        if not await _topic_known(self.namesrv, self.topic, client_options()):
            typer.echo(f"topic {self.topic} does not exist (yet); waiting for it", err=True)
        self.last_activity = trio.current_time()
        with self.meter:
            async with self.consumer.consuming(self.handle):
                log.info(
                    "consuming %s (%s) as %s; queues: %s",
                    self.topic,
                    self.expression,
                    self.group,
                    ", ".join(str(q) for q in self.consumer.assigned),
                )
                await self._until_done()
        if self.stdout_closed:
            raise BrokenPipeError("stdout was closed")

    async def _until_done(self) -> None:
        if self.idle_exit_s is None:
            await self.done.wait()
            return
        while not self.done.is_set():
            remaining = self.last_activity + self.idle_exit_s - trio.current_time()
            if remaining <= 0:
                return
            with trio.move_on_after(remaining):
                await self.done.wait()

    async def handle(self, messages: list[MessageExt]) -> None:
        """A message is printed, then handled (its offset may be committed), or it
        waits here until the consumer stops: past --count, or with stdout gone, it is
        neither printed nor committed (the group's next run gets it)."""
        for message in messages:
            if self.done.is_set():
                await trio.sleep_forever()
            if not self.quiet:
                await self._print(message)
            self.printed += 1
            self.meter.add()
            if self.count is not None and self.printed >= self.count:
                self.done.set()
        self.last_activity = trio.current_time()

    async def _print(self, message: MessageExt) -> None:
        """One line for ``message``; with stdout closed, the run ends and this waits."""
        try:
            _echo(self.meter, message)
        except BrokenPipeError:
            self.stdout_closed = True
            self.done.set()
            await trio.sleep_forever()


@attrs.define(kw_only=True)
class _Popping(_Run):
    """consume --pop's run: receive, print, ack, until ``count`` were printed, stdout's
    reader left (what was received and not printed is not acked: it comes back to the
    group), or ``idle_exit_s`` passed with nothing received."""

    consumer: SimpleConsumer = attrs.field(kw_only=False)
    invisible_s: float

    async def main(self) -> None:
        if not await _topic_known(self.namesrv, self.topic, client_options()):
            typer.echo(f"topic {self.topic} does not exist (yet); waiting for it", err=True)
        idle_since = trio.current_time()
        with self.meter:
            async with self.consumer:
                while self.count is None or self.printed < self.count:
                    wait = POP_WAIT_S
                    if self.idle_exit_s is not None:
                        wait = min(wait, idle_since + self.idle_exit_s - trio.current_time())
                        if wait <= 0:
                            return
                    most = min(MAX_POP_MESSAGES, (self.count or 1 << 30) - self.printed)
                    try:
                        messages = await self.consumer.receive(most, self.invisible_s, await_s=wait)
                    except NoRouteError:
                        await trio.sleep(min(wait, 1.0))  # (the topic does not exist yet)
                        continue
                    if messages:
                        idle_since = trio.current_time()
                    for message in messages:
                        if not self.quiet:
                            _echo(self.meter, message)  # (BrokenPipeError: not acked)
                        await self.consumer.ack(message)
                        self.printed += 1
                        self.meter.add()


def _echo(meter: LiveCount, message: MessageExt) -> None:
    body = message.body.decode(errors="replace")
    meter.echo(
        f"{message.topic} q{message.queue_id} #{message.queue_offset} "
        f"tags={message.tags or '-'} id={message.msg_id} {body}"
    )


async def _topic_known(namesrv: str, topic: str, options: dict[str, Any]) -> bool:
    """Whether a nameserver knows ``topic``; NameServerUnavailableError if none answers."""
    async with AdminClient(namesrv, **options) as admin:
        try:
            await admin.topic_route(topic)
        except NoRouteError:
            return False
    return True
