"""Stored records as the store reads them, sound or damaged (layout:
docs/PROTOCOL.md#commitlog-record).

``hamq.protocol.record`` decodes records: ``read_record`` as consumers do (every
length, UTF-8, the body CRC), ``read_summary`` as the reput task does (the same less
the CRC); the structs of the record's fields (``RECORD_HEAD``, ``BODY_LENGTH``...) are
defined there too. What the store needs beyond that lives here, in one place:

- ``record_problem``: whether the record a consume-queue entry points at can be given
  to a consumer — what ``read_record`` would trip on, plus the record's place
  (PHYSICALOFFSET, and the topic, queue id and queue offset the entry stands for). A
  pull runs it once per record and process (``ConsumeQueue.checked`` remembers).
- ``fields`` / ``identity`` / ``implied_size``: where a record's variable fields lie
  and what it says it is, read by its own lengths without trusting them: what is left
  of a damaged record.
- ``isolated_damage``: whether a damaged record is one record with intact neighbours
  (passed over: its bytes stay, the log goes on) or the start of a torn tail (cut).
  Recovery and the reput task use the same rule.
- ``is_lost_record``: whether a sound record is a lost record's placeholder (its
  properties start with PROPERTY_LOST, its body is empty: queue_check.py writes them), which
  pulls pass over as they pass over damage, without counting it as damage.
- ``DamageLog``: damaged records met are all counted; one is logged at most every
  DAMAGE_LOG_INTERVAL_S (consumers pulling past the same record again and again must
  not flood the log).

Nothing here writes or blocks beyond reading the bytes given.
"""

from __future__ import annotations

import logging
import math
import struct
import time
from collections.abc import Callable

from hamq.protocol.message import (
    NAME_VALUE_SEPARATOR,
    PROPERTY_LOST,
    SYSFLAG_BORNHOST_V6,
    SYSFLAG_STOREHOST_V6,
    MessageFormatError,
    topic_error,
)
from hamq.protocol.record import (
    BODY_LENGTH,
    BORN_HOST_AT,
    MAGIC_V1,
    MAGIC_V2,
    RECORD_HEAD,
    SIZE_MAGIC,
    TEXT_LENGTH,
    body_crc,
    is_blank,
    read_record,
)
from hamq.store.segment import Segment

log = logging.getLogger(__name__)

# The record's structs read through module-level names: CPython 3.11 compiles a method
# call on an imported name (``RECORD_HEAD.unpack_from(...)``) as an attribute load
# that makes a bound method per call, 10-20 % slower on these per-record paths.
_unpack_head = RECORD_HEAD.unpack_from
_unpack_body_length = BODY_LENGTH.unpack_from
_unpack_text_length = TEXT_LENGTH.unpack_from
_unpack_size_magic = SIZE_MAGIC.unpack_from
#: the smallest record: 91 fixed bytes (IPv4 hosts, V1) and a one-byte topic
MIN_RECORD_BYTES = 92
#: a damaged record is logged at most this often (the others are counted)
DAMAGE_LOG_INTERVAL_S = 10.0


def _body_length_at(sys_flag: int) -> int:
    """Where BODYLENGTH is: after the 48 bytes before BORNHOST (``BORN_HOST_AT``),
    BORNHOST, STORETIMESTAMP, STOREHOST, RECONSUMETIMES and PREPAREDTRANSACTIONOFFSET."""
    born = 20 if sys_flag & SYSFLAG_BORNHOST_V6 else 8
    store = 20 if sys_flag & SYSFLAG_STOREHOST_V6 else 8
    return BORN_HOST_AT + born + 8 + store + 12


#: BODYLENGTH's position by the two host bits of SYSFLAG (``(sys_flag >> 4) & 3``)
_BODY_LENGTH_AT = tuple(_body_length_at(bits << 4) for bits in range(4))


# ---------------------------------------------------------------- can a consumer have it


def record_problem(
    record: memoryview,
    physical_offset: int,
    entry: tuple[str, int, int] | None = None,
    *,
    check_crc: bool = False,
) -> str | None:
    """What is wrong with ``record`` (one whole record, read at ``physical_offset`` for
    the consume-queue ``entry`` (topic, queue id, queue offset) if given), or None if a
    consumer can decode it: what ``read_record`` checks — magic, TOTALSIZE, every
    length, the lengths adding up, topic and properties UTF-8, and with ``check_crc``
    the body CRC — plus the record's place: its PHYSICALOFFSET, and what it says it is.

    Its own walk over the fields, not ``read_summary``'s: it runs for each record a pull
    checks (once per record and process), and skipping the tuple, the store timestamp
    and the exception wrapping read_summary needs measured 0.5 us (30 %) cheaper."""
    size = len(record)
    if size < MIN_RECORD_BYTES:
        return f"{size} bytes are too few for a record"
    total, magic, crc, queue_id, _flag, queue_offset, physical, sys_flag = _unpack_head(record)
    if magic != MAGIC_V1 and magic != MAGIC_V2:
        return f"magic code {magic & 0xFFFFFFFF:#010x} is not a message's"
    if total != size:
        return f"total size {total} is not the {size} bytes its consume queue entry says"
    if physical != physical_offset:
        return f"it says it is at commitlog offset {physical}"
    body_at = _BODY_LENGTH_AT[(sys_flag >> 4) & 3] + 4
    try:
        (body_len,) = _unpack_body_length(record, body_at - 4)
        at = body_at + body_len
        if body_len < 0 or at > size:
            return f"body length {body_len} runs past total size {size}"
        if magic == MAGIC_V1:
            topic_len = record[at]
            at += 1
        else:
            (topic_len,) = _unpack_text_length(record, at)
            at += 2
        (properties_len,) = _unpack_text_length(record, at + topic_len)
        if topic_len <= 0 or properties_len < 0 or at + topic_len + 2 + properties_len != size:
            return f"topic and properties lengths do not add up to total size {size}"
        topic = str(record[at : at + topic_len], "utf-8")
        str(record[at + topic_len + 2 :], "utf-8")
    except (struct.error, IndexError):
        return f"record fields run past total size {size}"
    except UnicodeDecodeError as exc:
        return f"topic or properties are not UTF-8: {exc}"
    if entry is not None and (topic, queue_id, queue_offset) != entry:
        return (
            f"it is entry {queue_offset} of {topic}/{queue_id}, not entry {entry[2]} of "
            f"{entry[0]}/{entry[1]}"
        )
    if check_crc:
        actual = body_crc(record[body_at : body_at + body_len])
        if actual != crc:
            return f"body CRC {actual:#x} does not match stored {crc:#x}"
    return None


#: how a lost record's placeholder's properties start
_LOST_MARK = (PROPERTY_LOST + NAME_VALUE_SEPARATOR).encode()


def is_lost_record(record: memoryview | bytes) -> bool:
    """Whether ``record`` (one whole record, ``record_problem`` found sound) holds a queue
    offset for a record a crash cut from the log: an empty body and properties that
    start with PROPERTY_LOST. Cheap for every other record: one look at BODYLENGTH."""
    sys_flag = int.from_bytes(record[36:40], "big")
    at = _BODY_LENGTH_AT[(sys_flag >> 4) & 3]
    if record[at : at + 4] != b"\0\0\0\0":
        return False
    at += 4
    if _unpack_head(record)[1] == MAGIC_V2:
        at += 2 + int.from_bytes(record[at : at + 2], "big")
    else:
        at += 1 + record[at]
    return bytes(record[at + 2 : at + 2 + len(_LOST_MARK)]) == _LOST_MARK


def record_ok(view: memoryview, pos: int, physical_offset: int) -> bool:
    """A whole record at ``pos`` (magic, sizes, CRC) that says it is at ``physical_offset``."""
    return scan_problem(view, pos, physical_offset) is None


def scan_problem(
    view: memoryview, pos: int, physical_offset: int, *, check_crc: bool = True
) -> str | None:
    """What is wrong with the record at ``pos`` of ``view`` (that should be at
    ``physical_offset``), as crash recovery checks it; None if nothing."""
    try:
        info = read_record(view, pos, check_crc=check_crc)
    except MessageFormatError as exc:
        return str(exc)
    if info.physical_offset != physical_offset:
        return f"record says it is at {info.physical_offset}, it is at {physical_offset}"
    return None


# ---------------------------------------------------------------- what is left of a record


def fields(view: memoryview, pos: int) -> tuple[int, int, int, int] | None:
    """(where the body starts, its length, where the topic starts, its length) for the
    record at ``pos`` by its own BODYLENGTH and TOPICLENGTH, unchecked beyond being
    readable and not negative (the properties length follows the topic); None if they
    cannot be read."""
    try:
        _size, magic, _crc, _queue, _flag, _queue_offset, _phy, sys_flag = _unpack_head(view, pos)
        at = pos + _BODY_LENGTH_AT[(sys_flag >> 4) & 3]
        (body_len,) = _unpack_body_length(view, at)
        if body_len < 0:
            return None
        body_at = at + 4
        at = body_at + body_len
        if magic == MAGIC_V2:
            (topic_len,) = _unpack_text_length(view, at)
            at += 2
        else:
            topic_len = view[at]
            at += 1
    except (struct.error, IndexError):
        return None
    return (body_at, body_len, at, topic_len) if topic_len > 0 else None


def implied_size(view: memoryview, pos: int) -> int | None:
    """The size a record's own lengths (body, topic, properties) add up to, if they can
    be read; None otherwise."""
    found = fields(view, pos)
    if found is None:
        return None
    topic_end = found[2] + found[3]
    try:
        (properties_len,) = _unpack_text_length(view, topic_end)
    except struct.error:
        return None
    return topic_end + 2 + properties_len - pos if properties_len >= 0 else None


def identity(view: memoryview, pos: int) -> tuple[str | None, int, int, int]:
    """(topic, or None if it cannot be read or is not a valid name; queue id; queue
    offset; sys flag) of a possibly damaged record, as far as it can be read."""
    _size, _magic, _crc, queue_id, _flag, queue_offset, _phy, sys_flag = _unpack_head(view, pos)
    found = fields(view, pos)
    topic: str | None = None
    if found is not None:
        _body_at, _body_len, start, length = found
        try:
            topic = str(view[start : start + length], "utf-8")
        except UnicodeDecodeError:
            topic = None
        if topic is not None and topic_error(topic) is not None:
            topic = None
    return topic, queue_id, queue_offset, sys_flag


# ---------------------------------------------------------------- one record or a torn tail


def complete_by_its_lengths(view: memoryview, pos: int) -> bool:
    """Whether the record at ``pos`` of ``view`` (the bytes written so far), though its
    TOTALSIZE runs past them, is there whole by its own lengths, which disagree with
    that TOTALSIZE: then it is damaged now, not a record still coming."""
    implied = implied_size(view, pos)
    if implied is None or implied < MIN_RECORD_BYTES or pos + implied > len(view):
        return False
    return implied != int.from_bytes(view[pos : pos + 4], "big", signed=True)


def _whole(view: memoryview, at: int, physical_offset: int, segment_size: int) -> bool | None:
    """Whether a sound record starts at ``at`` of ``view`` (the bytes that can be read);
    None if that cannot be told yet: its bytes have not all come (``view`` ends inside
    it, and it would fit in the segment)."""
    if len(view) - at < 8:
        return None
    size, magic = _unpack_size_magic(view, at)
    if magic != MAGIC_V1 and magic != MAGIC_V2:
        return False  # (whatever comes after, no record starts here)
    if MIN_RECORD_BYTES <= size <= segment_size - at and at + size > len(view):
        return None
    return record_ok(view, at, physical_offset)


def isolated_damage(
    segment: Segment, pos: int, *, log_end: int | None = None, final: bool = True
) -> int | None:
    """The size of the damaged record at ``pos`` of ``segment`` if the damage is that one
    record; None if it cannot be told from a torn tail; 0 if that cannot be told yet
    (``final`` False: the log is still growing, and the bytes after the record have not
    all come).

    Its TOTALSIZE is taken when the bytes after it are whole: a record that checks
    (magic, sizes, CRC, PHYSICALOFFSET) or a blank marker ending the segment exactly —
    or, given ``log_end`` (where the log is known to end), when it ends the log there.
    Refused when the record's own lengths lead to a whole record before that: then the
    TOTALSIZE is the damaged field, and trusting it would swallow good records.

    What is read: with ``final``, the whole segment (zeros past the data) or up to
    ``log_end``; else what was written to it so far."""
    if final:
        stop = segment.size if log_end is None else min(segment.size, log_end - segment.start)
    else:
        stop = segment.wrote
    pending = None if final else 0
    view = segment.view(0, stop)
    if stop - pos < 8:
        return pending
    total = int.from_bytes(view[pos : pos + 4], "big", signed=True)
    after = pos + total
    if total < MIN_RECORD_BYTES or after > segment.size:
        return None
    if log_end is not None and segment.start + after == log_end:
        return total  # the last record of a log whose end is known
    implied = implied_size(view, pos)
    if implied is not None and MIN_RECORD_BYTES <= implied < total:
        # (lengths that say more than TOTALSIZE are damaged themselves if the record
        # after it by TOTALSIZE is whole: that is checked below)
        elsewhere = pos + implied
        whole = _whole(view, elsewhere, segment.start + elsewhere, segment.size)
        if whole:
            return None
        if whole is None and not final and elsewhere < segment.size:
            return pending
    if after > stop:
        return pending
    if stop - after < 8:
        return pending
    if is_blank(view, after):
        remaining = int.from_bytes(view[after : after + 4], "big", signed=True)
        return total if remaining == segment.size - after else None
    whole = _whole(view, after, segment.start + after, segment.size)
    if whole is None:
        return pending
    return total if whole else None


# ---------------------------------------------------------------- counting and logging


class DamageLog:
    """Damaged records met by one path (``what``: "a pull", "dispatching"): every one
    is counted, one is logged at most every DAMAGE_LOG_INTERVAL_S."""

    def __init__(self, what: str, clock: Callable[[], float] = time.monotonic) -> None:
        self.what = what
        self.count = 0
        self._clock = clock
        self._unlogged = 0
        self._next_log = -math.inf

    def note(self, physical_offset: int, problem: str) -> None:
        self.count += 1
        now = self._clock()
        if now < self._next_log:
            self._unlogged += 1
            return
        more = f" ({self._unlogged} more since the last report)" if self._unlogged else ""
        log.error(
            "%s passed over the damaged record at commitlog offset %d: %s%s",
            self.what,
            physical_offset,
            problem,
            more,
        )
        self._unlogged = 0
        self._next_log = now + DAMAGE_LOG_INTERVAL_S
