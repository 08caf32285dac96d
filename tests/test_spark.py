"""The "hamq" Spark data source against a real broker process: batch and streaming
reads, the sink, reading from a slave while its master is down, and a broker with ACL
and TLS on.

One local[2] SparkSession serves the whole test session (starting a JVM takes seconds).
"""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio

from hamq.client import (
    AdminClient,
    Message,
    MessageQueue,
    PullStatus,
    RemotingConfig,
    SendStatus,
    TlsConfig,
)
from hamq.client.blocking import Producer, PullConsumer
from hamq.spark import reading
from hamq.spark.options import QueueKey, parse_read_options, parse_write_options
from hamq.spark.planning import QueueRange
from hamq.spark.writing import write_batches
from tests.support.brokers import create_topic
from tests.support.ha import broker_group
from tests.support.processes import broker_process, stop
from tests.support.timing import wait_for
from tests.support.tls import server_files

pytestmark = pytest.mark.slow

BROKER = "broker-a"


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    from hamq.spark import HamqDataSource

    session = (
        SparkSession.builder.master("local[2]")
        .appName("hamq-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.sql.session.timeZone", "UTC")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    session.dataSource.register(HamqDataSource)
    yield session
    session.stop()


@pytest.fixture(scope="module")
def namesrv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A ``hamq broker`` process (embedded nameserver) shared by the module's tests."""
    with broker_process(tmp_path_factory.mktemp("spark-broker")) as (_, ns):
        yield ns


def fill(namesrv: str, topic: str, queues: range, per_queue: int, first: int = 0) -> None:
    """``per_queue`` messages into each queue, bodies ``q{queue}-{n}``, keys ``k{n}``."""
    with Producer("spark-test-fill", namesrv) as producer:
        for q in queues:
            target = MessageQueue(topic, BROKER, q)
            for start in range(first, first + per_queue, 250):
                batch = [
                    Message(topic, f"q{q}-{n}".encode(), keys=f"k{n}", tags=f"t{q}")
                    for n in range(start, min(start + 250, first + per_queue))
                ]
                assert producer.send_batch(batch, queue=target).status is SendStatus.SEND_OK
    trio.run(visible, namesrv, topic, queues, first + per_queue)


async def visible(namesrv: str, topic: str, queues: range, count: int) -> None:
    """Until the queues' max offsets reach ``count``: a send is answered when the
    CommitLog holds it, its queue shows it once the reput service has dispatched it, and
    a read planned in between (an availableNow run) would miss the tail of a batch."""

    async def shown() -> bool:
        status = {s.queue.queue_id: s.max_offset for s in await admin.queue_status(topic)}
        return all(status.get(q, 0) >= count for q in queues)

    async with AdminClient(namesrv) as admin:
        await wait_for(shown, what=f"{topic}'s queues {queues} to show {count} messages each")


def read(spark: Any, namesrv: str, topic: str, **options: str) -> Any:
    reader = spark.read.format("hamq").option("namesrv", namesrv).option("topic", topic)
    for name, value in options.items():
        reader = reader.option(name, value)
    return reader.load()


def body_offsets(df: Any) -> list[tuple[int, int, str]]:
    """(queue_id, queue_offset, body) of every row, sorted."""
    rows = df.select("queue_id", "queue_offset", "body").collect()
    return sorted((r.queue_id, r.queue_offset, bytes(r.body).decode()) for r in rows)


# ---------------------------------------------------------------- batch reads


def test_batch_read_returns_every_message_once(spark: Any, namesrv: str) -> None:
    trio.run(create_topic, namesrv, "spark-batch", 4)
    fill(namesrv, "spark-batch", range(4), 2500)
    df = read(spark, namesrv, "spark-batch")
    assert df.rdd.getNumPartitions() == 4  # one per queue
    rows = df.collect()
    assert len(rows) == 10_000
    seen = sorted((r.queue_id, r.queue_offset, bytes(r.body)) for r in rows)
    assert seen == [(q, n, f"q{q}-{n}".encode()) for q in range(4) for n in range(2500)]
    assert len({r.msg_id for r in rows}) == 10_000
    assert len({r.commitlog_offset for r in rows}) == 10_000
    first = min(rows, key=lambda r: (r.queue_id, r.queue_offset))
    assert (first.topic, first.broker) == ("spark-batch", BROKER)
    assert (first.keys, first.tags) == ("k0", "t0")
    assert first.properties["KEYS"] == "k0" and first.reconsume_times == 0
    assert first.born_timestamp <= first.store_timestamp
    assert first.born_host.startswith("127.0.0.1:")


def test_a_batch_ends_once_its_records_reach_batch_bytes(
    namesrv: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Big messages end an Arrow batch before BATCH_ROWS rows: at BATCH_BYTES of records
    (here lowered to a few pull answers' worth); every row still comes, once, in order."""
    trio.run(create_topic, namesrv, "spark-bytes", 1)
    fill(namesrv, "spark-bytes", range(1), 600)
    monkeypatch.setattr(reading, "BATCH_BYTES", 10_000)
    options = parse_read_options({"namesrv": namesrv, "topic": "spark-bytes"}, streaming=False)
    batches: list[Any] = []

    async def emit(batch: Any) -> None:
        batches.append(batch)

    queue = QueueRange(QueueKey("spark-bytes", BROKER, 0), 0, 600)
    trio.run(reading.read_range, options, queue, emit)
    offsets = [n for batch in batches for n in batch.column("queue_offset").to_pylist()]
    assert offsets == list(range(600))
    assert len(batches) >= 5 and max(batch.num_rows for batch in batches) < 200


def test_json_starting_and_ending_offsets(spark: Any, namesrv: str) -> None:
    trio.run(create_topic, namesrv, "spark-range", 2)
    fill(namesrv, "spark-range", range(2), 100)
    df = read(
        spark,
        namesrv,
        "spark-range",
        startingOffsets='{"broker-a": {"0": 90, "1": -2}}',
        endingOffsets='{"broker-a": {"1": 5}}',
    )
    assert body_offsets(df) == [(0, n, f"q0-{n}") for n in range(90, 100)] + [
        (1, n, f"q1-{n}") for n in range(5)
    ]
    assert read(spark, namesrv, "spark-range", startingOffsets="latest").count() == 0


def test_several_topics_with_topic_first_offsets(spark: Any, namesrv: str) -> None:
    for topic in ("spark-multi-a", "spark-multi-b"):
        trio.run(create_topic, namesrv, topic, 1)
        fill(namesrv, topic, range(1), 20)
    df = read(
        spark,
        namesrv,
        "spark-multi-a,spark-multi-b",
        startingOffsets='{"spark-multi-b": {"broker-a": {"0": 15}}}',
    )
    counts = {r.topic: r["count"] for r in df.groupBy("topic").count().collect()}
    assert counts == {"spark-multi-a": 20, "spark-multi-b": 5}


def test_starting_timestamp(spark: Any, namesrv: str) -> None:
    trio.run(create_topic, namesrv, "spark-time", 1)
    fill(namesrv, "spark-time", range(1), 30)
    time.sleep(0.05)
    since = int(time.time() * 1000)
    time.sleep(0.05)
    fill(namesrv, "spark-time", range(1), 12, first=30)
    df = read(spark, namesrv, "spark-time", startingTimestamp=str(since))
    assert body_offsets(df) == [(0, n, f"q0-{n}") for n in range(30, 42)]


def test_compressed_bodies_arrive_inflated(spark: Any, namesrv: str) -> None:
    trio.run(create_topic, namesrv, "spark-zip", 1)
    big = b"abc" * 10_000  # over the producer's 4 KiB: sent zlib-compressed
    with Producer("spark-test-zip", namesrv) as producer:
        producer.send(Message("spark-zip", big))
    [row] = read(spark, namesrv, "spark-zip").collect()
    assert bytes(row.body) == big


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"startingOffset": "earliest"}, "no option startingoffset "),
        ({"maxOffsetsPerTrigger": "5"}, "maxOffsetsPerTrigger is for streaming"),
        ({"endingOffsets": '{"broker-a": {"0": 1000}}'}, "holds messages only up to offset 99"),
        ({"startingOffsets": '{"broker-a": {"9": 0}}'}, "spark-range/broker-a/9"),
    ],
)
def test_bad_read_options_fail_the_query_with_their_name(
    spark: Any, namesrv: str, options: dict[str, str], named: str
) -> None:
    with pytest.raises(Exception, match=named):
        read(spark, namesrv, "spark-range", **options).collect()


def test_an_unknown_topic_is_named(spark: Any, namesrv: str) -> None:
    with pytest.raises(Exception, match="topic 'spark-nothing' is not known to the nameservers"):
        read(spark, namesrv, "spark-nothing").collect()


# ---------------------------------------------------------------- streaming reads


def run_available_now(spark: Any, namesrv: str, topic: str, base: Path, **options: str) -> Any:
    """One availableNow run of topic -> parquet at ``base``, on ``base``'s checkpoint."""
    reader = spark.readStream.format("hamq").option("namesrv", namesrv).option("topic", topic)
    for name, value in {"startingOffsets": "earliest", **options}.items():
        reader = reader.option(name, value)
    query = (
        reader.load()
        .select("queue_id", "queue_offset", "body")
        .writeStream.format("parquet")
        .option("path", str(base / "out"))
        .option("checkpointLocation", str(base / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    assert query.awaitTermination(120), "the availableNow query did not finish"
    assert query.exception() is None
    return query


def test_stream_resumes_from_its_checkpoint_and_finds_new_queues(
    spark: Any, namesrv: str, tmp_path: Path
) -> None:
    trio.run(create_topic, namesrv, "spark-stream", 2)
    fill(namesrv, "spark-stream", range(2), 100)
    run_available_now(spark, namesrv, "spark-stream", tmp_path)
    first = body_offsets(spark.read.parquet(str(tmp_path / "out")))
    assert first == [(q, n, f"q{q}-{n}") for q in range(2) for n in range(100)]

    fill(namesrv, "spark-stream", range(2), 30, first=100)
    trio.run(create_topic, namesrv, "spark-stream", 3)  # a queue the stream has not seen
    fill(namesrv, "spark-stream", range(2, 3), 7)
    query = run_available_now(spark, namesrv, "spark-stream", tmp_path)
    new_rows = sum(p["numInputRows"] for p in query.recentProgress)
    assert new_rows == 67  # only what came after the first run
    second = body_offsets(spark.read.parquet(str(tmp_path / "out")))
    assert second == sorted(
        [(q, n, f"q{q}-{n}") for q in range(2) for n in range(130)]
        + [(2, n, f"q2-{n}") for n in range(7)]
    )


def test_max_offsets_per_trigger_bounds_each_micro_batch(
    spark: Any, namesrv: str, tmp_path: Path
) -> None:
    trio.run(create_topic, namesrv, "spark-limit", 3)
    fill(namesrv, "spark-limit", range(3), 30)
    query = run_available_now(
        spark, namesrv, "spark-limit", tmp_path, maxOffsetsPerTrigger="20", group="spark-limit-g"
    )
    sizes = [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]
    assert sum(sizes) == 90 and max(sizes) <= 20 and len(sizes) >= 5
    rows = body_offsets(spark.read.parquet(str(tmp_path / "out")))
    assert rows == [(q, n, f"q{q}-{n}") for q in range(3) for n in range(30)]
    with PullConsumer("spark-limit-g", namesrv) as consumer:  # the group's offsets: the ends
        committed = [consumer.committed_offset(MessageQueue("spark-limit", BROKER, q)) for q in
                     range(3)]  # fmt: skip
    assert committed == [30, 30, 30]


# ---------------------------------------------------------------- the sink


def drain(namesrv: str, topic: str) -> list[Any]:
    """Every message of ``topic``, pulled queue by queue."""
    found = []
    with PullConsumer("spark-test-drain", namesrv) as consumer:
        for queue in consumer.queues(topic):
            offset = 0
            while True:
                result = consumer.pull(queue, offset, max_nums=32)
                if result.status is not PullStatus.FOUND:
                    break
                found += result.messages
                offset = result.next_begin_offset
    return found


def test_sink_writes_a_dataframe_a_consumer_reads_back(spark: Any, namesrv: str) -> None:
    trio.run(create_topic, namesrv, "spark-sink", 4)
    rows = [(f"order {i}", f"k{i} x", f"t{i % 2}", {"n": str(i)}) for i in range(500)]
    df = spark.createDataFrame(
        rows, "body string, keys string, tags string, properties map<string,string>"
    ).repartition(3)
    writer = df.write.format("hamq").option("namesrv", namesrv).option("topic", "spark-sink")
    writer.mode("append").save()
    messages = drain(namesrv, "spark-sink")
    assert sorted(m.body.decode() for m in messages) == sorted(r[0] for r in rows)
    for m in messages:
        i = int(m.body.split()[1])
        assert (list(m.keys), m.tags, m.properties["n"]) == ([f"k{i}", "x"], f"t{i % 2}", str(i))


def test_sink_topic_and_queue_columns(spark: Any, namesrv: str) -> None:
    trio.run(create_topic, namesrv, "spark-sink-q", 4)
    df = spark.createDataFrame(
        [("spark-sink-q", 2, bytearray(b"\x00\x01 binary")) for _ in range(10)],
        "topic string, queue_id int, body binary",
    )
    df.write.format("hamq").option("namesrv", namesrv).mode("append").save()
    messages = drain(namesrv, "spark-sink-q")
    assert [(m.queue_id, m.body) for m in messages] == [(2, b"\x00\x01 binary")] * 10


def test_sink_refuses_what_it_cannot_send(spark: Any, namesrv: str) -> None:
    def write(df: Any, mode: str = "append", **options: str) -> None:
        writer = df.write.format("hamq").option("namesrv", namesrv)
        for name, value in options.items():
            writer = writer.option(name, value)
        writer.mode(mode).save()

    values = spark.createDataFrame([("a",)], "value string")
    with pytest.raises(Exception, match="needs a body column"):
        write(values, topic="spark-sink")
    bodies = spark.createDataFrame([("a",)], "body string")
    with pytest.raises(Exception, match="cannot be overwritten"):
        write(bodies, "overwrite", topic="spark-sink")
    with pytest.raises(Exception, match="say where the messages go"):
        write(bodies)
    with pytest.raises(Exception, match="column keys is int"):
        write(spark.createDataFrame([("a", 1)], "body string, keys int"), topic="spark-sink")
    with pytest.raises(Exception, match="null body"):
        write(spark.createDataFrame([(None,)], "body string"), topic="spark-sink")


def test_streaming_sink_copies_a_topic(spark: Any, namesrv: str, tmp_path: Path) -> None:
    trio.run(create_topic, namesrv, "spark-copy-in", 2)
    trio.run(create_topic, namesrv, "spark-copy-out", 2)
    fill(namesrv, "spark-copy-in", range(2), 40)
    source = (
        spark.readStream.format("hamq")
        .option("namesrv", namesrv)
        .option("topic", "spark-copy-in")
        .option("startingOffsets", "earliest")
        .load()
    )
    query = (
        source.selectExpr("body", "keys", "upper(tags) AS tags")
        .writeStream.format("hamq")
        .option("namesrv", namesrv)
        .option("topic", "spark-copy-out")
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    assert query.awaitTermination(120) and query.exception() is None
    copied = drain(namesrv, "spark-copy-out")
    assert sorted(m.body.decode() for m in copied) == sorted(
        f"q{q}-{n}" for q in range(2) for n in range(40)
    )
    assert {m.tags for m in copied} == {"T0", "T1"}


def test_write_batches_reports_counts_per_send_status(namesrv: str) -> None:
    import pyarrow as pa

    trio.run(create_topic, namesrv, "spark-sink-direct", 2)
    options = parse_write_options({"namesrv": namesrv, "topic": "spark-sink-direct"})
    batch = pa.RecordBatch.from_pydict({"body": [b"x%d" % i for i in range(300)]})
    report = write_batches(options, iter([batch, batch]))
    assert report.counts == {"SEND_OK": 600} and str(report) == "600 messages (SEND_OK 600)"
    too_big = pa.RecordBatch.from_pydict({"body": [b"x" * (5 * 1024 * 1024)]})
    with pytest.raises(Exception, match="body"):
        write_batches(options, iter([too_big]))


# ---------------------------------------------------------------- a slave, the master down


async def test_read_from_the_slave_while_the_master_is_down(spark: Any, tmp_path: Path) -> None:
    async with broker_group(tmp_path, "SYNC_MASTER") as (ns, (master, master_addr), _):
        async with AdminClient(ns) as admin:
            await admin.create_topic("spark-ha", 2, broker_addr=master_addr)
        await trio.to_thread.run_sync(fill, ns, "spark-ha", range(2), 500)

        def read_all() -> list[tuple[int, int, str]]:
            return body_offsets(read(spark, ns, "spark-ha", readFromSlave="true"))

        expected = [(q, n, f"q{q}-{n}") for q in range(2) for n in range(500)]
        assert await trio.to_thread.run_sync(read_all) == expected  # master up: pulls the slave
        await stop(master, signal.SIGKILL)
        assert await trio.to_thread.run_sync(read_all) == expected


# ---------------------------------------------------------------- ACL and TLS on


#: a broker's accounts: its own (admin), and an application that may write and read
#: SparkSecure with the source's default groups, nothing else
SPARK_ACL = """\
globalWhiteRemoteAddresses: []
accounts:
  - accessKey: hamq-broker
    secretKey: broker-secret
    admin: true
  - accessKey: spark-app
    secretKey: spark-app-secret
    defaultTopicPerm: DENY
    defaultGroupPerm: DENY
    topicPerms:
      - SparkSecure=PUB|SUB
    groupPerms:
      - HAMQ_SPARK_READER=SUB
"""


def test_the_source_signs_and_speaks_tls_to_a_secured_broker(spark: Any, tmp_path: Path) -> None:
    """A broker with ACL and TLS on every port: the sink and a read reach it with
    accessKey / secretKey / tlsCaFile; the same read without the account is refused."""
    pki = server_files(tmp_path)
    ca_file, cert, key = pki.ca, pki.cert, pki.key
    (tmp_path / "plain_acl.yml").write_text(SPARK_ACL)
    config = (
        f"acl_enable = true\nacl_file = '{tmp_path / 'plain_acl.yml'}'\n"
        "access_key = 'hamq-broker'\nsecret_key = 'broker-secret'\n"
        f"[remoting.tls]\ncert_file = '{cert}'\nkey_file = '{key}'\nca_file = '{ca_file}'\n"
    )
    tls = RemotingConfig(tls=TlsConfig(ca_file=ca_file))
    with broker_process(tmp_path, config) as (_, ns):

        async def create() -> None:
            keys = {"access_key": "hamq-broker", "secret_key": "broker-secret"}
            async with AdminClient(ns, remoting=tls, **keys) as admin:
                await admin.create_topic("SparkSecure", 2)

        trio.run(create)
        access = {"accessKey": "spark-app", "secretKey": "spark-app-secret"}
        bodies = [f"secure {i}" for i in range(40)]
        writer = spark.createDataFrame([(b,) for b in bodies], "body string").write.format("hamq")
        sink = {"namesrv": ns, "topic": "SparkSecure", "tlsCaFile": str(ca_file), **access}
        for name, value in sink.items():
            writer = writer.option(name, value)
        writer.mode("append").save()
        df = read(spark, ns, "SparkSecure", tlsCaFile=str(ca_file), **access)
        assert sorted(bytes(r.body).decode() for r in df.collect()) == sorted(bodies)
        with pytest.raises(Exception, match="not signed"):
            read(spark, ns, "SparkSecure", tlsCaFile=str(ca_file)).collect()
