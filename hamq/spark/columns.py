"""Pull answers decoded straight into the columns of the source's rows (pure).

A pull answer is stored records back to back (shared/PROTOCOL.md §5). Decoding each into
a message object and then into a row costs more than everything else a Spark read
does, so ``Columns`` decodes column-wise: ``add_records`` only walks an answer's record
sizes (keeping the records of the range), and ``batch`` reads every field of all the
records kept at once with numpy gathers and Arrow string kernels (the fixed fields at
their offsets, then body, topic and properties by their lengths; keys, tags and the
message id out of the properties), into a ``pyarrow.RecordBatch`` of ``SCHEMA``.
Records with IPv6 hosts, compressed bodies (inflated here) or anything irregular take
the general decoder, which names what is wrong in a MessageFormatError.
"""

from __future__ import annotations

import struct
import zlib
from array import array

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import (
    BinaryType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from hamq.client.records import (
    COMPRESSION_TYPE_MASK,
    COMPRESSION_ZLIB,
    MAGIC_V1,
    MAGIC_V2,
    NAME_VALUE_SEPARATOR,
    PROPERTY_KEYS,
    PROPERTY_SEPARATOR,
    PROPERTY_TAGS,
    PROPERTY_UNIQ_KEY,
    RECORD_HEAD,
    SYSFLAG_BORNHOST_V6,
    SYSFLAG_COMPRESSED,
    SYSFLAG_STOREHOST_V6,
    MessageFormatError,
    decode_properties,
    offset_msg_id,
    read_record,
    unpack_host,
)

SCHEMA = StructType(
    [
        StructField("topic", StringType(), False),
        StructField("broker", StringType(), False),
        StructField("queue_id", IntegerType(), False),
        StructField("queue_offset", LongType(), False),
        StructField("commitlog_offset", LongType(), False),
        StructField("msg_id", StringType(), False),
        StructField("keys", StringType(), True),
        StructField("tags", StringType(), True),
        StructField("body", BinaryType(), False),
        StructField("properties", MapType(StringType(), StringType(), False), False),
        StructField("born_timestamp", TimestampType(), False),
        StructField("store_timestamp", TimestampType(), False),
        StructField("born_host", StringType(), False),
        StructField("reconsume_times", IntegerType(), False),
    ]
)
ARROW_SCHEMA: pa.Schema = to_arrow_schema(SCHEMA, timezone="UTC")

#: where the fields are in a record with IPv4 hosts
_AT_MAGIC, _AT_QUEUE_OFFSET, _AT_PHYSICAL_OFFSET, _AT_SYSFLAG = 4, 20, 28, 36
_AT_BORN_TS, _AT_BORN_HOST, _AT_STORE_TS, _AT_STORE_HOST = 40, 48, 56, 64
_AT_RECONSUME, _AT_BODY_LENGTH, _AT_BODY = 72, 84, 88
_V6 = SYSFLAG_BORNHOST_V6 | SYSFLAG_STOREHOST_V6
#: TOTALSIZE, the first field of every record
_TOTAL_SIZE = struct.Struct(">i")


class _Irregular(Exception):
    """Records the column-wise decoder does not read (the general decoder does)."""


class Columns:
    """The rows of one queue range, gathered as records and decoded a batch at a time."""

    def __init__(self, topic: str, broker: str, queue_id: int) -> None:
        self.topic = topic
        self.broker = broker
        self.queue_id = queue_id
        self._data = bytearray()
        #: where each kept record starts in ``_data``
        self._starts = array("q")

    def __len__(self) -> int:
        return len(self._starts)

    def add_records(self, raw: bytes, low: int, high: int) -> int:
        """Keep the records of ``raw`` whose queue offset is in ``low .. high - 1``; the
        offset after the last record there (-1: none).

        The walk from record to record reads only each one's size; the queue offsets
        are read all at once after it."""
        pos, size_all = 0, len(raw)
        found: list[int] = []
        size_of = _TOTAL_SIZE.unpack_from
        head = RECORD_HEAD.size
        while pos < size_all:
            if size_all - pos < head:
                raise MessageFormatError(f"only {size_all - pos} bytes left for a record")
            (size,) = size_of(raw, pos)
            if size < head or pos + size > size_all:
                raise MessageFormatError(
                    f"a record of total size {size} at byte {pos} of a {size_all}-byte answer"
                )
            found.append(pos)
            pos += size
        if not found:
            return -1
        starts = np.array(found, np.int64)
        buf = np.frombuffer(raw, np.uint8)
        where = (starts + _AT_QUEUE_OFFSET)[:, None] + np.arange(8)
        queue_offsets = buf[where].view(">i8").ravel()
        keep = (queue_offsets >= low) & (queue_offsets < high)
        if keep.any():
            base = len(self._data)
            self._starts.extend((starts[keep] + base).tolist())
            self._data += raw
        return int(queue_offsets[-1]) + 1

    def batch(self) -> pa.RecordBatch:
        """The rows so far as one Arrow batch; the columns start empty again."""
        try:
            batch = self._decode()
        except _Irregular:
            batch = self._decode_each()
        self._data = bytearray()
        self._starts = array("q")
        return batch

    # ------------------------------------------------------------ column-wise

    def _decode(self) -> pa.RecordBatch:
        rows = len(self._starts)
        buf = np.frombuffer(self._data, np.uint8)
        starts = np.frombuffer(self._starts, np.int64)

        def field(at: int | np.ndarray, dtype: str) -> np.ndarray:
            width = np.dtype(dtype).itemsize
            where = (starts + at)[:, None] + np.arange(width)
            return buf[where].view(dtype).ravel().astype(np.int64)

        sizes = field(0, ">i4")
        magic = field(_AT_MAGIC, ">i4")
        sys_flag = field(_AT_SYSFLAG, ">i4")
        body_length = field(_AT_BODY_LENGTH, ">i4")
        ends = starts + sizes
        if (
            (sizes < _AT_BODY + 3).any()
            or ((magic != MAGIC_V1) & (magic != MAGIC_V2)).any()
            or (sys_flag & (_V6 | SYSFLAG_COMPRESSED)).any()
            or (body_length < 0).any()
            or (starts + _AT_BODY + body_length + 3 > ends).any()
        ):
            raise _Irregular
        topic_at = starts + _AT_BODY + body_length
        long_topic = magic == MAGIC_V2
        topic_length = np.where(long_topic, field(topic_at - starts, ">u2"), buf[topic_at])
        properties_at = topic_at + np.where(long_topic, 2, 1) + topic_length
        if (properties_at + 2 > ends).any():
            raise _Irregular
        properties_length = field(properties_at - starts, ">u2")
        if (properties_at + 2 + properties_length != ends).any():
            raise _Irregular
        bodies = self._strings(buf, starts + _AT_BODY, body_length, pa.binary())
        properties = self._strings(buf, properties_at + 2, properties_length, pa.string())
        try:
            properties.validate(full=True)
        except pa.ArrowInvalid:
            raise _Irregular from None
        physical = field(_AT_PHYSICAL_OFFSET, ">i8")
        property_map, named = _properties(properties)
        msg_ids = named[PROPERTY_UNIQ_KEY]
        if msg_ids.null_count:
            msg_ids = self._offset_msg_ids(msg_ids, field(_AT_STORE_HOST, ">u8"), physical)
        stamp = ARROW_SCHEMA.field("born_timestamp").type
        columns = [
            pa.array([self.topic] * rows, pa.string()),
            pa.array([self.broker] * rows, pa.string()),
            pa.array(np.full(rows, self.queue_id, np.int32)),
            pa.array(field(_AT_QUEUE_OFFSET, ">i8")),
            pa.array(physical),
            msg_ids,
            named[PROPERTY_KEYS],
            named[PROPERTY_TAGS],
            bodies,
            property_map,
            pa.array(field(_AT_BORN_TS, ">i8") * 1000, stamp),
            pa.array(field(_AT_STORE_TS, ">i8") * 1000, stamp),
            _hosts(field(_AT_BORN_HOST, ">u8")),
            pa.array(field(_AT_RECONSUME, ">i4").astype(np.int32)),
        ]
        return pa.RecordBatch.from_arrays(columns, schema=ARROW_SCHEMA)

    @staticmethod
    def _strings(
        buf: np.ndarray, starts: np.ndarray, lengths: np.ndarray, kind: pa.DataType
    ) -> pa.Array:
        """The byte runs ``starts[i] .. + lengths[i]`` of ``buf`` as one Arrow array."""
        ends = np.cumsum(lengths)
        where = np.arange(int(ends[-1]), dtype=np.int64) + np.repeat(
            starts - ends + lengths, lengths
        )
        offsets = np.concatenate(([0], ends)).astype(np.int32)
        data = buf[where]
        return pa.Array.from_buffers(
            kind, len(lengths), [None, pa.py_buffer(offsets), pa.py_buffer(data)]
        )

    @staticmethod
    def _offset_msg_ids(ids: pa.Array, store_hosts: np.ndarray, physical: np.ndarray) -> pa.Array:
        """``ids``, a record without UNIQ_KEY identified by its offset message id."""
        filled = ids.to_pylist()
        for i in np.flatnonzero(pc.is_null(ids).to_numpy(zero_copy_only=False)):
            host = int(store_hosts[i]).to_bytes(8, "big")
            filled[i] = offset_msg_id(host, int(physical[i]))
        return pa.array(filled, pa.string())

    # ------------------------------------------------------------ record by record

    def _decode_each(self) -> pa.RecordBatch:
        """Every record through the general decoder (IPv6 hosts, compressed bodies);
        MessageFormatError naming what is wrong with a bad one."""
        rows = []
        for start in self._starts:
            info = read_record(self._data, start, check_crc=False)
            body = bytes(info.body)
            if info.sys_flag & SYSFLAG_COMPRESSED:
                body = _inflate(body, info.sys_flag, info.queue_offset)
            properties = decode_properties(info.properties)
            rows.append(
                {
                    "topic": self.topic,
                    "broker": self.broker,
                    "queue_id": self.queue_id,
                    "queue_offset": info.queue_offset,
                    "commitlog_offset": info.physical_offset,
                    "msg_id": properties.get(PROPERTY_UNIQ_KEY)
                    or offset_msg_id(info.store_host, info.physical_offset),
                    "keys": properties.get(PROPERTY_KEYS),
                    "tags": properties.get(PROPERTY_TAGS),
                    "body": body,
                    "properties": list(properties.items()),
                    "born_timestamp": info.born_timestamp * 1000,
                    "store_timestamp": info.store_timestamp * 1000,
                    "born_host": unpack_host(info.born_host),
                    "reconsume_times": info.reconsume_times,
                }
            )
        return pa.RecordBatch.from_pylist(rows, schema=ARROW_SCHEMA)


def _properties(properties: pa.Array) -> tuple[pa.Array, dict[str, pa.Array]]:
    """``name\x01value\x02 ...`` strings as map<string,string> (pairs without their
    separator left out, as RocketMQ does), and the values of UNIQ_KEY, KEYS and TAGS as
    columns (null where a row has none; of a name given twice, the last, as
    ``decode_properties`` keeps it): one split of the strings serves both."""
    pairs = pc.split_pattern(properties, PROPERTY_SEPARATOR)
    row_of = pc.list_parent_indices(pairs)
    split = pc.split_pattern(pairs.flatten(), NAME_VALUE_SEPARATOR, max_splits=1)
    whole = pc.equal(pc.list_value_length(split), 2)
    split, row_of = split.filter(whole), row_of.filter(whole)
    names, values = pc.list_element(split, 0), pc.list_element(split, 1)
    rows = len(properties)
    row_numbers = row_of.to_numpy()
    counts = np.bincount(row_numbers, minlength=rows)
    offsets = np.concatenate(([0], np.cumsum(counts))).astype(np.int32)
    property_map = pa.MapArray.from_arrays(
        pa.array(offsets), names, values, type=ARROW_SCHEMA.field("properties").type
    )
    named = {}
    for name in (PROPERTY_UNIQ_KEY, PROPERTY_KEYS, PROPERTY_TAGS):
        at = np.flatnonzero(pc.equal(names, name).to_numpy(zero_copy_only=False))
        index = np.full(rows, -1, np.int64)
        index[row_numbers[at]] = at  # (repeated rows: the last assignment stays)
        named[name] = values.take(pa.array(index, mask=index < 0))
    return property_map, named


def _hosts(packed: np.ndarray) -> pa.Array:
    """``ip:port`` of packed IPv4 hosts (as big-endian uint64), formatted once each."""
    unique, index = np.unique(packed, return_inverse=True)
    names = pa.array([unpack_host(int(u).to_bytes(8, "big")) for u in unique], pa.string())
    return names.take(pa.array(index.ravel()))


def _inflate(body: bytes, sys_flag: int, queue_offset: int) -> bytes:
    kind = sys_flag & COMPRESSION_TYPE_MASK
    if kind not in (0, COMPRESSION_ZLIB):
        raise MessageFormatError(
            f"the message at queue offset {queue_offset} is compressed with a codec hamq "
            f"cannot inflate (sysflag {sys_flag:#x})"
        )
    try:
        return zlib.decompress(body)
    except zlib.error as exc:
        raise MessageFormatError(
            f"the compressed body of the message at queue offset {queue_offset} does not "
            f"inflate ({exc})"
        ) from None
