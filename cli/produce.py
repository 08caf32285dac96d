"""``hamq produce``: a producer at the terminal.

Its bodies (BODY, ``--body-file``, stdin) are read and checked by cli/bodies.py; every
message is checked before the first is sent: bad input ends the command with exit code
2, having sent nothing.

``--concurrency`` tasks (1) send requests of ``--batch`` messages (1: one message a
request; more: SEND_BATCH_MESSAGE, a batch stored in one queue), numbered 0 to COUNT -
1 and taken in turn, each task one request at a time. Each request may take
``--send-timeout`` (30 s), retries and a master failover included, a single try at most
``--attempt-timeout`` (ATTEMPT_TIMEOUT_S: a master that hangs is given up for the next
try, on a fresh route). The command ends with one summary line on stdout (how many were
sent, how many acknowledged SEND_OK: counted per answered request, so exact whatever
the concurrency) whether it finished, gave up on a request (then no new request starts,
those under way end, and one ``error:`` line follows, exit code 1) or was interrupted
(exit code 130); exit code 1 too when a message was stored short of SEND_OK. A batch too
large for the broker (``max_message_size``) is refused before anything is sent.
``--transaction commit|rollback|unknown`` sends each message in a transaction whose
local state is that (a TransactionProducer); with ``unknown`` the command then stays
until the broker has checked every message back (answering ``--check-answer``) or
``--check-wait`` has passed. ``--deliver-at`` (an ISO 8601 time) or ``--deliver-after``
(500ms, 30s, 5m, 2h, 1d) makes them timer messages, delivered then (RocketMQ 5's
delivery time). It draws its count and rate live on stderr when that is a terminal
(LiveCount).
"""

from __future__ import annotations

import enum
import re
import time
from collections import Counter
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any

import attrs
import trio
import typer

from cli.bodies import MAX_BODY_BYTES, Bodies, read_bodies
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
    BrokerError,
    InvalidArgumentError,
    LocalTransactionState,
    Message,
    MessageExt,
    NoMasterError,
    Producer,
    SendError,
    SendResult,
    SendStatus,
    TransactionProducer,
    TransactionSendResult,
)
from hamq.client.message import check_message, check_topic
from hamq.protocol import send_timing

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


@attrs.frozen
class _Messages:
    """What produce sends: COUNT messages numbered 0 to COUNT - 1 ('{i}' in BODY and
    the keys becomes the number), in requests of BATCH consecutive messages."""

    topic: str
    bodies: Bodies
    tags: str | None
    keys: str | None
    delay_level: int
    count: int
    batch: int
    #: seconds since the epoch (--deliver-at), or from the send (--deliver-after)
    deliver_at: float | None = None
    deliver_after: float | None = None

    def message(self, i: int) -> Message:
        return Message(
            self.topic,
            self.bodies(i),
            tags=self.tags,
            keys=self.keys.replace("{i}", str(i)) if self.keys else None,
            delay_level=self.delay_level,
            deliver_at=self.deliver_at,
            deliver_after=self.deliver_after,
        )

    @property
    def timed(self) -> bool:
        return self.deliver_at is not None or self.deliver_after is not None

    @property
    def requests(self) -> range:
        """Each request's first message."""
        return range(0, self.count, self.batch)

    def numbers(self, first: int) -> range:
        """The messages of the request that starts at ``first``."""
        return range(first, min(first + self.batch, self.count))

    def of_request(self, first: int) -> list[Message]:
        return [self.message(i) for i in self.numbers(first)]

    def request_name(self, first: int) -> str:
        """The request that starts at ``first``, as an error line names it."""
        if self.batch > 1:
            return f"the batch of messages #{first}-#{self.numbers(first)[-1]}"
        return f"message #{first}"


class Transaction(enum.Enum):
    """produce --transaction: the local transaction's state each message reports."""

    commit = "commit"
    rollback = "rollback"
    unknown = "unknown"


class CheckAnswer(enum.Enum):
    """produce --check-answer: what the broker's check-backs are answered."""

    commit = "commit"
    rollback = "rollback"


_STATES = {
    "commit": LocalTransactionState.COMMIT_MESSAGE,
    "rollback": LocalTransactionState.ROLLBACK_MESSAGE,
    "unknown": LocalTransactionState.UNKNOW,
}


@attrs.define
class _Listener:
    """produce --transaction's local transactions: each one ends as ``state``; a
    check-back is answered ``answer`` and counted."""

    state: LocalTransactionState
    answer: LocalTransactionState
    echo: bool
    checked: set[str] = attrs.field(factory=set)
    all_checked: trio.Event = attrs.field(factory=trio.Event)
    expected: int = 0

    async def execute(self, message: Message, arg: Any) -> LocalTransactionState:
        return self.state

    async def check(self, message: MessageExt) -> LocalTransactionState:
        self.checked.add(message.msg_id)
        if self.echo:
            typer.echo(f"checked back: id {message.msg_id}, answered {self.answer.name}")
        if len(self.checked) >= self.expected:
            self.all_checked.set()
        return self.answer


def _checked_producer(
    messages: _Messages,
    group: str,
    namesrv: str,
    send_timeout_s: float,
    attempt_timeout_s: float,
    listener: _Listener | None = None,
) -> Producer:
    """The producer for ``messages``, once they are known to be valid: bad input ends the
    command here (exit code 2), before anything is sent. With a ``listener`` it is a
    TransactionProducer."""
    if messages.batch > 1 and messages.delay_level > 0:
        raise fail("--batch cannot be used with --delay-level (a batch has no delay level)", 2)
    if messages.batch > 1 and messages.timed:
        raise fail("--batch cannot be used with --deliver-at/--deliver-after", 2)
    if messages.delay_level > 0 and messages.timed:
        raise fail("--delay-level cannot be used with --deliver-at/--deliver-after", 2)
    if listener is not None and messages.batch > 1:
        raise fail("--transaction cannot be used with --batch: each is sent on its own", 2)
    if listener is not None and messages.delay_level > 0:
        raise fail("--transaction cannot be used with --delay-level: not delayed", 2)
    # '{i}' grows with i: the last message is the longest, the last two requests hold
    # the largest batch; bodies of their own (stdin's lines) are checked one by one
    each = messages.bodies.per_message
    try:
        check_topic(messages.topic)
        for i in range(messages.count) if each else (0, messages.count - 1):
            check_message(messages.message(i), MAX_BODY_BYTES)
        options = {
            "send_timeout_s": send_timeout_s,
            "send_attempt_timeout_s": min(attempt_timeout_s, send_timeout_s),
            **client_options(),
        }
        producer = (
            Producer(group, namesrv, **options)
            if listener is None
            else TransactionProducer(group, namesrv, listener, **options)
        )
    except InvalidArgumentError as exc:
        raise fail(str(exc), 2) from None
    batches = messages.requests if each else messages.requests[-2:]
    try:
        for first in batches if messages.batch > 1 else ():
            producer.check_batch(messages.of_request(first))
    except InvalidArgumentError as exc:
        raise fail(f"--batch {messages.batch}: {exc}", 2) from None
    return producer


@attrs.define
class _Sending:
    """produce's run: ``concurrency`` senders share one producer and take the requests
    in turn, each request once. The first request given up on (``failure``) stops new
    ones; those under way end. The summary line is printed however the run ends."""

    producer: Producer
    messages: _Messages
    send_timeout_s: float
    tally: _Tally
    meter: LiveCount
    failure: str | None = None
    #: --transaction's listener, and how long to wait for check-backs (unknown)
    listener: _Listener | None = None
    check_wait_s: float = 0.0

    async def main(self, concurrency: int) -> None:
        async with self.producer:
            # the route first: a nameserver that is not there ends the command here; a
            # topic whose broker groups have no master now is sent to until the send
            # timeout (a failover may bring one), saying so once
            try:
                await self.producer.queues(self.messages.topic)
            except NoMasterError as exc:
                typer.echo(
                    f"warning: {exc}; trying for {self.send_timeout_s:g}s (--send-timeout)",
                    err=True,
                )
            requests = self.messages.requests
            next_request = iter(requests)  # shared by the senders: each request goes once
            started = time.perf_counter()
            try:
                with self.meter:
                    async with trio.open_nursery() as nursery:
                        for _ in range(min(concurrency, len(requests))):
                            nursery.start_soon(self._sender, next_request)
            finally:
                self.tally.elapsed_s = time.perf_counter() - started
                typer.echo(self.tally.summary(self.messages.topic))
            if self.failure is not None:
                raise CommandError(self.failure)
            await self._checked_back()

    async def _checked_back(self) -> None:
        """--transaction unknown: wait until the broker checked back every message."""
        listener = self.listener
        if listener is None or listener.state is not LocalTransactionState.UNKNOW:
            return
        listener.expected = self.tally.sent
        if len(listener.checked) < listener.expected:
            typer.echo(
                f"waiting for the broker to check back {listener.expected} transaction(s) "
                f"(at most {self.check_wait_s:g}s; the broker's transaction_timeout_s and "
                "transaction_check_interval_s say when)",
                err=True,
            )
            with trio.move_on_after(self.check_wait_s):
                await listener.all_checked.wait()
        checked = len(listener.checked)
        typer.echo(
            f"checked back {checked} of {listener.expected} transaction(s), answered "
            f"{listener.answer.name}"
        )
        if checked < listener.expected:
            raise CommandError(
                f"the broker did not check back {listener.expected - checked} "
                f"transaction(s) within {self.check_wait_s:g}s (--check-wait)"
            )

    async def _sender(self, next_request: Iterator[int]) -> None:
        for first in next_request:
            if self.failure is not None:
                return
            numbers = self.messages.numbers(first)
            try:
                result = await self._send(first)
            except SendError as exc:
                if self.failure is None:
                    self.failure = self._gave_up(first, exc)
                return
            self.tally.add(result, len(numbers))
            self.meter.add(len(numbers))
            if self.messages.count <= ECHO_EACH_UP_TO:
                _echo_sent(self.meter, result, numbers)

    async def _send(self, first: int) -> SendResult:
        if isinstance(self.producer, TransactionProducer):
            return await self.producer.send_in_transaction(self.messages.message(first))
        if self.messages.batch == 1:
            return await self.producer.send(self.messages.message(first))
        return await self.producer.send_batch(self.messages.of_request(first))

    def _gave_up(self, first: int, exc: SendError) -> str:
        last = f"; the last: {exc.attempts[-1]}" if exc.attempts else ""
        # a refusal that is not retried (a body over the broker's max_message_bytes)
        # ends the send at once: the time did not run out
        refused = isinstance(exc.__cause__, BrokerError)
        why = "refused" if refused else f"not sent within {self.send_timeout_s:g}s"
        return (
            f"gave up on {self.messages.request_name(first)}: {why} "
            f"({len(exc.attempts)} attempt(s){last})"
        )


#: produce's longer options, named here to keep its signature short (typer reads them
#: from it as if written there)
DelayLevelOption = Annotated[
    int,
    typer.Option(
        "--delay-level",
        min=0,
        max=MAX_DELAY_LEVEL,
        help=f"Deliver later: 1=1s 2=5s 3=10s ... {MAX_DELAY_LEVEL}=2h (0: at once).",
    ),
]
DeliverAtOption = Annotated[
    str | None,
    typer.Option(
        "--deliver-at",
        help="Deliver at this time: ISO 8601 (2026-12-01T09:30:00, local time unless it "
        "names a zone: ...Z, ...+01:00), up to the broker's timer_max_delay_s (3 days).",
        show_default=False,
    ),
]
DeliverAfterOption = Annotated[
    str | None,
    typer.Option(
        "--deliver-after",
        help="Deliver this long after the broker stores it: 500ms, 30s, 5m, 2h, 1d (a bare "
        "number: seconds).",
        show_default=False,
    ),
]
SendTimeoutOption = Annotated[
    float,
    typer.Option(
        "--send-timeout",
        min=0.1,
        help="Seconds one message (or batch) may take, retries and a master failover included.",
    ),
]
AttemptTimeoutOption = Annotated[
    float,
    typer.Option(
        "--attempt-timeout",
        min=0.1,
        help="Seconds one try may wait for a broker before the next try (default "
        f"{ATTEMPT_TIMEOUT_S:g}): keep it above the brokers' sync_flush_timeout_s and "
        "[ha] sync_timeout_s.",
    ),
]
ConcurrencyOption = Annotated[
    int,
    typer.Option(
        "--concurrency",
        min=1,
        max=MAX_CONCURRENCY,
        help="How many requests are under way at once (COUNT stays the total).",
    ),
]
TransactionOption = Annotated[
    Transaction | None,
    typer.Option(
        "--transaction",
        help="Send each message in a transaction whose local state is this: commit (the "
        "message is delivered), rollback (never delivered), unknown (the broker checks "
        "back later: the command waits and answers --check-answer).",
    ),
]
CheckAnswerOption = Annotated[
    CheckAnswer,
    typer.Option("--check-answer", help="What the broker's check-backs are answered."),
]
CheckWaitOption = Annotated[
    float,
    typer.Option(
        "--check-wait",
        min=0.1,
        help="Seconds --transaction unknown waits for the broker to check back every message.",
    ),
]
BatchOption = Annotated[
    int,
    typer.Option(
        "--batch",
        min=1,
        max=MAX_BATCH,
        help="Messages per request, sent as one batch to one queue (1: no batching).",
    ),
]


BodyFileOption = Annotated[
    Path | None,
    typer.Option(
        "--body-file",
        help="Send the content of this file as the body of each message, bytes as they "
        f"are (binary too; at most {MAX_BODY_BYTES} bytes); '-' reads it from stdin.",
    ),
]
WholeOption = Annotated[
    bool,
    typer.Option("--whole", help="With BODY '-': all of stdin is the body of each message."),
]


def produce(
    topic: Annotated[str, typer.Option("--topic", "-t", help="Topic to send to.")],
    body: Annotated[
        str | None,
        typer.Argument(
            help="Message body; '{i}' becomes the message's number. '-': read the bodies "
            "from stdin, one message a line (empty lines skipped; --whole: one message).",
            metavar="BODY",
            show_default=False,
        ),
    ] = None,
    count: Annotated[
        int | None,
        typer.Option(
            "--count",
            "-c",
            min=1,
            help="How many messages (default 1; with BODY '-', one a line of stdin: then "
            "the first COUNT lines).",
        ),
    ] = None,
    body_file: BodyFileOption = None,
    whole: WholeOption = False,
    tags: Annotated[str | None, typer.Option("--tags", help="Tag of every message.")] = None,
    keys: Annotated[
        str | None, typer.Option("--keys", help="Space-separated keys ('{i}' numbered).")
    ] = None,
    delay_level: DelayLevelOption = 0,
    deliver_at: DeliverAtOption = None,
    deliver_after: DeliverAfterOption = None,
    group: Annotated[str, typer.Option("--group", "-g", help="Producer group.")] = "hamq-cli",
    send_timeout_s: SendTimeoutOption = SEND_TIMEOUT_S,
    attempt_timeout_s: AttemptTimeoutOption = ATTEMPT_TIMEOUT_S,
    concurrency: ConcurrencyOption = 1,
    batch: BatchOption = 1,
    transaction: TransactionOption = None,
    check_answer: CheckAnswerOption = CheckAnswer.commit,
    check_wait_s: CheckWaitOption = 90.0,
    namesrv: NamesrvOption = DEFAULT_NAMESRV,
) -> None:
    """Send COUNT messages to TOPIC and report where they went (Ctrl-C stops; the
    summary says how many were sent).

    The body is BODY, the content of --body-file, or stdin's ('-'). Every message is
    checked before the first is sent."""
    bodies, count = read_bodies(body, body_file, whole, count)
    if deliver_at is not None and deliver_after is not None:
        raise fail("give --deliver-at or --deliver-after, not both", 2)
    messages = _Messages(
        topic,
        bodies,
        tags,
        keys,
        delay_level,
        count,
        batch,
        deliver_at=None if deliver_at is None else parse_instant("--deliver-at", deliver_at),
        deliver_after=(
            None if deliver_after is None else parse_duration("--deliver-after", deliver_after)
        ),
    )
    listener = None
    if transaction is not None:
        listener = _Listener(
            _STATES[transaction.value], _STATES[check_answer.value], count <= ECHO_EACH_UP_TO
        )
    producer = _checked_producer(
        messages, group, namesrv, send_timeout_s, attempt_timeout_s, listener
    )
    tally = _Tally(count)
    sending = _Sending(
        producer,
        messages,
        send_timeout_s,
        tally,
        LiveCount(f"produce {topic}", total=count),
        listener=listener,
        check_wait_s=check_wait_s,
    )
    run(sending.main, concurrency, interruptible=True)
    if tally.acknowledged < count:
        raise fail(
            f"{count - tally.acknowledged} of {count} message(s) stored short of "
            f"SEND_OK: {tally.short_of_ok()}"
        )


_DURATION = re.compile(r"([0-9]+(?:\.[0-9]+)?)\s*(ms|s|m|h|d)?")
_UNIT_S = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_duration(option: str, text: str) -> float:
    """Seconds from '500ms', '30s', '5m', '2h', '1d' or a bare number of seconds; a
    usage error (exit 2) naming ``option`` for anything else, or for no time at all."""
    found = _DURATION.fullmatch(text.strip())
    if found is None:
        raise fail(f"{option} {text!r} is not a duration: write 500ms, 30s, 5m, 2h or 1d", 2)
    seconds = float(found[1]) * _UNIT_S[found[2] or "s"]
    if not seconds > 0:
        raise fail(f"{option} {text!r} is not a positive duration", 2)
    return seconds


def parse_instant(option: str, text: str) -> float:
    """Seconds since the epoch from an ISO 8601 time (local time unless it names a
    zone); a usage error (exit 2) naming ``option`` for anything else."""
    try:
        instant = datetime.fromisoformat(text.strip())
    except ValueError:
        raise fail(
            f"{option} {text!r} is not an ISO 8601 time (e.g. 2026-12-01T09:30:00+01:00)", 2
        ) from None
    if instant.tzinfo is None:
        instant = instant.astimezone()  # (the local zone)
    return instant.timestamp()


def _echo_sent(meter: LiveCount, result: SendResult, numbers: range) -> None:
    """One line per message of a request: a batch's are stored one after the other. A
    transactional send says its local state (its queue offset is the half message's)."""
    ids = result.msg_id.split(",") if len(numbers) > 1 else [result.msg_id]
    offset, state = "offset", ""
    if isinstance(result, TransactionSendResult):
        offset, state = "half offset", f" {result.local_transaction_state.name}"
    for k, i in enumerate(numbers):
        msg_id = ids[k] if k < len(ids) else "?"
        meter.echo(
            f"#{i} {result.status.value} {result.queue} {offset} {result.queue_offset + k} "
            f"id {msg_id}{state}"
        )
