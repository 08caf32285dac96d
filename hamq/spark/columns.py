"""Pull answers decoded straight into the columns of the source's rows (pure).

A pull answer is stored records back to back (docs/PROTOCOL.md#pulling). Decoding each into
a message object and then into a row costs more than everything else a Spark read
does, so ``Columns`` decodes column-wise, with no Python loop over records:
``add_records`` finds an answer's records where their MAGICCODE is (``record_starts``)
and keeps those of the range; ``batch`` reads every field of all the records kept at
once: the fixed fields as one structured numpy gather, body and properties copied out by
Arrow's take, and the properties split into a map (keys, tags and the message id out of
it) by where their separators are, into a ``pyarrow.RecordBatch`` of ``SCHEMA``.
Records with IPv6 hosts, compressed bodies (inflated here) or anything irregular take
the general decoder, which names what is wrong in a MessageFormatError.
"""

from __future__ import annotations

import struct
import zlib

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
_AT_QUEUE_OFFSET, _AT_BODY = 20, 88
#: the fixed fields of a record with IPv4 hosts, the first ``_AT_BODY`` bytes
_HEAD = np.dtype(
    {
        "names": [
            "size", "magic", "queue_offset", "physical_offset", "sys_flag", "born_timestamp",
            "born_host", "store_timestamp", "store_host", "reconsume_times", "body_length",
        ],
        "formats": [">i4", ">i4", ">i8", ">i8", ">i4", ">i8", ">u8", ">i8", ">u8", ">i4", ">i4"],
        "offsets": [0, 4, _AT_QUEUE_OFFSET, 28, 36, 40, 48, 56, 64, 72, 84],
        "itemsize": _AT_BODY,
    }
)  # fmt: skip
_V6 = SYSFLAG_BORNHOST_V6 | SYSFLAG_STOREHOST_V6
#: TOTALSIZE, the first field of every record
_TOTAL_SIZE = struct.Struct(">i")
#: MAGICCODE, the second: its first byte, and the two values it has
_MAGIC_FIRST_BYTE = (MAGIC_V1 >> 24) & 0xFF
_MAX_OFFSET = 2**31 - 1
#: the properties that are columns of their own too
_NAMED = pa.array([PROPERTY_UNIQ_KEY, PROPERTY_KEYS, PROPERTY_TAGS], pa.string())


class _Irregular(Exception):
    """Records the column-wise decoder does not read (the general decoder does)."""


def _at(data: bytes | bytearray, where: np.ndarray, dtype: np.dtype | str) -> np.ndarray:
    """The values of ``dtype`` starting at the byte positions ``where`` of ``data`` (each
    one must fit), as one array: an overlapping view of ``data`` indexed once."""
    kind = np.dtype(dtype)
    every_byte = np.ndarray((len(data) - kind.itemsize + 1,), kind, data, strides=(1,))
    values: np.ndarray = every_byte[where]
    return values


def record_starts(raw: bytes) -> np.ndarray:
    """Where each record of a pull answer starts, checked to follow one another exactly
    (each start plus its TOTALSIZE is the next; the last ends where ``raw`` does); a
    MessageFormatError naming what is wrong with an answer that is not so.

    Where MAGICCODE sits is found for all records at once; they are the answer's records
    when their sizes chain. Otherwise (a body holding the magic bytes, a damaged answer)
    the records are walked one by one, which names the damage."""
    size_all = len(raw)
    if size_all >= RECORD_HEAD.size:
        buf = np.frombuffer(raw, np.uint8)
        found = np.flatnonzero(buf[4 : size_all - RECORD_HEAD.size + 5] == _MAGIC_FIRST_BYTE)
        magic = _at(raw, found + 4, ">i4")
        starts: np.ndarray = found[(magic == MAGIC_V1) | (magic == MAGIC_V2)]
        if len(starts) and starts[0] == 0:
            sizes = _at(raw, starts, ">i4").astype(np.int64)
            ends = starts + sizes
            if (
                ends[-1] == size_all
                and (ends[:-1] == starts[1:]).all()
                and (sizes >= RECORD_HEAD.size).all()
            ):
                return starts
    return _walk(raw)


def _walk(raw: bytes) -> np.ndarray:
    """``record_starts`` record by record."""
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
    return np.array(found, np.int64)


class Columns:
    """The rows of one queue range, gathered as records and decoded a batch at a time."""

    def __init__(self, topic: str, broker: str, queue_id: int) -> None:
        self.topic = topic
        self.broker = broker
        self.queue_id = queue_id
        #: the answers kept (joined into one buffer for a batch), their bytes, and
        #: where each kept record starts in them as joined
        self._answers: list[bytes] = []
        self._size = 0
        self._starts: list[np.ndarray] = []
        self._rows = 0

    def __len__(self) -> int:
        return self._rows

    @property
    def size_bytes(self) -> int:
        """The bytes of records kept so far."""
        return self._size

    def add_records(self, raw: bytes, low: int, high: int) -> int:
        """Keep the records of ``raw`` whose queue offset is in ``low .. high - 1``; the
        offset after the last record there (-1: none)."""
        starts = record_starts(raw)
        if not len(starts):
            return -1
        queue_offsets = _at(raw, starts + _AT_QUEUE_OFFSET, ">i8")
        keep = (queue_offsets >= low) & (queue_offsets < high)
        kept = starts[keep] if not keep.all() else starts
        if len(kept):
            self._starts.append(kept + self._size)
            self._rows += len(kept)
            self._answers.append(raw)
            self._size += len(raw)
        return int(queue_offsets[-1]) + 1

    def batch(self) -> pa.RecordBatch:
        """The rows so far as one Arrow batch; the columns start empty again."""
        data, starts = self._take()
        try:
            return self._decode(data, starts)
        except _Irregular:
            return self._decode_each(data, starts)

    def _take(self) -> tuple[bytes, np.ndarray]:
        """The answers kept, joined, and where their kept records start; none kept after."""
        data = b"".join(self._answers)
        starts = np.concatenate(self._starts) if self._starts else np.zeros(0, np.int64)
        self._answers, self._size, self._starts, self._rows = [], 0, [], 0
        return data, starts

    # ------------------------------------------------------------ column-wise

    def _decode(self, data: bytes, starts: np.ndarray) -> pa.RecordBatch:
        rows = len(starts)
        if not rows or int(starts[-1]) + _AT_BODY > len(data):
            raise _Irregular
        # the heads as rows of bytes, then seen as their fields (a gather of the
        # structured dtype itself copies field by field, several times slower)
        every_head = np.ndarray(
            (len(data) - _AT_BODY + 1, _AT_BODY), np.uint8, data, strides=(1, 1)
        )
        head = every_head[starts].view(_HEAD)[:, 0]
        sizes = head["size"].astype(np.int64)
        magic = head["magic"]
        body_length = head["body_length"].astype(np.int64)
        ends = starts + sizes
        if (
            (sizes < _AT_BODY + 3).any()
            or ((magic != MAGIC_V1) & (magic != MAGIC_V2)).any()
            or (head["sys_flag"] & (_V6 | SYSFLAG_COMPRESSED)).any()
            or (body_length < 0).any()
            or (starts + _AT_BODY + body_length + 3 > ends).any()
        ):
            raise _Irregular
        topic_at = starts + _AT_BODY + body_length
        long_topic = magic == MAGIC_V2
        topic_length = _at(data, topic_at, "u1")
        if long_topic.any():
            topic_length = np.where(long_topic, _at(data, topic_at, ">u2"), topic_length)
        properties_at = topic_at + np.where(long_topic, 2, 1) + topic_length
        if (properties_at + 2 > ends).any():
            raise _Irregular
        properties_length = _at(data, properties_at, ">u2").astype(np.int64)
        if (properties_at + 2 + properties_length != ends).any():
            raise _Irregular
        bodies, properties = _runs(
            data, [(starts + _AT_BODY, body_length), (properties_at + 2, properties_length)]
        )
        properties = properties.view(pa.string())
        try:
            properties.validate(full=True)
        except pa.ArrowInvalid:
            raise _Irregular from None
        physical = head["physical_offset"].astype(np.int64)
        property_map, named = _properties(properties)
        msg_ids = named[PROPERTY_UNIQ_KEY]
        if msg_ids.null_count:
            msg_ids = self._offset_msg_ids(msg_ids, head["store_host"], physical)
        stamp = ARROW_SCHEMA.field("born_timestamp").type
        columns = [
            pa.repeat(pa.scalar(self.topic, pa.string()), rows),
            pa.repeat(pa.scalar(self.broker, pa.string()), rows),
            pa.repeat(pa.scalar(self.queue_id, pa.int32()), rows),
            pa.array(head["queue_offset"].astype(np.int64)),
            pa.array(physical),
            msg_ids,
            named[PROPERTY_KEYS],
            named[PROPERTY_TAGS],
            bodies,
            property_map,
            pa.array(head["born_timestamp"].astype(np.int64) * 1000, stamp),
            pa.array(head["store_timestamp"].astype(np.int64) * 1000, stamp),
            _hosts(head["born_host"].astype(np.uint64)),
            pa.array(head["reconsume_times"].astype(np.int32)),
        ]
        return pa.RecordBatch.from_arrays(columns, schema=ARROW_SCHEMA)

    @staticmethod
    def _offset_msg_ids(ids: pa.Array, store_hosts: np.ndarray, physical: np.ndarray) -> pa.Array:
        """``ids``, a record without UNIQ_KEY identified by its offset message id."""
        filled = ids.to_pylist()
        for i in np.flatnonzero(pc.is_null(ids).to_numpy(zero_copy_only=False)):
            host = int(store_hosts[i]).to_bytes(8, "big")
            filled[i] = offset_msg_id(host, int(physical[i]))
        return pa.array(filled, pa.string())

    # ------------------------------------------------------------ record by record

    def _decode_each(self, data: bytes, starts: np.ndarray) -> pa.RecordBatch:
        """Every record through the general decoder (IPv6 hosts, compressed bodies);
        MessageFormatError naming what is wrong with a bad one."""
        rows = []
        for start in starts.tolist():
            info = read_record(data, start, check_crc=False)
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


def _runs(
    data: bytes | bytearray | np.ndarray, runs: list[tuple[np.ndarray, np.ndarray]]
) -> list[pa.Array]:
    """For each ``(starts, lengths)`` of ``runs``, the byte runs ``starts[i] .. + lengths[i]``
    of ``data`` as one binary array.

    ``data`` is seen, without a copy, as one array alternating the runs and what lies
    between them (the runs, in order, must not overlap); Arrow's take then copies the
    runs out."""
    if len(data) > _MAX_OFFSET:
        raise _Irregular  # past what a binary array's int32 offsets reach
    rows = len(runs[0][0])
    count = 2 * len(runs) * rows
    offsets = np.empty(count + 1, np.int32)
    offsets[0] = 0
    for i, (starts, lengths) in enumerate(runs):
        offsets[1 + 2 * i :: 2 * len(runs)] = starts
        offsets[2 + 2 * i :: 2 * len(runs)] = starts + lengths
    whole = pa.Array.from_buffers(
        pa.binary(), count, [None, pa.py_buffer(offsets), pa.py_buffer(data)]
    )
    step = 2 * len(runs)
    return [whole.take(pa.array(np.arange(1 + 2 * i, count, step))) for i in range(len(runs))]


def _properties(properties: pa.Array) -> tuple[pa.Array, dict[str, pa.Array]]:
    """``name\x01value\x02 ...`` strings as map<string,string> (pairs without their
    separator left out, as RocketMQ does), and the values of UNIQ_KEY, KEYS and TAGS as
    columns (null where a row has none; of a name given twice, the last, as
    ``decode_properties`` keeps it): one split of the strings serves both."""
    names, values, offsets = _regular_pairs(properties) or _pairs(properties)
    rows = len(properties)
    property_map = pa.MapArray.from_arrays(
        pa.array(offsets), names, values, type=ARROW_SCHEMA.field("properties").type
    )
    row_numbers = np.repeat(np.arange(rows), np.diff(offsets))
    named = {}
    which = pc.index_in(names, value_set=_NAMED).fill_null(-1).to_numpy()
    for k, name in enumerate(_NAMED.to_pylist()):
        at = np.flatnonzero(which == k)
        index = np.full(rows, -1, np.int64)
        index[row_numbers[at]] = at  # (repeated rows: the last assignment stays)
        named[name] = values.take(pa.array(index, mask=index < 0))
    return property_map, named


def _regular_pairs(properties: pa.Array) -> tuple[pa.Array, pa.Array, np.ndarray] | None:
    """``_pairs`` of strings that are all pairs ``name\x01value\x02`` (what producers
    write), read off where the separators are; None for any other.

    The separators of all the strings alternate \x01, \x02 and every string that is
    not empty ends with \x02: then each pair lies in one string."""
    _, offsets_buffer, data_buffer = properties.buffers()
    rows = len(properties)
    offsets = np.frombuffer(offsets_buffer, np.int32, rows + 1, properties.offset * 4)
    base = int(offsets[0])
    text = np.frombuffer(data_buffer, np.uint8)[base : int(offsets[-1])]
    ends = offsets - base
    marks = np.flatnonzero(text <= ord(PROPERTY_SEPARATOR))  # (a NUL too: not regular)
    kinds = text[marks]
    lasts = ends[1:][ends[1:] > ends[:-1]] - 1
    if (
        len(marks) % 2
        or (kinds[0::2] != ord(NAME_VALUE_SEPARATOR)).any()
        or (kinds[1::2] != ord(PROPERTY_SEPARATOR)).any()
        or (text[lasts] != ord(PROPERTY_SEPARATOR)).any()
    ):
        return None
    ones, twos = marks[0::2], marks[1::2]
    name_starts = np.concatenate(([0], twos + 1))[: len(twos)]
    names, values = _runs(text, [(name_starts, ones - name_starts), (ones + 1, twos - ones - 1)])
    offsets = np.searchsorted(twos, ends).astype(np.int32)  # (the pairs before each row)
    return names.view(pa.string()), values.view(pa.string()), offsets


def _pairs(properties: pa.Array) -> tuple[pa.Array, pa.Array, np.ndarray]:
    """The names and values of the pairs of ``name\x01value\x02 ...`` strings, and
    where each string's pairs start among them (one offset a string, and the end)."""
    pairs = pc.split_pattern(properties, PROPERTY_SEPARATOR)
    row_of = pc.list_parent_indices(pairs)
    split = pc.split_pattern(pairs.flatten(), NAME_VALUE_SEPARATOR, max_splits=1)
    whole = pc.equal(pc.list_value_length(split), 2)
    split, row_of = split.filter(whole), row_of.filter(whole)
    names, values = pc.list_element(split, 0), pc.list_element(split, 1)
    counts = np.bincount(row_of.to_numpy(), minlength=len(properties))
    return names, values, np.concatenate(([0], np.cumsum(counts))).astype(np.int32)


def _hosts(packed: np.ndarray) -> pa.Array:
    """``ip:port`` of packed IPv4 hosts (as big-endian uint64), formatted once each."""
    if (packed == packed[0]).all():  # (one producer host: the common case)
        name = unpack_host(int(packed[0]).to_bytes(8, "big"))
        return pa.repeat(pa.scalar(name, pa.string()), len(packed))
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
