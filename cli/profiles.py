"""Cluster profiles: the files of conf/<profile>, read and checked, as the children to run.

A profile is a directory: one broker TOML per broker (``hamq broker -c``'s format; any
``*.toml`` but ``cluster.toml``) and optionally ``cluster.toml`` with
``nameserver_ports = [9876, 9877]`` (one ``hamq nameserver --port N`` each, on
127.0.0.1). With ``embed_controller = true`` each nameserver also runs a controller
(``--controller``), Raft between them on ``raft_ports`` (default: each nameserver's port
+ 1), each keeping its Raft log in ``<controller_dir>/nameserver-<port>`` (default
controller_dir ./data/controller). ``--profile NAME`` is a directory under the source
checkout's conf/ (conf/README.md lists them); anything else is taken as a path.

Invariants: a Profile is checked whole before anything starts (``load_profile``): every
file parses, no two children share a port, a store or a (broker_name, broker_id), a
broker that names this profile's nameservers as controllers has them embed one; any
problem is one ProfileError naming the file. Its children are in START_ORDER: nameservers,
masters (broker_id 0), slaves, then brokers in controller mode. This module only reads
files (and writes the Raft secret, ``ensure_raft_secret``): it starts no process and
runs no event loop (an import-linter contract keeps it so).
"""

from __future__ import annotations

import enum
import os
import secrets
import tomllib
from pathlib import Path
from typing import Any

import attrs

from hamq.broker import BrokerConfig, ConfigError, build_config
from hamq.broker.config import resolve_files
from hamq.remoting import RemotingConfig

#: profiles by name: the conf/ directory of the source checkout
CONF_DIR = Path(__file__).resolve().parent.parent / "conf"
CLUSTER_FILE = "cluster.toml"
NAMESERVER_HOST = "127.0.0.1"
#: where embedded controllers keep their Raft logs unless cluster.toml says otherwise
DEFAULT_CONTROLLER_DIR = Path("data/controller")
#: the embedded controllers' shared secret, in controller_dir
RAFT_SECRET_FILE = "raft.secret"


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
        if config.grpc_port:
            ports.add(config.grpc_port)
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
