"""Produce and consume throughput of hamq's client against a broker in its own process.

The broker is started as ``python -m cli.main broker`` (embedded nameserver, ASYNC_FLUSH,
a fresh temporary store) on loopback; the clients run in this process, on the event loop
``--backend`` names: Trio (the default), asyncio, or asyncio on uvloop. The client code
is the same on each (hamq.client is written on AnyIO, and so is this driver: anyio.run
picks the loop); the broker is always the same Trio process. Neither
is pinned to a CPU unless ``--pin`` asks (broker on CPU 1, client on CPU 0): a pinned
pair ping-ponging on a virtual machine waits for idle vCPUs to wake up, which made the
1-in-flight figures slow and erratic (milliseconds-long stalls) where unpinned ones were
steady. Bodies are 1 KiB. Scenarios, in this order, each round on a fresh topic of 8
queues:

  send, 1 in flight    one task awaiting Producer.send in a loop
  send, 64 in flight   64 tasks awaiting Producer.send, sharing one counter
  1/req, 64 in flight  the same from a producer that sends one message per request
                       with JSON headers (auto_batch off, serialize_type JSON): the
                       requests every RocketMQ client but hamq's own makes
  1/req, 1 in flight   that producer with one send at a time: requests arriving one by
                       one, at about the rate of the gRPC row's client
  send_batch of 32     one task awaiting Producer.send_batch of 32 messages
                       (messages/s counts messages; latencies are per batch)
  transaction, 1       one task awaiting TransactionProducer.send_in_transaction in a
                       loop, its (async) local transaction committing at once: a half
                       message sent and stored, then END_TRANSACTION (oneway), and the
                       broker stores the committed copy (compare with "send, 1 in flight")
  transaction, 64      the same with 64 tasks (compare with "send, 64 in flight")
  push consume         a PushConsumer of a fresh group, FIRST_OFFSET, consuming every
                       message the round stored (timed from its start to the last one)
                       with an async handler (a coroutine of the loop, no thread hop)
  pull consume         a PullConsumer, one task per queue pulling 32 at a time
  pop consume          a SimpleConsumer of a fresh group (RocketMQ 5's pop), POP_CONSUMERS
                       tasks each receiving 32 at a time and acking them in one batch ack
                       (each pop and ack stored as a record before it is answered)
  gRPC send, 64        RocketMQ's official Python 5.x client (rocketmq-python-client, in
                       its own virtualenv, made from the index on first use: a child
                       process, rocketmq5_client.py) through the broker's gRPC endpoint,
                       send_async with 64 in flight: one message per request, as every
                       5.x client sends (compare the broker CPU with "1/req, 64")
  1/req, 64, paced     "1/req, 64 in flight" offered at the rate the gRPC send row reached
                       in the same round: the same load on the broker, over remoting
                       (the broker CPU per message to compare gRPC's with)
  gRPC receive+ack     the same client's SimpleConsumer of a fresh group: receive 32,
                       ack each, until it has as many as were sent
                       (--no-grpc: neither gRPC row)

Latency is from the call to its result. Besides the rates, CPU microseconds per message
of the broker process and of this (client) process show which side is the bottleneck.
Each figure is the median of ``--rounds`` rounds.

    python benchmarks/produce_consume.py            # full run (1-3 minutes on 2 cores)
    python benchmarks/produce_consume.py --quick    # fewer messages, one round
    python benchmarks/produce_consume.py --quick --backend asyncio   # or uvloop
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import anyio
import attrs
from support import (
    REPO,
    can_pin,
    cpu_seconds,
    create_topic,
    ensure_venv,
    free_ports,
    percentile,
    start_broker,
    stop_broker,
)

from hamq.client import (
    ConsumeFrom,
    LocalTransactionState,
    Message,
    MessageExt,
    MessageQueue,
    Producer,
    PullConsumer,
    PushConsumer,
    SendResult,
    SendStatus,
    SimpleConsumer,
    TransactionProducer,
)
from hamq.protocol import SerializeType

MIB = 1024 * 1024
BODY_SIZE = 1024
BATCH = 32
IN_FLIGHT = 64
QUEUES = 8
PULL_BATCH = 32

SEQUENTIAL = "send, 1 in flight"
CONCURRENT = f"send, {IN_FLIGHT} in flight"
PLAIN = f"1/req, {IN_FLIGHT} in flight"
PLAIN_SEQUENTIAL = "1/req, 1 in flight"
BATCHED = f"send_batch of {BATCH}"
TX_SEQUENTIAL = "transaction, 1"
TX_CONCURRENT = f"transaction, {IN_FLIGHT}"
PUSH = "push consume"
PULL = "pull consume"
POP = "pop consume"
GRPC_SEND = f"gRPC send, {IN_FLIGHT}"
GRPC_RECEIVE = "gRPC receive+ack"
PLAIN_PACED = f"1/req, {IN_FLIGHT}, paced"
SCENARIOS = (
    SEQUENTIAL,
    CONCURRENT,
    PLAIN,
    PLAIN_SEQUENTIAL,
    BATCHED,
    TX_SEQUENTIAL,
    TX_CONCURRENT,
    PUSH,
    PULL,
    POP,
    GRPC_SEND,
    PLAIN_PACED,
    GRPC_RECEIVE,
)
#: the tasks of the pop scenario, each with a SimpleConsumer of the group
POP_CONSUMERS = 4

#: --backend: the event loop the clients run on (anyio.run's backend and its options)
BACKENDS: dict[str, tuple[str, dict[str, Any]]] = {
    "trio": ("trio", {}),
    "asyncio": ("asyncio", {}),
    "uvloop": ("asyncio", {"use_uvloop": True}),
}
T = TypeVar("T")


@attrs.frozen
class Sizes:
    sequential: int  # messages sent one at a time
    concurrent: int  # messages sent with 64 in flight
    batches: int  # batches of 32 messages
    grpc: int  # messages the official 5.x client sends (and receives)


@attrs.frozen
class Figure:
    """One scenario of one round."""

    messages: int
    seconds: float
    #: per call (per batch for send_batch); empty for the consumers
    latencies: list[float]
    broker_cpu: float
    client_cpu: float


# =========================================================================== scenarios


def _messages(topic: str, count: int) -> list[Message]:
    body = os.urandom(BODY_SIZE)
    return [Message(topic, body) for _ in range(count)]


def _check(status: SendStatus) -> None:
    if status is not SendStatus.SEND_OK:
        raise RuntimeError(f"a send ended {status.value}")


# Each scenario returns when it ended (time.perf_counter) and its latencies.
Outcome = tuple[float, list[float]]


async def send_sequential(producer: Producer, topic: str, count: int) -> Outcome:
    latencies = []
    for message in _messages(topic, count):
        start = time.perf_counter()
        result = await producer.send(message)
        latencies.append(time.perf_counter() - start)
        _check(result.status)
    return time.perf_counter(), latencies


class Committing:
    """The transactions' listener: every local transaction commits at once (so the
    figure is the messaging's cost, not a database's)."""

    async def execute(self, message: Message, arg: Any) -> LocalTransactionState:
        return LocalTransactionState.COMMIT_MESSAGE

    async def check(self, message: MessageExt) -> LocalTransactionState:
        return LocalTransactionState.COMMIT_MESSAGE


async def send_in_transactions(
    producer: TransactionProducer, topic: str, count: int, in_flight: int
) -> Outcome:
    """``count`` transactional sends by ``in_flight`` tasks sharing one counter."""
    return await _send_many(producer.send_in_transaction, topic, count, in_flight)


async def send_concurrent(producer: Producer, topic: str, count: int) -> Outcome:
    return await _send_many(producer.send, topic, count, IN_FLIGHT)


async def send_paced(producer: Producer, topic: str, count: int, rate: float) -> Outcome:
    """``count`` sends with 64 in flight, the i-th not before i / ``rate`` s."""
    return await _send_many(producer.send, topic, count, IN_FLIGHT, rate)


async def _send_many(
    send: Callable[[Message], Awaitable[SendResult]],
    topic: str,
    count: int,
    in_flight: int,
    rate: float | None = None,
) -> Outcome:
    messages = _messages(topic, count)
    latencies: list[float] = []
    next_index = 0
    began = time.perf_counter()

    async def sender() -> None:
        nonlocal next_index
        while next_index < count:
            message = messages[next_index]
            if rate is not None:
                due = began + next_index / rate
                next_index += 1
                await anyio.sleep(max(0.0, due - time.perf_counter()))
            else:
                next_index += 1
            start = time.perf_counter()
            result = await send(message)
            latencies.append(time.perf_counter() - start)
            _check(result.status)

    async with anyio.create_task_group() as tasks:
        for _ in range(in_flight):
            tasks.start_soon(sender)
    return time.perf_counter(), latencies


async def send_batches(producer: Producer, topic: str, batches: int) -> Outcome:
    messages = _messages(topic, BATCH)
    latencies = []
    for _ in range(batches):
        start = time.perf_counter()
        result = await producer.send_batch(messages)
        latencies.append(time.perf_counter() - start)
        _check(result.status)
    return time.perf_counter(), latencies


async def push_consume(namesrv: str, topic: str, group: str, count: int) -> Outcome:
    """Until a PushConsumer of a new group has consumed ``count`` messages of ``topic``
    (the end is the last message handled, not the consumer's shutdown after it)."""
    consumer = PushConsumer(group, namesrv, consume_from=ConsumeFrom.FIRST_OFFSET)
    consumer.subscribe(topic)
    done = anyio.Event()
    consumed = 0

    async def handle(messages: list[MessageExt]) -> None:  # in the loop (no worker thread)
        nonlocal consumed
        consumed += len(messages)
        if consumed >= count:
            done.set()

    async with consumer.consuming(handle):
        await done.wait()
        end = time.perf_counter()
    return end, []


async def pull_consume(namesrv: str, topic: str, count: int) -> Outcome:
    """Every message of ``topic`` pulled, one task per queue, PULL_BATCH at a time."""
    async with PullConsumer(f"{topic}-pull", namesrv) as consumer:
        queues = await consumer.queues(topic)
        pulled = 0

        async def drain(queue: MessageQueue) -> None:
            nonlocal pulled
            end = await consumer.max_offset(queue)
            offset = await consumer.min_offset(queue)
            while offset < end:
                result = await consumer.pull(queue, offset, max_nums=PULL_BATCH)
                pulled += len(result.messages)
                offset = result.next_begin_offset

        async with anyio.create_task_group() as tasks:
            for queue in queues:
                tasks.start_soon(drain, queue)
        end = time.perf_counter()
    if pulled != count:
        raise RuntimeError(f"pulled {pulled} messages of {topic}, expected {count}")
    return end, []


async def pop_consume(namesrv: str, topic: str, group: str, count: int) -> Outcome:
    """Until the SimpleConsumers of a new group have received and acked ``count``
    messages of ``topic``, PULL_BATCH a receive, each batch acked at once."""
    received = 0
    done = anyio.Event()

    async def member() -> None:
        nonlocal received
        async with SimpleConsumer(group, namesrv) as consumer:
            consumer.subscribe(topic)
            while not done.is_set():
                messages = await consumer.receive(PULL_BATCH, 60, await_s=0.5)
                if messages:
                    await consumer.ack_many(messages)
                    received += len(messages)
                    if received >= count:
                        done.set()

    async with anyio.create_task_group() as tasks:
        for _ in range(POP_CONSUMERS):
            tasks.start_soon(member)
        await done.wait()
        end = time.perf_counter()
    if received != count:
        raise RuntimeError(f"popped {received} messages of {topic}, expected {count}")
    return end, []


def round_topic(round_no: int) -> str:
    return f"BenchProduceConsume{round_no}"


async def grpc_figure(python: Path, broker_pid: int, command: str, *args: str) -> Figure:
    """One run of the official 5.x client (rocketmq5_client.py) in its virtualenv."""
    script = REPO / "benchmarks" / "rocketmq5_client.py"
    broker_before = cpu_seconds(broker_pid)
    done = await anyio.run_process([str(python), str(script), command, *args], check=False)
    broker_cpu = cpu_seconds(broker_pid) - broker_before
    if done.returncode != 0:
        raise RuntimeError(f"rocketmq5_client.py {command} failed:\n{done.stderr.decode()}")
    result = json.loads(done.stdout.decode().strip().splitlines()[-1])
    return Figure(
        result["messages"], result["seconds"], result["latencies"], broker_cpu, result["cpu"]
    )


async def run_round(
    namesrv: str,
    broker_pid: int,
    round_no: int,
    sizes: Sizes,
    grpc: tuple[Path, str] | None = None,
) -> dict[str, Figure]:
    topic = round_topic(round_no)
    figures: dict[str, Figure] = {}

    async def timed(scenario: str, messages: int, work: Callable[[], Awaitable[Outcome]]) -> None:
        broker_before, client_before = cpu_seconds(broker_pid), time.process_time()
        start = time.perf_counter()
        end, latencies = await work()
        figures[scenario] = Figure(
            messages,
            end - start,
            latencies,
            cpu_seconds(broker_pid) - broker_before,
            time.process_time() - client_before,
        )

    async with Producer(f"{topic}-producer", namesrv) as producer:
        # warm up: the route, the connection, the broker's first writes to the topic
        warm_up = 2 * IN_FLIGHT
        await send_concurrent(producer, topic, warm_up)
        await timed(
            SEQUENTIAL,
            sizes.sequential,
            lambda: send_sequential(producer, topic, sizes.sequential),
        )
        await timed(
            CONCURRENT,
            sizes.concurrent,
            lambda: send_concurrent(producer, topic, sizes.concurrent),
        )
        await timed(
            BATCHED, BATCH * sizes.batches, lambda: send_batches(producer, topic, sizes.batches)
        )
    plain_options: dict[str, Any] = {"auto_batch": False, "serialize_type": SerializeType.JSON}
    async with Producer(f"{topic}-plain", namesrv, **plain_options) as plain:
        await send_concurrent(plain, topic, IN_FLIGHT)  # (warm up: its route and connection)
        await timed(
            PLAIN, sizes.concurrent, lambda: send_concurrent(plain, topic, sizes.concurrent)
        )
        await timed(
            PLAIN_SEQUENTIAL,
            sizes.sequential,
            lambda: send_sequential(plain, topic, sizes.sequential),
        )
    async with TransactionProducer(f"{topic}-tx", namesrv, Committing()) as tx_producer:
        await send_in_transactions(tx_producer, topic, IN_FLIGHT, IN_FLIGHT)  # (warm up)
        await timed(
            TX_SEQUENTIAL,
            sizes.sequential,
            lambda: send_in_transactions(tx_producer, topic, sizes.sequential, 1),
        )
        await timed(
            TX_CONCURRENT,
            sizes.concurrent,
            lambda: send_in_transactions(tx_producer, topic, sizes.concurrent, IN_FLIGHT),
        )
    # (every transaction committed: its message is in the topic too)
    sent = sizes.sequential + sizes.concurrent
    stored = (
        warm_up
        + 2 * IN_FLIGHT
        + 2 * sent
        + sizes.concurrent
        + sizes.sequential
        + BATCH * sizes.batches
    )
    await timed(PUSH, stored, lambda: push_consume(namesrv, topic, f"{topic}-push", stored))
    await timed(PULL, stored, lambda: pull_consume(namesrv, topic, stored))
    await timed(POP, stored, lambda: pop_consume(namesrv, topic, f"{topic}-pop", stored))
    if grpc is not None:
        python, endpoints = grpc
        common = ("--endpoints", endpoints, "--topic", f"{topic}-grpc", "--count", str(sizes.grpc))
        figures[GRPC_SEND] = sent = await grpc_figure(python, broker_pid, "send", *common)
        async with Producer(f"{topic}-paced", namesrv, **plain_options) as plain:
            await send_concurrent(plain, topic, IN_FLIGHT)  # (warm up)
            await timed(
                PLAIN_PACED,
                sizes.grpc,
                lambda: send_paced(plain, topic, sizes.grpc, sent.messages / sent.seconds),
            )
        figures[GRPC_RECEIVE] = await grpc_figure(
            python, broker_pid, "receive", *common, "--group", f"{topic}-grpc"
        )
    return figures


# =========================================================================== driver


def check_backend(backend: str) -> str | None:
    """Why ``backend`` cannot run here (uvloop not installed), or None."""
    if backend == "uvloop" and importlib.util.find_spec("uvloop") is None:
        return (
            "--backend uvloop needs uvloop, which is not installed here: "
            "pip install uvloop (it does not run on Windows), or use --backend asyncio"
        )
    return None


def run_on(backend: str, func: Callable[..., Awaitable[T]], *args: object) -> T:
    """``func(*args)`` run to the end on a fresh event loop of ``backend``."""
    name, options = BACKENDS[backend]
    return anyio.run(func, *args, backend=name, backend_options=options)


def describe(backend: str) -> str:
    """The clients' event loop and its version, for the first line of the output."""
    if backend == "trio":
        return f"clients on Trio {importlib.metadata.version('trio')}"
    loop = "asyncio"
    if backend == "uvloop":
        loop = f"asyncio on uvloop {importlib.metadata.version('uvloop')}"
    return f"clients on {loop} (AnyIO {importlib.metadata.version('anyio')})"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=3, help="rounds (median of each figure)")
    parser.add_argument("--quick", action="store_true", help="fewer messages, one round")
    parser.add_argument("--dir", type=Path, default=None, help="where the store goes")
    parser.add_argument(
        "--pin", action="store_true", help="pin the broker to CPU 1 and this process to CPU 0"
    )
    parser.add_argument(
        "--no-grpc", action="store_true", help="leave out the official 5.x client's gRPC rows"
    )
    parser.add_argument(
        "--backend",
        choices=list(BACKENDS),
        default="trio",
        help="the event loop the clients run on (the broker is Trio in any case)",
    )
    args = parser.parse_args()
    if (problem := check_backend(args.backend)) is not None:
        parser.error(problem)
    pin = args.pin and can_pin()
    rounds = 1 if args.quick else args.rounds
    sizes = Sizes(2_000, 10_000, 300, 3_000) if args.quick else Sizes(10_000, 60_000, 2_000, 20_000)
    grpc_python = None
    if not args.no_grpc:
        print("the official RocketMQ 5 client's virtualenv (.venv-rmq5) ...", flush=True)
        grpc_python = ensure_venv()
    (grpc_port,) = free_ports(1)
    print(
        f"Python {platform.python_version()}, broker on Trio {importlib.metadata.version('trio')}, "
        f"{describe(args.backend)}, {os.cpu_count()} core(s); broker and client "
        f"{'pinned to CPU 1 and CPU 0' if pin else 'not pinned'}",
        flush=True,
    )

    base = Path(tempfile.mkdtemp(prefix="hamq-bench-", dir=args.dir))
    stderr_path = base / "broker.stderr"
    figures: dict[str, list[Figure]] = {}
    exit_code: int | None = None
    try:
        proc, namesrv = start_broker(base / "store", stderr_path, pin=pin, grpc_port=grpc_port)
        grpc = None if grpc_python is None else (grpc_python, f"127.0.0.1:{grpc_port}")
        try:
            if pin:
                os.sched_setaffinity(0, {0})
            for round_no in range(rounds):
                # set-up, not measured: the tests' helper (tests/support), which waits on Trio
                run_on("trio", create_topic, namesrv, round_topic(round_no), QUEUES)
                result = run_on(args.backend, run_round, namesrv, proc.pid, round_no, sizes, grpc)
                for scenario, figure in result.items():
                    figures.setdefault(scenario, []).append(figure)
                    print(
                        f"round {round_no + 1}: {scenario:20} {figure.messages:>8,} messages"
                        f" {figure.messages / figure.seconds:>10,.0f} msgs/s",
                        file=sys.stderr,
                    )
        finally:
            exit_code = stop_broker(proc)
        broker_stderr = stderr_path.read_text().strip()
    finally:
        shutil.rmtree(base, ignore_errors=True)

    print(
        f"\nProduce and consume, {BODY_SIZE} B bodies, broker in its own process (ASYNC_FLUSH),"
        f" clients on {args.backend}, median of {rounds} round(s)\n"
    )
    header = (
        f"{'scenario':20}{'messages':>10}{'msgs/s':>10}{'MB/s':>8}{'p50 ms':>9}{'p99 ms':>9}"
        f"{'broker CPU':>12}{'client CPU':>12}"
    )
    print(header)
    print(f"{'':57}{'us/msg':>12}{'us/msg':>12}")
    print("-" * len(header))
    rates: dict[str, float] = {}
    for scenario in SCENARIOS:
        if scenario not in figures:
            continue
        runs = figures[scenario]
        rate = statistics.median(f.messages / f.seconds for f in runs)
        rates[scenario] = rate
        if runs[0].latencies:
            p50 = f"{statistics.median(percentile(f.latencies, 0.5) for f in runs) * 1e3:9.2f}"
            p99 = f"{statistics.median(percentile(f.latencies, 0.99) for f in runs) * 1e3:9.2f}"
        else:
            p50 = p99 = f"{'-':>9}"
        broker_us = statistics.median(1e6 * f.broker_cpu / f.messages for f in runs)
        client_us = statistics.median(1e6 * f.client_cpu / f.messages for f in runs)
        print(
            f"{scenario:20}{runs[0].messages:>10,}{rate:>10,.0f}{rate * BODY_SIZE / MIB:>8.1f}"
            f"{p50}{p99}{broker_us:>12.1f}{client_us:>12.1f}"
        )
    print(f"\n(send_batch latencies are per batch of {BATCH}; MB/s counts bodies only)")
    print(
        f"{IN_FLIGHT} in flight: {rates[CONCURRENT] / rates[SEQUENTIAL]:.1f}x the sends/s of 1 in"
        f" flight; batches of {BATCH}: {rates[BATCHED] / rates[CONCURRENT]:.1f}x the msgs/s of"
        f" {IN_FLIGHT} in flight; push consumer at {rates[PUSH] / rates[PULL]:.0%} of plain pulls;"
        f" pop consume at {rates[POP] / rates[PUSH]:.2f}x push consume."
    )
    plain_us = statistics.median(1e6 * f.broker_cpu / f.messages for f in figures[PLAIN])
    own_us = statistics.median(1e6 * f.broker_cpu / f.messages for f in figures[CONCURRENT])
    print(
        f"One message per request with JSON headers: {rates[PLAIN] / rates[CONCURRENT]:.2f}x the"
        f" sends/s of hamq's own client (auto-batched, msgpack headers) at {IN_FLIGHT} in"
        f" flight, {plain_us / own_us:.1f}x its broker CPU per message."
    )
    print(
        f"Transactional sends: {rates[TX_SEQUENTIAL] / rates[SEQUENTIAL]:.2f}x the sends/s of"
        f" plain sends with 1 in flight, {rates[TX_CONCURRENT] / rates[CONCURRENT]:.2f}x with"
        f" {IN_FLIGHT} in flight."
    )
    if GRPC_SEND in figures:
        grpc_us = statistics.median(1e6 * f.broker_cpu / f.messages for f in figures[GRPC_SEND])
        one_us = statistics.median(
            1e6 * f.broker_cpu / f.messages for f in figures[PLAIN_SEQUENTIAL]
        )
        # (each round's gRPC send against its paced remoting sends, at the same rate)
        paced = statistics.median(
            (grpc.broker_cpu / grpc.messages) / (remoting.broker_cpu / remoting.messages)
            for grpc, remoting in zip(figures[GRPC_SEND], figures[PLAIN_PACED], strict=True)
        )
        print(
            f"gRPC (the official Python 5.x client, one message per request): {grpc_us:.1f} us"
            f" of broker CPU per send at {rates[GRPC_SEND]:,.0f} sends/s: {paced:.2f}x a"
            f" remoting 1/req send at the same rate and {IN_FLIGHT} in flight (median of the"
            f" rounds' ratios), {grpc_us / plain_us:.2f}x one at {IN_FLIGHT} in flight unpaced"
            f" ({rates[PLAIN]:,.0f}/s, grouped), {grpc_us / one_us:.2f}x one at 1 in flight"
            f" ({rates[PLAIN_SEQUENTIAL]:,.0f}/s); receive+ack at"
            f" {rates[GRPC_RECEIVE] / rates[POP]:.2f}x hamq's pop consume."
        )
    if exit_code not in (0, None) or broker_stderr:
        print(f"\nThe broker exited with code {exit_code}; its stderr:\n{broker_stderr}")


if __name__ == "__main__":
    main()
