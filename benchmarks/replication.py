"""Replication: sends on ASYNC_MASTER and SYNC_MASTER with one slave, a slave's catch-up.

Every broker and nameserver is a real ``python -m cli.main`` process on 127.0.0.1 (free
ports, stores in a temporary directory removed at the end, every process stopped by PID:
SIGTERM, then SIGKILL); producers, probes and the loopback baselines run in this process.
Each group has its own nameserver. Measured, each round:

  send, 64 in flight   an ASYNC_MASTER group and a SYNC_MASTER group (one slave each,
                       both alive the whole run, rounds alternating between them): one
                       Producer, 64 tasks sending 1 KiB bodies to a fresh topic of 8
                       queues; msgs/s, MB/s of bodies, p50/p99 latency, the send statuses
                       seen, CPU per message of master, slave and client (this process).
                       Meanwhile the master's GET_BROKER_HA_STATUS is polled every 100 ms:
                       the slave's lag_bytes (master max offset - slave ack), the same in
                       milliseconds of the master's append rate, and lag_s (the master's
                       figure: how long ago the oldest byte the slave has not acked was
                       sent), median and max.
  catch-up             a master (no slave) filled once with ~1 GiB of CommitLog (16 KiB
                       bodies, batches of 32), then, each round, a slave started with an
                       empty store (``sync_from_last_file = false``: from offset 0):
                       MB/s from the slave's ready line until its max offset
                       (GET_BROKER_HA_STATUS ``slave.max_offset``) is the master's, and
                       until its dispatch (consume queues and index, from
                       GET_BROKER_RUNTIME_INFO ``dispatched_offset``) has caught up too.
  loopback TCP         the same number of bytes from this process to a plain-Trio
                       receiver process (``receive_some(256 KiB)``, discarded): plain Trio
                       ``send_all`` of 32 KiB (what the master's writer does: one
                       ``transfer_batch_bytes`` a call) -- the baseline the catch-up goal
                       uses; the same with the receiver also appending what it gets to a
                       new posix_fallocate'd file, through a shared map (as the store's
                       segments are written) or with os.pwrite -- what a slave cannot
                       avoid; and, for scale, blocking sockets in two threads
                       (``sendall``/``recv_into`` of 1 MiB).

Goals (from the issue): SYNC_MASTER at >= 50 % of ASYNC_MASTER's msgs/s at 64 in flight;
catch-up at >= 50 % of the plain-Trio loopback MB/s of the same run. Figures are medians
over ``--rounds``; MB is 2^20 bytes.

    python benchmarks/replication.py            # full run (~2 minutes on 2 cores)
    python benchmarks/replication.py --quick    # 128 MiB log, fewer messages, one round
    python benchmarks/replication.py --profile DIR   # brokers under cProfile, DIR/*.prof
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import platform
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import attrs
import trio
from support import cpu_seconds, create_topic, median, percentile, wait_ready, write_toml

from hamq.client import Message, Producer, SendError, SendStatus
from hamq.protocol import RemotingCommand, RequestCode
from hamq.remoting import RemotingClient

KIB = 1024
MIB = 1024 * KIB
GIB = 1024 * MIB
BODY_SIZE = 1 * KIB
IN_FLIGHT = 64
QUEUES = 8
FILL_BODY_SIZE = 16 * KIB
FILL_BATCH = 32
FILL_SENDERS = 2
LAG_POLL_S = 0.1
CATCH_UP_POLL_S = 0.02
CHUNK = 32 * KIB  # plain-Trio baseline: one send_all per transfer_batch_bytes
SINK_RECEIVE = 256 * KIB  # what the slave's receive_some asks for
THREAD_CHUNK = 1 * MIB
STOP_TIMEOUT_S = 10.0
CATCH_UP_TIMEOUT_S = 600.0
GOAL_SYNC_RATIO = 0.5
GOAL_CATCH_UP_RATIO = 0.5
REPO = Path(__file__).resolve().parent.parent

ROLES = ("ASYNC_MASTER", "SYNC_MASTER")

#: loopback baselines: what the catch-up goal compares with first, then the others
TRIO = "loopback TCP, plain Trio, 32 KiB send_all"
THREADS = "loopback TCP, 2 threads, 1 MiB sendall"
TRIO_MMAP = "  + receiver writes a new file, mmap"
TRIO_PWRITE = "  + receiver writes a new file, pwrite"
BASELINES = (TRIO, TRIO_MMAP, TRIO_PWRITE, THREADS)

#: store files of the send groups: small, they hold a few hundred thousand 1 KiB messages
SEND_STORE = {
    "commitlog_segment_bytes": 64 * MIB,
    "consume_queue_entries_per_file": 100_000,
    "index_hash_slots": 100_003,
    "index_max_entries": 400_000,
}
#: the catch-up log: 256 MiB segments; the index holds two keys a message of ~65,000
#: (a full index file would roll over to a new one, which is fine too)
CATCH_UP_STORE = {
    "commitlog_segment_bytes": 256 * MIB,
    "consume_queue_entries_per_file": 100_000,
    "index_hash_slots": 100_003,
    "index_max_entries": 200_000,
}


@attrs.frozen
class Sizes:
    sends: int  # messages per role and round, 64 in flight
    log_bytes: int  # the catch-up CommitLog


@attrs.frozen
class SendFigure:
    messages: int
    seconds: float
    latencies: list[float]
    statuses: Counter[str]
    lag_bytes: list[int]
    lag_s: list[float]
    appended_per_s: float  # CommitLog bytes a second on the master during the run
    master_cpu: float
    slave_cpu: float
    client_cpu: float  # this process: the producer (and the lag probe)


@attrs.frozen
class CatchUpFigure:
    bytes: int  # what the slave received after its ready line
    seconds: float  # ready line -> slave max offset == master's
    dispatch_seconds: float  # ready line -> slave dispatched offset == master's
    spawn_seconds: float  # process start -> ready line
    master_cpu: float  # while replicating
    slave_cpu: float  # while replicating and dispatching
    sessions: int  # HA sessions the slave opened (1 unless one failed)
    last_error: str | None  # why the last one failed, if one did


@attrs.frozen
class Group:
    role: str
    namesrv: str
    master: str
    master_pid: int
    slave: str
    slave_pid: int


# =========================================================================== processes


class Processes:
    """Every process this benchmark starts; each is stopped by its PID."""

    def __init__(self, base: Path, profile_dir: Path | None) -> None:
        self.base = base
        self.profile_dir = profile_dir
        self.started: list[tuple[str, subprocess.Popen[str]]] = []

    def start(self, name: str, args: list[str]) -> tuple[subprocess.Popen[str], str]:
        """``hamq <args>`` until its ``hamq ... ready:`` line; (process, that line)."""
        python = [sys.executable]
        if self.profile_dir is not None and args[0] == "broker":
            python += ["-m", "cProfile", "-o", str(self.profile_dir / f"{name}.prof")]
        command = [*python, "-m", "cli.main", "--log-level", "warning", *args]
        with open(self.base / f"{name}.stderr", "w") as stderr:
            proc = subprocess.Popen(
                command, cwd=REPO, stdout=subprocess.PIPE, stderr=stderr, text=True
            )
        self.started.append((name, proc))
        try:
            return proc, wait_ready(name, proc)
        except BaseException:
            self.stop(proc)
            raise

    def stop(self, proc: subprocess.Popen[str]) -> int:
        """SIGTERM (a clean shutdown; a profile is written), SIGKILL after STOP_TIMEOUT_S."""
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                print(
                    f"pid {proc.pid} did not stop in {STOP_TIMEOUT_S:g} s: killed", file=sys.stderr
                )
                proc.kill()
                proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()
        return proc.returncode

    def stop_all(self) -> None:
        """Newest first: brokers before the nameservers they unregister from."""
        for _, proc in reversed(self.started):
            self.stop(proc)

    def report(self) -> list[str]:
        """Exit codes other than 0 and stderr lines of every process, for the end."""
        lines = []
        for name, proc in self.started:
            code = proc.returncode
            try:
                text = (self.base / f"{name}.stderr").read_text().strip()
            except OSError:
                text = ""
            err = [line for line in text.splitlines() if not _expected(line)]
            hidden = len(text.splitlines()) - len(err)
            if code in (0, None) and not err:
                continue
            lines.append(
                f"{name} (pid {proc.pid}) exited with code {code}"
                + (f"; {hidden} expected line(s) not shown" if hidden else "")
            )
            lines += [f"    {line}" for line in err[:15]]
            if len(err) > 15:
                lines.append(f"    ... {len(err) - 15} more line(s)")
        return lines


def _expected(line: str) -> bool:
    """A master's warning that a slave this benchmark stopped has gone."""
    return "WARNING hamq.ha.master: HA slave" in line and "dropped: closed the connection" in line


def start_nameserver(procs: Processes, name: str) -> str:
    _, line = procs.start(name, ["nameserver", "--port", "0"])
    return line.rsplit(" ", 1)[1]  # "hamq nameserver ready: 127.0.0.1:PORT"


def start_broker(
    procs: Processes,
    name: str,
    *,
    namesrv: str,
    role: str,
    store_dir: Path,
    store: dict[str, int],
) -> tuple[subprocess.Popen[str], str]:
    """A broker of group ``bench``: the master (broker_id 0) or its slave (role SLAVE)."""
    config = write_toml(
        procs.base / f"{name}.toml",
        {
            "broker_name": "bench",
            "broker_id": 1 if role == "SLAVE" else 0,
            "listen_port": 0,
            "namesrv_addrs": [namesrv],
            "store": {"store_dir": str(store_dir), "role": role, **store},
            # a slave with nothing starts at the master's first byte, not its last segment
            # (classic replication: the master's setting decides)
            "ha": {"sync_from_last_file": False},
        },
    )
    proc, line = procs.start(name, ["broker", "-c", str(config)])
    # "hamq broker ready: broker NAME at ADDR, nameserver NS, store DIR"
    return proc, line.split(" at ", 1)[1].split(",", 1)[0]


# =========================================================================== probes


async def _request(client: RemotingClient, addr: str, code: RequestCode) -> dict[str, Any]:
    response = await client.invoke(addr, RemotingCommand.request(code), 5.0)
    body: dict[str, Any] = json.loads(response.body)
    return body


async def ha_status(client: RemotingClient, addr: str) -> dict[str, Any]:
    return await _request(client, addr, RequestCode.GET_BROKER_HA_STATUS)


async def dispatched_offset(client: RemotingClient, addr: str) -> int:
    table = (await _request(client, addr, RequestCode.GET_BROKER_RUNTIME_INFO))["table"]
    return int(table["dispatched_offset"])


async def wait_in_sync(master: str) -> None:
    """Until the master has a slave in sync (it connected and acked)."""
    async with RemotingClient() as client:
        with trio.fail_after(30):
            while True:
                slaves = (await ha_status(client, master))["master"]["slaves"]
                if slaves and slaves[0]["in_sync"]:
                    return
                await trio.sleep(0.05)


# =========================================================================== send, 64 in flight


def start_group(procs: Processes, role: str) -> Group:
    tag = role.split("_")[0].lower()
    namesrv = start_nameserver(procs, f"{tag}-nameserver")
    master, master_addr = start_broker(
        procs,
        f"{tag}-master",
        namesrv=namesrv,
        role=role,
        store_dir=procs.base / f"{tag}-master",
        store=SEND_STORE,
    )
    slave, slave_addr = start_broker(
        procs,
        f"{tag}-slave",
        namesrv=namesrv,
        role="SLAVE",
        store_dir=procs.base / f"{tag}-slave",
        store=SEND_STORE,
    )
    trio.run(wait_in_sync, master_addr)
    return Group(role, namesrv, master_addr, master.pid, slave_addr, slave.pid)


async def send_round(group: Group, round_no: int, count: int) -> SendFigure:
    topic = f"BenchReplication{round_no}"
    await create_topic(group.namesrv, topic, QUEUES)
    body = os.urandom(BODY_SIZE)
    statuses: Counter[str] = Counter()
    latencies: list[float] = []
    lag_bytes: list[int] = []
    lag_s: list[float] = []
    offsets: list[tuple[float, int]] = []

    async def send(n: int, record: bool) -> None:
        left = n

        async def sender() -> None:
            nonlocal left
            while left > 0:
                left -= 1
                start = time.perf_counter()
                try:
                    result = await producer.send(Message(topic, body))
                except SendError as exc:
                    status = f"error: {type(exc).__name__}"
                else:
                    status = result.status.value
                if record:
                    latencies.append(time.perf_counter() - start)
                    statuses[status] += 1

        async with trio.open_nursery() as nursery:
            for _ in range(IN_FLIGHT):
                nursery.start_soon(sender)

    async def sample_lag(client: RemotingClient) -> None:
        while True:
            status = (await ha_status(client, group.master))["master"]
            offsets.append((time.perf_counter(), status["max_offset"]))
            if status["slaves"]:
                slave = status["slaves"][0]
                lag_bytes.append(slave["lag_bytes"])
                lag_s.append(slave["lag_s"])
            else:
                statuses["(no slave connected at a lag sample)"] += 1
            await trio.sleep(LAG_POLL_S)

    async with Producer(f"{topic}-producer", group.namesrv) as producer, RemotingClient() as probe:
        await send(2 * IN_FLIGHT, record=False)  # warm up: route, connection, first writes
        master_before, slave_before = cpu_seconds(group.master_pid), cpu_seconds(group.slave_pid)
        client_before = time.process_time()
        start = time.perf_counter()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(sample_lag, probe)
            await send(count, record=True)
            seconds = time.perf_counter() - start
            nursery.cancel_scope.cancel()
        master_cpu = cpu_seconds(group.master_pid) - master_before
        slave_cpu = cpu_seconds(group.slave_pid) - slave_before
        client_cpu = time.process_time() - client_before
    (t0, first), (t1, last) = offsets[0], offsets[-1]
    return SendFigure(
        count,
        seconds,
        latencies,
        statuses,
        lag_bytes,
        lag_s,
        (last - first) / (t1 - t0) if t1 > t0 else float("nan"),
        master_cpu,
        slave_cpu,
        client_cpu,
    )


# =========================================================================== catch-up


async def fill(namesrv: str, master: str, target: int) -> tuple[int, float]:
    """Batches of 16 KiB messages until the master's CommitLog holds ``target`` bytes and
    its dispatch is done; (CommitLog bytes, seconds of sending)."""
    topic = "BenchCatchUp"
    await create_topic(namesrv, topic, QUEUES)
    body = os.urandom(FILL_BODY_SIZE)
    batch = [Message(topic, body) for _ in range(FILL_BATCH)]
    # an estimate of each record's header; the master's own figure decides at the end
    per_batch = FILL_BATCH * (FILL_BODY_SIZE + 200)
    batches = max(1, target // per_batch)
    async with Producer("BenchCatchUpFill", namesrv) as producer, RemotingClient() as probe:
        start = time.perf_counter()
        while True:
            left = batches

            async def sender() -> None:
                nonlocal left
                while left > 0:
                    left -= 1
                    result = await producer.send_batch(batch)
                    if result.status is not SendStatus.SEND_OK:
                        raise RuntimeError(f"a fill batch ended {result.status.value}")

            async with trio.open_nursery() as nursery:
                for _ in range(FILL_SENDERS):
                    nursery.start_soon(sender)
            size = (await ha_status(probe, master))["master"]["max_offset"]
            if size >= target:
                break
            batches = max(1, (target - size) // per_batch)
        seconds = time.perf_counter() - start
        with trio.fail_after(120):
            while True:  # the master's own dispatch must not compete with the catch-up
                if await dispatched_offset(probe, master) >= size:
                    break
                await trio.sleep(0.05)
    await trio.to_thread.run_sync(os.sync)  # no writeback of the fill during the catch-up
    return size, seconds


async def catch_up(master_pid: int, slave: str, slave_pid: int, size: int) -> CatchUpFigure:
    """From now (the slave's ready line) until the slave has ``size`` bytes, and until
    it has dispatched them (spawn_seconds is left 0 for the caller)."""
    async with RemotingClient() as client:
        master_before, slave_before = cpu_seconds(master_pid), cpu_seconds(slave_pid)
        start = time.perf_counter()
        status = (await ha_status(client, slave))["slave"]
        first = status["max_offset"]
        dispatched = -1
        with trio.move_on_after(CATCH_UP_TIMEOUT_S):
            while status["max_offset"] < size:
                await trio.sleep(CATCH_UP_POLL_S)
                status = (await ha_status(client, slave))["slave"]
            received = time.perf_counter() - start
            master_cpu = cpu_seconds(master_pid) - master_before
            while dispatched < size:
                dispatched = await dispatched_offset(client, slave)
                if dispatched < size:
                    await trio.sleep(CATCH_UP_POLL_S)
            dispatch_seconds = time.perf_counter() - start
            slave_cpu = cpu_seconds(slave_pid) - slave_before
        if dispatched < size:
            raise RuntimeError(
                f"the slave did not catch up within {CATCH_UP_TIMEOUT_S:g} s: its HA status"
                f" {status}, dispatched offset {dispatched}, the master's log ends at {size}"
            )
    return CatchUpFigure(
        size - first,
        received,
        dispatch_seconds,
        0.0,
        master_cpu,
        slave_cpu,
        status["sessions"],
        status["last_error"],
    )


def run_catch_up(
    procs: Processes, namesrv: str, master_pid: int, size: int, round_no: int
) -> CatchUpFigure:
    """One round: a slave with an empty store, from its start until it has everything."""
    name = f"catchup-slave-{round_no + 1}"
    store_dir = procs.base / name
    spawned = time.perf_counter()
    slave, slave_addr = start_broker(
        procs, name, namesrv=namesrv, role="SLAVE", store_dir=store_dir, store=CATCH_UP_STORE
    )
    ready = time.perf_counter()
    try:
        figure = trio.run(catch_up, master_pid, slave_addr, slave.pid, size)
    finally:
        procs.stop(slave)
        shutil.rmtree(store_dir, ignore_errors=True)
    return attrs.evolve(figure, spawn_seconds=ready - spawned)


# =========================================================================== loopback TCP


async def _sink(total: int, mode: str, path: str) -> None:
    """The receiving process: take ``total`` bytes with receive_some, answer one byte.
    ``mode`` "discard" drops them; "mmap" and "pwrite" append them to a new file of
    ``total`` bytes reserved with posix_fallocate, as the store's segments are, through a
    shared map (slice assignment, what the store does) or os.pwrite."""
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    print(listeners[0].socket.getsockname()[1], flush=True)
    fd = -1
    mapped: mmap.mmap | None = None
    if mode != "discard":
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        os.posix_fallocate(fd, 0, total)
        if mode == "mmap":
            mapped = mmap.mmap(fd, total)
    stream = await listeners[0].accept()
    received = 0
    while received < total:
        data = await stream.receive_some(SINK_RECEIVE)
        if not data:
            raise RuntimeError(f"the sender closed after {received} of {total} bytes")
        if mapped is not None:
            mapped[received : received + len(data)] = data
        elif fd >= 0:
            os.pwrite(fd, data, received)
        received += len(data)
    await stream.send_all(b"!")
    await stream.aclose()
    if mapped is not None:
        mapped.close()
    if fd >= 0:
        os.close(fd)
        os.unlink(path)


async def _trio_send(port: int, total: int) -> float:
    payload = memoryview(os.urandom(THREAD_CHUNK))
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    async with stream:
        start = time.perf_counter()
        sent = 0
        while sent < total:
            at = sent % THREAD_CHUNK
            n = min(CHUNK, total - sent, THREAD_CHUNK - at)
            await stream.send_all(payload[at : at + n])
            sent += n
        if await stream.receive_some(1) != b"!":
            raise RuntimeError("the receiver did not confirm")
        return time.perf_counter() - start


def loopback_trio(procs: Processes, total: int, mode: str = "discard") -> float:
    """Seconds to move ``total`` bytes to a plain-Trio receiver process, 32 KiB send_all;
    the receiver drops them or writes them to a new file (``_sink``)."""
    path = procs.base / "loopback.data"
    proc = subprocess.Popen(
        [sys.executable, __file__, "_sink", str(total), mode, str(path)],
        stdout=subprocess.PIPE,
        text=True,
    )
    procs.started.append((f"loopback-sink-{mode}", proc))
    try:
        assert proc.stdout is not None
        port = int(proc.stdout.readline())
        seconds = trio.run(_trio_send, port, total)
        proc.wait(STOP_TIMEOUT_S)  # it exits by itself once it has confirmed
        return seconds
    finally:
        procs.stop(proc)


def loopback_threads(total: int) -> float:
    """Seconds to move ``total`` bytes between two threads over loopback, blocking
    sockets, 1 MiB sendall / recv_into (C speed: no event loop in the way)."""
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    done = threading.Event()
    problem: list[str] = []

    def receive() -> None:
        conn, _ = listener.accept()
        buffer = bytearray(THREAD_CHUNK)
        received = 0
        with conn:
            while received < total:
                n = conn.recv_into(buffer)
                if not n:
                    problem.append(f"closed after {received} bytes")
                    break
                received += n
            conn.sendall(b"!")
        done.set()

    receiver = threading.Thread(target=receive, daemon=True)
    receiver.start()
    payload = memoryview(os.urandom(THREAD_CHUNK))
    with listener, socket.create_connection(("127.0.0.1", port)) as conn:
        start = time.perf_counter()
        sent = 0
        while sent < total:
            n = min(THREAD_CHUNK, total - sent)
            conn.sendall(payload[:n])
            sent += n
        conn.recv(1)
        seconds = time.perf_counter() - start
    receiver.join(30)
    if problem or not done.is_set():
        raise RuntimeError(f"threaded loopback failed: {problem or 'no answer'}")
    return seconds


# =========================================================================== driver


def _verdict(ratio: float, goal: float) -> str:
    return "goal met" if ratio >= goal else "goal NOT met"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=3, help="rounds (median of each figure)")
    parser.add_argument("--quick", action="store_true", help="128 MiB log, fewer messages, 1 round")
    parser.add_argument("--dir", type=Path, default=None, help="where the stores go")
    parser.add_argument(
        "--profile", type=Path, default=None, help="run the brokers under cProfile: DIR/NAME.prof"
    )
    parser.add_argument("--skip-sends", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--skip-catch-up", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    rounds = 1 if args.quick else args.rounds
    sizes = Sizes(10_000, 128 * MIB) if args.quick else Sizes(50_000, GIB)
    if args.profile is not None:
        args.profile.mkdir(parents=True, exist_ok=True)
        args.profile = args.profile.resolve()
    print(
        f"Python {platform.python_version()}, Trio {trio.__version__}, {os.cpu_count()} core(s);"
        f" {rounds} round(s), {sizes.sends:,} sends a role and round,"
        f" a {sizes.log_bytes / MIB:,.0f} MiB catch-up log"
        + (f"; brokers under cProfile into {args.profile}" if args.profile else ""),
        flush=True,
    )

    base = Path(tempfile.mkdtemp(prefix="hamq-bench-repl-", dir=args.dir))
    procs = Processes(base, args.profile)
    sends: dict[str, list[SendFigure]] = {role: [] for role in ROLES}
    catch_ups: list[CatchUpFigure] = []
    loopback: dict[str, list[float]] = {name: [] for name in BASELINES}  # bytes/s
    log_size = fill_seconds = 0.0
    try:
        if not args.skip_sends:
            groups = [start_group(procs, role) for role in ROLES]
            for round_no in range(rounds):
                for group in groups:
                    figure = trio.run(send_round, group, round_no, sizes.sends)
                    sends[group.role].append(figure)
                    print(
                        f"round {round_no + 1}: {group.role:12} {figure.messages:,} sends"
                        f" {figure.messages / figure.seconds:>8,.0f} msgs/s"
                        f" p99 {percentile(figure.latencies, 0.99) * 1e3:.1f} ms"
                        f" {dict(figure.statuses)}",
                        file=sys.stderr,
                        flush=True,
                    )
            procs.stop_all()
        if not args.skip_catch_up:
            namesrv = start_nameserver(procs, "catchup-nameserver")
            master, master_addr = start_broker(
                procs,
                "catchup-master",
                namesrv=namesrv,
                role="ASYNC_MASTER",
                store_dir=base / "catchup-master",
                store=CATCH_UP_STORE,
            )
            log_size, fill_seconds = trio.run(fill, namesrv, master_addr, sizes.log_bytes)
            print(
                f"filled {log_size / MIB:,.0f} MiB in {fill_seconds:.1f} s"
                f" ({log_size / MIB / fill_seconds:,.0f} MB/s)",
                file=sys.stderr,
                flush=True,
            )
            total = int(log_size)
            for round_no in range(rounds):
                loopback[TRIO].append(total / loopback_trio(procs, total))
                loopback[THREADS].append(total / loopback_threads(total))
                loopback[TRIO_MMAP].append(total / loopback_trio(procs, total, "mmap"))
                loopback[TRIO_PWRITE].append(total / loopback_trio(procs, total, "pwrite"))
                caught = run_catch_up(procs, namesrv, master.pid, total, round_no)
                catch_ups.append(caught)
                print(
                    f"round {round_no + 1}: catch-up {caught.bytes / MIB / caught.seconds:,.0f}"
                    f" MB/s (dispatched at {caught.bytes / MIB / caught.dispatch_seconds:,.0f}"
                    " MB/s); loopback "
                    + ", ".join(f"{rates[-1] / MIB:,.0f}" for rates in loopback.values())
                    + " MB/s",
                    file=sys.stderr,
                    flush=True,
                )
    finally:
        procs.stop_all()
        problems = procs.report()
        shutil.rmtree(base, ignore_errors=True)

    if not args.skip_sends:
        print_sends(sends, rounds)
    if not args.skip_catch_up:
        print_catch_up(catch_ups, loopback, log_size, fill_seconds, rounds)
    if problems:
        print("\nProcesses with a non-zero exit code or stderr output:")
        print("\n".join(problems))
    if args.profile:
        print(f"\nProfiles: {', '.join(sorted(p.name for p in args.profile.glob('*.prof')))}")


def print_sends(sends: dict[str, list[SendFigure]], rounds: int) -> None:
    print(
        f"\nSend, {BODY_SIZE} B bodies, {IN_FLIGHT} in flight, one slave, median of"
        f" {rounds} round(s); lag sampled on the master every {LAG_POLL_S * 1e3:.0f} ms\n"
    )
    header = (
        f"{'role':14}{'msgs/s':>9}{'MB/s':>7}{'p50 ms':>8}{'p99 ms':>8}"
        f"{'master':>8}{'slave':>7}{'client':>8}{'lag KiB':>12}{'lag ms':>13}{'lag s':>12}"
    )
    print(header)
    print(
        f"{'':46}{'us/msg':>8}{'us/msg':>7}{'us/msg':>8}"
        f"{'median/max':>12}{'median/max':>13}{'median/max':>12}"
    )
    print("-" * len(header))
    rates: dict[str, float] = {}
    for role, runs in sends.items():
        rate = statistics.median(f.messages / f.seconds for f in runs)
        rates[role] = rate
        p50 = statistics.median(percentile(f.latencies, 0.5) for f in runs) * 1e3
        p99 = statistics.median(percentile(f.latencies, 0.99) for f in runs) * 1e3
        master_us = statistics.median(1e6 * f.master_cpu / f.messages for f in runs)
        slave_us = statistics.median(1e6 * f.slave_cpu / f.messages for f in runs)
        client_us = statistics.median(1e6 * f.client_cpu / f.messages for f in runs)
        lag_b = [b for f in runs for b in f.lag_bytes]
        lag_s = [s for f in runs for s in f.lag_s]
        # lag in time: bytes behind / bytes appended a second
        per_s = statistics.median(f.appended_per_s for f in runs)
        lag_ms = [1e3 * b / per_s for b in lag_b] if per_s > 0 else []
        print(
            f"{role:14}{rate:>9,.0f}{rate * BODY_SIZE / MIB:>7.1f}{p50:>8.2f}{p99:>8.2f}"
            f"{master_us:>8.0f}{slave_us:>7.0f}{client_us:>8.0f}"
            f"{median([b / KIB for b in lag_b]):>6.0f}/{max(lag_b, default=0) / KIB:<5.0f}"
            f"{median(lag_ms):>7.1f}/{max(lag_ms, default=0):<5.1f}"
            f"{median(lag_s):>6.2f}/{max(lag_s, default=0):<5.2f}"
        )
    for role, runs in sends.items():
        statuses: Counter[str] = Counter()
        for f in runs:
            statuses.update(f.statuses)
        print(f"statuses, {role}: {', '.join(f'{k} {v:,}' for k, v in statuses.most_common())}")
    print(
        "(lag KiB: master max offset - slave ack; lag ms: that / the master's append rate;"
        " lag s: the master's lag_s, how long ago its oldest unacked byte was sent)"
    )
    ratio = rates["SYNC_MASTER"] / rates["ASYNC_MASTER"]
    print(
        f"\nGoal 1: SYNC_MASTER msgs/s >= {GOAL_SYNC_RATIO:.0%} of ASYNC_MASTER at {IN_FLIGHT}"
        f" in flight: {ratio:.0%} -- {_verdict(ratio, GOAL_SYNC_RATIO)}"
    )


def print_catch_up(
    catch_ups: list[CatchUpFigure],
    loopback: dict[str, list[float]],
    log_size: float,
    fill_seconds: float,
    rounds: int,
) -> None:
    print(
        f"\nCatch-up of an empty slave from offset 0, a {log_size / MIB:,.0f} MiB CommitLog"
        f" ({FILL_BODY_SIZE // KIB} KiB bodies), median of {rounds} round(s); the master was"
        f" filled at {log_size / MIB / fill_seconds:,.0f} MB/s (batches of {FILL_BATCH})\n"
    )
    header = f"{'':44}{'MB/s':>8}{'seconds':>9}{'vs Trio':>9}"
    print(header)
    print("-" * len(header))
    trio_rate = statistics.median(loopback[TRIO]) / MIB
    rows = [
        (name, statistics.median(rates) / MIB, statistics.median(log_size / r for r in rates))
        for name, rates in loopback.items()
    ]
    rows += [
        (
            "slave: replicated (max offset = master's)",
            statistics.median(f.bytes / MIB / f.seconds for f in catch_ups),
            statistics.median(f.seconds for f in catch_ups),
        ),
        (
            "slave: dispatched (queues + index built)",
            statistics.median(f.bytes / MIB / f.dispatch_seconds for f in catch_ups),
            statistics.median(f.dispatch_seconds for f in catch_ups),
        ),
    ]
    for name, rate, seconds in rows:
        print(f"{name:44}{rate:>8,.0f}{seconds:>9.2f}{rate / trio_rate:>9.0%}")
    spawn = statistics.median(f.spawn_seconds for f in catch_ups)
    master_cpu = statistics.median(f.master_cpu / f.seconds for f in catch_ups)
    slave_cpu = statistics.median(f.slave_cpu / f.dispatch_seconds for f in catch_ups)
    print(
        f"(slave timed from its ready line, {spawn:.2f} s after its start; CPU busy while"
        f" catching up: master {master_cpu:.0%}, slave {slave_cpu:.0%} of one core.\n"
        " '+ receiver writes': the plain-Trio receiver also appends to a fresh"
        " posix_fallocate'd file, as a slave's store must)"
    )
    odd = [f for f in catch_ups if f.sessions != 1 or f.last_error]
    for f in odd:
        print(f"note: a slave opened {f.sessions} HA session(s); last error: {f.last_error}")
    catch_up = statistics.median(f.bytes / MIB / f.seconds for f in catch_ups)
    ratio = catch_up / trio_rate
    print(
        f"\nGoal 2: catch-up MB/s >= {GOAL_CATCH_UP_RATIO:.0%} of loopback TCP (baseline: plain"
        f" Trio, 32 KiB send_all, same run): {catch_up:,.0f} / {trio_rate:,.0f} MB/s ="
        f" {ratio:.0%} -- {_verdict(ratio, GOAL_CATCH_UP_RATIO)}"
    )


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "_sink":
        trio.run(_sink, int(sys.argv[2]), sys.argv[3], sys.argv[4])
    else:
        main()
