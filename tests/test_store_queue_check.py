"""The consume queues judged against the CommitLog (hamq/store/queue_check.py), on the
files a real store wrote and stopped cleanly: what each check names, and what it leaves.
Recovery's use of it (rebuilds, placeholders) is tested in test_store_promises.py."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from hamq.store import StoreConfig, queue_check
from hamq.store.commitlog import CommitLog
from hamq.store.consume_queue import ENTRY, ENTRY_SIZE
from hamq.store.deletions import TopicDeletions
from hamq.store.queue_check import (
    check_consume_queues,
    lost_entries,
    remove_unloadable_queues,
    tail_start,
)
from hamq.store.reput import ConsumeQueueTable
from tests.support.store import open_store, put_many, small_config

#: 480 messages in 4 queues: 120 entries each, two files of 100 entries per queue
COUNT = 480
PER_FILE = 100

Loaded = tuple[CommitLog, ConsumeQueueTable, TopicDeletions]


async def written(tmp_path: Path) -> tuple[StoreConfig, list[int], int]:
    """A store with COUNT messages, stopped cleanly: its config, the records' CommitLog
    offsets (message i in queue i % 4, queue offset i // 4) and the log's end."""
    config = small_config(tmp_path, consume_queue_entries_per_file=PER_FILE)
    async with open_store(config) as store:
        offsets = await put_many(store, COUNT, padding=100)
        await store.wait_dispatched()
        end = store.commitlog_max_offset
    return config, offsets, end


@contextmanager
def loaded(config: StoreConfig, end: int) -> Iterator[Loaded]:
    """The stopped store's log (ending at ``end``), queues and deletions, loaded."""
    commitlog = CommitLog(config.commitlog_dir, config.commitlog_segment_bytes, lambda: 0)
    commitlog.load()
    commitlog.segments.set_end(end)
    queues = ConsumeQueueTable(config.consume_queue_dir, PER_FILE)
    queues.load()
    deletions = TopicDeletions(config.config_dir / "topicDeletions.json")
    deletions.load()
    try:
        yield commitlog, queues, deletions
    finally:
        queues.close()
        commitlog.close()


def overwrite_entry(config: StoreConfig, queue_id: int, index: int, data: bytes) -> None:
    start = index - index % PER_FILE
    path = config.consume_queue_dir / "T" / str(queue_id) / f"{start * ENTRY_SIZE:020d}"
    with path.open("r+b") as out:
        out.seek((index - start) * ENTRY_SIZE)
        out.write(data)


async def test_queues_written_by_the_store_match_its_log(tmp_path: Path) -> None:
    config, _offsets, end = await written(tmp_path)
    with loaded(config, end) as (commitlog, queues, deletions):
        assert sorted(queues.queues) == [("T", 0), ("T", 1), ("T", 2), ("T", 3)]
        assert all(q.max_offset == COUNT // 4 for q in queues.queues.values())
        assert check_consume_queues(commitlog, queues, end, deletions) == {}
        assert lost_entries(queues, end, end) == {}
    assert remove_unloadable_queues(config.consume_queue_dir, PER_FILE) == []


async def test_a_last_entry_pointing_at_another_record_is_named(tmp_path: Path) -> None:
    config, offsets, end = await written(tmp_path)
    # queue 1's last entry (queue offset 119: message 477) points at message 476's record
    size = offsets[478] - offsets[477]
    overwrite_entry(config, 1, 119, ENTRY.pack(offsets[476], size, 0))
    with loaded(config, end) as (commitlog, queues, deletions):
        problems = check_consume_queues(commitlog, queues, end, deletions)
    assert problems == {
        ("T", 1): f"entry 119 is ({offsets[476]}, {size}, 0), the record is at "
        f"{offsets[477]}+{size}"
    }


async def test_an_empty_entry_ending_a_file_is_named_from_the_queue_files_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Queue 2's entry 99 (the last of its first file) zeroed, far from the log's tail
    (the window checks the last 2 records only): the queue's own files show the hole."""
    config, offsets, end = await written(tmp_path)
    monkeypatch.setattr(queue_check, "TAIL_CHECK_BYTES", end - offsets[COUNT - 2])
    overwrite_entry(config, 2, 99, bytes(ENTRY_SIZE))
    with loaded(config, end) as (commitlog, queues, deletions):
        problems = check_consume_queues(commitlog, queues, end, deletions)
    assert problems == {("T", 2): "entry 99 is empty"}


async def test_entries_past_the_logs_end_are_lost_entries_of_their_queues(
    tmp_path: Path,
) -> None:
    """The log cut before message 470: messages 470-479 (queue offsets 117 to 119)
    are entries whose records are gone."""
    config, offsets, end = await written(tmp_path)
    with loaded(config, end) as (_commitlog, queues, _deletions):
        lost = lost_entries(queues, offsets[470], end)
        assert {key: (e.first, e.count) for key, e in lost.items()} == {
            ("T", 0): (118, 2),  # messages 472, 476
            ("T", 1): (118, 2),  # 473, 477
            ("T", 2): (117, 3),  # 470, 474, 478
            ("T", 3): (117, 3),  # 471, 475, 479
        }
        assert lost[("T", 2)].at == offsets[470]
        # entries pointing past the space the segments had are not records: not lost
        assert lost_entries(queues, offsets[470], offsets[470]) == {}


async def test_a_queue_directory_whose_files_cannot_load_is_removed(tmp_path: Path) -> None:
    config, _offsets, _end = await written(tmp_path)
    root = config.consume_queue_dir / "T"
    with (root / "3" / f"{0:020d}").open("r+b") as out:
        out.truncate(PER_FILE * ENTRY_SIZE - 1)
    assert remove_unloadable_queues(config.consume_queue_dir, PER_FILE) == ["T/3"]
    assert sorted(p.name for p in root.iterdir()) == ["0", "1", "2"]


async def test_the_tail_starts_at_a_record_inside_the_window(tmp_path: Path) -> None:
    config, offsets, end = await written(tmp_path)
    with loaded(config, end) as (commitlog, queues, _deletions):
        window = end - offsets[430] + 10  # a little more than the last 50 records
        start = tail_start(commitlog, queues, end, window)
        assert start in offsets and end - window <= start <= offsets[430]
        assert tail_start(commitlog, queues, end, end) == commitlog.min_offset
