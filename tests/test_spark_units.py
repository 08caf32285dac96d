"""The Spark data source's pure parts: options, offset planning, records to Arrow columns."""

from __future__ import annotations

import random
import re
import struct
import threading
import zlib
from collections.abc import Awaitable, Callable
from pathlib import Path

import pyarrow as pa
import pytest
import trustme

from hamq.client import InvalidArgumentError
from hamq.client.records import SYSFLAG_COMPRESSED, MessageFormatError
from hamq.protocol.message import encode_properties, pack_host
from hamq.protocol.record import MAGIC_V1, make_record_template
from hamq.spark import DataLossError
from hamq.spark.bridge import iterate_in_trio
from hamq.spark.columns import ARROW_SCHEMA, Columns, _pairs, _regular_pairs, record_starts
from hamq.spark.options import (
    EARLIEST,
    LATEST,
    OffsetSpec,
    QueueKey,
    offsets_from_json,
    offsets_to_json,
    parse_offset_spec,
    parse_read_options,
    parse_write_options,
)
from hamq.spark.planning import (
    Bounds,
    QueueRange,
    latest_offsets,
    plan_batch,
    start_offsets,
    stream_ranges,
)

BASE = {"namesrv": "127.0.0.1:9876", "topic": "orders"}


def key(queue_id: int, broker: str = "broker-a", topic: str = "orders") -> QueueKey:
    return QueueKey(topic, broker, queue_id)


# ---------------------------------------------------------------- options


def test_read_options_defaults_follow_the_kafka_source() -> None:
    batch = parse_read_options(BASE, streaming=False)
    assert batch.topics == ("orders",)
    assert batch.starting == OffsetSpec(EARLIEST) and batch.ending == OffsetSpec(LATEST)
    assert batch.fail_on_data_loss and not batch.read_from_slave and batch.group is None
    stream = parse_read_options(BASE, streaming=True)
    assert stream.starting == OffsetSpec(LATEST)  # a new stream starts at the end


def test_read_options_are_case_insensitive_and_typed() -> None:
    parsed = parse_read_options(
        {
            **BASE,
            "topic": "orders, refunds",
            "STARTINGOFFSETS": "latest",
            "readFromSlave": "TRUE",
            "maxoffsetspertrigger": "500",
            "failOnDataLoss": "false",
            "group": "pipeline",
        },
        streaming=True,
    )
    assert parsed.topics == ("orders", "refunds")
    assert parsed.read_from_slave and not parsed.fail_on_data_loss
    assert parsed.max_offsets_per_trigger == 500 and parsed.group == "pipeline"


@pytest.mark.parametrize(
    ("options", "streaming", "named"),
    [
        ({"startingOffset": "earliest"}, False, "no option startingoffset "),  # a typo
        ({"endingOffsets": "latest"}, True, "endingOffsets"),
        ({"maxOffsetsPerTrigger": "10"}, False, "maxOffsetsPerTrigger"),
        ({"maxOffsetsPerTrigger": "0"}, True, "maxOffsetsPerTrigger"),
        ({"maxOffsetsPerTrigger": "ten"}, True, "maxOffsetsPerTrigger"),
        ({"failOnDataLoss": "maybe"}, False, "failOnDataLoss"),
        ({"startingOffsets": "first"}, False, "startingOffsets"),
        ({"startingOffsets": '{"broker-a": {"zero": 1}}'}, False, "startingOffsets"),
        ({"startingOffsets": '{"broker-a": {"0": -3}}'}, False, "startingOffsets"),
        ({"startingOffsets": "earliest", "startingTimestamp": "5"}, False, "startingTimestamp"),
        ({"topic": ""}, False, "topic"),
        ({"topic": "no spaces"}, False, "topic"),
        ({"namesrv": " , "}, False, "namesrv"),
        ({"group": "a/b"}, False, "group"),
    ],
)
def test_bad_read_options_are_named(options: dict[str, str], streaming: bool, named: str) -> None:
    with pytest.raises(InvalidArgumentError, match=named):
        parse_read_options({**BASE, **options}, streaming=streaming)


def test_spark_own_options_are_tolerated() -> None:
    parse_read_options({**BASE, "path": "x", "checkpointLocation": "/tmp/c"}, streaming=True)


def test_offset_json_one_topic_or_topic_first() -> None:
    one = parse_offset_spec("startingOffsets", '{"broker-a": {"0": 42, "1": -2}}', ("orders",),
                            missing=EARLIEST)  # fmt: skip
    assert one == OffsetSpec(EARLIEST, {key(0): 42, key(1): EARLIEST})
    two = parse_offset_spec(
        "endingOffsets",
        '{"orders": {"broker-a": {"0": 7}}, "refunds": {"broker-b": {"3": -1}}}',
        ("orders", "refunds"),
        missing=LATEST,
    )
    assert two.queues == {key(0): 7, key(3, "broker-b", "refunds"): LATEST}
    with pytest.raises(InvalidArgumentError, match="names the topic first"):
        parse_offset_spec("startingOffsets", '{"broker-a": {"0": 1}}', ("a", "b"), missing=EARLIEST)
    with pytest.raises(InvalidArgumentError, match="'other', which is not read"):
        parse_offset_spec(
            "startingOffsets", '{"other": {"broker-a": {"0": 1}}}', ("orders",), missing=EARLIEST
        )


def test_checkpoint_offsets_round_trip() -> None:
    offsets = {key(0): 5, key(1): 0, key(2, "broker-b", "refunds"): 9}
    as_json = offsets_to_json(offsets)
    assert as_json == {"orders": {"broker-a": {"0": 5, "1": 0}}, "refunds": {"broker-b": {"2": 9}}}
    assert offsets_from_json(as_json) == offsets
    with pytest.raises(InvalidArgumentError, match="not a JSON object"):
        offsets_from_json([1, 2])
    with pytest.raises(InvalidArgumentError):
        offsets_from_json({"orders": {"broker-a": {"0": -2}}})  # a checkpoint holds offsets


def test_write_options() -> None:
    parsed = parse_write_options({"namesrv": "h:1", "topic": "out", "batchSize": "64"})
    assert (parsed.topic, parsed.batch_size, parsed.group) == ("out", 64, "HAMQ_SPARK_WRITER")
    assert parse_write_options({"namesrv": "h:1"}).topic is None  # a topic column then
    with pytest.raises(InvalidArgumentError, match="batchSize"):
        parse_write_options({"namesrv": "h:1", "batchSize": "0"})
    with pytest.raises(InvalidArgumentError, match="no option startingoffsets"):
        parse_write_options({"namesrv": "h:1", "startingOffsets": "earliest"})


def test_access_options_reach_every_client_and_hide_the_secret(tmp_path: Path) -> None:
    """accessKey / secretKey / tlsCaFile, read and write alike, become the clients'
    access_key, secret_key and TLS settings; the secret never shows in a repr."""
    ca_file = tmp_path / "ca.pem"
    trustme.CA().cert_pem.write_to_path(str(ca_file))
    given = {"accessKey": "spark-app", "SECRETKEY": "spark-app-secret", "tlsCaFile": str(ca_file)}
    read = parse_read_options({**BASE, **given}, streaming=False)
    write = parse_write_options({**BASE, **given})
    assert read.access == write.access
    assert "spark-app-secret" not in repr(read) + repr(write)
    clients = read.access.client_options()
    assert (clients["access_key"], clients["secret_key"]) == ("spark-app", "spark-app-secret")
    assert clients["remoting"].tls.ca_file == ca_file
    assert parse_read_options(BASE, streaming=False).access.client_options() == {}
    system_cas = parse_write_options({**BASE, "tls": "true"}).access.client_options()
    assert system_cas["remoting"].tls.ca_file is None


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"accessKey": "spark-app"}, "accessKey / secretKey: access key 'spark-app' is given "
                                     "without a secret key"),
        ({"secretKey": "spark-app-secret"}, "a secret key is given without an access key"),
        ({"tlsCaFile": " "}, "tlsCaFile is empty"),
        ({"tlsCaFile": "ca.pem", "tls": "false"}, "tlsCaFile is for TLS connections"),
        ({"tls": "yes"}, "tls is true or false, not 'yes'"),
    ],
)  # fmt: skip
def test_bad_access_options_are_named(options: dict[str, str], named: str) -> None:
    for parse in (lambda o: parse_read_options(o, streaming=True), parse_write_options):
        with pytest.raises(InvalidArgumentError, match=re.escape(named)):
            parse({**BASE, **options})


def test_a_ca_file_that_cannot_be_used_is_named_with_its_option(tmp_path: Path) -> None:
    (tmp_path / "not-a-ca.pem").write_text("hello")
    for name, problem in (("missing.pem", "cannot read it"), ("not-a-ca.pem", "no PEM")):
        access = parse_read_options(
            {**BASE, "tlsCaFile": str(tmp_path / name)}, streaming=False
        ).access
        with pytest.raises(InvalidArgumentError, match=f"^tlsCaFile: tls ca_file .*{problem}"):
            access.client_options()


# ---------------------------------------------------------------- batch planning


def test_plan_batch_covers_each_queue_between_its_bounds() -> None:
    bounds = {key(0): Bounds(0, 100), key(1): Bounds(10, 10), key(2): Bounds(5, 50)}
    options = parse_read_options(
        {**BASE, "startingOffsets": '{"broker-a": {"2": 20}}',
         "endingOffsets": '{"broker-a": {"0": 60}}'},
        streaming=False,
    )  # fmt: skip
    assert plan_batch(options, bounds) == [QueueRange(key(0), 0, 60), QueueRange(key(2), 20, 50)]
    searched = {key(0): 90, key(1): 10, key(2): 50}
    ranges = plan_batch(parse_read_options(BASE, streaming=False), bounds, searched)
    assert ranges == [QueueRange(key(0), 90, 100)]


def test_plan_batch_refuses_impossible_ranges() -> None:
    bounds = {key(0): Bounds(0, 100)}

    def plan(**options: str) -> list[QueueRange]:
        return plan_batch(parse_read_options({**BASE, **options}, streaming=False), bounds)

    with pytest.raises(InvalidArgumentError, match="holds messages only up to offset 99"):
        plan(endingOffsets='{"broker-a": {"0": 101}}')
    with pytest.raises(InvalidArgumentError, match="before its starting offset 50"):
        plan(startingOffsets='{"broker-a": {"0": 50}}', endingOffsets='{"broker-a": {"0": 40}}')
    with pytest.raises(InvalidArgumentError, match="orders/broker-a/7, which the route"):
        plan(startingOffsets='{"broker-a": {"7": 0}}')


def test_deleted_starting_offsets_are_data_loss_unless_told_to_skip() -> None:
    bounds = {key(0): Bounds(40, 100)}
    options = {**BASE, "startingOffsets": '{"broker-a": {"0": 10}}'}
    with pytest.raises(DataLossError, match=r"messages 10\.\.39 were deleted"):
        start_offsets(parse_read_options(options, streaming=False), bounds)
    skipping = parse_read_options({**options, "failOnDataLoss": "false"}, streaming=False)
    assert start_offsets(skipping, bounds) == {key(0): 40}


# ---------------------------------------------------------------- streaming planning


def test_latest_offsets_reads_everything_without_a_limit() -> None:
    start = {key(0): 10, key(1): 0}
    bounds = {key(0): Bounds(0, 30), key(1): Bounds(0, 5), key(2): Bounds(3, 8)}  # 2 is new
    end = latest_offsets(start, bounds, max_rows=None, target=None, fail_on_data_loss=True)
    assert end == {key(0): 30, key(1): 5, key(2): 8}
    assert stream_ranges(start, end) == [
        QueueRange(key(0), 10, 30),
        QueueRange(key(1), 0, 5),
        QueueRange(key(2), 0, 8, from_earliest=True),  # begins at whatever is earliest
    ]


def test_max_offsets_per_trigger_is_shared_in_proportion() -> None:
    start = {key(0): 0, key(1): 0, key(2): 0}
    bounds = {key(0): Bounds(0, 600), key(1): Bounds(0, 300), key(2): Bounds(0, 100)}
    end = latest_offsets(start, bounds, max_rows=100, target=None, fail_on_data_loss=True)
    assert end == {key(0): 60, key(1): 30, key(2): 10}
    odd = latest_offsets(start, bounds, max_rows=7, target=None, fail_on_data_loss=True)
    assert sum(odd.values()) == 7 and all(odd[k] <= bounds[k].max for k in odd)
    # batches under the limit until all is read, none empty while messages wait
    offsets, batches = dict(start), 0
    while sum(offsets.values()) < 1000:
        after = latest_offsets(offsets, bounds, max_rows=33, target=None, fail_on_data_loss=True)
        moved = sum(after.values()) - sum(offsets.values())
        assert 0 < moved <= 33
        offsets, batches = after, batches + 1
    assert offsets == {k: b.max for k, b in bounds.items()} and batches == 31


def test_available_now_stops_at_its_target() -> None:
    start = {key(0): 0}
    bounds = {key(0): Bounds(0, 50), key(1): Bounds(0, 20)}  # queue 1 came after the target
    end = latest_offsets(start, bounds, max_rows=None, target={key(0): 30},
                         fail_on_data_loss=True)  # fmt: skip
    assert end == {key(0): 30}


def test_a_queue_behind_the_checkpoint_is_data_loss() -> None:
    start = {key(0): 80}
    bounds = {key(0): Bounds(0, 50)}  # a failover to a slave that lacked 50..79
    with pytest.raises(DataLossError, match="ends at offset 50, before the stream's offset 80"):
        latest_offsets(start, bounds, max_rows=None, target=None, fail_on_data_loss=True)
    end = latest_offsets(start, bounds, max_rows=None, target=None, fail_on_data_loss=False)
    assert end == {key(0): 50}


# ---------------------------------------------------------------- records to columns

BORN = pack_host("10.1.2.3", 40000)
STORE = pack_host("127.0.0.1", 10911)


def record(
    offset: int,
    body: bytes,
    *,
    properties: dict[str, str] | None = None,
    sys_flag: int = 0,
    born_host: bytes = BORN,
) -> bytes:
    template = make_record_template(
        topic="orders",
        queue_id=3,
        body=body,
        properties=encode_properties(properties or {}),
        sys_flag=sys_flag,
        born_timestamp=1_700_000_000_123,
        born_host=born_host,
        store_host=STORE,
        reconsume_times=2,
    )
    return template.encode(
        queue_offset=offset, physical_offset=1000 + offset * 200, store_timestamp=1_700_000_000_456
    )


def test_records_become_arrow_rows() -> None:
    compressed = zlib.compress(b"z" * 10_000, 5)
    raw = b"".join(
        [
            record(7, b"before the range"),
            record(8, b"plain", properties={"KEYS": "k1 k2", "TAGS": "red", "UNIQ_KEY": "ID8"}),
            record(9, compressed, sys_flag=SYSFLAG_COMPRESSED),
            record(10, b"v6", born_host=pack_host("::1", 5)),
            record(11, b"after the range"),
        ]
    )
    columns = Columns("orders", "broker-a", 3)
    assert columns.add_records(raw, 8, 11) == 12
    batch = columns.batch()
    assert batch.schema == ARROW_SCHEMA and len(columns) == 0
    rows = batch.to_pylist()
    assert [r["queue_offset"] for r in rows] == [8, 9, 10]
    assert [r["body"] for r in rows] == [b"plain", b"z" * 10_000, b"v6"]
    first = rows[0]
    assert (first["topic"], first["broker"], first["queue_id"]) == ("orders", "broker-a", 3)
    assert (first["keys"], first["tags"], first["msg_id"]) == ("k1 k2", "red", "ID8")
    assert dict(first["properties"]) == {"KEYS": "k1 k2", "TAGS": "red", "UNIQ_KEY": "ID8"}
    assert first["commitlog_offset"] == 2600 and first["reconsume_times"] == 2
    assert first["born_host"] == "10.1.2.3:40000"
    assert first["born_timestamp"].timestamp() == 1_700_000_000.123
    assert first["store_timestamp"].timestamp() == 1_700_000_000.456
    assert rows[1]["keys"] is None and len(rows[1]["msg_id"]) == 32  # the offset msg id
    assert rows[2]["born_host"] == "[::1]:5" or rows[2]["born_host"].endswith(":5")


@pytest.mark.parametrize(
    ("damage", "match"),
    [
        (lambda raw: raw[:20], "only 20 bytes left for a record"),
        (lambda raw: raw[:39], "only 39 bytes left for a record"),  # a head is 40
        (lambda raw: raw[:-1], "total size 116 at byte 0 of a 115-byte answer"),
        (lambda raw: raw[:4] + b"\x00\x00\x00\x01" + raw[8:], "magic"),
        (lambda raw: raw[:84] + b"\x00\x00\x00\x09" + raw[88:], "runs past total size"),
        (lambda raw: raw[:-10] + b"\xff" + raw[-9:], "not UTF-8"),
    ],
)
def test_bad_records_are_named(damage: Callable[[bytes], bytes], match: str) -> None:
    raw = record(1, b"body", properties={"A": "b", "UNIQ_KEY": "X"})
    columns = Columns("orders", "broker-a", 3)
    with pytest.raises(MessageFormatError, match=match):
        columns.add_records(damage(raw), 0, 10)
        columns.batch()


def test_a_body_that_does_not_inflate_is_named() -> None:
    raw = record(4, b"not zlib", sys_flag=SYSFLAG_COMPRESSED)
    columns = Columns("orders", "broker-a", 3)
    columns.add_records(raw, 0, 10)
    with pytest.raises(MessageFormatError, match="offset 4 does not inflate"):
        columns.batch()


def test_column_wise_and_record_by_record_decoding_agree_on_odd_properties() -> None:
    """A name given twice (the last counts, as in decode_properties), a pair without its
    separator (left out), a row without UNIQ_KEY (the offset msg id), an empty value."""
    texts = [
        "TAGS\x01a\x02TAGS\x01b\x02UNIQ_KEY\x01U0\x02",
        "junk\x02KEYS\x01k1 k2\x02UNIQ_KEY\x01U1\x02UNIQ_KEY\x01U1b\x02",
        "TAGS\x01\x02x\x01y\x02",
        "",
    ]
    raw = b"".join(
        make_record_template(
            topic="orders", queue_id=3, body=b"b%d" % i, properties=text, born_host=BORN
        ).encode(queue_offset=i, physical_offset=100 * i, store_timestamp=5)
        for i, text in enumerate(texts)
    )
    column_wise, record_wise = Columns("orders", "broker-a", 3), Columns("orders", "broker-a", 3)
    assert column_wise.add_records(raw, 0, 10) == record_wise.add_records(raw, 0, 10) == 4
    fast = column_wise._decode(*column_wise._take()).to_pylist()
    slow = record_wise._decode_each(*record_wise._take()).to_pylist()
    for row in fast + slow:
        row["properties"] = sorted(dict(row["properties"]).items())
    assert fast == slow
    assert [r["tags"] for r in fast] == ["b", None, "", None]
    assert [r["msg_id"] for r in fast][:2] == ["U0", "U1b"]


def test_born_hosts_are_named_per_row() -> None:
    hosts = [BORN, BORN, pack_host("10.9.8.7", 1), BORN]
    raw = b"".join(record(n, b"b", born_host=host) for n, host in enumerate(hosts))
    columns = Columns("orders", "broker-a", 3)
    columns.add_records(raw, 0, 10)
    assert columns.batch().column("born_host").to_pylist() == [
        "10.1.2.3:40000", "10.1.2.3:40000", "10.9.8.7:1", "10.1.2.3:40000"
    ]  # fmt: skip
    columns.add_records(raw[: 2 * len(raw) // 4], 0, 10)  # one host only
    assert columns.batch().column("born_host").to_pylist() == ["10.1.2.3:40000"] * 2


@pytest.mark.parametrize("at", [0, 3, 60])
def test_bodies_holding_the_magic_bytes_are_walked(at: int) -> None:
    """The records are found where MAGICCODE sits; bodies holding those bytes (here a
    whole record head: size and magic) make the found places not chain, and the answer
    is walked record by record instead, to the same records."""
    fake = struct.pack(">ii", 116, MAGIC_V1)
    bodies = [b"a" * 70, (b"b" * 70)[:at] + fake + (b"b" * 70)[at:], b"c"]
    records = [record(n, body) for n, body in enumerate(bodies)]
    raw = b"".join(records)
    sizes = [len(r) for r in records]
    assert record_starts(raw).tolist() == [0, sizes[0], sizes[0] + sizes[1]]
    columns = Columns("orders", "broker-a", 3)
    assert columns.add_records(raw, 0, 10) == 3
    assert columns.batch().column("body").to_pylist() == bodies


def test_regular_properties_split_as_the_general_split_does() -> None:
    """Strings that are all ``name\x01value\x02`` pairs are split by where their
    separators are; any other string (a pair without its separator, a value holding
    \x01, a missing last \x02, a NUL) goes to the general split. Both agree."""
    rng = random.Random(18)
    parts = ["a", "b", "\x01", "\x02", "\u00e9", "", "KEYS", "UNIQ_KEY", "\x00"]
    regular = 0
    for _ in range(2000):
        texts = []
        for _ in range(rng.randint(0, 6)):
            if rng.random() < 0.5:
                texts.append("".join(rng.choice(parts) for _ in range(rng.randint(0, 8))))
            else:
                pairs = rng.randint(0, 3)
                texts.append(
                    "".join(f"{rng.choice(parts[4:8])}\x01v\u00e9\x02" for _ in range(pairs))
                )
        strings = pa.array(texts, pa.string())
        if len(strings) > 1 and rng.random() < 0.3:
            strings = strings.slice(1)  # an array that starts past its buffers' start
        fast, general = _regular_pairs(strings), _pairs(strings)
        if fast is not None:
            regular += 1
            assert fast[0].to_pylist() == general[0].to_pylist()
            assert fast[1].to_pylist() == general[1].to_pylist()
            assert fast[2].tolist() == general[2].tolist()  # where each row's pairs start
    assert 500 < regular < 1900  # both kinds were tried


def test_a_slow_reader_gets_every_item_the_loop_emitted_before_it_ended() -> None:
    """The loop's last items wait in the buffer after it returns: the reader, slower
    than the loop, still gets them all, then the end (none lost to a finished loop)."""
    produced_all = threading.Event()

    async def produce(emit: Callable[[int], Awaitable[None]]) -> None:
        for i in range(6):
            await emit(i)
        produced_all.set()

    items = iterate_in_trio(produce, name="test-bridge", buffer=8)
    got = [next(items)]
    assert produced_all.wait(10)  # the loop is done producing; 5 items wait in the buffer
    got += list(items)
    assert got == list(range(6))


def test_the_loop_error_reaches_the_reader_after_the_items_before_it() -> None:
    async def produce(emit: Callable[[int], Awaitable[None]]) -> None:
        await emit(1)
        raise ValueError("broker gone")

    items = iterate_in_trio(produce, name="test-bridge")
    assert next(items) == 1
    with pytest.raises(ValueError, match="broker gone"):
        next(items)
