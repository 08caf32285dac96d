"""What the benchmarks share: process CPU time, percentiles, brokers in processes (TOML
configs and topics come from the tests' support package, tests/support).

The benchmarks run as scripts (``python benchmarks/NAME.py``), so this is imported as a
sibling module (``import support``).
"""

from __future__ import annotations

import os
import selectors
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

READY_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 10.0
REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # the tests' support package: one copy of what both use
from tests.support.brokers import create_topic  # noqa: E402
from tests.support.processes import free_ports, write_toml  # noqa: E402
from tests.support.rocketmq5 import ensure_venv  # noqa: E402

__all__ = ["create_topic", "ensure_venv", "free_ports", "write_toml"]


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process and its threads (Linux /proc), else NaN."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except OSError:
        return float("nan")
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


# =========================================================================== a broker


def can_pin() -> bool:
    return hasattr(os, "sched_setaffinity") and (os.cpu_count() or 1) >= 2


def start_broker(
    store_dir: Path,
    stderr_path: Path,
    *,
    pin: bool = False,
    config: Path | None = None,
    grpc_port: int | None = None,
) -> tuple[subprocess.Popen[str], str]:
    """A broker process (embedded nameserver, free ports, ``config`` if given, gRPC on
    ``grpc_port`` if given) and its nameserver's address, once it serves; ``pin``: on
    CPU 1."""
    command = [sys.executable, "-m", "cli.main", "--log-level", "warning", "broker"]
    command += ["--port", "0", "--namesrv-port", "0", "--store-dir", str(store_dir)]
    if grpc_port is not None:
        command += ["--grpc-port", str(grpc_port)]
    if config is not None:
        command += ["-c", str(config)]
    with open(stderr_path, "w") as stderr:
        proc = subprocess.Popen(
            command,
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
            # every thread the broker starts inherits the pinning
            preexec_fn=(lambda: os.sched_setaffinity(0, {1})) if pin else None,
        )
    try:
        line = wait_ready("the broker", proc)
        # "... at 127.0.0.1:PORT, nameserver 127.0.0.1:NSPORT (embedded), store ..."
        return proc, line.split(", nameserver ", 1)[1].split()[0].rstrip(",")
    except BaseException:
        stop_broker(proc)
        raise


def wait_ready(name: str, proc: subprocess.Popen[str]) -> str:
    """The ``hamq ... ready: ...`` line ``proc`` prints once it serves (bounded wait)."""
    assert proc.stdout is not None
    deadline = time.monotonic() + READY_TIMEOUT_S
    with selectors.DefaultSelector() as selector:
        selector.register(proc.stdout, selectors.EVENT_READ)
        while (left := deadline - time.monotonic()) > 0:
            if not selector.select(left):
                continue
            line = proc.stdout.readline()
            if not line:
                raise RuntimeError(f"{name} exited (code {proc.wait()}) before it was ready")
            if line.startswith("hamq ") and " ready: " in line:
                return line.strip()
    raise RuntimeError(f"{name} was not ready within {READY_TIMEOUT_S:g} s")


def stop_broker(proc: subprocess.Popen[str]) -> int:
    """SIGTERM, then SIGKILL if it has not stopped within STOP_TIMEOUT_S; its exit code."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            print(f"the broker did not stop within {STOP_TIMEOUT_S:g} s: killed", file=sys.stderr)
            proc.kill()
            proc.wait()
    if proc.stdout is not None:
        proc.stdout.close()
    return proc.returncode
