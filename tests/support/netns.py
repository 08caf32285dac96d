"""Network namespaces for partition tests: hosts on one bridge, links cut with iptables.

``Network`` makes a switch namespace holding a bridge, and one namespace per host with a
veth pair to that bridge and an address of the network's /24 (nothing is added to the
namespace the tests run in). ``cut(a, b)`` drops every packet between two hosts (an
iptables DROP in each, both directions: a connection attempt hangs as across a real
partition, it is not refused); ``heal`` takes the rules away again. Processes run in a
host with ``host.command(argv)`` (``ip netns exec``: the command replaces ``ip``, so its
PID is the process's own, for kill -9 and SIGSTOP); the test itself can act as a host
with ``entered(host)`` (setns of the calling thread: sockets it opens from then on are
the host's).

Needs root, ``ip`` (iproute2) and ``iptables``: ``unavailable()`` says why not, after
trying to install what is missing (install-debian.sh); tests skip with that reason.
Everything made is removed by ``close`` (namespaces, and with them their links and
rules), also after a crash of the test: the names carry the network's number, and
``Network.create`` removes what an earlier run left under the same number. A number is
held with an flock (``LOCK_DIR``) while its network lives, so that runs side by side
(``make test``'s two pytest workers) never pick the same one; the lock goes with the
process that held it, crashed or not.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import fcntl
import functools
import os
import random
import subprocess
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import attrs
import trio

INSTALL_SCRIPT = Path(__file__).with_name("install-debian.sh")
#: the networks are 10.213.N.0/24 (N picked at random per network)
PREFIX = "10.213"
CLONE_NEWNET = 0x40000000
#: how long one ``ip`` / ``iptables`` command may take
COMMAND_TIMEOUT_S = 20
#: where the networks' numbers are held (hamq-netns-N.lock, flocked)
LOCK_DIR = Path(tempfile.gettempdir())


class NetnsError(RuntimeError):
    """A namespace command failed; the text has its output."""


def run(*argv: str) -> str:
    """Run a command (bounded); its stdout. NetnsError with its stderr if it fails."""
    try:
        done = subprocess.run(
            argv, capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise NetnsError(f"{' '.join(argv)}: {exc}") from None
    if done.returncode != 0:
        raise NetnsError(f"{' '.join(argv)} exited {done.returncode}: {done.stderr.strip()}")
    return done.stdout


@functools.cache
def unavailable() -> str | None:
    """Why namespaces with iptables cannot be used here, None if they can (once per run)."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    try:
        subprocess.run(
            ["sh", str(INSTALL_SCRIPT), "iproute2", "iptables"],
            capture_output=True,
            text=True,
            timeout=600,
            check=True,
        )
    except subprocess.CalledProcessError as exc:
        return f"cannot install iproute2 and iptables: {exc.stderr.strip()}"
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"{INSTALL_SCRIPT.name} did not run: {exc}"
    probe = f"hqprobe{os.getpid()}"
    try:
        run("ip", "netns", "add", probe)
        run("ip", "netns", "exec", probe, "iptables", "-L", "INPUT")
    except NetnsError as exc:
        return f"network namespaces or iptables do not work here: {exc}"
    finally:
        subprocess.run(["ip", "netns", "del", probe], capture_output=True, check=False)
    return None


@attrs.frozen
class Host:
    """One namespace on the network: ``ip`` is its address."""

    name: str
    namespace: str
    ip: str

    def command(self, argv: list[str]) -> list[str]:
        """``argv`` run in this host's namespace."""
        return ["ip", "netns", "exec", self.namespace, *argv]

    def iptables(self, *args: str) -> None:
        run("ip", "netns", "exec", self.namespace, "iptables", "-w", *args)


class Network:
    """A bridge and its hosts (module docstring)."""

    def __init__(self, number: int, lock: int) -> None:
        self.number = number
        #: the flocked file that holds the number (closed by ``close``)
        self._lock = lock
        self.switch = f"hq{number}-sw"
        self.hosts: dict[str, Host] = {}
        #: the pairs cut now (names, sorted)
        self.cuts: set[tuple[str, str]] = set()

    @classmethod
    def create(cls, number: int | None = None) -> Network:
        """A new network (its bridge up, no hosts yet); a random number not held by
        another run unless given (NetnsError if that one is)."""
        candidates = random.sample(range(1, 250), 249) if number is None else [number]
        for candidate in candidates:
            lock = _hold(candidate)
            if lock is not None:
                break
        else:
            held = "every network number is" if number is None else f"network {number} is"
            raise NetnsError(f"{held} held by another run ({LOCK_DIR}/hamq-netns-*.lock)")
        network = cls(candidate, lock)
        network._remove_leftovers()
        run("ip", "netns", "add", network.switch)
        try:
            run("ip", "-n", network.switch, "link", "add", "br0", "type", "bridge")
            run("ip", "-n", network.switch, "link", "set", "br0", "up")
        except BaseException:
            network.close()
            raise
        return network

    def _remove_leftovers(self) -> None:
        prefix = f"hq{self.number}-"
        for line in run("ip", "netns", "list").splitlines():
            name = line.split(" ", 1)[0]
            if name.startswith(prefix):
                subprocess.run(["ip", "netns", "del", name], capture_output=True, check=False)

    def add(self, name: str) -> Host:
        """A host named ``name`` (short: it goes into interface names' place) with the
        network's next address; its loopback up."""
        index = len(self.hosts) + 1
        host = Host(name, f"hq{self.number}-{name}", f"{PREFIX}.{self.number}.{index}")
        run("ip", "netns", "add", host.namespace)
        self.hosts[name] = host
        port = f"hq{self.number}p{index}"
        run(
            "ip", "link", "add", port, "netns", self.switch,
            "type", "veth", "peer", "name", "eth0", "netns", host.namespace,
        )  # fmt: skip
        run("ip", "-n", self.switch, "link", "set", port, "master", "br0")
        run("ip", "-n", self.switch, "link", "set", port, "up")
        run("ip", "-n", host.namespace, "addr", "add", f"{host.ip}/24", "dev", "eth0")
        run("ip", "-n", host.namespace, "link", "set", "eth0", "up")
        run("ip", "-n", host.namespace, "link", "set", "lo", "up")
        return host

    def cut(self, a: str, b: str) -> None:
        """Drop every packet between hosts ``a`` and ``b``, both ways (until ``heal``)."""
        pair = (min(a, b), max(a, b))
        if pair in self.cuts:
            return
        first, second = self.hosts[a], self.hosts[b]
        for host, other in ((first, second), (second, first)):
            host.iptables("-A", "INPUT", "-s", other.ip, "-j", "DROP")
            host.iptables("-A", "OUTPUT", "-d", other.ip, "-j", "DROP")
        self.cuts.add(pair)

    def cut_between(self, side: list[str], other_side: list[str]) -> None:
        """Cut every host of ``side`` from every host of ``other_side``."""
        for a in side:
            for b in other_side:
                if a != b:
                    self.cut(a, b)

    def heal(self) -> None:
        """Take every cut away."""
        for name in {n for pair in self.cuts for n in pair}:
            self.hosts[name].iptables("-F")
        self.cuts.clear()

    def close(self) -> None:
        """Remove every namespace of the network (their links and rules go with them)."""
        for host in self.hosts.values():
            subprocess.run(["ip", "netns", "del", host.namespace], capture_output=True, check=False)
        subprocess.run(["ip", "netns", "del", self.switch], capture_output=True, check=False)
        self.hosts.clear()
        if self._lock >= 0:
            os.close(self._lock)
            self._lock = -1


def _hold(number: int) -> int | None:
    """The descriptor of network ``number``'s lock file, flocked; None if another
    process holds it."""
    fd = os.open(LOCK_DIR / f"hamq-netns-{number}.lock", os.O_CREAT | os.O_RDWR, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


def _setns(fd: int) -> None:
    setns = getattr(os, "setns", None)  # (Python 3.12 and later)
    if setns is not None:
        setns(fd, CLONE_NEWNET)
        return
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    if libc.setns(fd, CLONE_NEWNET) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"setns: {os.strerror(errno)}")


@contextlib.contextmanager
def entered(host: Host) -> Iterator[None]:
    """The calling thread in ``host``'s namespace for the block (sockets opened in it
    are the host's; threads started in it inherit the namespace), then back — and Trio's
    worker threads with it (``_bring_workers_home``)."""
    with open("/proc/thread-self/ns/net") as home:
        with open(f"/run/netns/{host.namespace}") as target:
            _setns(target.fileno())
        try:
            yield
        finally:
            _setns(home.fileno())
            _bring_workers_home(home.fileno())


def _bring_workers_home(home: int) -> None:
    """Trio keeps its worker threads for later jobs, and one started in the block is in
    the host's namespace: a child process a later test spawns from it (Trio forks in a
    worker thread) would start there, its 127.0.0.1 not this one's. So every idle worker
    is given a job that moves it back to ``home``: as many jobs at once as there are
    Trio worker threads, and one more, each holding its thread until all have moved, so
    that no thread takes two."""
    count = 1 + sum(1 for t in threading.enumerate() if t.name.startswith("Trio thread"))
    moved = threading.Barrier(count + 1)

    def move() -> None:
        _setns(home)
        moved.wait(COMMAND_TIMEOUT_S)

    for _ in range(count):
        trio.lowlevel.start_thread_soon(move, lambda _outcome: None)
    moved.wait(COMMAND_TIMEOUT_S)
