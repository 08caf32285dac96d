"""What the store promises about deleted topics, damaged files and queue offsets,
checked on a real store in tmp_path whose files are damaged the way an
operator, a disk or a hostile tester would damage them:

- a deleted topic's messages are gone for every reader, across restarts, rebuilds and
  on a slave; its queues start again at 0;
- a consume queue whose files do not cover what the CommitLog holds for it is rebuilt;
- a queue offset, once handed out, is never handed out again, even when a crash or
  damage cut its record from the log;
- a damaged tail after a clean stop is dealt with as after a crash, and a segment cut
  short says what can explain it.
"""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path

import pytest

from hamq.protocol.message import SYSFLAG_TRANSACTION_COMMIT
from hamq.protocol.record import decode_messages
from hamq.store import (
    GetMessageStatus,
    MessageStore,
    MessageToStore,
    PutMessageStatus,
    queue_check,
    recovery,
)
from hamq.store.config import BrokerRole
from hamq.store.segment import StoreCorruptionError, StoreError
from tests.support.store import SEGMENT, message, open_store, put, put_many, small_config
from tests.support.timing import wait_for

# ---------------------------------------------------------------- helpers


def read_queue(store: MessageStore, topic: str, queue_id: int, offset: int = 0) -> list[str]:
    """The bodies (up to the first '.') of a queue from ``offset``, pulled 7 at a time."""
    found: list[str] = []
    high = store.max_offset_in_queue(topic, queue_id)
    while offset < high:
        result = store.get_message("g", topic, queue_id, offset, 7)
        assert result.next_begin_offset > offset, result  # never stalls
        found += [m.body.split(b".")[0].decode() for m in decode_messages(result.body)]
        offset = result.next_begin_offset
    return found


def read_topic(store: MessageStore, topic: str, queues: int = 4) -> list[str]:
    return sorted(b for q in range(queues) for b in read_queue(store, topic, q))


async def put_bodies(store: MessageStore, topic: str, bodies: list[str], queues: int = 4) -> None:
    for i, body in enumerate(bodies):
        result = await put(
            store, message(topic, queue_id=i % queues, body=f"{body}.".encode(), KEYS=f"key-{body}")
        )
        assert result.status is PutMessageStatus.PUT_OK, result


def commitlog_file(store_dir: Path, offset: int) -> tuple[Path, int]:
    start = offset - offset % SEGMENT
    return store_dir / "commitlog" / f"{start:020d}", offset - start


def overwrite(store_dir: Path, offset: int, data: bytes) -> None:
    path, pos = commitlog_file(store_dir, offset)
    with path.open("r+b") as out:
        out.seek(pos)
        out.write(data)


def crash(store_dir: Path) -> None:
    """The next start recovers as after a kill -9 (the abort marker is left)."""
    (store_dir / "abort").write_bytes(b"")


# ---------------------------------------------------------------- 1. deleted topics


async def test_a_deleted_topics_messages_are_gone_and_its_queues_start_again(
    tmp_path: Path,
) -> None:
    config = small_config(tmp_path)
    async with open_store(config) as store:
        await put_bodies(store, "T", [f"old{i}" for i in range(10)])
        await put_bodies(store, "U", [f"u{i}" for i in range(4)])
        await store.wait_dispatched()
        old = store.get_message("g", "T", 0, 0, 1).messages[0]
        old_offset = int.from_bytes(old[28:36], "big")
        await store.delete_topic("T")
        for q in range(4):
            assert store.get_message("g", "T", q, 0, 32).status is (
                GetMessageStatus.NO_MATCHED_LOGIC_QUEUE
            )
        assert store.query_message("T", "key-old0", 10) == []
        with pytest.raises(StoreError, match="was deleted after it"):
            store.look_message_by_offset(old_offset)
        await put_bodies(store, "T", ["new0", "new1"])
        await store.wait_dispatched()
        assert read_topic(store, "T") == ["new0", "new1"]
        assert store.max_offset_in_queue("T", 0) == 1  # offsets start again at 0
        assert read_topic(store, "U") == [f"u{i}" for i in range(4)]
    # across a clean restart, a crash, and a rebuild of every consume queue
    for damage in ("none", "crash", "consume queues deleted"):
        if damage == "crash":
            crash(tmp_path)
            (tmp_path / "checkpoint").unlink()
        if damage == "consume queues deleted":
            shutil.rmtree(tmp_path / "consumequeue")
        async with open_store(config) as store:
            assert read_topic(store, "T") == ["new0", "new1"], damage
            assert store.query_message("T", "key-old0", 10) == [], damage
            assert [m.body for m in store.query_message("T", "key-new1", 10)] == [b"new1."]
            assert read_topic(store, "U") == [f"u{i}" for i in range(4)], damage
    async with open_store(config) as store:  # deleted twice: the later deletion holds
        await store.delete_topic("T")
        await put_bodies(store, "T", ["newer"])
        await store.wait_dispatched()
        assert read_topic(store, "T") == ["newer"]


async def test_a_slave_deletes_a_topic_where_its_master_did(tmp_path: Path) -> None:
    """The deletion is a record of the log: a slave that copies the log deletes the
    topic at the same place, keeps the messages sent after it, and says so to whoever
    listens (its broker drops the topic's offsets)."""
    master_config = small_config(tmp_path / "master")
    async with open_store(master_config) as master:
        await put_bodies(master, "T", [f"old{i}" for i in range(6)])
        await master.delete_topic("T")
        await put_bodies(master, "T", ["new0"])
        data = bytes(master.get_data(0, master.commitlog_max_offset))
    slave_config = small_config(tmp_path / "slave", role=BrokerRole.SLAVE)
    deleted: list[str] = []
    async with open_store(slave_config) as slave:
        slave.on_topic_deleted(deleted.append)
        slave.append_raw(0, data)
        await slave.wait_dispatched()
        assert read_topic(slave, "T") == ["new0"]
        assert deleted == ["T"]
    async with open_store(slave_config) as slave:
        assert read_topic(slave, "T") == ["new0"]
        assert slave.recovery is not None and slave.recovery.topics_deleted == ()
    # killed before its deletion table was written: recovery applies the deletion again,
    # and says so (the broker then forgets the topic's offsets)
    for name in ("topicDeletions.json", "topicDeletions.json.bak", "checkpoint"):
        (tmp_path / "slave" / ("config" if name.startswith("topic") else "") / name).unlink(
            missing_ok=True
        )
    crash(tmp_path / "slave")
    async with open_store(slave_config) as slave:
        assert slave.recovery is not None and slave.recovery.topics_deleted == ("T",)
        assert read_topic(slave, "T") == ["new0"]


async def test_delayed_and_uncommitted_messages_of_a_deleted_topic_stay_gone(
    tmp_path: Path,
) -> None:
    config = small_config(tmp_path, message_delay_level="1s")
    async with open_store(config) as store:
        delayed = message("T", body=b"late.", DELAY="1")
        assert (await put(store, delayed)).status is PutMessageStatus.PUT_OK
        half = await put(store, message("T", body=b"half."))
        assert half.append is not None
        await store.delete_topic("T")
        commit = MessageToStore(
            topic="T",
            queue_id=0,
            body=b"half.",
            sys_flag=SYSFLAG_TRANSACTION_COMMIT,
            prepared_transaction_offset=half.append.physical_offset,
        )
        refused = await put(store, commit)
        assert refused.status is PutMessageStatus.MESSAGE_ILLEGAL
        assert "deleted after this transaction's half message" in refused.remark
        assert store.schedule is not None
        await wait_for(lambda: store.schedule is not None and store.schedule.offsets.get(1) == 1)
        assert read_topic(store, "T") == []


async def test_no_one_sends_to_the_deletions_topic_or_deletes_a_topic_on_a_slave(
    tmp_path: Path,
) -> None:
    async with open_store(small_config(tmp_path)) as store:
        forged = await put(store, message("HAMQ_SYS_TOPIC_DELETION", body=b"T"))
        assert forged.status is PutMessageStatus.MESSAGE_ILLEGAL
        with pytest.raises(StoreError, match="reserved"):
            await store.delete_topic("HAMQ_SYS_TOPIC_DELETION")
    async with open_store(small_config(tmp_path, role=BrokerRole.SLAVE)) as slave:
        with pytest.raises(StoreError, match="slave"):
            await slave.delete_topic("T")


# ---------------------------------------------------------------- 2. missing queue files


@pytest.mark.parametrize("which", ["the queue of the newest message", "another queue"])
async def test_a_deleted_queue_file_is_rebuilt_whichever_queue_it_was(
    tmp_path: Path, which: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The tester's case: 400 messages, 100 per queue (one file each, 100 entries per
    file), a clean stop, one queue's only file deleted."""
    config = small_config(tmp_path)
    async with open_store(config) as store:
        await put_many(store, 400, padding=50)
    queue = 3 if which == "the queue of the newest message" else 1
    (tmp_path / "consumequeue" / "T" / str(queue) / f"{0:020d}").unlink()
    with caplog.at_level(logging.WARNING):
        async with open_store(config) as store:
            assert store.min_offset_in_queue("T", queue) == 0
            assert store.max_offset_in_queue("T", queue) == 100
            assert len(read_topic(store, "T")) == 400
            assert store.recovery is not None
            assert store.recovery.rebuilt_queues == (f"T/{queue}",)
    assert f"consume queue T/{queue} rebuilt" in caplog.text


async def test_a_queue_that_lost_files_far_from_the_logs_end_is_rebuilt(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Beyond the window of the log's tail that every start checks, what the last clean
    stop recorded of each queue (config/queueExtents.json) tells: a queue whose files
    end early, or start late while the log has the records, is rebuilt."""
    monkeypatch.setattr(queue_check, "TAIL_CHECK_BYTES", 4096)
    monkeypatch.setattr(recovery, "CLEAN_TAIL_SCAN_BYTES", 4096)
    config = small_config(tmp_path)
    async with open_store(config) as store:
        await put_bodies(store, "Old", [f"o{i}" for i in range(250)], queues=2)
        await put_bodies(store, "Recent", [f"r{i}" for i in range(100)], queues=1)
    queues = tmp_path / "consumequeue" / "Old"
    shutil.rmtree(queues / "0")  # all of it: 125 entries
    (queues / "1" / f"{0:020d}").unlink()  # its first file: entries 0-99
    async with open_store(config) as store:
        assert store.recovery is not None
        assert store.recovery.rebuilt_queues == ("Old/0", "Old/1")
        assert read_topic(store, "Old", 2) == sorted(f"o{i}" for i in range(250))
        result = await put(store, message("Old", queue_id=0, body=b"next."))
        assert result.append is not None and result.append.queue_offset == 125


# ---------------------------------------------------------------- 3. offsets never twice


@pytest.mark.parametrize("damage", ["zeros", "random bytes"])
async def test_offsets_of_records_a_crash_cut_are_not_handed_out_again(
    tmp_path: Path, damage: str
) -> None:
    """The last 5 records destroyed, then a crash: the log is cut before them, and the
    queue offsets they had stay taken (placeholders that pulls pass over): a consumer
    that read offset k never sees another message there."""
    config = small_config(tmp_path)
    async with open_store(config) as store:
        offsets = await put_many(store, 200, padding=100)
        end = store.commitlog_max_offset
        await store.wait_dispatched()
        seen = {q: read_queue(store, "T", q) for q in range(4)}  # what a consumer read
    data = bytes(end - offsets[195]) if damage == "zeros" else os.urandom(end - offsets[195])
    overwrite(tmp_path, offsets[195], data)
    crash(tmp_path)
    async with open_store(config) as store:
        report = store.recovery
        assert report is not None and report.commitlog_end == offsets[195]
        assert report.lost_offsets == {"T/3": (48, 50), **{f"T/{q}": (49, 50) for q in range(3)}}
        for q in range(4):
            assert store.max_offset_in_queue("T", q) == 50
            assert read_queue(store, "T", q) == [b for b in seen[q] if int(b[1:]) < 195]
        new = await put(store, message("T", queue_id=3, body=b"new."))
        assert new.append is not None and new.append.queue_offset == 50
        await store.wait_dispatched()
        assert read_queue(store, "T", 3, 48) == ["new"]  # placeholders passed over
        with pytest.raises(StoreError, match="lost in a crash"):
            store.look_message_by_offset(report.commitlog_end)
    shutil.rmtree(tmp_path / "consumequeue")  # the placeholders are in the log itself
    async with open_store(config) as store:
        assert store.max_offset_in_queue("T", 3) == 51
        assert read_queue(store, "T", 3, 47) == ["m191", "new"]


async def test_a_slave_takes_the_placeholders_with_the_log(tmp_path: Path) -> None:
    master_config = small_config(tmp_path / "master")
    async with open_store(master_config) as master:
        offsets = await put_many(master, 40, padding=100)
    overwrite(tmp_path / "master", offsets[38], bytes(600))
    crash(tmp_path / "master")
    async with open_store(master_config) as master:
        assert master.recovery is not None and master.recovery.lost_offsets
        await put_bodies(master, "T", ["after"], queues=1)
        data = bytes(master.get_data(0, master.commitlog_max_offset))
    async with open_store(small_config(tmp_path / "slave", role=BrokerRole.SLAVE)) as slave:
        slave.append_raw(0, data)
        await slave.wait_dispatched()
        # m38 and m39 (entry 9 of queues 2 and 3) are lost, their offsets kept
        assert [slave.max_offset_in_queue("T", q) for q in range(4)] == [11, 10, 10, 10]
        assert read_queue(slave, "T", 0, 9) == ["m36", "after"]
        assert read_queue(slave, "T", 2, 8) == ["m34"]


# ---------------------------------------------------------------- 4. damaged after a clean stop


@pytest.mark.parametrize("damage", ["zeros", "random bytes"])
async def test_a_damaged_tail_after_a_clean_stop_is_cut_as_after_a_crash(
    tmp_path: Path, damage: str, caplog: pytest.LogCaptureFixture
) -> None:
    config = small_config(tmp_path)
    async with open_store(config) as store:
        offsets = await put_many(store, 100, padding=100)
        end = store.commitlog_max_offset
    data = bytes(end - offsets[95]) if damage == "zeros" else os.urandom(end - offsets[95])
    overwrite(tmp_path, offsets[95], data)
    with caplog.at_level(logging.ERROR):
        async with open_store(config) as store:  # (it used to refuse to start)
            report = store.recovery
            assert report is not None and report.clean
            assert report.commitlog_end == offsets[95]
            assert sum(stop - first for first, stop in report.lost_offsets.values()) == 5
            assert len(read_topic(store, "T")) == 95
            assert (await put(store, message(body=b"new."))).status is (PutMessageStatus.PUT_OK)
    assert f"stopped cleanly at {end} but its records end at {offsets[95]}" in caplog.text
    if damage == "random bytes":
        [copy] = report.torn_copy
        assert copy.read_bytes().startswith(data[:100])
        assert f"commitlog cut at {offsets[95]}" in caplog.text


async def test_a_last_segment_cut_short_is_scanned_and_cut_where_its_records_end(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    config = small_config(tmp_path)
    async with open_store(config) as store:
        offsets = await put_many(store, 300, padding=1000)
    last = max((tmp_path / "commitlog").iterdir())
    start = int(last.name)
    in_last = [o for o in offsets if o >= start]
    middle = in_last[len(in_last) // 2]
    os.truncate(last, middle - start + 40)  # mid-record
    with caplog.at_level(logging.ERROR):
        async with open_store(config) as store:
            assert store.recovery is not None and store.recovery.commitlog_end == middle
            assert len(read_topic(store, "T")) == offsets.index(middle)
            lost = len(offsets) - offsets.index(middle)
            kept = store.recovery.lost_offsets.values()
            assert sum(stop - first for first, stop in kept) == lost
    assert last.stat().st_size == SEGMENT
    assert "it was cut short (truncated, or only partly copied)" in caplog.text


@pytest.mark.parametrize(
    ("case", "says"),
    [
        ("the only segment cut short", "either commitlog_segment_bytes was changed"),
        ("the size configuration changed", "the store was written with commitlog_segment"),
        ("a segment before the last cut short", "unlike the segments after it"),
    ],
)
async def test_a_segment_of_the_wrong_size_names_what_can_explain_it(
    tmp_path: Path, case: str, says: str
) -> None:
    config = small_config(tmp_path)
    async with open_store(config) as store:
        await put_many(store, 10 if case == "the only segment cut short" else 300)
    files = sorted((tmp_path / "commitlog").iterdir())
    if case == "the size configuration changed":
        config = small_config(tmp_path, commitlog_segment_bytes=2 * SEGMENT)
    else:
        os.truncate(files[0], 5000)
    with pytest.raises(StoreCorruptionError, match=says):
        await MessageStore(config).run()  # (it fails before it starts anything)


async def test_placeholders_are_on_disk_before_the_store_serves(tmp_path: Path) -> None:
    """A second crash right after recovery keeps the placeholders: they were synced,
    and they are records of the log, found again by the next crash scan."""
    config = small_config(tmp_path)
    async with open_store(config) as store:
        offsets = await put_many(store, 20, queues=1, padding=100)
    overwrite(tmp_path, offsets[18], bytes(400))
    crash(tmp_path)
    async with open_store(config) as store:
        assert store.max_offset_in_queue("T", 0) == 20
    crash(tmp_path)
    (tmp_path / "checkpoint").unlink()
    async with open_store(config) as store:
        assert store.max_offset_in_queue("T", 0) == 20
        assert read_queue(store, "T", 0, 17) == ["m17"]
