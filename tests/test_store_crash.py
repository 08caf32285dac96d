"""A real store process killed with SIGKILL in the middle of appends, then recovered."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import trio

from hamq.protocol.record import decode_messages
from hamq.store import FlushDiskType, GetMessageStatus
from tests.support.store import open_store, small_config

ROOT = Path(__file__).resolve().parent.parent

WRITER = """
import sys, trio
from hamq.store import FlushDiskType, MessageStore, MessageToStore
sys.path.insert(0, sys.argv[3])
from tests.support.store import put, small_config

async def main():
    config = small_config(sys.argv[1], flush_disk_type=FlushDiskType(sys.argv[2]))
    store = MessageStore(config)
    async with trio.open_nursery() as nursery:
        await nursery.start(store.run)
        print("ready", flush=True)
        i = 0
        while True:
            body = f"record-{i}|".encode() + bytes(range(256)) * (1 + i % 7)
            result = await put(store,
                MessageToStore(topic="T", queue_id=i % 4, body=body, properties={"KEYS": f"k{i}"})
            )
            assert result.append is not None, result
            # the append has returned (and, with SYNC_FLUSH, its fsync too)
            print(i, result.append.queue_offset, flush=True)
            i += 1

trio.run(main)
"""


@pytest.mark.parametrize("flush", [FlushDiskType.SYNC_FLUSH, FlushDiskType.ASYNC_FLUSH])
async def test_every_returned_append_survives_kill_9(tmp_path: Path, flush: FlushDiskType) -> None:
    root = str(ROOT)
    proc = await trio.lowlevel.open_process(
        [sys.executable, "-c", WRITER, str(tmp_path), flush.value, root],
        stdout=subprocess.PIPE,
    )
    reported: list[tuple[int, int]] = []
    try:
        assert proc.stdout is not None
        buffer = b""
        with trio.fail_after(60):
            while len(reported) < 1500:  # several segments' worth, then kill mid-stream
                chunk = await proc.stdout.receive_some()
                assert chunk, "the writer exited on its own"
                buffer += chunk
                *lines, buffer = buffer.split(b"\n")
                reported += [tuple(map(int, line.split())) for line in lines if line != b"ready"]  # type: ignore[misc]
            os.kill(proc.pid, signal.SIGKILL)
            while chunk := await proc.stdout.receive_some():  # lines printed before the kill
                buffer += chunk
            *lines, _partial = buffer.split(b"\n")
            reported += [tuple(map(int, line.split())) for line in lines]  # type: ignore[misc]
            await proc.wait()
    finally:
        with trio.CancelScope(shield=True):
            if proc.returncode is None:
                os.kill(proc.pid, signal.SIGKILL)
                await proc.wait()
            if proc.stdout is not None:
                await proc.stdout.aclose()
    assert proc.returncode == -signal.SIGKILL
    assert (tmp_path / "abort").exists()  # it did not stop cleanly

    async with open_store(small_config(tmp_path, flush_disk_type=flush)) as store:
        report = store.recovery
        assert report is not None and not report.clean
        for i, queue_offset in reported:
            result = store.get_message("g", "T", i % 4, queue_offset, 1)
            assert result.status is GetMessageStatus.FOUND, (i, queue_offset, result.status)
            [record] = decode_messages(result.body)  # checks the body CRC
            assert record.body.startswith(f"record-{i}|".encode())
            assert record.keys == [f"k{i}"]
        # appends go on from where the log ends, with the next queue offsets
        last_i, last_offset = reported[-1]
        queue = last_i % 4
        assert store.max_offset_in_queue("T", queue) >= last_offset + 1
