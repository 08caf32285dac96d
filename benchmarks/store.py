"""Message store throughput, side by side with plain files in the same run.

- async flush: appends of 256 B and 4 KiB bodies, one appender, against writing the
  same record bytes to a plain file (buffered writes, one fsync at the end). Two
  store figures: the appends themselves (CommitLog writes, what a producer waits
  for; the goal is >= 50 % of the plain file's MB/s at 4 KiB), and the sustained
  rate once the dispatch task has also built consume queues and index for them (in
  one Python process both share a core). Each timed phase starts after os.sync(), so
  writeback left over from the previous phase does not slow it down.
- sync flush: 64 concurrent appenders (group commit) against the same store doing
  what an ideal group commit would: 64 appends, then one fsync (goal: within 2x).
  A plain file written 64 records per fsync is shown as well, for scale.
- reads: get_message of 32 messages at a time.
- the mmap/pread choice: segment writes by mmap slice assignment vs os.pwrite, reads
  by memoryview vs os.pread.

Every figure is the median of ``--rounds`` runs; the store and the plain files live in
one temporary directory on the same filesystem (``--dir`` to choose it).

    python benchmarks/store.py              # full run
    python benchmarks/store.py --quick      # fewer messages, one round
"""

from __future__ import annotations

import argparse
import mmap
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import trio
from support import median

from hamq.protocol.message import encode_properties, pack_host
from hamq.protocol.record import make_record_template
from hamq.store import FlushDiskType, MessageStore, MessageToStore, StoreConfig

MIB = 1024 * 1024
PROPERTIES = {"TAGS": "bench", "KEYS": "key", "UNIQ_KEY": "7F0000010001000000000000000000AB"}


def _config(directory: Path, flush: FlushDiskType) -> StoreConfig:
    return StoreConfig(
        store_dir=directory,
        flush_disk_type=flush,
        commitlog_segment_bytes=256 * MIB,
        index_hash_slots=1_000_003,
        index_max_entries=4_000_000,
    )


def _message(body: bytes, i: int) -> MessageToStore:
    return MessageToStore(topic="BenchTopic", queue_id=i % 8, body=body, properties=PROPERTIES)


def _record_bytes(body: bytes) -> bytes:
    template = make_record_template(
        topic="BenchTopic",
        queue_id=0,
        body=body,
        properties=encode_properties(PROPERTIES),
        born_host=pack_host("127.0.0.1", 0),
        store_host=pack_host("127.0.0.1", 10911),
    )
    return template.encode(queue_offset=0, physical_offset=0, store_timestamp=0)


# ---------------------------------------------------------------- store side


async def store_appends(directory: Path, count: int, body_size: int) -> tuple[float, float, int]:
    """(seconds for the appends, seconds until also dispatched and flushed, bytes).

    The appends run back to back (put_message_nowait, as the broker's inline send
    processor calls it), so the dispatch task runs after them and the two costs can
    be told apart; the second figure is the sustained rate of both.
    """
    body = os.urandom(body_size)
    messages = [_message(body, i) for i in range(count)]
    store = MessageStore(_config(directory, FlushDiskType.ASYNC_FLUSH))
    async with trio.open_nursery() as nursery:
        await nursery.start(store.run)
        await trio.to_thread.run_sync(os.sync)  # no writeback left over from before
        start = time.perf_counter()
        for message in messages:
            store.put_message_nowait(message)
        appended = time.perf_counter() - start
        await store.wait_dispatched()
        assert store.flush is not None
        await store.flush.flush_commitlog()
        sustained = time.perf_counter() - start
        stored = store.commitlog_max_offset
        nursery.cancel_scope.cancel()
    return appended, sustained, stored


async def store_group_commit(directory: Path, count: int, appenders: int) -> tuple[float, float]:
    """(seconds for ``count`` SYNC_FLUSH puts of 1 KiB from ``appenders`` tasks, seconds
    for the same store doing ``appenders`` appends then one fsync, ``count`` times over)."""
    body = os.urandom(1024)
    store = MessageStore(_config(directory, FlushDiskType.SYNC_FLUSH))
    async with trio.open_nursery() as nursery:
        await nursery.start(store.run)
        assert store.flush is not None

        async def appender(k: int) -> None:
            for i in range(k, count, appenders):
                message = _message(body, i)
                ticket = store.durability.ticket(message.wait_store_ok)
                result = store.put_message_nowait(message)
                assert ticket is not None and result.append is not None, result
                status, remark = await ticket.result(result.append.end_offset)
                assert status.value == "PUT_OK", remark

        start = time.perf_counter()
        async with trio.open_nursery() as workers:
            for k in range(appenders):
                workers.start_soon(appender, k)
        group = time.perf_counter() - start
        start = time.perf_counter()
        for first in range(0, count, appenders):
            for i in range(first, min(count, first + appenders)):
                store.put_message_nowait(_message(body, i))
            await store.flush.flush_commitlog()
        batched = time.perf_counter() - start
        nursery.cancel_scope.cancel()
    return group, batched


async def store_reads(directory: Path, count: int) -> float:
    """Seconds to read back ``count`` 256 B messages 32 at a time (after a put phase)."""
    body = os.urandom(256)
    store = MessageStore(_config(directory, FlushDiskType.ASYNC_FLUSH))
    async with trio.open_nursery() as nursery:
        await nursery.start(store.run)
        for _ in range(count):
            store.put_message_nowait(MessageToStore(topic="R", queue_id=0, body=body))
        await store.wait_dispatched()
        start = time.perf_counter()
        offset = 0
        while offset < count:
            result = store.get_message("g", "R", 0, offset, 32)
            _ = result.body
            offset = result.next_begin_offset
        elapsed = time.perf_counter() - start
        nursery.cancel_scope.cancel()
    return elapsed


# ---------------------------------------------------------------- plain files


def plain_appends(path: Path, record: bytes, count: int) -> float:
    os.sync()  # no writeback left over from before
    start = time.perf_counter()
    with open(path, "wb") as out:
        for _ in range(count):
            out.write(record)
        out.flush()
        os.fdatasync(out.fileno())
    return time.perf_counter() - start


def plain_fsync_per_batch(path: Path, record: bytes, count: int, batch: int) -> float:
    os.sync()
    start = time.perf_counter()
    with open(path, "wb") as out:
        for done in range(0, count, batch):
            for _ in range(min(batch, count - done)):
                out.write(record)
            out.flush()
            os.fdatasync(out.fileno())
    return time.perf_counter() - start


def mmap_vs_pread(path: Path, size: int, segment: int) -> dict[str, float]:
    """Microseconds per record for the four ways of writing and reading a segment."""
    record = os.urandom(size)
    n = segment // size - 1
    out: dict[str, float] = {}
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    os.posix_fallocate(fd, 0, segment)
    mm = mmap.mmap(fd, segment)
    start = time.perf_counter()
    for i in range(n):
        mm[i * size : (i + 1) * size] = record
    out["mmap write"] = (time.perf_counter() - start) / n * 1e6
    view = memoryview(mm)
    start = time.perf_counter()
    for i in range(n):
        chunk = view[i * size : (i + 1) * size]
    out["mmap read"] = (time.perf_counter() - start) / n * 1e6
    chunk.release()
    view.release()
    mm.close()
    start = time.perf_counter()
    for i in range(n):
        os.pwrite(fd, record, i * size)
    out["pwrite"] = (time.perf_counter() - start) / n * 1e6
    start = time.perf_counter()
    for i in range(n):
        os.pread(fd, size, i * size)
    out["pread"] = (time.perf_counter() - start) / n * 1e6
    os.close(fd)
    path.unlink()
    return out


# ---------------------------------------------------------------- driver


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="fewer messages, one round")
    parser.add_argument("--dir", type=Path, default=None, help="where the files go")
    args = parser.parse_args()
    scale = 0.2 if args.quick else 1.0
    rounds = 1 if args.quick else args.rounds
    counts = {256: int(200_000 * scale), 4096: int(50_000 * scale)}
    group_count = int(20_000 * scale)
    read_count = int(100_000 * scale)
    base = Path(tempfile.mkdtemp(prefix="hamq-bench-", dir=args.dir))

    def fresh(name: str) -> Path:
        path = base / name
        shutil.rmtree(path, ignore_errors=True)
        return path

    rows: dict[str, list[float]] = {}

    def add(key: str, value: float) -> None:
        rows.setdefault(key, []).append(value)

    try:
        for round_no in range(rounds):
            for size, count in counts.items():
                appended, sustained, stored = trio.run(store_appends, fresh("store"), count, size)
                add(f"store {size}", appended)
                add(f"sustained {size}", sustained)
                add(f"store {size} bytes", stored)
                record = _record_bytes(os.urandom(size))
                add(f"plain {size}", plain_appends(fresh("plain.bin"), record, count))
                add(f"plain {size} bytes", len(record) * count)
            group, batched = trio.run(store_group_commit, fresh("store"), group_count, 64)
            add("group", group)
            add("store batch", batched)
            record = _record_bytes(os.urandom(1024))
            add("batch fsync", plain_fsync_per_batch(fresh("batch.bin"), record, group_count, 64))
            add("reads", trio.run(store_reads, fresh("store"), read_count))
            for size in (256, 4096):
                for name, value in mmap_vs_pread(base / "mm.bin", size, 64 * MIB).items():
                    add(f"{name} {size}", value)
            print(f"round {round_no + 1} done", flush=True)
    finally:
        shutil.rmtree(base, ignore_errors=True)

    m: Callable[[str], float] = lambda key: median(rows[key])  # noqa: E731
    print(f"\nMessage store, median of {rounds} round(s)\n")
    print(
        f"{'async flush, 1 appender':24}{'appends/s':>11}{'MB/s':>7}{'plain MB/s':>12}"
        f"{'ratio':>7}{'   with dispatch: msgs/s':>25}{'MB/s':>7}{'ratio':>7}"
    )
    ratios = {}
    for size, count in counts.items():
        stored = m(f"store {size} bytes") / MIB
        plain_mbs = m(f"plain {size} bytes") / MIB / m(f"plain {size}")
        append_mbs = stored / m(f"store {size}")
        sustained_mbs = stored / m(f"sustained {size}")
        ratios[size] = append_mbs / plain_mbs
        print(
            f"{f'{size} B bodies':24}{count / m(f'store {size}'):>11,.0f}{append_mbs:>7,.0f}"
            f"{plain_mbs:>12,.0f}{append_mbs / plain_mbs:>7.0%}"
            f"{count / m(f'sustained {size}'):>25,.0f}{sustained_mbs:>7,.0f}"
            f"{sustained_mbs / plain_mbs:>7.0%}"
        )
    group_rate = group_count / m("group")
    batch_rate = group_count / m("store batch")
    plain_rate = group_count / m("batch fsync")
    slowdown = batch_rate / group_rate
    print(
        f"\nsync flush, 64 appenders, 1 KiB bodies: group commit {group_rate:,.0f} msgs/s; the same"
        f" store with 64 appends per fsync {batch_rate:,.0f} msgs/s ({slowdown:.2f}x);"
        f" a plain file with 64 records per fsync {plain_rate:,.0f} msgs/s"
    )
    print(f"reads, 32 x 256 B per get_message: {read_count / m('reads'):,.0f} msgs/s")
    print("\nsegment I/O, microseconds per record:")
    for size in (256, 4096):
        cells = ", ".join(
            f"{name} {m(f'{name} {size}'):.2f}"
            for name in ("mmap write", "pwrite", "mmap read", "pread")
        )
        print(f"  {size:5} B: {cells}")
    print(
        f"\nGoals: 4 KiB appends at {ratios[4096]:.0%} of the plain file's MB/s (goal >= 50%): "
        f"{'meets' if ratios[4096] >= 0.5 else 'MISSES'}; group commit {slowdown:.2f}x of one "
        f"fsync per batch (goal <= 2x): {'meets' if slowdown <= 2 else 'MISSES'}."
    )


if __name__ == "__main__":
    main()
