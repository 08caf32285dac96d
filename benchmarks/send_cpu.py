"""The broker's CPU per send, without the noise of sockets and a client: a broker in this
process (ASYNC_MASTER, ASYNC_FLUSH), fed pre-encoded SEND_MESSAGE_V2 frames with JSON
headers and 1 KiB bodies — the requests a RocketMQ client makes, one message each — in
chunks of ``--group`` frames, as the connection's reader feeds them: decoded,
dispatched, stored, answered (into a socket pair this script drains), dispatched to
the consume queues and the index. The figure is this process's CPU time (every thread:
the fsyncs too) over the sends; a stable figure to compare changes of the send path by
(a few per cent between runs here, where the peers harness moves 10-30 %).

Run by hand: ``python benchmarks/send_cpu.py [--sends N] [--group G] [--profile]``
(about 2 s; ``--profile``: cProfile's 30 costliest functions, which it slows 3x).
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import socket
import sys
import tempfile
import time
from pathlib import Path

ROOT = str(Path(__file__).resolve().parent.parent)
sys.path.insert(0, ROOT)

import trio  # noqa: E402

from hamq.protocol import SerializeType, encode_frame  # noqa: E402
from hamq.protocol.frame import FrameDecoder  # noqa: E402
from hamq.remoting import Connection, RemotingConfig  # noqa: E402
from hamq.remoting.trio_stream import TrioByteStream  # noqa: E402
from tests.support.brokers import create_topic, namesrv, running_broker, send_request  # noqa: E402

TOPIC, QUEUES, BODY = "SendCpu", 8, b"x" * 1024


def frames(count: int) -> list[bytes]:
    """``count`` sends to the topic's queues in turn, as hamq's 1/req client encodes them."""
    out = []
    for i in range(count):
        request = send_request(
            TOPIC, BODY, queue_id=i % QUEUES, UNIQ_KEY=f"7F0000010001{i:020X}", WAIT="true"
        )
        request.opaque = i
        request.serialize_type = SerializeType.JSON
        out.append(encode_frame(request))
    return out


async def measure(sends: int, group: int, profiler: cProfile.Profile | None) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        store = {"commitlog_segment_bytes": 1 << 30}
        async with running_broker(Path(tmp) / "store", store=store) as node:
            await create_topic(namesrv(node), TOPIC, QUEUES)
            ours, theirs = trio.socket.socketpair()
            ours.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
            dispatcher = node.server.dispatcher
            conn = Connection(
                TrioByteStream(trio.SocketStream(theirs)),
                peer="127.0.0.1:5555",
                dispatcher=dispatcher,
                config=RemotingConfig(),
            )
            encoded = frames(64)
            chunks = [b"".join(encoded[i : i + group]) for i in range(0, 64 - group + 1, group)]
            decoder = FrameDecoder()

            async def drain() -> None:
                while True:
                    await ours.recv(1 << 20)

            async with trio.open_nursery() as nursery:
                nursery.start_soon(drain)
                started = time.process_time()
                if profiler is not None:
                    profiler.enable()
                done = 0
                while done < sends:
                    for chunk in chunks:  # (what Connection._read_loop does with a chunk)
                        decoder.feed(chunk)
                        conn._in_read_batch = True
                        for command in decoder.commands():
                            dispatcher.dispatch(command, conn)
                        conn._end_group()
                        conn._in_read_batch = False
                        if conn._out:
                            conn._write_now()
                        done += group
                    await trio.lowlevel.checkpoint()
                await node.store.wait_dispatched()
                if profiler is not None:
                    profiler.disable()
                seconds = time.process_time() - started
                nursery.cancel_scope.cancel()
    return seconds / done


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sends", type=int, default=30_000)
    parser.add_argument("--group", type=int, default=10, help="frames per read (1..64)")
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args()
    if not 1 <= args.group <= 64:
        parser.error(f"--group {args.group} is not in 1..64")
    profiler = cProfile.Profile() if args.profile else None
    per_send = trio.run(measure, args.sends, args.group, profiler)
    print(f"{args.sends:,} sends in reads of {args.group}: {per_send * 1e6:.1f} us CPU a send")
    if profiler is not None:
        pstats.Stats(profiler).sort_stats("tottime").print_stats(30)


if __name__ == "__main__":
    main()
