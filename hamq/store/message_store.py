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

import logging
from collections.abc import Awaitable, Callable, Mapping

import trio

from hamq.protocol.message import (
    TOPIC_DELETION_TOPIC,
    topic_error,
)
from hamq.protocol.record import (
    RecordTemplate,
    StoredMessage,
    make_record_template,
)
from hamq.store.checkpoint import Checkpoint, load_checkpoint, save_with_backup
from hamq.store.commitlog import AppendResult, CommitLog
from hamq.store.config import StoreConfig
from hamq.store.consume_queue import ConsumeQueue, ConsumeQueueTable
from hamq.store.deletions import TopicDeletions
from hamq.store.durability import Durability, PutMessageStatus, ReplicaGate
from hamq.store.encoding import PutEncoder
from hamq.store.extents import QueueExtents, forget_extents, load_extents, save_extents
from hamq.store.files import DirectoryInUseError, DirectoryLock, fsync_directory
from hamq.store.flush import FlushService
from hamq.store.index import IndexService
from hamq.store.reads import StoreReader
from hamq.store.recovery import RecoveryReport, recover
from hamq.store.reput import DispatchRequest, ReputService
from hamq.store.retention import RetentionService
from hamq.store.role import ConfiguredRole, RoleReader
from hamq.store.schedule import ScheduleService, encode_delay_offsets
from hamq.store.segment import StoreCorruptionError, StoreError
from hamq.store.timer import TimerHandler, TimerService, TimerWaits
from hamq.store.values import (
    MessageToStore,
    PutMessageResult,
    StoreStatistics,
    copy_to_store,
    wall_clock_ms,
)

log = logging.getLogger(__name__)


class StoreLockedError(StoreError):
    """Another process holds the store directory (its lock file): the text names the
    directory as configured and the holder's PID; ``pid`` is None if it is unknown."""

    def __init__(self, message: str, pid: int | None) -> None:
        super().__init__(message)
        self.pid = pid


class MessageStore(StoreReader):
    """The store: lifecycle, writes, replication; reads are ``StoreReader``'s (reads.py)."""

    def __init__(
        self,
        config: StoreConfig,
        *,
        clock: Callable[[], int] = wall_clock_ms,
        retention_floor: Callable[[], int] | None = None,
        confirm_offset: Callable[[], int] = lambda: 0,
        on_recovered: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        super().__init__(
            config,
            CommitLog(config.commitlog_dir, config.commitlog_segment_bytes, clock),
            ConsumeQueueTable(config.consume_queue_dir, config.consume_queue_entries_per_file),
            IndexService(config.index_dir, config.index_hash_slots, config.index_max_entries),
            # deleted topics: where each was deleted (hamq/store/deletions.py)
            TopicDeletions(config.config_dir / "topicDeletions.json"),
        )
        self._clock = clock
        self._delay_levels_ms = config.delay_levels_ms
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
        #: puts made with ``announce=False`` whose appends were not announced yet
        self._unannounced = False
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
        #: whose role this store follows (``use_role``): puts are taken, and delayed
        #: messages delivered, only while it is a master's
        self.role: RoleReader = ConfiguredRole(config.role.is_master)
        self._nursery: trio.Nursery | None = None
        #: the scheduler's (cancelled: none runs)
        self._schedule_scope = trio.CancelScope()
        self._schedule_scope.cancel()
        #: the timer messages waiting (hamq/store/timer.py), followed on every broker
        self.timers = TimerWaits(
            queues=self.queues,
            index=self.index,
            read_message=self.look_message_by_offset,
            log_end=lambda: self.commitlog.max_offset,
            floors_path=config.config_dir / "timerFloor.json",
            max_pending=config.timer_max_pending,
        )
        #: their delivery, while this store is a master's (None: none runs)
        self.timer_service: TimerService | None = None
        self._truncation_listeners: list[Callable[[], None]] = []
        #: real topic -> what delivers its timer messages instead of a copy (timer.py)
        self.timer_handlers: dict[str, TimerHandler] = {}
        self._encoder = PutEncoder(config, self.deletions, clock=clock, timer_room=self.timers.room)
        #: where the log ended when records were left undispatched (a full disk at
        #: start or at promotion): sends wait until they are, then take their queue
        #: offsets afresh
        self._undispatched_end: int | None = None
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
            self.timers.load_floors(self.commitlog.max_offset)
            await trio.to_thread.run_sync(self.timers.build)
            self.reput.listeners.append(self.timers.on_dispatch)
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
                floor=self._retention_floor_with_timers,
                reserved_ms=int(config.file_reserved_time_h * 3_600_000),
                interval_s=config.clean_interval_s,
                exclusive=self.flush.exclusive,
            )
            async with trio.open_nursery() as nursery:
                await nursery.start(self.reput.run)
                await nursery.start(self.flush.run)
                await nursery.start(self.retention.run)
                await nursery.start(self.durability.replica_acks.run)
                nursery.start_soon(self._timer_floors_loop)
                self._running = True
                self._nursery = nursery
                if self.role.is_master:
                    await nursery.start(self._run_schedule)
                # (a broker's store starts taking no sends whatever its role: the broker
                # makes it master once it is serving, and says so itself)
                log.info(
                    "message store running in %s, %s",
                    config.store_dir,
                    "taking sends" if self.role.is_master else "taking no sends",
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
                await self._save_timer_floors()
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

    def use_role(self, role: RoleReader) -> None:
        """Whose role this store reads (a broker's: hamq/broker/roles.py)."""
        self.role = role

    async def prepare_master(self) -> None:
        """Before the role makes this store a master's (a slave's or a starting one's
        until now): wait until everything in the log is dispatched, so new sends
        continue each queue where it ends (a replica's queues grew by dispatch); if
        dispatching is paused by a full disk, sends wait until it is done."""
        assert self._nursery is not None, "the store is not running"
        end = self.commitlog.max_offset
        if await self.reput.wait_settled(end):
            self._recover_queue_offsets()
            self._undispatched_end = None
        else:
            self._undispatched_end = end

    async def follow_role(self) -> None:
        """The role changed: run the delayed-message scheduler while it is a master's,
        stop it when it is not."""
        if self.role.is_master and self._schedule_scope.cancel_called:
            assert self._nursery is not None, "the store is not running"
            await self._nursery.start(self._run_schedule)
        elif not self.role.is_master:
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
        ticket = self.durability.ticket(True)
        if ticket is not None:
            await ticket.result(appended.end_offset)
        return appended.physical_offset

    def on_truncated(self, listener: Callable[[], None]) -> None:
        """Call ``listener()`` after every cut of the log (``truncate``), once the queues,
        the index and the timer messages waiting reflect it."""
        self._truncation_listeners.append(listener)

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
        """The delayed-message scheduler and the timer messages' delivery, while this
        store is a master's."""
        schedule = self.schedule = self._schedule_service()
        self.timer_service = TimerService(
            self.timers,
            clock=self._clock,
            read_message=self.look_message_by_offset,
            put=lambda message: self.put_message_nowait(message, announce=False),
            announce=self.announce_appends,
            deletions=self.deletions,
            handlers=self.timer_handlers,
        )
        self.reput.listeners.append(schedule.on_dispatch)
        try:
            with trio.CancelScope() as self._schedule_scope:
                async with trio.open_nursery() as nursery:
                    await nursery.start(self.timer_service.run)
                    await nursery.start(schedule.run)  # (persists its offsets at the end)
                    task_status.started()
        finally:
            self.reput.listeners.remove(schedule.on_dispatch)
            if not self.role.is_master:  # demoted (at shutdown _stop persists it after the flush)
                self.schedule = None
                self.timer_service = None

    def _retention_floor_with_timers(self) -> int:
        """The broker's retention floor, lowered to the oldest timer message waiting."""
        floor = self._retention_floor()
        oldest = self.timers.oldest_offset()
        return floor if oldest is None else min(floor, oldest)

    async def _timer_floors_loop(self) -> None:
        while True:
            await trio.sleep(self.config.delay_offset_persist_interval_s)
            try:
                await self._save_timer_floors()
            except OSError:
                log.exception("saving the timer floors failed; retrying")

    async def _save_timer_floors(self) -> None:
        """Note the timer floor as of what is dispatched, and save those on disk now."""
        self.timers.sample(self.reput.offset)
        floors = self.timers.durable_floors(self.flush.flushed_offset if self.flush else 0)
        if floors is not None:
            await trio.to_thread.run_sync(self.timers.save_floors, floors)

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
    def put_message_nowait(
        self, message: MessageToStore, *, announce: bool = True
    ) -> PutMessageResult:
        """Append without waiting for a flush. ``announce=False``: the caller groups puts
        and says once that the log grew (``announce_appends``) after the group's last."""
        prepared = self._unavailable() or self._encoder.prepare(message)
        if isinstance(prepared, PutMessageResult):
            result = prepared
        else:
            result = self._append(*prepared)
            if result.stored:
                self._unannounced = True
                if announce:
                    self.announce_appends()
        self._count(result)
        return result

    def put_batch_nowait(
        self, messages: list[MessageToStore], *, announce: bool = True
    ) -> list[PutMessageResult]:
        """Append messages one after another, all or none: every message is checked
        before the first is appended. On a refusal the one result says which entry and
        why, and nothing was stored (only a failing disk can stop a batch half-way; its
        last result then says so).

        A batch as a send makes it (one topic and queue; the same sys flag, born time,
        hosts and reconsume times; no delay level) is checked and encoded as one
        (encoding.py's ``prepare_batch``); any other, or one with a fault, goes message
        by message. ``announce``: as ``put_message_nowait``'s."""
        unavailable = self._unavailable()
        if unavailable is not None:
            unavailable.remark = f"batch entry 0: {unavailable.remark}"
            self._count(unavailable)
            return [unavailable]
        encoder = self._encoder
        prepared = encoder.prepare_batch(messages)
        if prepared is None:
            prepared = []
            for i, message in enumerate(messages):
                outcome = encoder.prepare(message)
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
            self._unannounced = True
            if announce:
                self.announce_appends()
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

    def use_replicas(self, replicas: ReplicaGate | None) -> None:
        """Who else a put waits for (the broker's replication: hamq/ha/group_transfer.py)."""
        self.durability.replicas = replicas

    def _refuse(self, status: PutMessageStatus, remark: str) -> PutMessageResult:
        return PutMessageResult(status, None, remark)

    def _unavailable(self) -> PutMessageResult | None:
        """Why the store takes no puts now (not running, a slave, dispatching stopped or
        behind after a disk error), None if it takes them."""
        if not self._running:
            return self._refuse(PutMessageStatus.SERVICE_NOT_AVAILABLE, "the store is not running")
        if not self.role.is_master:
            return self._refuse(
                PutMessageStatus.SERVICE_NOT_AVAILABLE,
                "this broker is a slave; send to its master",
            )
        if self.reput.failure is not None or self._undispatched_end is not None:
            unavailable = self._dispatch_unavailable()
            if unavailable is not None:
                return self._refuse(PutMessageStatus.SERVICE_NOT_AVAILABLE, unavailable)
        return None

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

    def announce_appends(self) -> None:
        """Say that puts made with ``announce=False`` grew the log (nothing if none
        did): a group of puts says it once, after its last, so a master's slaves are
        sent the group's bytes in one write and its acks come once for the group."""
        if self._unannounced:
            self._appended()

    def _appended(self) -> None:
        """After a put stored its message(s): the listeners first (a master's HA service
        sends them to its slaves), then the dispatch of their queue and index entries."""
        self._unannounced = False
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
            self.timers.truncated(offset)
            await trio.to_thread.run_sync(self.timers.save_floors, list(self.timers.floors))
            for listener in self._truncation_listeners:
                listener()
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

    def durable_delay_offsets(self) -> dict[int, int]:
        """The scheduler's offsets as far as the delivered copies are on disk (what a
        slave's metadata sync copies: schedule.py's ``durable_offsets``); none on a slave."""
        return self.schedule.durable_offsets() if self.schedule is not None else {}

    # ------------------------------------------------------------------ dispatching
    @property
    def dispatch_failure(self) -> str | None:
        """Why dispatching (building queues and index from the log) is stopped or
        paused, None while it runs (reput.py)."""
        return self.reput.failure

    def defer_dispatch(self, seconds: float) -> None:
        """Hold dispatching back for up to ``seconds`` (a replica catching up: the log
        first, its queues after; reput.py bounds it)."""
        self.reput.defer_for(seconds)

    def on_dispatch(self, listener: Callable[[DispatchRequest], None]) -> None:
        """Call ``listener(request)`` for every record dispatched from now on."""
        self.reput.listeners.append(listener)

    def consume_queue(self, topic: str, queue_id: int) -> ConsumeQueue | None:
        """The consume queue of ``topic``/``queue_id``, None if it has none."""
        return self.queues.get(topic, queue_id)

    def statistics(self) -> StoreStatistics:
        return StoreStatistics(
            running=self._running,
            role="MASTER" if self.role.is_master else "SLAVE",
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
            timers_waiting=len(self.timers.pending),
            timers_delivered=self.timer_service.delivered if self.timer_service else 0,
        )
