"""A Spark batch read of a hamq topic, against Spark reading the same rows from parquet.

A broker runs in its own process (embedded nameserver, fresh temporary store, loopback);
``--messages`` messages of ``--size`` bytes are sent to a topic of ``--queues`` queues;
then a local SparkSession (``local[2]`` unless ``--master``) runs, each round:

  hamq -> count()       spark.read.format("hamq")...load().count()
  hamq -> noop          every column of every row materialized (Spark's "noop" sink)
  hamq 32/pull -> noop  the same, each pull answer capped at 32 messages (pullBatchSize
                        32: what a broker with RocketMQ's default max_transfer_count gives)
  hamq -> parquet       the rows written to a parquet directory
  parquet -> count()    spark.read.parquet(...).count() (answered from parquet footers)
  parquet -> noop       every column of every row read back from parquet

Figures are rows/s and MB/s of message bodies, each the median of ``--rounds`` rounds;
the ratio compares reading the topic with reading the same rows from parquet (noop
against noop: both read every column; count() against count() is shown too, though
parquet answers count() from its footers without reading a row).

``--pull-count`` sets the broker's max_transfer_count (messages per pull answer;
RocketMQ's default is 32; 1024 here, as the README advises for brokers Spark reads in
bulk) and raises max_transfer_bytes to fit. Each pull costs the reader and the broker
a few hundred microseconds of CPU on a small machine, so bigger answers read faster.

    python benchmarks/spark_read.py                     # 1,000,000 x 100 B (a few minutes)
    python benchmarks/spark_read.py --messages 100000   # quicker
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import trio
from support import create_topic, median, start_broker, stop_broker, write_toml

from hamq.client import Message, MessageQueue, Producer, SendStatus

MIB = 1024 * 1024
BATCH = 256
SENDERS = 4


async def fill(namesrv: str, topic: str, queues: int, messages: int, size: int) -> float:
    """Send ``messages`` bodies of ``size`` bytes, spread evenly over the queues; s taken."""
    await create_topic(namesrv, topic, queues)
    started = time.perf_counter()
    async with Producer("spark-bench", namesrv, send_timeout_s=30) as producer:
        targets = [MessageQueue(topic, "broker-a", q) for q in range(queues)]
        batches = iter(range(0, messages, BATCH))

        async def sender() -> None:
            for first in batches:
                count = min(BATCH, messages - first)
                batch = [
                    Message(topic, (b"%012d" % (first + i)).ljust(size, b"x")) for i in range(count)
                ]
                queue = targets[(first // BATCH) % queues]
                result = await producer.send_batch(batch, queue=queue)
                if result.status is not SendStatus.SEND_OK:
                    raise RuntimeError(f"a batch was {result.status.value}")

        async with trio.open_nursery() as nursery:
            for _ in range(SENDERS):
                nursery.start_soon(sender)
    return time.perf_counter() - started


def timed(action: Callable[[], object]) -> float:
    started = time.perf_counter()
    action()
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--size", type=int, default=100, help="body bytes")
    parser.add_argument("--queues", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--master", default="local[2]", help="Spark master")
    parser.add_argument("--pull-count", type=int, default=1024, help="broker max_transfer_count")
    args = parser.parse_args()

    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import DataFrame, SparkSession

    from hamq.spark import HamqDataSource

    base = Path(tempfile.mkdtemp(prefix="hamq-spark-bench-"))
    config = write_toml(
        base / "broker.toml",
        {
            "store": {
                "max_transfer_count": args.pull_count,
                "max_transfer_bytes": max(256 * 1024, args.pull_count * (args.size + 300)),
            }
        },
    )
    proc, namesrv = start_broker(base / "store", base / "broker.log", config=config)
    try:
        fill_s = trio.run(fill, namesrv, "bench", args.queues, args.messages, args.size)
        print(
            f"filled topic bench: {args.messages:,} messages of {args.size} B over "
            f"{args.queues} queues in {fill_s:.1f} s ({args.messages / fill_s:,.0f} msgs/s); "
            f"broker max_transfer_count {args.pull_count}"
        )
        spark = (
            SparkSession.builder.master(args.master)
            .appName("hamq-spark-read-bench")
            .config("spark.ui.enabled", "false")
            .config("spark.ui.showConsoleProgress", "false")
            .config("spark.driver.memory", "4g")
            .getOrCreate()
        )
        spark.sparkContext.setLogLevel("ERROR")
        spark.dataSource.register(HamqDataSource)

        def topic(**options: str) -> DataFrame:  # a new reader each time: option() mutates
            reader = spark.read.format("hamq").option("namesrv", namesrv)
            return reader.options(topic="bench", **options).load()

        parquet = str(base / "parquet")

        def to_parquet() -> None:
            shutil.rmtree(parquet, ignore_errors=True)
            topic().write.parquet(parquet)

        scenarios: dict[str, Callable[[], object]] = {
            "hamq -> count()": lambda: topic().count(),
            "hamq -> noop": lambda: topic().write.format("noop").mode("overwrite").save(),
            "hamq 32/pull -> noop": lambda: (
                topic(pullBatchSize="32").write.format("noop").mode("overwrite").save()
            ),
            "hamq -> parquet": to_parquet,
            "parquet -> count()": lambda: spark.read.parquet(parquet).count(),
            "parquet -> noop": lambda: (
                spark.read.parquet(parquet).write.format("noop").mode("overwrite").save()
            ),
        }
        # one unmeasured pass: JVM and Python workers warm, the parquet copy made
        rows = topic().count()
        to_parquet()
        if rows != args.messages:
            raise RuntimeError(f"the read found {rows:,} rows, not {args.messages:,}")
        seconds: dict[str, list[float]] = {name: [] for name in scenarios}
        for _ in range(args.rounds):
            for name, action in scenarios.items():
                seconds[name].append(timed(action))
        spark.stop()
    finally:
        stop_broker(proc)
        shutil.rmtree(base, ignore_errors=True)

    print(f"\n{'scenario':<22} {'median s':>9} {'rows/s':>12} {'MB/s':>8}")
    rates = {}
    for name, values in seconds.items():
        took = median(values)
        rates[name] = args.messages / took
        mbs = args.messages * args.size / MIB / took
        print(f"{name:<22} {took:>9.2f} {rates[name]:>12,.0f} {mbs:>8.1f}")
    noop = rates["parquet -> noop"] / rates["hamq -> noop"]
    small = rates["parquet -> noop"] / rates["hamq 32/pull -> noop"]
    count = rates["parquet -> count()"] / rates["hamq -> count()"]
    print(
        f"\nparquet reads every column {noop:.1f}x as fast as hamq (goal: within 3x); "
        f"{small:.1f}x with 32 messages per pull; count(): {count:.1f}x (parquet answers "
        "it from its footers)"
    )


if __name__ == "__main__":
    main()
