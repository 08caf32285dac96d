"""Timer messages in the store (hamq/store/timer.py): a delivery time in the future
waits in rmq_sys_wheel_timer and is delivered once, at or after its time, in due order;
refusals name what was wrong; what waits survives a restart and a cut of the log, and a
delivery the log keeps is never made again. Real clocks (a flush thread runs): delays of
a second or less, every wait bounded."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import trio

from hamq.protocol.message import TIMER_TOPIC
from hamq.protocol.record import StoredMessage, decode_messages
from hamq.store import MessageStore, PutMessageStatus
from hamq.store.timer import decode_floors
from tests.support.store import message, open_store, put, small_config
from tests.support.timing import wait_for


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def delivered(store: MessageStore, topic: str = "T", queue_id: int = 0) -> list[StoredMessage]:
    return decode_messages(store.get_message("g", topic, queue_id, 0, 32).body)


async def test_timer_messages_wait_and_come_once_at_their_time_in_due_order(
    tmp_path: Path,
) -> None:
    async with open_store(small_config(tmp_path)) as store:
        sent_at = now_ms()
        later = await put(store, message(body=b"second", TIMER_DELAY_MS="2000", UNIQ_KEY="ID-2"))
        sooner = await put(
            store, message(body=b"first", TIMER_DELIVER_MS=str(sent_at + 1500), UNIQ_KEY="ID-1")
        )
        assert later.stored and sooner.stored
        await store.wait_dispatched()
        assert store.max_offset_in_queue(TIMER_TOPIC, 0) == 2  # waiting there
        assert store.max_offset_in_queue("T", 0) == 0
        assert store.statistics().timers_waiting == 2
        await wait_for(lambda: store.max_offset_in_queue("T", 0) == 2, 10)
        first, second = delivered(store)
        assert (first.body, second.body) == (b"first", b"second")
        assert first.msg_id == "ID-1"  # the id the producer was answered with
        assert first.store_timestamp >= sent_at + 1500
        assert second.store_timestamp >= int(second.properties["TIMER_OUT_MS"])
        assert int(second.properties["TIMER_OUT_MS"]) >= sent_at + 2000
        for copy, source in ((first, "1"), (second, "0")):
            assert copy.properties["HAMQ_TIMER_SOURCE"] == source
            assert "REAL_TOPIC" not in copy.properties and "REAL_QID" not in copy.properties
            assert int(copy.properties["TIMER_DEQUEUE_MS"]) >= int(copy.properties["TIMER_OUT_MS"])
            assert int(copy.properties["TIMER_ENQUEUE_MS"]) <= int(copy.properties["TIMER_OUT_MS"])
        await store.wait_dispatched()
        assert store.timers.pending == {}
        assert store.statistics().timers_delivered == 2


async def test_timer_refusals_name_what_was_wrong(tmp_path: Path) -> None:
    config = small_config(tmp_path, timer_max_delay_s=60, timer_max_pending=2)
    async with open_store(config) as store:
        not_a_number = await put(store, message(TIMER_DELAY_SEC="soon"))
        assert not_a_number.status is PutMessageStatus.WHEEL_TIMER_MSG_ILLEGAL
        assert "TIMER_DELAY_SEC 'soon' is not a whole number" in not_a_number.remark
        too_far = await put(store, message(TIMER_DELAY_SEC="61"))
        assert too_far.status is PutMessageStatus.WHEEL_TIMER_MSG_ILLEGAL
        assert "past the broker's timer_max_delay_s 60s" in too_far.remark
        deletion = await put(store, message(TIMER_DELAY_SEC="5", TIMER_DEL_UNIQKEY="T+ID"))
        assert deletion.status is PutMessageStatus.WHEEL_TIMER_MSG_ILLEGAL
        assert not (not_a_number.stored or too_far.stored or deletion.stored)
        # a time that has come is no timer: stored in its topic at once
        past = await put(store, message(body=b"now", TIMER_DELIVER_MS=str(now_ms() - 1000)))
        assert past.stored
        # a delay level wins over a delivery time (RocketMQ's rule): the timer's are dropped
        leveled = await put(store, message(body=b"level", DELAY="1", TIMER_DELAY_SEC="50"))
        assert leveled.stored
        for _ in range(2):
            assert (await put(store, message(TIMER_DELAY_SEC="50"))).stored
        await store.wait_dispatched()
        full = await put(store, message(TIMER_DELAY_SEC="50"))
        assert full.status is PutMessageStatus.WHEEL_TIMER_FLOW_CONTROL
        assert "timer_max_pending 2" in full.remark
        assert [m.body for m in delivered(store)] == [b"now"]
        assert store.max_offset_in_queue("SCHEDULE_TOPIC_XXXX", 0) == 1
        [waiting] = decode_messages(store.get_message("g", "SCHEDULE_TOPIC_XXXX", 0, 0, 1).body)
        assert "TIMER_DELAY_SEC" not in waiting.properties


async def test_a_restart_keeps_what_waits_and_never_delivers_twice(tmp_path: Path) -> None:
    config = small_config(tmp_path, delay_offset_persist_interval_s=0.05)
    async with open_store(config) as store:
        assert (await put(store, message(body=b"soon", TIMER_DELAY_MS="200"))).stored
        assert (await put(store, message(body=b"later", TIMER_DELAY_SEC="4"))).stored
        await wait_for(lambda: store.max_offset_in_queue("T", 0) == 1, 10)
        await store.wait_dispatched()
        # the floor moves past the delivered one once the log is on disk
        await wait_for(lambda: store.timers.floors and store.timers.floors[0].floor == 1, 10)
    floors = decode_floors((tmp_path / "config" / "timerFloor.json").read_bytes())
    assert floors[0].floor == 1
    async with open_store(config) as store:
        assert list(store.timers.pending) == [1]  # built from the floor: only "later" waits
        await wait_for(lambda: store.max_offset_in_queue("T", 0) == 2, 10)
        assert [m.body for m in delivered(store)] == [b"soon", b"later"]
    # without the floors, the index tells what was delivered: nothing comes again
    for name in ("timerFloor.json", "timerFloor.json.bak"):
        (tmp_path / "config" / name).unlink(missing_ok=True)
    async with open_store(config) as store:
        assert store.timers.pending == {}
        assert store.max_offset_in_queue("T", 0) == 2


async def test_a_crash_copy_of_the_store_delivers_what_it_lacks_once(tmp_path: Path) -> None:
    """A copy taken while running (as a crash leaves it) with a delivery in it, and one
    from before that delivery: the first never delivers it again, the second does."""
    live = tmp_path / "live"
    async with open_store(small_config(live)) as store:
        assert (await put(store, message(body=b"timed", TIMER_DELAY_MS="300"))).stored
        await store.wait_dispatched()
        await store.flush.flush_queues_and_checkpoint()  # type: ignore[union-attr]
        shutil.copytree(live, tmp_path / "before", ignore=shutil.ignore_patterns("lock"))
        await wait_for(lambda: store.max_offset_in_queue("T", 0) == 1, 10)
        await store.wait_dispatched()
        await store.flush.flush_queues_and_checkpoint()  # type: ignore[union-attr]
        shutil.copytree(live, tmp_path / "after", ignore=shutil.ignore_patterns("lock"))
    async with open_store(small_config(tmp_path / "after")) as store:
        assert store.timers.pending == {}
        assert [m.body for m in delivered(store)] == [b"timed"]
    async with open_store(small_config(tmp_path / "before")) as store:
        await wait_for(lambda: store.max_offset_in_queue("T", 0) == 1, 10)
        assert [m.body for m in delivered(store)] == [b"timed"]


async def test_a_cut_that_removes_a_delivery_delivers_it_again(tmp_path: Path) -> None:
    async with open_store(small_config(tmp_path)) as store:
        assert (await put(store, message(body=b"timed", TIMER_DELAY_MS="200"))).stored
        await wait_for(lambda: store.max_offset_in_queue("T", 0) == 1, 10)
        [copy] = delivered(store)
        await store.wait_dispatched()
        assert store.timers.pending == {}
        # (a master's own log is never cut; a replica's is, the same way)
        await store.truncate(copy.physical_offset)
        await wait_for(lambda: store.max_offset_in_queue("T", 0) == 1, 10)
        [again] = delivered(store)
        assert again.physical_offset == copy.physical_offset
        await store.wait_dispatched()
        assert store.timers.pending == {}


async def test_an_undeliverable_timer_message_is_recorded_and_dropped(tmp_path: Path) -> None:
    async with open_store(small_config(tmp_path)) as store:
        # (only a producer's send is checked for a real topic; a put here can lack one)
        sent = await put(store, message(body=b"gone", TIMER_DELAY_MS="100"))
        assert sent.stored
        await store.delete_topic("T")
        await wait_for(lambda: store.max_offset_in_queue(TIMER_TOPIC, 1) == 1, 10)
        [record] = decode_messages(store.get_message("g", TIMER_TOPIC, 1, 0, 1).body)
        assert record.properties["HAMQ_TIMER_SOURCE"] == "0"
        assert b"deleted after it was sent" in record.body
        await store.wait_dispatched()
        assert store.timers.pending == {}
        assert store.max_offset_in_queue("T", 0) == 0


async def test_a_timer_message_waits_no_longer_than_it_must(tmp_path: Path) -> None:
    """The deliverer sleeps until the first is due, and wakes for one due sooner."""
    async with open_store(small_config(tmp_path)) as store:
        assert (await put(store, message(body=b"far", TIMER_DELAY_SEC="30"))).stored
        await store.wait_dispatched()
        start = trio.current_time()
        assert (await put(store, message(body=b"near", TIMER_DELAY_MS="100"))).stored
        await wait_for(lambda: store.max_offset_in_queue("T", 0) == 1, 10)
        assert trio.current_time() - start < 10
        assert [m.body for m in delivered(store)] == [b"near"]
        assert list(store.timers.pending) == [0]
