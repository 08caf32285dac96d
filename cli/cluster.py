"""``hamq cluster up``: nameservers and broker groups of a profile, as child processes.

A profile is a directory: one broker TOML per broker (``hamq broker -c``'s format; any
``*.toml`` but ``cluster.toml``) and optionally ``cluster.toml`` with
``nameserver_ports = [9876, 9877]`` (one ``hamq nameserver --port N`` each, on
127.0.0.1). With ``embed_controller = true`` each nameserver also runs a controller
(``--controller``), Raft between them on ``raft_ports`` (default: each nameserver's port
+ 1), each keeping its Raft log in ``<controller_dir>/nameserver-<port>`` (default
controller_dir ./data/controller). ``--profile NAME`` is a directory under the source
checkout's conf/ (conf/README.md lists them); anything else is taken as a path.

Order: nameservers, then masters (broker_id 0), then slaves, then brokers in controller
mode (``enable_controller_mode``: the controllers pick their ids and their master) start,
each awaited until its one ``hamq ... ready:`` line (at most READY_TIMEOUT_S; a broker
says it once a nameserver accepted its registration: one started before the nameservers
it names, unless it embeds one of them, would not be ready in time); then ``up``
waits until every nameserver knows every master and slave (asked over TLS with the
brokers' settings when they have ``[remoting.tls]``; nameservers embedded in
brokers learn of the brokers started before theirs within seconds; at most
REGISTERED_TIMEOUT_S, then a warning) before it prints the table and says ready. They
stop in reverse kind order: controller-mode brokers, slaves, masters, nameservers;
SIGTERM, then at most STOP_TIMEOUT_S per group, then SIGKILL. SIGINT, SIGTERM and
SIGHUP (a closed terminal) stop them; a second SIGINT or SIGTERM kills what is left.

Supervision: a child that cannot start stops them all (exit 1). One that ends later
is reported in one line and the others keep running; with restarts on (``--restart``;
the default for controller-mode profiles, whose brokers come back as slaves) it is
started again, same command line and log, after ``restart_delay``: longer after each
quick failure (before ready, or less than QUICK_FAILURE_S after), and not at all
after RESTART_GIVE_UP of them in a row (one line says so).

Invariants: every child is recorded the moment it is spawned and is waited for before
``up`` returns, on every path (a child that fails, a bad start, Ctrl-C, a second
Ctrl-C). Children run in their own process group, so a terminal's Ctrl-C reaches only
``up``, which stops them in order; and each has PARENT_DEATH_SIGNAL (SIGTERM) set for
the death of the thread that forked it, always the main thread (``spawn``), so they
stop even when ``up`` is killed with SIGKILL. Children's stderr, and anything they
print after the ready line, goes to ``<log-dir>/<profile>-<child>.log``; at each
``up`` a non-empty log of the last run is kept as ``<...>.log.1`` (one generation),
and a restart appends to the log after a ``---- hamq cluster up:`` line.
Exit codes: 0 after a clean stop of children that all ran at that time, 1 when a
child failed to start, had ended by the stop (or all had), or had to be killed, 2 for
a bad profile.
"""

from __future__ import annotations

import contextlib
import ctypes
import enum
import os
import re
import secrets
import signal
import subprocess
import sys
import threading
import tomllib
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Annotated, Any, BinaryIO

import attrs
import trio
import typer
from rich.console import Console
from rich.table import Table

from cli.common import HELP_MARKUP, fail
from hamq.broker import BrokerConfig, ConfigError, build_config
from hamq.broker.config import resolve_files
from hamq.protocol import ProtocolError, RemotingCommand, RequestCode, ResponseCode
from hamq.protocol.bodies import BodyError, ClusterInfo, decode_body
from hamq.remoting import RemotingClient, RemotingConfig, RemotingError

app = typer.Typer(
    help="Run a whole cluster from a profile (see conf/).",
    no_args_is_help=True,
    rich_markup_mode=HELP_MARKUP,
)
console = Console()

#: profiles by name: the conf/ directory of the source checkout
CONF_DIR = Path(__file__).resolve().parent.parent / "conf"
CLUSTER_FILE = "cluster.toml"
NAMESERVER_HOST = "127.0.0.1"
#: where embedded controllers keep their Raft logs unless cluster.toml says otherwise
DEFAULT_CONTROLLER_DIR = Path("data/controller")
#: the embedded controllers' shared secret, in controller_dir
RAFT_SECRET_FILE = "raft.secret"

READY_TIMEOUT_S = 30.0
#: how long ``up`` waits, once all are ready, for every nameserver to know every broker
REGISTERED_TIMEOUT_S = 15.0
STOP_TIMEOUT_S = 15.0
#: how long a SIGKILLed child is waited for (it cannot refuse; this only bounds a hang)
KILL_WAIT_S = 5.0
#: how much of a child's log an error shows
LOG_TAIL_LINES = 15
LOG_TAIL_BYTES = 16 * 1024
#: a child that ends before it is ready, or sooner than this after, failed quickly
QUICK_FAILURE_S = 10.0
#: the pause before a restart, by quick failures in a row (the last one repeats)
RESTART_DELAYS_S = (0.5, 1.0, 2.0, 4.0)
#: after this many quick failures in a row a child is not started again
RESTART_GIVE_UP = 4
#: what each child gets when ``up`` ends, however it ends (SIGTERM: a clean stop)
PARENT_DEATH_SIGNAL = signal.SIGTERM
#: how often a child's end is polled where Linux has no pidfd_open
EXIT_POLL_S = 0.05


class ProfileError(ValueError):
    """A profile that cannot be used; the text names the file or the profile."""


class Kind(enum.Enum):
    NAMESERVER = "nameserver"
    MASTER = "master"
    SLAVE = "slave"
    #: a broker in controller mode: master or slave as the controllers decide
    BROKER = "broker"


#: the order children start in; they stop in the reverse one
START_ORDER = (Kind.NAMESERVER, Kind.MASTER, Kind.SLAVE, Kind.BROKER)
#: how the stop report names each kind, in the plural
_PLURAL = {
    Kind.NAMESERVER: "nameservers",
    Kind.MASTER: "masters",
    Kind.SLAVE: "slaves",
    Kind.BROKER: "controller-mode brokers",
}


@attrs.frozen
class ChildSpec:
    name: str
    kind: Kind
    #: the ``hamq`` command line after the global options
    args: tuple[str, ...]
    role: str = "-"
    broker_id: int | None = None


@attrs.frozen
class Profile:
    name: str
    directory: Path
    #: in start order
    children: tuple[ChildSpec, ...]
    #: the shared Raft secret of a group of embedded controllers (made by ``up``)
    raft_secret_file: Path | None = None
    #: how ``up`` asks the nameservers: TLS as the brokers connect (their
    #: ``[remoting.tls]``, when a broker has one), else plain TCP
    remoting: RemotingConfig | None = None

    @property
    def controller_mode(self) -> bool:
        """Its brokers are in controller mode (a restarted one comes back as a slave)."""
        return any(child.kind is Kind.BROKER for child in self.children)


# ---------------------------------------------------------------- loading a profile
def profile_names() -> list[str]:
    if not CONF_DIR.is_dir():
        return []
    return sorted(p.name for p in CONF_DIR.iterdir() if p.is_dir() and any(p.glob("*.toml")))


def resolve_profile(profile: str) -> Path:
    """conf/<profile> for a plain name, else the directory ``profile``."""
    if profile and "/" not in profile and profile not in (".", ".."):
        named = CONF_DIR / profile
        if named.is_dir():
            return named
    directory = Path(profile).expanduser()
    if directory.is_dir():
        return directory
    known = ", ".join(profile_names()) or "none"
    raise ProfileError(
        f"profile {profile!r} not found: not a directory, nor a profile of {CONF_DIR} "
        f"(known: {known})"
    )


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        return tomllib.loads(path.read_text())
    except OSError as exc:
        raise ProfileError(f"cannot read {path}: {exc.strerror or exc}") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ProfileError(f"{path} is not valid TOML: {exc}") from None


@attrs.frozen
class ClusterFile:
    """cluster.toml: standalone nameservers, and the controllers they embed."""

    nameserver_ports: tuple[int, ...] = ()
    embed_controller: bool = False
    #: each nameserver's controller's Raft port, in nameserver_ports' order
    raft_ports: tuple[int, ...] = ()
    controller_dir: Path = DEFAULT_CONTROLLER_DIR


_CLUSTER_KEYS = ("nameserver_ports", "embed_controller", "raft_ports", "controller_dir")


def _ports(path: Path, data: dict[str, Any], key: str) -> list[int]:
    ports = data.get(key, [])
    if not isinstance(ports, list) or not all(
        isinstance(p, int) and not isinstance(p, bool) and 0 < p < 65536 for p in ports
    ):
        raise ProfileError(f"{path}: {key} must be a list of ports (1-65535)")
    if len(set(ports)) != len(ports):
        raise ProfileError(f"{path}: {key} lists a port twice")
    return list(ports)


def _cluster_file(path: Path) -> ClusterFile:
    data = _read_toml(path)
    unknown = sorted(set(data) - set(_CLUSTER_KEYS))
    if unknown:
        raise ProfileError(
            f"{path}: unknown key(s) {', '.join(unknown)}; only {', '.join(_CLUSTER_KEYS)}"
        )
    ns_ports = _ports(path, data, "nameserver_ports")
    embed = data.get("embed_controller", False)
    if not isinstance(embed, bool):
        raise ProfileError(f"{path}: embed_controller must be true or false")
    if not embed:
        extra = [key for key in ("raft_ports", "controller_dir") if key in data]
        if extra:
            raise ProfileError(f"{path}: {', '.join(extra)} need(s) embed_controller = true")
        return ClusterFile(tuple(ns_ports))
    if not ns_ports:
        raise ProfileError(f"{path}: embed_controller needs nameserver_ports")
    raft_ports = _ports(path, data, "raft_ports") if "raft_ports" in data else []
    if "raft_ports" in data and len(raft_ports) != len(ns_ports):
        raise ProfileError(
            f"{path}: raft_ports must list one port per nameserver ({len(ns_ports)})"
        )
    if not raft_ports:
        raft_ports = [port + 1 for port in ns_ports]
        if any(not 0 < port < 65536 for port in raft_ports):
            raise ProfileError(f"{path}: nameserver port 65535 needs raft_ports")
    clash = sorted(set(raft_ports) & set(ns_ports))
    if clash:
        raise ProfileError(
            f"{path}: raft port {clash[0]} is also a nameserver's port"
            + ("" if "raft_ports" in data else " (each nameserver's port + 1); set raft_ports")
        )
    controller_dir = data.get("controller_dir", str(DEFAULT_CONTROLLER_DIR))
    if not isinstance(controller_dir, str) or not controller_dir:
        raise ProfileError(f"{path}: controller_dir must be a directory name")
    return ClusterFile(tuple(ns_ports), True, tuple(raft_ports), Path(controller_dir))


def _nameserver_args(cluster: ClusterFile, index: int) -> tuple[str, ...]:
    port = cluster.nameserver_ports[index]
    args: tuple[str, ...] = ("nameserver", "--port", str(port))
    if not cluster.embed_controller:
        return args
    peers = ";".join(f"{NAMESERVER_HOST}:{p}" for p in cluster.raft_ports)
    directory = (cluster.controller_dir / f"nameserver-{port}").resolve()
    args += ("--controller", "--raft-address", f"{NAMESERVER_HOST}:{cluster.raft_ports[index]}")
    if len(cluster.raft_ports) > 1:
        args += ("--raft-peers", peers, "--raft-secret-file", str(_secret_file(cluster)))
    return (*args, "--controller-dir", str(directory))


def _secret_file(cluster: ClusterFile) -> Path:
    return (cluster.controller_dir / RAFT_SECRET_FILE).resolve()


def ensure_raft_secret(path: Path) -> None:
    """Make the group's Raft secret (random, readable by this user only) unless it exists:
    every controller of the profile reads it; a restart keeps it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return
    with os.fdopen(fd, "w") as out:
        out.write(secrets.token_urlsafe(32) + "\n")


_LOCAL_HOSTS = (NAMESERVER_HOST, "localhost")


def _check_controllers(
    brokers: list[tuple[Path, BrokerConfig]], cluster: ClusterFile, cluster_file: Path
) -> None:
    """A controller-mode broker that names one of this profile's nameservers as a
    controller needs the nameservers to embed one."""
    if cluster.embed_controller:
        return
    local = {f"{host}:{port}" for port in cluster.nameserver_ports for host in _LOCAL_HOSTS}
    for path, config in brokers:
        if not config.enable_controller_mode:
            continue
        named = [addr for addr in config.controller_addrs if addr in local]
        if named:
            raise ProfileError(
                f"{path}: controller_addrs names nameserver {named[0]}, but {cluster_file} "
                "does not set embed_controller = true"
            )


def _check_distinct(
    brokers: list[tuple[Path, BrokerConfig]], cluster: ClusterFile, cluster_file: Path
) -> None:
    """No two children may share a port, a store or a (broker_name, broker_id)."""
    owners: dict[tuple[str, object], Path] = {
        ("port", port): cluster_file for port in (*cluster.nameserver_ports, *cluster.raft_ports)
    }
    for path, config in brokers:
        ports = {config.listen_port}
        if config.is_master or config.enable_controller_mode:
            ports.add(config.ha_port)
        if not config.namesrv_addrs or config.embed_namesrv:
            ports.add(config.embedded_namesrv_port)
        if config.metrics_port:
            ports.add(config.metrics_port)
        keys: list[tuple[str, object]] = [
            ("store_dir", config.store.store_dir.resolve()),
            *(("port", port) for port in sorted(ports) if port),
        ]
        if not config.enable_controller_mode:  # (the controllers give those their ids)
            keys.append(("broker_name and broker_id", f"{config.broker_name} {config.broker_id}"))
        for key in keys:
            if key in owners:
                raise ProfileError(f"{path}: {key[0]} {key[1]} is also {owners[key]}'s")
            owners[key] = path


def load_profile(profile: str) -> Profile:
    """Read and check every file of ``profile``; raises ProfileError naming the bad one."""
    directory = resolve_profile(profile)
    cluster_file = directory / CLUSTER_FILE
    cluster = _cluster_file(cluster_file) if cluster_file.exists() else ClusterFile()
    brokers: list[tuple[Path, BrokerConfig]] = []
    for path in sorted(directory.glob("*.toml")):
        if path.name == CLUSTER_FILE:
            continue
        try:
            brokers.append((path, build_config(resolve_files(_read_toml(path), path.parent))))
        except ConfigError as exc:
            raise ProfileError(f"{path}: {exc}") from None
    if not brokers:
        raise ProfileError(f"profile {directory} has no broker (no *.toml but {CLUSTER_FILE})")
    _check_distinct(brokers, cluster, cluster_file)
    _check_controllers(brokers, cluster, cluster_file)
    name = directory.resolve().name
    children = [
        ChildSpec(
            f"nameserver-{port}",
            Kind.NAMESERVER,
            _nameserver_args(cluster, index),
            role="+ controller" if cluster.embed_controller else "-",
        )
        for index, port in enumerate(cluster.nameserver_ports)
    ]
    specs = [
        ChildSpec(
            path.stem,
            _broker_kind(config),
            ("broker", "-c", str(path.resolve())),
            role="by controller" if config.enable_controller_mode else config.role.value,
            broker_id=None if config.enable_controller_mode else config.broker_id,
        )
        for path, config in brokers
    ]
    for kind in START_ORDER[1:]:
        children += [spec for spec in specs if spec.kind is kind]
    secret = _secret_file(cluster) if len(cluster.raft_ports) > 1 else None
    tls = next((config.remoting for _, config in brokers if config.remoting.tls), None)
    return Profile(name, directory, tuple(children), secret, tls)


def _broker_kind(config: BrokerConfig) -> Kind:
    if config.enable_controller_mode:
        return Kind.BROKER
    return Kind.MASTER if config.broker_id == 0 else Kind.SLAVE


# ---------------------------------------------------------------- restarts
def restart_delay(quick_failures: int) -> float | None:
    """The pause before starting a child again after ``quick_failures`` quick failures in
    a row (0: it had been running for a while), or None: do not start it again."""
    if quick_failures >= RESTART_GIVE_UP:
        return None
    return RESTART_DELAYS_S[min(quick_failures, len(RESTART_DELAYS_S) - 1)]


# ---------------------------------------------------------------- child processes
def open_log(path: Path) -> BinaryIO:
    """``path``, empty, opened for appending (the child's stderr and our copies of its
    stdout never overwrite each other). A non-empty log of an earlier run becomes
    ``<name>.1``, replacing the one before. Raises OSError; a failed rename leaves both
    files as they were."""
    with contextlib.suppress(FileNotFoundError):
        if path.stat().st_size > 0:
            os.replace(path, path.with_name(f"{path.name}.1"))
    return path.open("ab")


_PR_SET_PDEATHSIG = 1


def _parent_death_hook() -> Callable[[], None] | None:
    """A ``preexec_fn`` asking the kernel to send PARENT_DEATH_SIGNAL to the child when
    the thread that forks it ends; None where there is no prctl (not Linux)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    parent = os.getpid()
    death_signal = int(PARENT_DEATH_SIGNAL)

    def hook() -> None:  # in the child, between fork and exec
        if prctl(_PR_SET_PDEATHSIG, death_signal, 0, 0, 0) != 0 or os.getppid() != parent:
            os._exit(127)  # no signal set, or ``up`` is gone already: do not run orphaned

    return hook


class ChildProcess:
    """A child started by ``spawn``: its pid, its stdout as a Trio stream, and waits that
    keep the run loop going (on a pidfd where Linux has them, else polling)."""

    def __init__(self, popen: subprocess.Popen[bytes], stdout: trio.lowlevel.FdStream) -> None:
        self._popen = popen
        self.pid = popen.pid
        self.stdout = stdout
        self._wait_lock = trio.Lock()
        self._pidfd: int | None
        try:
            self._pidfd = os.pidfd_open(popen.pid)
        except (AttributeError, OSError):
            self._pidfd = None

    @property
    def returncode(self) -> int | None:
        """None while it runs, else its exit code (-N: killed by signal N); reaps it."""
        return self._popen.poll()

    async def wait(self) -> int:
        """Until it has ended; its return code."""
        async with self._wait_lock:
            while (code := self._popen.poll()) is None:
                if self._pidfd is None:
                    await trio.sleep(EXIT_POLL_S)
                    continue
                try:
                    await trio.lowlevel.wait_readable(self._pidfd)
                except trio.ClosedResourceError:  # (aclose meanwhile: poll instead)
                    pass
        return code

    def send_signal(self, sig: int) -> None:
        """``sig`` to the child, unless it has ended (and been reaped) already."""
        self._popen.send_signal(sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    async def aclose(self) -> None:
        """Close our ends of it (its stdout, the pidfd); the process itself is left alone.
        Idempotent."""
        if self._pidfd is not None:
            pidfd, self._pidfd = self._pidfd, None
            trio.lowlevel.notify_closing(pidfd)
            os.close(pidfd)
        await self.stdout.aclose()


def spawn(command: list[str], log: BinaryIO) -> ChildProcess:
    """Start ``command`` in a process group of its own (a terminal's Ctrl-C is for ``up``)
    with stdin /dev/null, stdout a pipe we read, stderr ``log``, and a parent-death signal.

    It forks from the main thread and blocks it for the fork and exec (milliseconds):
    the kernel sends the parent-death signal when the *thread* that forked the child
    ends, so a fork from a worker thread (``trio.lowlevel.open_process`` forks in one,
    and idle ones end after 10 s) would stop the children long before ``up`` ends.
    Raises RuntimeError off the main thread, OSError if the command cannot start;
    nothing is left open then."""
    if threading.current_thread() is not threading.main_thread():
        raise RuntimeError("spawn() forks from the main thread only")
    read_fd, write_fd = os.pipe()
    try:
        popen = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=write_fd,
            stderr=log,
            process_group=0,
            preexec_fn=_parent_death_hook(),
        )
    except BaseException:
        os.close(read_fd)
        raise
    finally:
        os.close(write_fd)
    return ChildProcess(popen, trio.lowlevel.FdStream(read_fd))


# ---------------------------------------------------------------- running it
@attrs.define(eq=False)
class Child:
    spec: ChildSpec
    #: the current process (a restart replaces it)
    process: ChildProcess
    log_path: Path
    #: the parent's handle on the log (the child writes its stderr through its own)
    log: BinaryIO
    address: str = "-"
    #: the nameservers a broker's ready line names
    namesrvs: list[str] = attrs.Factory(list)
    #: trio.current_time() when the current process was ready; None before
    ready_at: float | None = None
    #: how many times it was started again
    restarts: int = 0
    #: how it ended, for the stop report
    outcome: str = ""

    @property
    def title(self) -> str:
        return f"{self.spec.name} ({self.spec.kind.value}, pid {self.process.pid})"

    def write_log(self, data: bytes | bytearray) -> None:
        if data and not self.log.closed:
            self.log.write(data)
            self.log.flush()


class ChildFailed(Exception):
    """A child that could not be started: ``up`` stops the others."""

    def __init__(self, child: Child, what: str) -> None:
        super().__init__(f"{child.title} {what}")
        self.child = child


class NothingLeft(Exception):
    """Every child has ended and none will be started again."""


def log_tail(path: Path, lines: int = LOG_TAIL_LINES) -> list[str]:
    try:
        with path.open("rb") as f:
            size = f.seek(0, 2)
            f.seek(max(0, size - LOG_TAIL_BYTES))
            data = f.read()
    except OSError as exc:
        return [f"(cannot read {path}: {exc.strerror or exc})"]
    return data.decode(errors="replace").splitlines()[-lines:]


def describe_exit(code: int) -> str:
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


_BROKER_READY = re.compile(r"^hamq broker ready: .* at (\S+), nameserver (\S+)")
_NAMESERVER_READY = re.compile(r"^hamq nameserver ready: (\S+)")


def _say(message: str, *, err: bool = False) -> None:
    """Print, but never let a closed terminal or pipe stop the cluster from stopping."""
    try:
        typer.echo(message, err=err)
    except OSError:
        pass


class Cluster:
    """Starts, watches (and restarts) and stops the children of one profile (``run``)."""

    def __init__(self, profile: Profile, log_dir: Path, log_level: str, *, restart: bool) -> None:
        self.profile = profile
        self.log_dir = log_dir
        self.log_level = log_level
        self.restart = restart
        self.children: list[Child] = []
        self.exit_code = 0
        #: children that ended and will not be started again
        self._ended = 0
        #: a second signal while stopping: SIGKILL whatever is left, now
        self._hurry = False
        self._stop_wait: trio.CancelScope | None = None

    async def run(self) -> int:
        """Up until a signal (or a child that cannot start, or none left), then down;
        the exit code."""
        with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM, signal.SIGHUP) as signals:
            try:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(self._until_signalled, signals, nursery.cancel_scope)
                    await self._up(nursery)
                    await trio.sleep_forever()  # the supervisors raise NothingLeft
            except* ChildFailed as group:
                for exc in _leaves(group):
                    assert isinstance(exc, ChildFailed)
                    self._report_failure(exc)
                self.exit_code = 1
            except* NothingLeft:
                _say("error: every process has ended; nothing left to run", err=True)
                self.exit_code = 1
            except* OSError as group:  # a log file or a first spawn that failed
                for exc in _leaves(group):
                    _say(f"error: {exc}", err=True)
                self.exit_code = 1
            finally:
                with trio.CancelScope(shield=True):
                    await self._down(signals)
        return self.exit_code

    async def _until_signalled(self, signals: AsyncIterator[int], scope: trio.CancelScope) -> None:
        async for signum in signals:
            _say(f"{signal.Signals(signum).name}: stopping the cluster", err=True)
            scope.cancel()
            return

    # ------------------------------------------------------------ up
    @property
    def _restart_note(self) -> str:
        return "restarts: on" if self.restart else "restarts: off"

    async def _up(self, nursery: trio.Nursery) -> None:
        p = self.profile
        _say(
            f"starting profile {p.name} ({p.directory}): {len(p.children)} process(es); "
            f"logs in {self.log_dir}/{p.name}-<name>.log; {self._restart_note}"
        )
        for spec in p.children:
            child = await self._start(spec)
            nursery.start_soon(self._supervise, child)
        await self._until_registered()
        self._print_table()

    def _namesrvs(self) -> list[str]:
        """The nameservers clients use: the profile's, and those the brokers name."""
        namesrvs: list[str] = []
        for child in self.children:
            for addr in [child.address] if child.spec.kind is Kind.NAMESERVER else child.namesrvs:
                if addr != "-" and addr not in namesrvs:
                    namesrvs.append(addr)
        return namesrvs

    async def _until_registered(self) -> None:
        """Wait until every nameserver knows every master and slave. A nameserver
        embedded in a broker that started after another one learns of that one only at
        its next registration (retried within seconds), and a client asking it meanwhile
        would find no route. Late (REGISTERED_TIMEOUT_S): one warning line; the cluster
        runs on."""
        brokers = {c.address for c in self.children if c.spec.kind in (Kind.MASTER, Kind.SLAVE)}
        standalone = {c.address for c in self.children if c.spec.kind is Kind.NAMESERVER}
        namesrvs = self._namesrvs()
        if all(addr in standalone for addr in namesrvs):
            return  # (nameservers that started first know every broker from its start)
        unknown = ["the nameservers did not answer"]
        async with RemotingClient(config=self.profile.remoting) as client:
            with trio.move_on_after(REGISTERED_TIMEOUT_S):
                while True:
                    unknown = await _not_registered(client, namesrvs, brokers)
                    if not unknown:
                        return
                    await trio.sleep(0.1)
        _say(
            f"warning: after {REGISTERED_TIMEOUT_S:g} s {'; '.join(unknown)}: a client asking "
            "such a nameserver may find no route until the next registration",
            err=True,
        )

    def _command(self, spec: ChildSpec) -> list[str]:
        return [sys.executable, "-m", "cli.main", "--log-level", self.log_level, *spec.args]

    async def _start(self, spec: ChildSpec) -> Child:
        """The first start: rotate the log, spawn, wait until ready. Raises ChildFailed
        (the child recorded, for ``_down``) or OSError (nothing started)."""
        log_path = self.log_dir / f"{self.profile.name}-{spec.name}.log"
        log = open_log(log_path)
        try:
            process = spawn(self._command(spec), log)
        except BaseException:
            log.close()
            raise
        child = Child(spec, process, log_path, log)  # spawned means recorded: no await between
        self.children.append(child)
        started = trio.current_time()
        problem = await self._until_ready(child)
        if problem is not None:
            raise ChildFailed(child, problem)
        _say(
            f"  {spec.name}: {spec.kind.value} ready at {child.address} "
            f"in {trio.current_time() - started:.1f} s (pid {process.pid})"
        )
        return child

    async def _until_ready(self, child: Child) -> str | None:
        """Wait (at most READY_TIMEOUT_S) for the child's ready line; None once it is
        ready, else what went wrong (a late child is still running)."""
        try:
            with trio.fail_after(READY_TIMEOUT_S):
                line = await self._ready_line(child)
        except trio.TooSlowError:
            return f"was not ready after {READY_TIMEOUT_S:.0f} s"
        if line is None:
            with trio.move_on_after(KILL_WAIT_S):
                await child.process.wait()
            code = child.process.returncode
            how = describe_exit(code) if code is not None else "its output closed"
            return f"ended before it was ready ({how})"
        child.ready_at = trio.current_time()
        match = _BROKER_READY.match(line) or _NAMESERVER_READY.match(line)
        if match:
            child.address = match.group(1).rstrip(",")
            if match.re is _BROKER_READY:
                child.namesrvs = [a.strip(",") for a in match.group(2).split(";") if a.strip(",")]
        return None

    async def _ready_line(self, child: Child) -> str | None:
        """The child's ``hamq ... ready:`` line; None if its stdout ends first. Other
        lines, and what follows the ready line in the same read, go to its log."""
        stream = child.process.stdout
        buffer = b""
        while True:
            chunk = await stream.receive_some(4096)
            if not chunk:
                child.write_log(buffer)
                return None
            buffer += chunk
            while b"\n" in buffer:
                raw, buffer = buffer.split(b"\n", 1)
                line = raw.decode(errors="replace").strip()
                if line.startswith("hamq ") and " ready: " in line:
                    child.write_log(raw + b"\n" + buffer)
                    return line
                child.write_log(raw + b"\n")

    # ------------------------------------------------------------ supervising
    async def _supervise(self, child: Child) -> None:
        """Copy the child's stdout to its log until it ends; an end now is unexpected:
        one line says so. With restarts on, start it again after ``restart_delay`` of
        its quick failures in a row (ended before it was ready, or less than
        QUICK_FAILURE_S after); give up after RESTART_GIVE_UP of them. Raises
        NothingLeft once every child has ended for good."""
        quick = 0
        problem = await self._until_exit(child)
        while True:
            ready_at = child.ready_at
            if ready_at is None or trio.current_time() - ready_at < QUICK_FAILURE_S:
                quick += 1
            else:
                quick = 0
            delay = restart_delay(quick) if self.restart else None
            if delay is None:
                self._given_up(child, problem, quick)
                return
            _say(f"warning: {child.title} {problem}; starting it again in {delay:g} s", err=True)
            await trio.sleep(delay)
            problem = await self._restart(child) or await self._until_exit(child)

    async def _until_exit(self, child: Child) -> str:
        """Copy the child's stdout to its log until it ends; how it ended."""
        async for chunk in child.process.stdout:
            child.write_log(chunk)
        code = await child.process.wait()
        await child.process.aclose()
        return f"exited unexpectedly ({describe_exit(code)})"

    async def _restart(self, child: Child) -> str | None:
        """Start the child's command again, its output appended to the same log; None
        once it is ready, else what went wrong (it does not run then)."""
        child.restarts += 1
        child.ready_at = None
        child.write_log(
            f"---- hamq cluster up: {child.title} had ended; start {child.restarts + 1}\n".encode()
        )
        started = trio.current_time()
        try:
            process = spawn(self._command(child.spec), child.log)
        except OSError as exc:
            return f"could not be started again ({exc.strerror or exc})"
        child.process = process  # spawned means recorded: no await between
        problem = await self._until_ready(child)
        if problem is not None:
            process.kill()  # a late one still runs
            with trio.move_on_after(KILL_WAIT_S):
                await process.wait()
            await process.aclose()
            return problem
        _say(
            f"  {child.spec.name}: {child.spec.kind.value} ready again at {child.address} "
            f"in {trio.current_time() - started:.1f} s (pid {process.pid}, "
            f"restart {child.restarts})"
        )
        return None

    def _given_up(self, child: Child, problem: str, quick: int) -> None:
        if self.restart:
            verdict = f"{quick} quick failures in a row: not starting it again"
        else:
            verdict = "not started again (--no-restart), the others keep running"
        _say(f"error: {child.title} {problem}; {verdict}; its log: {child.log_path}", err=True)
        self._ended += 1
        if self._ended == len(self.profile.children):
            raise NothingLeft

    def _print_table(self) -> None:
        columns = ("name", "kind", "role", "broker id", "address", "pid")
        rows = [
            (
                child.spec.name,
                child.spec.kind.value,
                child.spec.role,
                "-" if child.spec.broker_id is None else str(child.spec.broker_id),
                child.address,
                str(child.process.pid),
            )
            for child in self.children
        ]
        table = Table(title=f"hamq cluster {self.profile.name}")
        for column in columns:
            table.add_column(column)
        for row in rows:
            table.add_row(*row)
        # never cut a name, an address or a pid short, however narrow the output (a pipe
        # counts as 80 columns): each column as wide as its widest cell, plus the borders
        widths = [len(column) for column in columns]
        for row in rows:
            widths = [max(w, len(cell)) for w, cell in zip(widths, row, strict=True)]
        width = max(console.width, sum(widths) + 3 * len(widths) + 1)
        with contextlib.suppress(OSError):
            Console(width=width).print(table)
        namesrvs = self._namesrvs()
        namesrv = ";".join(namesrvs)
        hint = f"clients: --namesrv {namesrv if len(namesrvs) < 2 else repr(namesrv)}"
        tls = self.profile.remoting.tls if self.profile.remoting is not None else None
        if tls is not None:  # (a root option: hamq --tls-ca CA produce ...)
            hint += f"; TLS: hamq --tls-ca {tls.ca_file or '<the CA of the servers>'} ..."
        _say(hint)
        _say(
            f"hamq cluster ready: {self.profile.name}, {len(self.children)} process(es); "
            f"logs in {self.log_dir}; {self._restart_note}; Ctrl-C stops them all"
        )

    def _report_failure(self, exc: ChildFailed) -> None:
        child = exc.child
        lines = log_tail(child.log_path)
        _say(f"error: {exc}; the last lines of {child.log_path}:", err=True)
        for line in lines or ["(empty)"]:
            _say(f"    {line}", err=True)

    # ------------------------------------------------------------ down
    async def _down(self, signals: AsyncIterator[int]) -> None:
        """Stop every child: controller-mode brokers, slaves, masters, nameservers;
        report how each ended."""
        present = {child.spec.kind for child in self.children}
        kinds = [_PLURAL[kind] for kind in reversed(START_ORDER) if kind in present]
        if kinds:
            _say(f"stopping: {', then '.join(kinds)}")
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._hurry_on_signal, signals)
                for kind in reversed(START_ORDER):
                    group = [c for c in self.children if c.spec.kind is kind]
                    if group:
                        await self._stop_group(group)
                nursery.cancel_scope.cancel()
        finally:
            for child in self.children:
                child.log.close()
                await child.process.aclose()

    async def _hurry_on_signal(self, signals: AsyncIterator[int]) -> None:
        async for signum in signals:
            if signum == signal.SIGHUP:  # a closing terminal may send two: not a hurry
                continue
            _say(f"{signal.Signals(signum).name} again: killing what is left", err=True)
            self._hurry = True
            if self._stop_wait is not None:
                self._stop_wait.cancel()

    async def _stop_group(self, group: list[Child]) -> None:
        """SIGTERM (SIGKILL in a hurry) to each, at most STOP_TIMEOUT_S, then SIGKILL."""
        running = []
        for child in group:
            code = child.process.returncode
            if code is None:
                running.append(child)
            elif not child.outcome:
                child.outcome = f"had already ended ({describe_exit(code)})"
                self.exit_code = 1
        sig = signal.SIGKILL if self._hurry else signal.SIGTERM
        started = trio.current_time()
        took: dict[int, float] = {}

        async def wait(child: Child) -> None:
            await child.process.wait()
            took[id(child)] = trio.current_time() - started

        for child in running:
            child.process.send_signal(sig)
        with trio.move_on_after(STOP_TIMEOUT_S) as self._stop_wait:
            async with trio.open_nursery() as waiting:
                for child in running:
                    waiting.start_soon(wait, child)
        self._stop_wait = None
        waited = trio.current_time() - started
        stubborn = [c for c in running if c.process.returncode is None]
        for child in stubborn:
            child.process.kill()
        with trio.move_on_after(KILL_WAIT_S):
            async with trio.open_nursery() as waiting:
                for child in stubborn:
                    waiting.start_soon(child.process.wait)
        for child in running:
            code = child.process.returncode
            if code is None:
                child.outcome = f"still running after SIGKILL (pid {child.process.pid})"
            elif child in stubborn:
                child.outcome = f"still running {waited:.1f} s after {sig.name}; SIGKILLed"
            else:
                seconds = took.get(id(child), waited)
                child.outcome = f"ended {seconds:.1f} s after {sig.name} ({describe_exit(code)})"
            if code not in (0, -signal.SIGTERM):  # (SIGTERM before its handler was set)
                self.exit_code = 1
        for child in group:
            _say(f"  {child.title}: {child.outcome}")


async def _not_registered(
    client: RemotingClient, namesrvs: list[str], brokers: set[str]
) -> list[str]:
    """Which nameserver does not know which of ``brokers`` (by address) yet: ``"ns
    does not know b1, b2"`` or ``"ns does not answer (...)"`` each; a nameserver that
    refuses the question (ACL) is not asked again."""
    unknown = []
    for namesrv in namesrvs:
        request = RemotingCommand.request(RequestCode.GET_BROKER_CLUSTER_INFO)
        try:
            response = await client.invoke(namesrv, request, 3.0)
            if response.code != ResponseCode.SUCCESS:
                continue
            info = decode_body(ClusterInfo, response.body)
        except (RemotingError, ProtocolError, BodyError) as exc:
            unknown.append(f"{namesrv} does not answer ({exc})")
            continue
        known = {a for data in info.broker_addr_table.values() for a in data.broker_addrs.values()}
        if missing := sorted(brokers - known):
            unknown.append(f"{namesrv} does not know {', '.join(missing)}")
    return unknown


def _leaves(group: BaseExceptionGroup[Any]) -> list[BaseException]:
    out: list[BaseException] = []
    for exc in group.exceptions:
        out += _leaves(exc) if isinstance(exc, BaseExceptionGroup) else [exc]
    return out


# ---------------------------------------------------------------- the command
@app.command()
def up(
    ctx: typer.Context,
    profile: Annotated[
        str,
        typer.Option(
            "--profile",
            "-p",
            help=f"A profile under conf/ ({', '.join(profile_names()) or 'none'}) or a directory.",
        ),
    ],
    log_dir: Annotated[
        Path, typer.Option("--log-dir", help="Where the children's logs go.")
    ] = Path("data/logs"),
    restart: Annotated[
        bool | None,
        typer.Option(
            "--restart/--no-restart",
            help="Start a process that ends on its own again (after 0.5-4 s; not after "
            f"{RESTART_GIVE_UP} quick failures in a row). Default: on when the profile's "
            "brokers are in controller mode (they come back as slaves), off otherwise.",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Start a profile's nameservers (with their controllers), masters, slaves and
    controller-mode brokers and watch them; Ctrl-C stops them all (brokers first)."""
    try:
        loaded = load_profile(profile)
    except ProfileError as exc:
        raise fail(str(exc), 2) from None
    try:
        log_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise fail(f"--log-dir {log_dir}: {exc.strerror or exc}", 2) from None
    if loaded.raft_secret_file is not None:
        try:
            ensure_raft_secret(loaded.raft_secret_file)
        except OSError as exc:
            secret = loaded.raft_secret_file
            raise fail(f"cannot write {secret}: {exc.strerror or exc}", 2) from None
    log_level = (ctx.obj or {}).get("log_level", "info")
    if restart is None:
        restart = loaded.controller_mode
    code = trio.run(Cluster(loaded, log_dir, log_level, restart=restart).run)
    if code:
        raise typer.Exit(code)
