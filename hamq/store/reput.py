"""The reput task: follows the CommitLog and builds consume queues and the index.

It reads records from ``offset`` on — written here (master) or replicated (slave) —
and for each one adds a consume-queue entry and index keys, then tells the listeners
(long polling, the delay scheduler). Invariants:
- ``offset`` only moves forward, one whole record (or one blank segment tail) at a
  time, and never past the CommitLog's end; a record not yet complete (a slave's
  replicated bytes can stop mid-record) is waited for, not reported;
- prepared and rolled-back transaction messages get no consume-queue entry, rolled-back
  ones no index keys (RocketMQ's rules); nor do the records of a deleted topic from
  before its deletion, and a deletion record destroys its topic's queues
  (hamq/store/deletions.py);
- for SCHEDULE_TOPIC_XXXX the tags code is the delivery time: store time + the delay
  of the message's level; for rmq_sys_wheel_timer queue 0 its TIMER_OUT_MS (when the
  timer message is due); a record with HAMQ_TIMER_SOURCE (a timer message's delivery)
  is also indexed under ``rmq_sys_wheel_timer#<that queue offset>`` (hamq/store/timer.py),
  and each of a record's HAMQ_MARKS under ``HAMQ_MARKS#<mark>`` (hamq/broker/pop.py);
- dispatching a record twice is harmless (consume queues and index skip what they have);
- every record dispatched was read whole (``read_summary``): its entry is marked in its
  queue's ``checked`` (with ``check_crc``, only if this process appended it, computing
  its CRC), and pulls need not check it again — except a lost record's placeholder
  (PROPERTY_LOST, written by recovery): pulls read it and pass over it;
- a disk error (an OSError: a full disk, too many open files) stops dispatching at the
  record it failed on, which is tried again with backoff (RETRY_MIN_S doubling up to
  RETRY_MAX_S) until it succeeds; meanwhile ``failure`` says why, and the store refuses
  sends with it. Nothing is skipped: dispatch resumes at that very record;
- a damaged record (one that does not decode, or names no valid queue: flipped bytes
  on disk, or received so from a master) is passed over where its neighbours are
  intact, by the rule crash recovery uses (``records.isolated_damage``); where the
  record after it has not all come yet, dispatching waits for it. A record passed over
  keeps its queue offset: when its header still names its queue at that queue's next
  offset, it gets its entry there (pulls skip it); else it is held in ``unplaced``
  until a record of some queue comes with a queue offset past that queue's end, and
  fills the gap. So queue offsets are never handed out twice, and never leave a gap.
  Each one is counted in ``damaged`` and logged (rate-limited). Any other failure (two
  damaged records in a row, an entry that conflicts with its queue) stops dispatching
  until a truncation removes the record (``truncated``).
"""

from __future__ import annotations

import errno
import logging
import math
import mmap
import struct
import time
from collections.abc import Callable, Mapping

import attrs
import trio

from hamq.protocol.message import (
    PROPERTY_DELAY,
    PROPERTY_KEYS,
    PROPERTY_LOST,
    PROPERTY_MARKS,
    PROPERTY_TAGS,
    PROPERTY_TIMER_OUT_MS,
    PROPERTY_TIMER_SOURCE,
    PROPERTY_UNIQ_KEY,
    SCHEDULE_TOPIC,
    SYSFLAG_TRANSACTION_MASK,
    SYSFLAG_TRANSACTION_PREPARED,
    SYSFLAG_TRANSACTION_ROLLBACK,
    TIMER_TOPIC,
    TOPIC_DELETION_TOPIC,
    MessageFormatError,
    decode_properties,
    tags_code,
    topic_error,
)
from hamq.protocol.record import BLANK_MAGIC, SIZE_MAGIC, decode_message, read_summary
from hamq.store.commitlog import AppendResult, CommitLog
from hamq.store.consume_queue import ConsumeQueue, ConsumeQueueTable
from hamq.store.deletions import TopicDeletions
from hamq.store.index import IndexService, index_key
from hamq.store.records import (
    MIN_RECORD_BYTES,
    DamageLog,
    complete_by_its_lengths,
    identity,
    isolated_damage,
)
from hamq.store.segment import Segment

log = logging.getLogger(__name__)

#: the transaction bits of records with no consume-queue entry (as in RocketMQ)
_UNQUEUED = (SYSFLAG_TRANSACTION_PREPARED, SYSFLAG_TRANSACTION_ROLLBACK)
#: the most records one run takes (a send batch's are far fewer)
MAX_RUN = 64

#: after a disk error the reput task tries again after RETRY_MIN_S, doubling the wait
#: with each failure up to RETRY_MAX_S
RETRY_MIN_S = 0.1
RETRY_MAX_S = 2.0
#: the longest one deferral (``defer_for``) holds dispatching: while a replica catches
#: up, its queues are still brought up to date at least this often
MAX_DEFERRAL_S = 5.0
#: most records whose dispatch requests wait for their dispatch (``appended``): a
#: dispatch far behind the puts reads the rest from the log itself
APPENDED_KEPT = 4096


@attrs.define(slots=True)
class DispatchRequest:
    """One record as the reput task hands it to queues, index and listeners (not
    frozen: one is made per message on the hot path; nobody changes it)."""

    topic: str
    queue_id: int
    physical_offset: int
    size: int
    tags_code: int
    store_timestamp: int
    queue_offset: int
    sys_flag: int
    properties: Mapping[str, str]


@attrs.define
class Unplaced:
    """A damaged record passed over whose consume queue could not be told (yet)."""

    offset: int
    size: int
    queue_id: int


class ReputService:
    def __init__(
        self,
        commitlog: CommitLog,
        queues: ConsumeQueueTable,
        index: IndexService,
        delay_levels_ms: tuple[int, ...],
        deletions: TopicDeletions,
        *,
        offset: int = 0,
        check_crc: bool = False,
    ) -> None:
        self.commitlog = commitlog
        #: deleted topics: their records before the deletion are not dispatched
        self.deletions = deletions
        #: the store checks CRCs on reads: an entry is ``checked`` only if its record's
        #: CRC is known good too (appended by this process); pulls check the others
        self.check_crc = check_crc
        self.queues = queues
        self.index = index
        self.delay_levels_ms = delay_levels_ms
        self.offset = offset
        #: store time of the last record dispatched (for the checkpoint)
        self.last_store_timestamp = 0
        self.listeners: list[Callable[[DispatchRequest], None]] = []
        #: told the name of each topic whose deletion is applied (``_apply_deletion``)
        self.deletion_listeners: list[Callable[[str], None]] = []
        #: the dispatch requests of records this process appended and has not dispatched
        #: yet, by physical offset (``appended``): the put knew all of it (properties
        #: decoded, place and time), dispatching need not read the record again
        self._appended: dict[int, DispatchRequest] = {}
        self.failure: str | None = None
        self.failure_is_transient = False
        #: how many times dispatching was tried again after a disk error (for statistics)
        self.retries = 0
        self._retry_delay = RETRY_MIN_S
        self._failed_at: float | None = None  # (time.monotonic: recovery runs in a thread)
        self._retries_before = 0
        self._last_failure: str | None = None
        #: damaged records passed over (counted; logged rate-limited unless ``on_damaged``
        #: is set: recovery copies each to torn/ and logs it there)
        self.damaged = DamageLog("dispatching")
        self.on_damaged: Callable[[int, int, str], None] | None = None
        #: damaged records passed over whose queue is not known yet (``_fill_gap``)
        self.unplaced: list[Unplaced] = []
        self._wakeup = trio.Event()
        self._progress = trio.Event()
        #: a replica taking a backlog from its master defers dispatching (``defer_for``)
        #: while large transfers keep coming, so that the log — what durability depends
        #: on — gets the core first; queues are still brought up to date at least every
        #: MAX_DEFERRAL_S
        self._defer_until = -math.inf

    def wake(self) -> None:
        """New bytes are in the CommitLog."""
        self._wakeup.set()

    def defer_for(self, seconds: float) -> None:
        """A replica is catching up: hold dispatching for ``seconds`` more."""
        self._defer_until = max(self._defer_until, trio.current_time() + seconds)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        while True:
            retry = self.failure is not None and self.failure_is_transient
            if retry:
                # sends are refused while ``failure`` is set: nothing wakes this task,
                # it tries again by itself
                await trio.sleep(self._retry_delay)
                self._retry_delay = min(2 * self._retry_delay, RETRY_MAX_S)
                self.retries += 1
            longest = trio.current_time() + MAX_DEFERRAL_S
            while (until := min(self._defer_until, longest)) > trio.current_time():  # noqa: ASYNC110 - a moving deadline, not a condition to signal
                await trio.sleep_until(until)  # the deferral may have been extended
            # a fresh event before each pass: appends after it wake the next pass,
            # appends before it are in the CommitLog this pass reads
            self._wakeup = trio.Event()
            if retry:
                self.failure = None  # (no await until the pass below: no send slips in)
            done = self.dispatch_available(limit=4096)
            if self.failure is None and self._failed_at is not None:
                self._resumed()
            if done == 4096:
                await trio.lowlevel.checkpoint()  # a backlog: let others run between batches
                continue
            if self.failure is not None and self.failure_is_transient:
                continue  # back to the backoff
            await self._wakeup.wait()

    def _resumed(self) -> None:
        assert self._failed_at is not None
        log.warning(
            "dispatching resumed after %.1fs and %d retries; sends are taken again",
            time.monotonic() - self._failed_at,
            self.retries - self._retries_before,
        )
        self._failed_at = self._last_failure = None
        self._retry_delay = RETRY_MIN_S

    async def wait_dispatched(self, offset: int) -> None:
        """Wait until every record before CommitLog ``offset`` is dispatched."""
        while self.offset < offset:
            await self._progress.wait()

    async def wait_settled(self, offset: int) -> bool:
        """Wait until every record before ``offset`` is dispatched (True), or dispatching
        fails first (False; ``failure`` says why: it may be retrying)."""
        while self.offset < offset:
            if self.failure is not None:
                return False
            await self._progress.wait()
        return True

    def dispatch_available(self, limit: int | None = None, *, final: bool = False) -> int:
        """Dispatch the records that are complete in the CommitLog; returns how many
        (damaged ones passed over included). ``final``: the log ends where it ends now
        for good (recovery: a damaged last record is judged by that end, not waited on)."""
        budget = -1 if limit is None else limit
        done = 0
        segments = self.commitlog.segments
        size_magic = SIZE_MAGIC.unpack_from  # (bound once: it runs per record)
        appended = self._appended
        if self.offset < segments.min_offset:
            self.offset = segments.min_offset  # a slave whose log starts mid-way
        while budget and self.failure is None:
            segment = segments.find(self.offset)
            if segment is None:
                break
            buffer, start, wrote = segment.buffer, segment.start, segment.wrote
            pos = self.offset - start
            magic = 0
            # the records of this segment, one after another
            while budget and wrote - pos >= 8:
                kept = appended.pop(start + pos, None)
                if kept is not None:  # (appended by this process: known good and whole)
                    run = self._run(kept, budget)
                    try:
                        self._dispatch(run)
                    except Exception as exc:
                        self._fail(start + pos, exc)
                        break
                    pos = run[-1].physical_offset + run[-1].size - start
                    done += len(run)
                    budget -= len(run)
                    continue
                size, magic = size_magic(buffer, pos)
                if magic == BLANK_MAGIC:
                    break
                if size > wrote - pos and self._incomplete(segment, pos, size, final):
                    break
                request = self._request(buffer, pos, start + pos)
                if isinstance(request, str):  # damaged
                    size = self._pass_over(segment, pos, request, final)
                    if not size:
                        break  # (0: wait for the bytes after it; None: failed)
                else:
                    try:
                        self._dispatch([request])
                    except Exception as exc:
                        self._fail(start + pos, exc)
                        break
                pos += size
                done += 1
                budget -= 1
            self.offset = start + pos
            if not (wrote - pos >= 8 and magic == BLANK_MAGIC and wrote == segment.size):
                break
            self.offset = segment.end  # a full segment ends with its blank tail: go on
        if done:
            progress, self._progress = self._progress, trio.Event()
            progress.set()
        return done

    @staticmethod
    def _incomplete(segment: Segment, pos: int, size: int, final: bool) -> bool:
        """Whether the record at ``pos``, whose TOTALSIZE ``size`` runs past what was
        written, is still to come (replicated bytes stop anywhere) — or, ``final``, the
        log's incomplete last record — rather than damaged: a size that could never fit
        in the segment, or the record's own lengths saying it is all there already."""
        if final:
            return True
        if not MIN_RECORD_BYTES <= size <= segment.size - pos:
            return False
        return not complete_by_its_lengths(segment.view(0, segment.wrote), pos)

    def _request(self, buffer: mmap.mmap, pos: int, offset: int) -> DispatchRequest | str:
        """The dispatch request for the record at ``pos`` of a segment (log ``offset``),
        or what is wrong with the record if no queue can take it."""
        try:
            size, queue_id, queue_offset, sys_flag, store_timestamp, topic, text = read_summary(
                buffer, pos
            )
        except (MessageFormatError, struct.error, IndexError) as exc:
            return str(exc)
        if (topic, queue_id) not in self.queues.queues:  # (a new queue: checked once)
            problem = topic_error(topic)
            if problem is not None or queue_id < 0:
                return f"it names no queue: {problem or f'queue id {queue_id}'}"
        properties = decode_properties(text)
        return DispatchRequest(
            topic,
            queue_id,
            offset,
            size,
            self._code(topic, store_timestamp, properties),
            store_timestamp,
            queue_offset,
            sys_flag,
            properties,
        )

    def _code(self, topic: str, store_timestamp: int, properties: Mapping[str, str]) -> int:
        """A consume-queue entry's tag code: a delayed or timer message's due time (a
        timer record whose TIMER_OUT_MS does not read: its store time), else the hash of
        its tags."""
        if topic == SCHEDULE_TOPIC:
            return store_timestamp + self._delay_ms(properties)
        if topic == TIMER_TOPIC:
            due = properties.get(PROPERTY_TIMER_OUT_MS, "")
            return int(due) if due.isdigit() and len(due) <= 18 else store_timestamp
        return tags_code(properties.get(PROPERTY_TAGS))

    def _pass_over(self, segment: Segment, pos: int, problem: str, final: bool) -> int | None:
        """Pass over the damaged record at ``pos`` of ``segment``: its size once it is
        placed (``_place``), counted and reported; 0 if the bytes after it must be waited
        for; None if it cannot be passed over (``failure`` says why)."""
        offset = segment.start + pos
        log_end = self.commitlog.max_offset if final else None
        try:
            size = isolated_damage(segment, pos, log_end=log_end, final=final)
            if size is None:
                raise MessageFormatError(
                    f"the record is damaged ({problem}) and so is what follows it"
                )
            if size:
                self._place(segment, pos, size)
        except Exception as exc:
            self._fail(offset, exc)
            return None
        if not size:
            log.debug("dispatching waits for the record after the damaged one at %d", offset)
            return 0
        if self.on_damaged is None:
            self.damaged.note(offset, f"{problem} (bytes [{offset}, {offset + size}))")
        else:
            self.damaged.count += 1
            self.on_damaged(offset, size, problem)
        return size

    def _place(self, segment: Segment, pos: int, size: int) -> None:
        """Give a damaged record its consume-queue entry (not ``checked``: pulls read it
        whole and skip it) if its header still says where: its queue's next offset.
        Else hold it in ``unplaced``. OSError (a full disk) leaves nothing placed."""
        offset = segment.start + pos
        topic, queue_id, queue_offset, sys_flag = identity(segment.view(0, pos + size), pos)
        transaction = sys_flag & SYSFLAG_TRANSACTION_MASK
        if transaction in _UNQUEUED or (topic is not None and self.deletions.dead(topic, offset)):
            return  # such records have no entry
        queue = self.queues.get(topic, queue_id) if topic is not None else None
        if queue is None and topic is not None and queue_offset == 0 and queue_id >= 0:
            queue = self.queues.get_or_create(topic, queue_id)  # its queue's first message
        if queue is not None and queue.max_offset == queue_offset:
            queue.put(queue_offset, offset, size, 0)
            return
        if all(u.offset != offset for u in self.unplaced):
            self.unplaced.append(Unplaced(offset, size, queue_id))

    def _fill_gap(self, queue: ConsumeQueue, queue_offset: int) -> None:
        """Entry ``queue_offset`` of ``queue`` comes past its end: the entries missing
        are damaged records passed over (``unplaced``, of its queue id first), if there
        are as many; else nothing is done (and the put refuses the gap)."""
        missing = queue_offset - queue.max_offset
        same = [u for u in self.unplaced if u.queue_id == queue.queue_id]
        chosen = (same if len(same) >= missing else self.unplaced)[:missing]
        if len(chosen) < missing:
            return
        for unplaced in chosen:
            queue.put(queue.max_offset, unplaced.offset, unplaced.size, 0)
            self.unplaced.remove(unplaced)
        log.warning(
            "consume queue %s/%d: entries [%d, %d) point at damaged records",
            queue.topic,
            queue.queue_id,
            queue_offset - missing,
            queue_offset,
        )

    def appended(
        self,
        topic: str,
        queue_id: int,
        sys_flag: int,
        properties: Mapping[str, str],
        where: AppendResult,
    ) -> None:
        """A put appended a record (``properties`` as encoded) where ``where`` says: its
        dispatch request is made here and taken by the dispatch (at most APPENDED_KEPT
        wait; beyond, the dispatch reads the record)."""
        if len(self._appended) < APPENDED_KEPT:
            store_timestamp = where.store_timestamp
            self._appended[where.physical_offset] = DispatchRequest(
                topic,
                queue_id,
                where.physical_offset,
                where.size,
                self._code(topic, store_timestamp, properties),
                store_timestamp,
                where.queue_offset,
                sys_flag,
                properties,
            )

    def truncated(self, offset: int) -> None:
        """The CommitLog was cut at ``offset``: dispatching goes on from there at most,
        and a failure at a record that is gone is forgotten."""
        self._appended.clear()
        if offset <= self.offset:
            self.offset = offset
            if self.failure is not None:
                log.warning("dispatching resumes at %d, cut there: %s", offset, self.failure)
                self.failure = self._last_failure = None
                self._failed_at = None
                self._retry_delay = RETRY_MIN_S
        self.unplaced = [u for u in self.unplaced if u.offset < offset]

    def _fail(self, offset: int, exc: Exception) -> None:
        """Stop dispatching at ``offset``; an OSError (a full disk) is tried again later."""
        transient = isinstance(exc, OSError)
        if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
            failure = f"disk full: {exc}; retrying (commitlog offset {offset} waits)"
        else:
            failure = f"dispatching the record at commitlog offset {offset} failed: {exc}"
            if transient:
                failure += "; retrying"
        repeated = failure == self._last_failure
        self.failure = self._last_failure = failure
        self.failure_is_transient = transient
        progress, self._progress = self._progress, trio.Event()
        progress.set()  # (``wait_settled`` returns)
        if not transient:
            log.error("dispatching stopped: %s", failure)
            return
        if self._failed_at is None:
            self._failed_at, self._retries_before = time.monotonic(), self.retries
        if repeated:  # (one line per distinct failure, not one per retry)
            log.debug("dispatching still fails: %s", failure)
        else:
            log.error("dispatching paused, sends refused until it succeeds: %s", failure)

    def _delay_ms(self, properties: Mapping[str, str]) -> int:
        try:
            level = int(properties.get(PROPERTY_DELAY, "1"))
        except ValueError:
            level = 1
        level = min(max(level, 1), len(self.delay_levels_ms))
        return self.delay_levels_ms[level - 1]

    def _run(self, first: DispatchRequest, budget: int) -> list[DispatchRequest]:
        """``first`` and the kept requests after it that can be dispatched with it as one
        run (``_dispatch``): of its queue, at the next offsets, each with a queue entry
        (a batch's records), at most ``budget`` (no limit if negative) and MAX_RUN."""
        run = [first]
        if first.sys_flag & SYSFLAG_TRANSACTION_MASK in _UNQUEUED:
            return run
        appended = self._appended
        last = first
        most = MAX_RUN if budget < 0 else min(budget, MAX_RUN)
        while len(run) < most:
            after = appended.get(last.physical_offset + last.size)
            if (
                after is None
                or after.queue_offset != last.queue_offset + 1
                or after.queue_id != last.queue_id
                or after.topic != last.topic
                or after.sys_flag & SYSFLAG_TRANSACTION_MASK in _UNQUEUED
            ):
                break
            del appended[after.physical_offset]
            run.append(after)
            last = after
        return run

    def _dispatch(self, run: list[DispatchRequest]) -> None:
        """Dispatch one record, or a run of them (``_run``): their consume-queue entries
        written together, then each indexed and told to the listeners. A record of a
        deleted topic from before its deletion gets neither entry nor index keys; a
        topic's deletion record is applied (``_apply_deletion``)."""
        first = run[0]
        transaction = first.sys_flag & SYSFLAG_TRANSACTION_MASK
        queued = transaction not in _UNQUEUED
        indexed = transaction != SYSFLAG_TRANSACTION_ROLLBACK
        deleted = self.deletions.offsets
        if deleted and first.physical_offset < deleted.get(first.topic, -1):
            queued = indexed = False  # (a run is of one topic, and lies on one side)
        queue = self.queues.queues.get((first.topic, first.queue_id)) if queued else None
        if queued and queue is None:
            if first.topic == TOPIC_DELETION_TOPIC:  # (that topic never has a queue)
                self._apply_deletion(first)
                queued = indexed = False
            else:
                queue = self.queues.get_or_create(first.topic, first.queue_id)
        if queue is not None:
            queue_offset = first.queue_offset
            if self.unplaced and queue_offset > queue.max_offset and not queue.segments.empty:
                self._fill_gap(queue, queue_offset)
            queue.put_run(queue_offset, [(r.physical_offset, r.size, r.tags_code) for r in run])
            # read whole by read_summary: what a pull checks, but for the CRC, which is
            # known good if this process appended the record (CommitLog.appended_here)
            # (a lost record's placeholder is never: pulls read it and pass over it)
            local = self.commitlog.local_from
            if (
                not self.check_crc or (local is not None and first.physical_offset >= local)
            ) and PROPERTY_LOST not in first.properties:
                queue.checked.add(queue_offset, queue_offset + len(run))
        for request in run:
            if indexed:
                self._index(request)
            self.offset = request.physical_offset + request.size  # listeners see it moved
            self.last_store_timestamp = request.store_timestamp
            for listener in self.listeners:
                try:
                    listener(request)
                except Exception:
                    log.exception("dispatch listener failed for %s", request)

    def _apply_deletion(self, request: DispatchRequest) -> None:
        """The record of a topic's deletion (hamq/store/deletions.py): recorded in the
        table (saved), then the topic's consume queues destroyed. Applied once: the
        table tells a record dispatched again. OSError (the table cannot be saved) fails
        the dispatch there, to be tried again."""
        record = self.commitlog.read(request.physical_offset, request.size)
        try:
            topic = str(decode_message(record, check_crc=False).body, "utf-8")
        except (MessageFormatError, UnicodeDecodeError) as exc:
            log.error(
                "a topic deletion record at %d does not read: %s", request.physical_offset, exc
            )
            return
        if topic_error(topic) is not None:
            log.error("a topic deletion record at %d names no topic", request.physical_offset)
            return
        if not self.deletions.apply(topic, request.physical_offset, self.commitlog.min_offset):
            return
        for key in [key for key in self.queues.queues if key[0] == topic]:
            self.queues.queues.pop(key).destroy()
        self.queues.remove_topic_directory(topic)
        for listener in self.deletion_listeners:
            try:
                listener(topic)
            except Exception:
                log.exception("topic deletion listener failed for %s", topic)

    def _index(self, request: DispatchRequest) -> None:
        """Index a record's keys (KEYS and UNIQ_KEY), and a timer delivery's mark."""
        properties = request.properties
        keys_text = properties.get(PROPERTY_KEYS)
        keys = [k for k in keys_text.split(" ") if k] if keys_text else []
        uniq_key = properties.get(PROPERTY_UNIQ_KEY)
        if uniq_key:
            keys.append(uniq_key)
        source = properties.get(PROPERTY_TIMER_SOURCE)
        marks: tuple[str, ...] = () if source is None else (index_key(TIMER_TOPIC, source),)
        text = properties.get(PROPERTY_MARKS)
        if text:
            marks += tuple(index_key(PROPERTY_MARKS, mark) for mark in text.split(" ") if mark)
        self.index.add(request.topic, keys, request.physical_offset, request.store_timestamp, marks)
