"""MessageStore: the one object the broker's processors use.

Lifecycle: ``await nursery.start(store.run)`` locks the directory (StoreLockedError,
naming the holder's PID, if another process has it), recovers (in a worker
thread), drops the abort marker, starts the dispatch, flush, schedule (master only) and
retention tasks, then reports started. Cancelling ``run`` stops it cleanly: the rest
is dispatched and flushed, the checkpoint written, the abort marker removed. A
process killed instead leaves the marker, and the next start recovers as after a
crash; so does one stopped while dispatching is stuck (a record it cannot pass over).

A full disk does not stop the store: while dispatching is paused by it (at start or
later), what is dispatched is served, sends are refused with a remark saying so, and
once the dispatcher's retries get through, sends continue each queue where its last
message is (``_dispatch_unavailable``).

Puts never await while appending (one writer, no lock). A put is then answered once
the message is as safe as configured — on disk (SYNC_FLUSH, group commit) and on the
replicas the broker injected (``use_replicas``) — or with the status saying which did
not happen in time; the message is stored either way (durability.py decides it all).
Reads return zero-copy views of the CommitLog, meant to be used (joined into a
response) before the next await.
"""

from __future__ import annotations

import bisect
import enum
import itertools
import logging
import operator
import time
from collections.abc import Awaitable, Callable, Collection, Mapping

import attrs
import trio

from hamq.protocol.message import (
    PROPERTY_DELAY,
    PROPERTY_KEYS,
    PROPERTY_REAL_QUEUE_ID,
    PROPERTY_REAL_TOPIC,
    PROPERTY_UNIQ_KEY,
    PROPERTY_WAIT,
    SCHEDULE_TOPIC,
    SYSFLAG_BORNHOST_V6,
    SYSFLAG_TRANSACTION_COMMIT,
    SYSFLAG_TRANSACTION_MASK,
    SYSFLAG_TRANSACTION_NOT_TYPE,
    TOPIC_DELETION_TOPIC,
    MessageFormatError,
    PropertiesTooLong,
    encode_properties,
    pack_host,
    topic_error,
)
from hamq.protocol.record import (
    RecordTemplate,
    StoredMessage,
    decode_message,
    make_record_template,
    make_record_templates,
    read_record,
)
from hamq.store.checkpoint import Checkpoint, load_checkpoint, save_with_backup
from hamq.store.commitlog import AppendResult, CommitLog
from hamq.store.config import StoreConfig
from hamq.store.consume_queue import ConsumeQueue
from hamq.store.deletions import TopicDeletions
from hamq.store.durability import Durability, PutMessageStatus, ReplicaWaiter
from hamq.store.extents import QueueExtents, forget_extents, load_extents, save_extents
from hamq.store.files import DirectoryInUseError, DirectoryLock, fsync_directory
from hamq.store.flush import FlushService
from hamq.store.index import IndexService
from hamq.store.records import is_lost_record
from hamq.store.recovery import RecoveryReport, recover
from hamq.store.reput import ConsumeQueueTable, ReputService
from hamq.store.retention import RetentionService
from hamq.store.schedule import ScheduleService, encode_delay_offsets
from hamq.store.segment import StoreCorruptionError, StoreError

log = logging.getLogger(__name__)

#: entries a get_message scans at most while a tag filter skips them (RocketMQ: 16000)
MAX_FILTERED_SCAN = 16_000
#: put_message yields to other tasks once per this many calls
YIELD_EVERY = 32


class StoreLockedError(StoreError):
    """Another process holds the store directory (its lock file): the text names the
    directory as configured and the holder's PID; ``pid`` is None if it is unknown."""

    def __init__(self, message: str, pid: int | None) -> None:
        super().__init__(message)
        self.pid = pid


def wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


class GetMessageStatus(enum.Enum):
    FOUND = "FOUND"
    NO_MATCHED_MESSAGE = "NO_MATCHED_MESSAGE"
    MESSAGE_WAS_REMOVING = "MESSAGE_WAS_REMOVING"
    OFFSET_FOUND_NULL = "OFFSET_FOUND_NULL"
    OFFSET_OVERFLOW_BADLY = "OFFSET_OVERFLOW_BADLY"
    OFFSET_OVERFLOW_ONE = "OFFSET_OVERFLOW_ONE"
    OFFSET_TOO_SMALL = "OFFSET_TOO_SMALL"
    NO_MATCHED_LOGIC_QUEUE = "NO_MATCHED_LOGIC_QUEUE"
    NO_MESSAGE_IN_QUEUE = "NO_MESSAGE_IN_QUEUE"


@attrs.define(slots=True)
class MessageToStore:
    """A message as a producer's request gives it; the store adds place and time.
    (Not frozen: one is made per send on the hot path; the store does not change it.)"""

    topic: str
    queue_id: int
    body: bytes
    flag: int = 0
    properties: Mapping[str, str] = attrs.field(factory=dict)
    sys_flag: int = 0
    born_timestamp: int = 0
    born_host: tuple[str, int] = ("127.0.0.1", 0)
    store_host: tuple[str, int] = ("127.0.0.1", 10911)
    reconsume_times: int = 0
    prepared_transaction_offset: int = 0
    #: ``properties`` as text, when the caller has it (a batch entry's own text, the
    #: pairs added since appended: it decodes to ``properties``); a batch's records then
    #: take it as it is, not encoded again. Whoever changes ``properties`` sets it None.
    properties_text: str | None = None

    @property
    def wait_store_ok(self) -> bool:
        """WAIT=false asks not to wait for flush or replicas (RocketMQ's default: wait)."""
        return self.properties.get(PROPERTY_WAIT, "true") != "false"


@attrs.define(slots=True)
class PutMessageResult:
    status: PutMessageStatus
    append: AppendResult | None = None
    remark: str = ""

    @property
    def stored(self) -> bool:
        """True when the message is in the CommitLog (even if a flush or replica timed out)."""
        return self.append is not None


@attrs.frozen
class GetMessageResult:
    status: GetMessageStatus
    next_begin_offset: int
    min_offset: int
    max_offset: int
    #: the records found, in queue order: zero-copy views of the CommitLog, each of one
    #: record or of several back to back (``messages``: one view a record)
    runs: tuple[memoryview, ...] = ()
    message_count: int = 0
    #: how far the last record found is behind the CommitLog's end, in bytes (a master
    #: sends consumers this far behind to a slave, slaveReadEnable)
    lag_bytes: int = 0
    #: damaged records passed over (not in ``runs``; ``next_begin_offset`` is past them)
    skipped: int = 0

    @property
    def body(self) -> bytes:
        """The records back to back: a PULL response body."""
        return b"".join(self.runs)

    @property
    def messages(self) -> tuple[memoryview, ...]:
        """The records found, a view each, in queue order."""
        records = []
        for run in self.runs:
            at = 0
            while at < len(run):
                size = int.from_bytes(run[at : at + 4], "big")
                if not 0 < size <= len(run) - at:  # (never for records this store read)
                    raise StoreError(f"a TOTALSIZE of {size} at byte {at} of a run of records")
                records.append(run[at : at + size])
                at += size
        return tuple(records)


@attrs.frozen
class StoreStatistics:
    running: bool
    role: str
    commitlog_min_offset: int
    commitlog_max_offset: int
    flushed_offset: int
    dispatched_offset: int
    consume_queues: int
    messages_put: int
    put_failures: int
    messages_got: int
    flush_rounds: int
    delayed_delivered: int
    segments_deleted: int
    dispatch_failure: str | None
    #: damaged records dispatching passed over (each once), and pulls skipped (each time)
    damaged_records_dispatched: int = 0
    damaged_records_read: int = 0


class _Scan:
    """What one read of a consume queue found (``get_message``)."""

    __slots__ = (
        "count", "filtered", "last_physical", "next_offset", "removed", "runs", "skipped",
    )  # fmt: skip

    def __init__(self, offset: int) -> None:
        self.next_offset = offset
        #: the records found: views of one or more records back to back (``count`` in all)
        self.runs: list[memoryview] = []
        self.count = 0
        self.last_physical = 0
        self.removed = self.filtered = self.skipped = 0


class MessageStore:
    def __init__(
        self,
        config: StoreConfig,
        *,
        clock: Callable[[], int] = wall_clock_ms,
        retention_floor: Callable[[], int] | None = None,
        confirm_offset: Callable[[], int] = lambda: 0,
        on_recovered: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self.config = config
        self._clock = clock
        self._delay_levels_ms = config.delay_levels_ms
        self.commitlog = CommitLog(config.commitlog_dir, config.commitlog_segment_bytes, clock)
        self.queues = ConsumeQueueTable(
            config.consume_queue_dir, config.consume_queue_entries_per_file
        )
        self.index = IndexService(
            config.index_dir, config.index_hash_slots, config.index_max_entries
        )
        #: deleted topics: where each was deleted (hamq/store/deletions.py)
        self.deletions = TopicDeletions(config.config_dir / "topicDeletions.json")
        self._extents_path = config.config_dir / "queueExtents.json"
        self.reput = ReputService(
            self.commitlog,
            self.queues,
            self.index,
            self._delay_levels_ms,
            self.deletions,
            check_crc=config.check_crc_on_read,
        )
        self._retention_floor = retention_floor or (lambda: self.commitlog.max_offset)
        #: called once after every put that stored something (the HA master sends it on)
        self.append_listeners: list[Callable[[], None]] = []
        self._confirm_offset = confirm_offset
        #: awaited once the log is recovered, before anything may append to it (a master
        #: records its new epoch there, before delayed messages come due)
        self._on_recovered = on_recovered
        self._lock = DirectoryLock(config.store_dir)
        self._abort_path = config.store_dir / "abort"
        self.recovery: RecoveryReport | None = None
        self.flush: FlushService | None = None
        self.schedule: ScheduleService | None = None
        self.retention: RetentionService | None = None
        #: what a put waits for before it is answered (durability.py: the one place)
        self.durability = Durability(config)
        self._running = False
        self._master = config.role.is_master
        self._nursery: trio.Nursery | None = None
        self._schedule_scope = trio.CancelScope()
        self._valid_topics: set[str] = set()  # names already checked (a bounded cache)
        #: where the log ended when records were left undispatched (a full disk at
        #: start or at promotion): sends wait until they are, then take their queue
        #: offsets afresh
        self._undispatched_end: int | None = None
        self._until_yield = YIELD_EVERY
        self._puts = 0
        self._put_failures = 0
        self._gets = 0

    # ------------------------------------------------------------------ lifecycle
    @property
    def running(self) -> bool:
        return self._running

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        config = self.config
        config.store_dir.mkdir(parents=True, exist_ok=True)
        try:
            self._lock.acquire()
        except DirectoryInUseError as exc:
            raise StoreLockedError(str(exc), exc.pid) from None
        try:
            clean = not self._abort_path.exists()
            try:
                checkpoint = load_checkpoint(config.store_dir / "checkpoint")
            except StoreCorruptionError as exc:
                log.error("%s; recovering by scanning the whole commitlog", exc)
                checkpoint, clean = None, False
            self.recovery = await trio.to_thread.run_sync(
                lambda: recover(
                    store_dir=config.store_dir,
                    commitlog=self.commitlog,
                    queues=self.queues,
                    index=self.index,
                    reput=self.reput,
                    checkpoint=checkpoint,
                    clean=clean,
                    extents=load_extents(self._extents_path),
                )
            )
            if self.recovery.paused is not None:
                self._undispatched_end = self.recovery.commitlog_end
            await trio.to_thread.run_sync(self._mark_running)
            if self._on_recovered is not None:
                await self._on_recovered()
            self.flush = FlushService(
                config,
                self.commitlog,
                self.queues,
                self.index,
                self.reput,
                checkpoint=checkpoint or Checkpoint(),
                confirm_offset=self._confirm_offset,
            )
            self.durability.flush = self.flush
            self.retention = RetentionService(
                commitlog=self.commitlog,
                queues=self.queues,
                index=self.index,
                reput=self.reput,
                clock=self._clock,
                floor=self._retention_floor,
                reserved_ms=int(config.file_reserved_time_h * 3_600_000),
                interval_s=config.clean_interval_s,
                exclusive=self.flush.exclusive,
            )
            async with trio.open_nursery() as nursery:
                await nursery.start(self.reput.run)
                await nursery.start(self.flush.run)
                await nursery.start(self.retention.run)
                self._running = True
                self._nursery = nursery
                if self._master:
                    await nursery.start(self._run_schedule)
                # (a broker's store starts taking no sends whatever its role: the broker
                # makes it master once it is serving, and says so itself)
                log.info(
                    "message store running in %s, %s",
                    config.store_dir,
                    f"taking sends as {config.role.value}" if self._master else "taking no sends",
                )
                task_status.started()
                await trio.sleep_forever()
        finally:
            self._running = False
            with trio.CancelScope(shield=True):
                await self._stop(flush=self.flush is not None)

    def _mark_running(self) -> None:
        self._abort_path.write_bytes(b"")
        fsync_directory(self.config.store_dir)

    async def _stop(self, flush: bool) -> None:
        stuck = self.reput.failure is not None and not self.reput.failure_is_transient
        try:
            if flush and self.flush is not None and stuck:
                # the log at least is on disk; the next start recovers as after a crash,
                # where what stopped dispatching (damage) is dealt with
                await self.flush.flush_commitlog()
                log.warning(
                    "message store stopped with dispatching stopped; the next start recovers: %s",
                    self.reput.failure,
                )
            elif flush and self.flush is not None:
                # (dispatching paused by a disk error: the checkpoint says how far it got,
                # and the next start goes on from there)
                self.reput.dispatch_available()
                await self.flush.flush_queues_and_checkpoint()
                if self.schedule is not None:
                    await self.schedule.persist()  # now that the delivered copies are flushed
                extents = QueueExtents.of(self.queues.queues.values(), self.reput.offset)
                await trio.to_thread.run_sync(save_extents, self._extents_path, extents)
                self._abort_path.unlink(missing_ok=True)
                await trio.to_thread.run_sync(fsync_directory, self.config.store_dir)
                log.info(
                    "message store stopped cleanly at commitlog offset %d",
                    self.commitlog.max_offset,
                )
        except Exception:
            log.exception("message store could not stop cleanly; the next start recovers")
        finally:
            self.commitlog.close()
            self.queues.close()
            self.index.close()
            self._lock.release()

    async def set_master(self, master: bool) -> None:
        """Take sends and deliver delayed messages (a master), or stop both (a slave).
        A controller-mode broker switches roles with this."""
        if master == self._master:
            return
        nursery = self._nursery
        if master:
            assert nursery is not None, "the store is not running"
            # a replica's queues grew by dispatch: new sends continue where they end
            # (if dispatching is paused by a full disk, sends wait until it is done)
            end = self.commitlog.max_offset
            if await self.reput.wait_settled(end):
                self._recover_queue_offsets()
                self._undispatched_end = None
            else:
                self._undispatched_end = end
        self._master = master
        if master:
            assert nursery is not None
            await nursery.start(self._run_schedule)
        else:
            self._schedule_scope.cancel()

    async def delete_topic(self, topic: str) -> int:
        """Delete every message of ``topic`` stored so far (hamq/store/deletions.py):
        append its deletion record, its queues' next offsets back to 0 in the same step,
        and return, with the record's offset, once the record is dispatched (the topic's
        queues destroyed) and as safe as a put would be (flushed with SYNC_FLUSH,
        replicated as configured). New sends to the topic start it afresh.

        Raises:
            StoreError: the store cannot take it (not running, a slave, dispatching
                stopped, a full disk: nothing was deleted), or ``topic`` is not one a
                producer can send to. A flush or replica that does not answer in time
                raises nothing: the deletion is in the log, and goes on."""
        if topic_error(topic) is not None or topic == TOPIC_DELETION_TOPIC:
            raise StoreError(f"cannot delete topic {topic!r}: {topic_error(topic) or 'reserved'}")
        unavailable = self._unavailable()
        if unavailable is not None:
            raise StoreError(f"cannot delete topic {topic} now: {unavailable.remark}")
        template = make_record_template(
            topic=TOPIC_DELETION_TOPIC, queue_id=0, body=topic.encode(), properties=""
        )
        try:
            appended = self.commitlog.append(TOPIC_DELETION_TOPIC, template)
        except (StoreError, OSError) as exc:
            raise StoreError(f"cannot delete topic {topic} now: {exc}") from exc
        for key in [key for key in self.commitlog.queue_offsets if key[0] == topic]:
            del self.commitlog.queue_offsets[key]
        self._appended()
        if not await self.reput.wait_settled(appended.end_offset):
            raise StoreError(
                f"topic {topic}: its deletion is in the log, and is applied once dispatching "
                f"gets there: {self.reput.failure}"
            )
        if self.durability.waits(True):
            answered = trio.Event()
            if self.durability.wait(appended.end_offset, True, lambda *_: answered.set()):
                await answered.wait()
        return appended.physical_offset

    def on_topic_deleted(self, listener: Callable[[str], None]) -> None:
        """Call ``listener(topic)`` whenever a topic's deletion is applied, here or (on a
        slave) as its master's deletion record arrives: what the broker keeps of the
        topic (consumer offsets, statistics) goes with it."""
        self.reput.deletion_listeners.append(listener)

    def _recover_queue_offsets(self) -> None:
        """The next offset of every consume queue, from the queues (RocketMQ's
        recoverTopicQueueTable)."""
        self.commitlog.queue_offsets = {k: q.max_offset for k, q in self.queues.queues.items()}

    async def _run_schedule(self, *, task_status: trio.TaskStatus[None]) -> None:
        """The delayed-message scheduler, while this store is a master's."""
        schedule = self.schedule = self._schedule_service()
        self.reput.listeners.append(schedule.on_dispatch)
        try:
            with trio.CancelScope() as self._schedule_scope:
                await schedule.run(task_status=task_status)  # (persists its offsets at the end)
        finally:
            self.reput.listeners.remove(schedule.on_dispatch)
            if not self._master:  # demoted (at shutdown _stop persists it after the flush)
                self.schedule = None

    def _schedule_service(self) -> ScheduleService:
        return ScheduleService(
            queues=self.queues,
            delay_levels_ms=self._delay_levels_ms,
            offsets_path=self.config.config_dir / "delayOffset.json",
            clock=self._clock,
            read_message=self.look_message_by_offset,
            deliver=self._deliver_delayed,
            persist_interval_s=self.config.delay_offset_persist_interval_s,
            flushed_offset=lambda: self.flush.flushed_offset if self.flush else 0,
        )

    # ------------------------------------------------------------------ writing
    def put_message_nowait(self, message: MessageToStore) -> PutMessageResult:
        """Append without waiting for a flush (what ``put_message`` does first)."""
        prepared = self._prepare(message)
        if isinstance(prepared, PutMessageResult):
            result = prepared
        else:
            result = self._append(*prepared)
            if result.stored:
                self._appended()
        self._count(result)
        return result

    def put_batch_nowait(self, messages: list[MessageToStore]) -> list[PutMessageResult]:
        """Append messages one after another, all or none: every message is checked
        before the first is appended. On a refusal the one result says which entry and
        why, and nothing was stored (only a failing disk can stop a batch half-way; its
        last result then says so).

        A batch as a send makes it (one topic and queue; the same sys flag, born time,
        hosts and reconsume times; no delay level) is checked and encoded as one
        (``_prepare_batch``); any other, or one with a fault, goes message by message."""
        prepared = self._prepare_batch(messages)
        if prepared is None:
            prepared = []
            for i, message in enumerate(messages):
                outcome = self._prepare(message)
                if isinstance(outcome, PutMessageResult):
                    outcome.remark = f"batch entry {i}: {outcome.remark}"
                    self._count(outcome)
                    return [outcome]
                prepared.append(outcome)
        done: list[AppendResult] = []
        failure = None
        try:
            self.commitlog.append_many([(topic, template) for topic, template, _ in prepared], done)
        except (StoreError, OSError) as exc:
            log.error("append to the commitlog failed: %s", exc)
            failure = self._refuse(PutMessageStatus.CREATE_MAPPED_FILE_FAILED, str(exc))
        appended = self.reput.appended
        results = []
        # (``done`` is shorter than ``prepared`` when a write failed)
        for (topic, template, properties), where in zip(prepared, done, strict=False):
            appended(topic, template.queue_id, template.sys_flag, properties, where)
            results.append(PutMessageResult(PutMessageStatus.PUT_OK, where))
        self._puts += len(results)
        if failure is not None:
            self._count(failure)
            results.append(failure)
        if done:
            self._appended()
        return results

    def _dispatch_unavailable(self) -> str | None:
        """Why sends are refused for dispatching's sake, None if they are not: it failed
        (a full disk: ``reput.failure``), or records were left undispatched (at start or
        promotion) and the queues do not know their next offsets yet (they are taken
        afresh once they do)."""
        if self.reput.failure is not None:
            return self.reput.failure
        end = self._undispatched_end
        if end is not None and self.reput.offset < end:
            return (
                f"dispatching the records left after a disk error: "
                f"{end - self.reput.offset} bytes to go; retry shortly"
            )
        if end is not None:
            self._recover_queue_offsets()
            self._undispatched_end = None
        return None

    def _count(self, result: PutMessageResult) -> None:
        if result.stored:
            self._puts += 1
        else:
            self._put_failures += 1

    def use_replicas(self, replicas: ReplicaWaiter | None) -> None:
        """Who else a put waits for (the broker's replication: hamq/ha/group_transfer.py)."""
        self.durability.replicas = replicas

    async def put_message(self, message: MessageToStore) -> PutMessageResult:
        """Append, and return once the message is as safe as configured: on disk
        (SYNC_FLUSH) and on the replicas the broker injected, or the status saying which
        did not happen in time (durability.py, the decision a broker's sends take too,
        with a callback where this awaits). The message is stored either way.

        Always a cancellation point; it yields to other tasks every ``YIELD_EVERY`` calls
        (a full Trio checkpoint per put would cost more than the append itself), so a
        burst of puts does not starve the dispatch or network tasks.
        """
        await trio.lowlevel.checkpoint_if_cancelled()
        self._until_yield -= 1
        if self._until_yield <= 0:
            self._until_yield = YIELD_EVERY
            await trio.lowlevel.checkpoint()
        result = self.put_message_nowait(message)
        if result.append is None or not self.durability.waits(message.wait_store_ok):
            return result
        answered = trio.Event()

        def answer(status: PutMessageStatus, remark: str) -> None:
            result.status, result.remark = status, remark
            answered.set()

        if self.durability.wait(result.append.end_offset, message.wait_store_ok, answer):
            await answered.wait()
        return result

    def _refuse(self, status: PutMessageStatus, remark: str) -> PutMessageResult:
        return PutMessageResult(status, None, remark)

    def _prepare_batch(
        self, messages: list[MessageToStore]
    ) -> list[tuple[str, RecordTemplate, Mapping[str, str]]] | None:
        """``_prepare`` for each message of a batch that shares all but body, flag and
        properties and has no delay level, with what they share checked and encoded
        once (make_record_templates): 0.9 against 1.7 us a message. None for any other
        batch, or one that would be refused (``_prepare`` then names the entry)."""
        first = messages[0]
        topic, queue_id, sys_flag = first.topic, first.queue_id, first.sys_flag
        born_timestamp, born_host, store_host = (
            first.born_timestamp,
            first.born_host,
            first.store_host,
        )
        reconsume_times, transaction_offset = (
            first.reconsume_times,
            first.prepared_transaction_offset,
        )
        most = self.config.max_message_bytes
        for message in messages:
            if not (
                message.topic == topic
                and message.queue_id == queue_id
                and message.sys_flag == sys_flag
                and message.born_timestamp == born_timestamp
                and message.born_host == born_host
                and message.store_host == store_host
                and message.reconsume_times == reconsume_times
                and message.prepared_transaction_offset == transaction_offset
                and len(message.body) <= most
                and not message.properties.get(PROPERTY_DELAY)
            ):
                return None
        if self._refusal(first) is not None:
            return None
        try:
            templates = make_record_templates(
                topic=topic,
                queue_id=queue_id,
                entries=[
                    (
                        m.body,
                        m.flag,
                        encode_properties(m.properties)
                        if m.properties_text is None
                        else m.properties_text,
                    )
                    for m in messages
                ],
                sys_flag=sys_flag,
                born_timestamp=born_timestamp,
                born_host=pack_host(*born_host),
                store_host=pack_host(*store_host),
                reconsume_times=reconsume_times,
                prepared_transaction_offset=transaction_offset,
            )
        except MessageFormatError:
            return None
        return [
            (topic, template, message.properties)
            for template, message in zip(templates, messages, strict=True)
        ]

    def _unavailable(self) -> PutMessageResult | None:
        """Why the store takes no puts now (not running, a slave, dispatching stopped or
        behind after a disk error), None if it takes them."""
        if not self._running:
            return self._refuse(PutMessageStatus.SERVICE_NOT_AVAILABLE, "the store is not running")
        if not self._master:
            return self._refuse(
                PutMessageStatus.SERVICE_NOT_AVAILABLE,
                "this broker is a slave; send to its master",
            )
        if self.reput.failure is not None or self._undispatched_end is not None:
            unavailable = self._dispatch_unavailable()
            if unavailable is not None:
                return self._refuse(PutMessageStatus.SERVICE_NOT_AVAILABLE, unavailable)
        return None

    def _refusal(self, message: MessageToStore) -> PutMessageResult | None:
        """Why ``message`` cannot be stored whatever its properties say, None if it can:
        the store's state (``_unavailable``), its topic, queue id and body size."""
        unavailable = self._unavailable()
        if unavailable is not None:
            return unavailable
        if message.topic not in self._valid_topics:
            problem = topic_error(message.topic)
            if message.topic == TOPIC_DELETION_TOPIC:
                problem = f"topic {TOPIC_DELETION_TOPIC} is the store's own; no one sends to it"
            if problem is not None:
                return self._refuse(PutMessageStatus.MESSAGE_ILLEGAL, problem)
            if len(self._valid_topics) < 100_000:
                self._valid_topics.add(message.topic)
        if not 0 <= message.queue_id < 2**31:
            return self._refuse(
                PutMessageStatus.MESSAGE_ILLEGAL, f"queue id {message.queue_id} is not valid"
            )
        if len(message.body) > self.config.max_message_bytes:
            return self._refuse(
                PutMessageStatus.MESSAGE_ILLEGAL,
                f"body of {len(message.body)} bytes is over max_message_bytes "
                f"{self.config.max_message_bytes}",
            )
        return None

    def _prepare(
        self, message: MessageToStore
    ) -> tuple[str, RecordTemplate, Mapping[str, str]] | PutMessageResult:
        """Check a message and encode its record: (the topic it goes to, the record, the
        properties it holds), or the refusal."""
        refusal = self._refusal(message)
        if refusal is not None:
            return refusal
        topic, queue_id = message.topic, message.queue_id
        properties = message.properties
        transaction = message.sys_flag & SYSFLAG_TRANSACTION_MASK
        if (
            transaction == SYSFLAG_TRANSACTION_COMMIT
            and self.deletions.offsets
            and self.deletions.dead(topic, message.prepared_transaction_offset)
        ):
            return self._refuse(
                PutMessageStatus.MESSAGE_ILLEGAL,
                f"topic {topic} was deleted after this transaction's half message was stored",
            )
        delay = properties.get(PROPERTY_DELAY)
        if delay and transaction in (SYSFLAG_TRANSACTION_NOT_TYPE, SYSFLAG_TRANSACTION_COMMIT):
            if not delay.strip().lstrip("-").isdigit():
                return self._refuse(
                    PutMessageStatus.MESSAGE_ILLEGAL, f"DELAY property {delay!r} is not a level"
                )
            level = min(int(delay), len(self._delay_levels_ms))
            if level > 0:
                properties = {
                    **properties,
                    PROPERTY_DELAY: str(level),
                    PROPERTY_REAL_TOPIC: topic,
                    PROPERTY_REAL_QUEUE_ID: str(queue_id),
                }
                topic, queue_id = SCHEDULE_TOPIC, level - 1
        try:
            template = make_record_template(
                topic=topic,
                queue_id=queue_id,
                body=message.body,
                flag=message.flag,
                properties=encode_properties(properties),
                sys_flag=message.sys_flag,
                born_timestamp=message.born_timestamp,
                born_host=pack_host(*message.born_host),
                store_host=pack_host(*message.store_host),
                reconsume_times=message.reconsume_times,
                prepared_transaction_offset=message.prepared_transaction_offset,
            )
        except PropertiesTooLong as exc:
            return self._refuse(PutMessageStatus.PROPERTIES_SIZE_EXCEEDED, str(exc))
        except MessageFormatError as exc:
            return self._refuse(PutMessageStatus.MESSAGE_ILLEGAL, str(exc))
        return topic, template, properties

    def _append(
        self, topic: str, template: RecordTemplate, properties: Mapping[str, str]
    ) -> PutMessageResult:
        try:
            appended = self.commitlog.append(topic, template)
        except (StoreError, OSError) as exc:
            log.error("append to the commitlog failed: %s", exc)
            return self._refuse(PutMessageStatus.CREATE_MAPPED_FILE_FAILED, str(exc))
        self.reput.appended(topic, template.queue_id, template.sys_flag, properties, appended)
        return PutMessageResult(PutMessageStatus.PUT_OK, appended)

    def _appended(self) -> None:
        """After a put stored its message(s): the listeners first (a master's HA service
        sends them to its slaves), then the dispatch of their queue and index entries."""
        for listener in self.append_listeners:
            listener()
        self.reput.wake()

    async def _deliver_delayed(
        self, message: StoredMessage, topic: str, queue_id: int, properties: dict[str, str]
    ) -> int | None:
        """Store a due delayed message under its real topic: the copy's end offset, -1 if
        it can never be stored (or its topic was deleted after it was sent), None if the
        store refused it for now."""
        if self.deletions.dead(topic, message.physical_offset):
            log.info(
                "delayed message at %d dropped: topic %s was deleted after it was sent",
                message.physical_offset,
                topic,
            )
            return -1
        result = self.put_message_nowait(copy_to_store(message, topic, queue_id, properties))
        if result.append is not None:
            return result.append.end_offset
        permanent = result.status in (
            PutMessageStatus.MESSAGE_ILLEGAL,
            PutMessageStatus.PROPERTIES_SIZE_EXCEEDED,
        )
        log.warning(
            "delayed message for %s/%d %s: %s",
            topic,
            queue_id,
            "dropped, it can never be stored" if permanent else "not delivered yet",
            result.remark,
        )
        return -1 if permanent else None

    # ------------------------------------------------------------------ replication (HA)
    def get_data(self, offset: int, max_bytes: int) -> memoryview:
        """Raw CommitLog bytes from ``offset`` (within one segment) for a replica."""
        return self.commitlog.get_data(offset, max_bytes)

    def append_raw(self, offset: int, *chunks: bytes | memoryview) -> None:
        """Append replicated bytes (consecutive chunks) at ``offset``; StoreError for a
        gap or an overlap."""
        self.commitlog.append_raw_many(offset, chunks)
        self.reput.wake()

    async def truncate(self, offset: int, *, partial_tail: bool = False) -> tuple[int, int] | None:
        """Drop every record at and after ``offset`` in the CommitLog, consume queues and
        index alike (an HA slave that diverged); the dropped range is logged, and the
        cut is on disk (zeroed tails synced, checkpoint written) when this returns."""
        if self.flush is None:
            raise StoreError("the store is not running")
        async with self.flush.exclusive():
            dropped = self.commitlog.truncate(offset, partial_tail=partial_tail)
            if dropped is None:
                return None
            for queue in self.queues.queues.values():
                queue.truncate_dirty(offset)
            self.index.truncate(offset)
            self.reput.truncated(offset)
            self._recover_queue_offsets()
            # (queues shrank: what the last clean stop recorded of them no longer holds)
            await trio.to_thread.run_sync(forget_extents, self._extents_path)
            self.flush.reset(offset)
            if self.schedule is not None:
                self.schedule.correct_offsets()
        await self.flush.flush_queues_and_checkpoint()
        return dropped

    async def trim_partial_tail(self) -> int:
        """A replica's log may end inside a record (transfers are cut anywhere): drop
        that incomplete record, so that the log ends where a record does. Returns the
        new end. StoreError if the log does not dispatch (it is not a valid log). (A
        damaged record that ends the log is passed over, not taken for a torn one.)"""
        self.reput.dispatch_available(final=True)
        if self.reput.failure is not None:
            raise StoreError(f"the log does not read as records: {self.reput.failure}")
        end = self.reput.offset
        if end < self.commitlog.max_offset:
            await self.truncate(end, partial_tail=True)
        return end

    def is_record_boundary(self, offset: int) -> bool:
        """Whether a replica whose log ends at ``offset`` can continue from there."""
        return self.commitlog.is_boundary(offset)

    # ------------------------------------------------------------------ reading
    def get_message(
        self,
        group: str,
        topic: str,
        queue_id: int,
        offset: int,
        max_count: int,
        *,
        tag_codes: Collection[int] | None = None,
        max_bytes: int | None = None,
    ) -> GetMessageResult:
        """Up to ``max_count`` messages of a queue from ``offset``; ``tag_codes`` keeps
        only messages whose tags hash is in it (None: all).

        A record a consumer could not decode (or, with ``check_crc_on_read``, whose body
        CRC fails) is passed over and counted in ``skipped``. Each record is checked
        once per run of the process: entries in the queue's ``checked`` (dispatched by
        this process, or checked by an earlier pull) are read as they are."""
        self._gets += 1
        queue = self.queues.get(topic, queue_id)
        if queue is None:
            return GetMessageResult(GetMessageStatus.NO_MATCHED_LOGIC_QUEUE, 0, 0, 0)
        low, high = queue.min_offset, queue.max_offset

        def result(status: GetMessageStatus, next_offset: int) -> GetMessageResult:
            return GetMessageResult(status, next_offset, low, high)

        if high == 0:
            return result(GetMessageStatus.NO_MESSAGE_IN_QUEUE, 0)
        if offset < low:
            return result(GetMessageStatus.OFFSET_TOO_SMALL, low)
        if offset == high:
            return result(GetMessageStatus.OFFSET_OVERFLOW_ONE, offset)
        if offset > high:  # RocketMQ: back to the start when the queue starts at 0
            return result(GetMessageStatus.OFFSET_OVERFLOW_BADLY, low if low == 0 else high)
        scan = _Scan(offset)
        self._read_queue(
            scan,
            queue,
            (topic, queue_id),
            high,
            max(1, min(max_count, self.config.max_transfer_count)),
            self.config.max_transfer_bytes if max_bytes is None else max_bytes,
            tag_codes,
        )
        if scan.count:
            lag = self.commitlog.max_offset - scan.last_physical
            return GetMessageResult(
                GetMessageStatus.FOUND,
                scan.next_offset,
                low,
                high,
                tuple(scan.runs),
                scan.count,
                lag,
                scan.skipped,
            )
        if scan.filtered:
            status = GetMessageStatus.NO_MATCHED_MESSAGE
        elif scan.removed or scan.skipped:  # (RocketMQ's status for a message it could not read)
            status = GetMessageStatus.MESSAGE_WAS_REMOVING
        else:
            status = GetMessageStatus.OFFSET_FOUND_NULL
        return GetMessageResult(status, scan.next_offset, low, high, skipped=scan.skipped)

    def _read_queue(
        self,
        scan: _Scan,
        queue: ConsumeQueue,
        queue_key: tuple[str, int],
        high: int,
        max_count: int,
        byte_budget: int,
        tag_codes: Collection[int] | None,
    ) -> None:
        """Read a queue's records into ``scan`` from its ``next_offset``: at most
        ``max_count`` and (but for the first) ``byte_budget`` bytes, scanning at most
        MAX_FILTERED_SCAN entries. Entries before ``trusted`` were checked in this
        process (queue.checked): read as they are (with no filter, ``_read_trusted``:
        records that follow one another in the log as one view); the others are checked
        whole (``record_problem``), and the runs that pass are added to ``checked``."""
        commitlog = self.commitlog
        read = commitlog.reader()
        commitlog_min = commitlog.min_offset
        check_crc = self.config.check_crc_on_read
        checked = queue.checked
        offset = next_offset = scan.next_offset
        trusted = checked.end_of(offset)
        run_start = run_end = offset
        runs = scan.runs
        count = total = 0
        full = False
        while next_offset < high and count < max_count and not full:
            if next_offset - offset >= MAX_FILTERED_SCAN:
                break
            if tag_codes is None and next_offset < trusted:
                limit = min(trusted, high, next_offset + max_count - count) - next_offset
                took, total, full = self._read_trusted(
                    scan, queue, read, next_offset, limit, total, byte_budget, first=not count
                )
                if took:
                    next_offset += took
                    count += took
                    continue
            batch = queue.entries(next_offset, max(max_count - count, 32))
            if not batch:
                break
            for physical_offset, size, tags in batch:
                if physical_offset < commitlog_min:
                    scan.removed += 1
                elif tag_codes is not None and tags not in tag_codes:
                    scan.filtered += 1
                else:
                    if count and total + size > byte_budget:
                        full = True
                        break
                    record: memoryview | None
                    if next_offset < trusted:
                        record = read(physical_offset, size)
                    else:
                        entry = (*queue_key, next_offset)
                        record = commitlog.read_checked(
                            physical_offset, size, entry, check_crc=check_crc
                        )
                        if record is not None and is_lost_record(record):
                            # a placeholder for a record a crash cut (recovery.py):
                            # passed over, as a message removed, never marked checked
                            scan.removed += 1
                            next_offset += 1
                            continue
                        if record is not None:
                            if next_offset != run_end:
                                checked.add(run_start, run_end)
                                run_start = next_offset
                            run_end = next_offset + 1
                    if record is None:  # damaged: passed over (counted, logged), never sent
                        scan.skipped += 1
                    else:
                        runs.append(record)
                        count += 1
                        scan.last_physical = physical_offset
                        total += size
                next_offset += 1
                if count >= max_count:
                    break
        checked.add(run_start, run_end)
        scan.next_offset = next_offset
        scan.count = count

    def _read_trusted(
        self,
        scan: _Scan,
        queue: ConsumeQueue,
        read: Callable[[int, int], memoryview],
        next_offset: int,
        limit: int,
        total: int,
        byte_budget: int,
        *,
        first: bool,
    ) -> tuple[int, int, bool]:
        """``_read_queue``'s loop for up to ``limit`` entries checked before, with no
        filter, without a step per entry: a file's entries unpacked at once, how many
        fit the byte budget found by bisection (``total`` bytes taken so far; the
        ``first`` record of a pull is taken whatever its size), and the records that
        follow one another in the log appended as one view. How many entries it took
        (0: none, the caller steps through them), the new total, and whether the byte
        budget stopped it."""
        physical, sizes, _tags = queue.entry_columns(next_offset, limit)
        if not physical or min(physical) < self.commitlog.min_offset:
            return 0, total, False
        totals = list(itertools.accumulate(sizes, initial=total))[1:]
        count = bisect.bisect_right(totals, byte_budget)
        full = count < len(physical)
        if first and not count:
            count = 1
        if not count:
            return 0, total, full
        ends = list(map(operator.add, physical[:count], sizes[:count]))
        breaks = itertools.compress(range(1, count), map(operator.ne, ends, physical[1:count]))
        segment_size = self.commitlog.segment_size
        runs = scan.runs
        begin = 0
        for stop in itertools.chain(breaks, (count,)):
            start, end = physical[begin], ends[stop - 1]
            if start // segment_size == (end - 1) // segment_size:
                runs.append(read(start, end - start))
            else:  # records back to back across a segment's end (never in a sound log)
                runs.extend(read(physical[i], sizes[i]) for i in range(begin, stop))
            begin = stop
        scan.last_physical = physical[count - 1]
        return count, totals[count - 1], full

    def max_offset_in_queue(self, topic: str, queue_id: int) -> int:
        queue = self.queues.get(topic, queue_id)
        return queue.max_offset if queue else 0

    def min_offset_in_queue(self, topic: str, queue_id: int) -> int:
        queue = self.queues.get(topic, queue_id)
        return queue.min_offset if queue else 0

    def store_time_at(self, physical_offset: int, size: int) -> int:
        """STORETIMESTAMP of the record at ``physical_offset``."""
        record = self.commitlog.read(physical_offset, size)
        sys_flag = int.from_bytes(record[36:40], "big")
        at = 48 + (20 if sys_flag & SYSFLAG_BORNHOST_V6 else 8)
        return int.from_bytes(record[at : at + 8], "big", signed=True)

    def offset_by_time(
        self, topic: str, queue_id: int, timestamp_ms: int, *, upper: bool = False
    ) -> int:
        """SEARCH_OFFSET_BY_TIMESTAMP: the first offset stored at or after ``timestamp_ms``
        (``upper``: the last stored at or before it)."""
        queue = self.queues.get(topic, queue_id)
        if queue is None:
            return 0
        return queue.offset_by_time(timestamp_ms, self.store_time_at, upper=upper)

    def message_store_time(self, topic: str, queue_id: int, offset: int) -> int:
        """Store time of the message at ``offset`` of a queue, -1 if there is none."""
        queue = self.queues.get(topic, queue_id)
        entry = queue.entry(offset) if queue else None
        if entry is None or entry[0] < self.commitlog.min_offset:
            return -1
        return self.store_time_at(entry[0], entry[1])

    def earliest_message_time(self, topic: str, queue_id: int) -> int:
        return self.message_store_time(topic, queue_id, self.min_offset_in_queue(topic, queue_id))

    def look_message_by_offset(
        self, physical_offset: int, size: int | None = None
    ) -> StoredMessage:
        """The message at a CommitLog offset; StoreError if none starts there (or what
        starts there is no message: ``record_at``)."""
        if size is None:
            return decode_message(self.record_at(physical_offset), check_crc=False)
        try:
            record = self.commitlog.read(physical_offset, size)
            message = decode_message(record, check_crc=False)
        except MessageFormatError as exc:
            raise StoreError(f"no message at commitlog offset {physical_offset}: {exc}") from None
        self._check_readable(physical_offset, record, message.topic)
        return message

    def record_at(self, physical_offset: int) -> memoryview:
        """The whole record that starts at ``physical_offset``, checked (magic, sizes,
        CRC); StoreError if no record starts there, or if it is no message for anyone to
        read: a lost record's placeholder (VIEW_MESSAGE_BY_ID)."""
        try:
            size = int.from_bytes(self.commitlog.read(physical_offset, 4), "big", signed=True)
            record = self.commitlog.read(physical_offset, size)
            topic = read_record(record).topic
        except (MessageFormatError, ValueError) as exc:
            raise StoreError(f"no message at commitlog offset {physical_offset}: {exc}") from None
        self._check_readable(physical_offset, record, topic)
        return record

    def _check_readable(self, physical_offset: int, record: memoryview, topic: str) -> None:
        """StoreError if the sound record of ``topic`` at ``physical_offset`` is not a
        message to hand out: the placeholder of a record lost in a crash, a topic's
        deletion record, or a message of a topic deleted after it."""
        problem = None
        if is_lost_record(record):
            problem = "it holds the queue offset of a message lost in a crash"
        elif topic == TOPIC_DELETION_TOPIC:
            problem = "it records a topic's deletion"
        elif self.deletions.dead(topic, physical_offset):
            problem = f"its topic {topic} was deleted after it"
        if problem is not None:
            raise StoreError(f"no message at commitlog offset {physical_offset}: {problem}")

    def query_records(
        self, topic: str, key: str, max_num: int, begin_ms: int = 0, end_ms: int = 2**62
    ) -> list[memoryview]:
        """Records of ``topic`` whose KEYS hold ``key`` or whose UNIQ_KEY is ``key``,
        stored in [begin_ms, end_ms], newest first (zero-copy views; QUERY_MESSAGE)."""
        found: list[memoryview] = []
        for physical_offset in self.index.query(topic, key, max_num * 4, begin_ms, end_ms):
            if physical_offset < self.commitlog.min_offset or len(found) >= max_num:
                continue
            if self.deletions.dead(topic, physical_offset):
                continue  # (indexed before its topic was deleted)
            try:
                record = self.record_at(physical_offset)
            except StoreError:
                continue  # an entry left by a truncation
            message = decode_message(record, check_crc=False)
            keys = message.properties.get(PROPERTY_KEYS, "").split(" ")
            if (
                message.topic == topic
                and (key in keys or message.properties.get(PROPERTY_UNIQ_KEY) == key)
                and begin_ms <= message.store_timestamp <= end_ms
            ):
                found.append(record)
        return found

    def query_message(
        self, topic: str, key: str, max_num: int, begin_ms: int = 0, end_ms: int = 2**62
    ) -> list[StoredMessage]:
        """Like ``query_records``, decoded."""
        return [
            decode_message(record, check_crc=False)
            for record in self.query_records(topic, key, max_num, begin_ms, end_ms)
        ]

    async def wait_dispatched(self, offset: int | None = None) -> None:
        """Wait until consume queues and index cover the CommitLog up to ``offset``
        (default: everything stored so far)."""
        await self.reput.wait_dispatched(self.commitlog.max_offset if offset is None else offset)

    @property
    def commitlog_min_offset(self) -> int:
        return self.commitlog.min_offset

    @property
    def commitlog_max_offset(self) -> int:
        return self.commitlog.max_offset

    async def replace_delay_offsets(self, offsets: dict[int, int]) -> None:
        """A slave's copy of its master's delay offsets (config/delayOffset.json), kept
        for the day it serves as master; a master's own are its scheduler's."""
        if self.schedule is not None:
            raise StoreError("a master keeps its own delay offsets")
        data = encode_delay_offsets(offsets)
        await trio.to_thread.run_sync(
            save_with_backup, self.config.config_dir / "delayOffset.json", data
        )

    def delay_offsets(self) -> dict[int, int]:
        return dict(self.schedule.offsets) if self.schedule else {}

    def statistics(self) -> StoreStatistics:
        return StoreStatistics(
            running=self._running,
            role=self.config.role.value,
            commitlog_min_offset=self.commitlog.min_offset,
            commitlog_max_offset=self.commitlog.max_offset,
            flushed_offset=self.flush.flushed_offset if self.flush else 0,
            dispatched_offset=self.reput.offset,
            consume_queues=len(self.queues.queues),
            messages_put=self._puts,
            put_failures=self._put_failures,
            messages_got=self._gets,
            flush_rounds=self.flush.rounds if self.flush else 0,
            delayed_delivered=self.schedule.delivered if self.schedule else 0,
            segments_deleted=self.retention.segments_deleted if self.retention else 0,
            dispatch_failure=self.reput.failure,
            damaged_records_dispatched=self.reput.damaged.count,
            damaged_records_read=self.commitlog.damaged.count,
        )


def copy_to_store(
    message: StoredMessage,
    topic: str,
    queue_id: int,
    properties: Mapping[str, str],
    *,
    sys_flag: int | None = None,
    prepared_transaction_offset: int | None = None,
) -> MessageToStore:
    """A stored message to store again under ``topic`` and ``queue_id`` with
    ``properties`` (a delayed message coming due, a transaction's half message put back
    or committed): born time and hosts, flag and reconsume times are kept."""
    return MessageToStore(
        topic=topic,
        queue_id=queue_id,
        body=message.body,
        flag=message.flag,
        properties=properties,
        sys_flag=message.sys_flag if sys_flag is None else sys_flag,
        born_timestamp=message.born_timestamp,
        born_host=_split_host(message.born_host),
        store_host=_split_host(message.store_host),
        reconsume_times=message.reconsume_times,
        prepared_transaction_offset=(
            message.prepared_transaction_offset
            if prepared_transaction_offset is None
            else prepared_transaction_offset
        ),
    )


def _split_host(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host.strip("[]"), int(port)
