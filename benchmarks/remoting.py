"""Remoting round trips per second: hamq's server and client against plain Trio.

Every server runs in its own process; the load comes from this process. Servers:

  baseline-inline  plain Trio, a trivial codec, each frame answered inline in the
                   connection's read loop (the reference figure)
  baseline-task    plain Trio, one task spawned per request (what inline avoids)
  hamq             hamq.remoting.RemotingServer with a trivial inline processor

Load generators:

  raw   a plain-Trio pipelined client: keeps N frames in flight per connection and
        only counts responses, so the server is the bottleneck
  hamq  hamq.remoting.RemotingClient: N tasks each calling invoke() in a loop

Scenarios: one connection sequential (1 in flight), one connection with 64 in
flight, 8 connections with 8 in flight each; a 256-byte body; MSGPACK and JSON
headers. Each cell is measured ``--rounds`` times, interleaving the servers, and
the median is reported with the ratio hamq / baseline-inline side by side.

    python benchmarks/remoting.py               # full table (about 4 minutes)
    python benchmarks/remoting.py --quick       # one round, shorter cells
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import struct
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import msgpack
import trio

from hamq.protocol import (
    HAMQ_PROTOCOL_VERSION,
    RemotingCommand,
    ResponseCode,
    SerializeType,
    encode_frame,
)
from hamq.remoting import Dispatcher, RemotingClient, RemotingServer

BODY = b"x" * 256
CODE = 1
_PREFIX = struct.Struct(">iI")

SERVERS = ("baseline-inline", "baseline-task", "hamq")
CODECS = {"msgpack": SerializeType.MSGPACK, "json": SerializeType.JSON}
SCENARIOS = {  # name: (connections, in flight per connection)
    "sequential": (1, 1),
    "64-in-flight": (1, 64),
    "8-connections": (8, 8),
}


# =========================================================================== servers


def _baseline_codec(codec: str) -> tuple[Callable[[Any], Any], Callable[[dict[str, Any]], bytes]]:
    if codec == "json":

        def dumps(header: dict[str, Any]) -> bytes:
            header["serializeTypeCurrentRPC"] = "JSON"
            return json.dumps(header, separators=(",", ":"), sort_keys=True).encode()

        return json.loads, dumps
    return msgpack.unpackb, msgpack.packb


def _baseline_response(loads: Any, dumps: Any, st: int, header: bytes, body: bytes) -> bytes:
    request = loads(header)
    reply = {
        "code": 0,
        "flag": 1,
        "language": "PYTHON",
        "opaque": request["opaque"],
        "version": HAMQ_PROTOCOL_VERSION,
    }
    head = dumps(reply)
    return _PREFIX.pack(4 + len(head) + len(body), (st << 24) | len(head)) + head + body


def _split_frames(buf: bytearray) -> list[tuple[int, bytes, bytes]]:
    frames = []
    pos = 0
    while len(buf) - pos >= 8:
        length, word = _PREFIX.unpack_from(buf, pos)
        end = pos + 4 + length
        if len(buf) < end:
            break
        header_length = word & 0xFFFFFF
        start = pos + 8
        frames.append(
            (
                word >> 24,
                bytes(buf[start : start + header_length]),
                bytes(buf[start + header_length : end]),
            )
        )
        pos = end
    del buf[:pos]
    return frames


async def _serve_baseline_inline(codec: str, stream: trio.SocketStream) -> None:
    loads, dumps = _baseline_codec(codec)
    buf = bytearray()
    while data := await stream.receive_some(65536):
        buf += data
        out = [_baseline_response(loads, dumps, st, h, b) for st, h, b in _split_frames(buf)]
        if out:
            await stream.send_all(b"".join(out))


async def _serve_baseline_task(codec: str, stream: trio.SocketStream) -> None:
    loads, dumps = _baseline_codec(codec)
    lock = trio.Lock()

    async def answer(st: int, header: bytes, body: bytes) -> None:
        frame = _baseline_response(loads, dumps, st, header, body)
        async with lock:
            await stream.send_all(frame)

    buf = bytearray()
    async with trio.open_nursery() as nursery:
        while data := await stream.receive_some(65536):
            buf += data
            for st, header, body in _split_frames(buf):
                nursery.start_soon(answer, st, header, body)


async def serve(kind: str, codec: str) -> None:
    if kind == "hamq":
        dispatcher = Dispatcher()
        dispatcher.register(CODE, lambda request, conn: request.response_to(body=request.body))
        server = RemotingServer(dispatcher, host="127.0.0.1", port=0)
        async with trio.open_nursery() as nursery:
            port = await nursery.start(server.run)
            print(port, flush=True)
        return
    handler = _serve_baseline_inline if kind == "baseline-inline" else _serve_baseline_task
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    print(listeners[0].socket.getsockname()[1], flush=True)

    async def handle(stream: trio.SocketStream) -> None:
        try:
            await handler(codec, stream)
        except trio.BrokenResourceError:
            pass

    await trio.serve_listeners(handle, listeners)


# =========================================================================== load


async def _raw_connection(port: int, frame: bytes, window: int, stop_at: float) -> int:
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    count = 0
    outstanding = window
    buf = bytearray()
    await stream.send_all(frame * window)
    while outstanding:
        data = await stream.receive_some(65536)
        if not data:
            break
        buf += data
        done = 0
        pos = 0
        while len(buf) - pos >= 4:
            (length,) = struct.unpack_from(">i", buf, pos)
            if len(buf) - pos < 4 + length:
                break
            pos += 4 + length
            done += 1
        del buf[:pos]
        count += done
        outstanding -= done
        if done and trio.current_time() < stop_at:
            await stream.send_all(frame * done)
            outstanding += done
    await stream.aclose()
    return count


async def raw_load(port: int, codec: str, conns: int, window: int, duration: float) -> float:
    request = RemotingCommand.request(CODE, body=BODY, serialize_type=CODECS[codec])
    frame = encode_frame(request)
    counts: list[int] = []
    start = trio.current_time()
    stop_at = start + duration

    async def one() -> None:
        counts.append(await _raw_connection(port, frame, window, stop_at))

    async with trio.open_nursery() as nursery:
        for _ in range(conns):
            nursery.start_soon(one)
    return sum(counts) / (trio.current_time() - start)


async def hamq_load(port: int, codec: str, conns: int, window: int, duration: float) -> float:
    addr = f"127.0.0.1:{port}"
    st = CODECS[codec]
    count = 0
    stop_at = trio.current_time() + duration

    async def worker(client: RemotingClient) -> None:
        nonlocal count
        while trio.current_time() < stop_at:
            response = await client.invoke(
                addr, RemotingCommand.request(CODE, body=BODY, serialize_type=st), 5.0
            )
            assert response.code == ResponseCode.SUCCESS
            count += 1

    start = trio.current_time()
    async with trio.open_nursery() as clients:
        async with trio.open_nursery() as workers:
            for _ in range(conns):
                client = await clients.start(_open_client)
                for _ in range(window):
                    workers.start_soon(worker, client)
        clients.cancel_scope.cancel()
    return count / (trio.current_time() - start)


async def _open_client(*, task_status: trio.TaskStatus[RemotingClient]) -> None:
    async with RemotingClient() as client:
        task_status.started(client)
        await trio.sleep_forever()


async def measure(load: str, port: int, codec: str, scenario: str, duration: float) -> float:
    conns, window = SCENARIOS[scenario]
    if load == "raw":
        return await raw_load(port, codec, conns, window, duration)
    return await hamq_load(port, codec, conns, window, duration)


# =========================================================================== driver


def _cpu_seconds(pid: int) -> float | None:
    """User + system CPU time of a process (Linux /proc), or None elsewhere."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _pin(pid: int, cpu: int) -> None:
    if hasattr(os, "sched_setaffinity") and (os.cpu_count() or 1) >= 2:
        os.sched_setaffinity(pid, {cpu})


def start_server(kind: str, codec: str) -> tuple[subprocess.Popen[str], int]:
    proc = subprocess.Popen(
        [sys.executable, __file__, "_serve", kind, codec],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line:
        proc.kill()
        raise RuntimeError(f"server {kind}/{codec} did not start")
    _pin(proc.pid, 1)
    return proc, int(line)


def run_cell(
    kind: str, codec: str, load: str, scenario: str, duration: float
) -> tuple[float, float]:
    """(round trips per second, server CPU microseconds per round trip) of one cell."""
    proc, port = start_server(kind, codec)
    try:
        time.sleep(0.2)
        cpu_before = _cpu_seconds(proc.pid)
        wall_before = time.monotonic()
        rate = trio.run(measure, load, port, codec, scenario, duration)
        wall = time.monotonic() - wall_before
        cpu_after = _cpu_seconds(proc.pid)
        if cpu_before is None or cpu_after is None:
            return rate, math.nan
        return rate, 1e6 * (cpu_after - cpu_before) / (rate * wall)
    finally:
        proc.kill()
        proc.wait()


GOAL = ("msgpack", "raw", "64-in-flight")
GOAL_RATIO = 0.75


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--duration", type=float, default=2.0, help="seconds per cell")
    parser.add_argument("--rounds", type=int, default=3, help="measurements per cell (median)")
    parser.add_argument("--quick", action="store_true", help="one round of 1 s cells")
    parser.add_argument("--codec", choices=sorted(CODECS), action="append")
    parser.add_argument("--load", choices=("raw", "hamq"), action="append")
    args = parser.parse_args()
    if args.quick:
        args.duration, args.rounds = 1.0, 1
    codecs = args.codec or list(CODECS)
    loads = args.load or ["raw", "hamq"]
    _pin(0, 0)

    rates: dict[tuple[str, str, str, str], list[float]] = {}
    cpus: dict[tuple[str, str, str, str], list[float]] = {}
    for round_no in range(args.rounds):
        for codec in codecs:
            for load in loads:
                for scenario in SCENARIOS:
                    for kind in SERVERS:
                        key = (codec, load, scenario, kind)
                        rate, cpu_us = run_cell(kind, codec, load, scenario, args.duration)
                        rates.setdefault(key, []).append(rate)
                        cpus.setdefault(key, []).append(cpu_us)
                        print(
                            f"round {round_no + 1}: {codec:8} {load:5} {scenario:14} {kind:16}"
                            f" {rate:10,.0f} rt/s {cpu_us:7.2f} us server CPU/rt",
                            file=sys.stderr,
                        )

    print()
    print(
        f"Round trips per second (and server CPU microseconds per round trip), 256-byte body,"
        f" median of {args.rounds} x {args.duration:g} s; server and load in separate processes."
    )
    title = f"{'codec':8} {'load':5} {'scenario':14}" + "".join(f"{k:>24}" for k in SERVERS)
    print(title + f"{'hamq/inline':>13}")
    print("-" * (len(title) + 13))
    for codec in codecs:
        for load in loads:
            for scenario in SCENARIOS:
                keys = {k: (codec, load, scenario, k) for k in SERVERS}
                rate = {k: statistics.median(rates[keys[k]]) for k in SERVERS}
                cpu = {k: statistics.median(cpus[keys[k]]) for k in SERVERS}
                cells = "".join(f"{rate[k]:>15,.0f} ({cpu[k]:5.1f})" for k in SERVERS)
                ratio = rate["hamq"] / rate["baseline-inline"]
                print(f"{codec:8} {load:5} {scenario:14}{cells}{ratio:>12.0%}")
    goal = (*GOAL, "hamq")
    if goal in rates:
        ratio = statistics.median(rates[goal]) / statistics.median(
            rates[(*GOAL[:3], "baseline-inline")]
        )
        verdict = "meets" if ratio >= GOAL_RATIO else "MISSES"
        print(
            f"\nGoal: hamq's server at >= {GOAL_RATIO:.0%} of plain Trio inline"
            f" ({' '.join(GOAL)}): {ratio:.0%}, {verdict} the goal."
        )


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "_serve":
        trio.run(serve, sys.argv[2], sys.argv[3])
    else:
        main()
