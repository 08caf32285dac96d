"""``hamq broker``, ``hamq nameserver`` and ``hamq controller``: the servers, in the
foreground.

Both print one line when they serve (``hamq broker ready: ...``), log to stderr, and
stop cleanly on Ctrl-C or SIGTERM (the broker writes its state and closes its store).
A broker is ready once a nameserver has accepted its registration (clients can find
it); until then it serves and retries, and its log says once per nameserver why it is
not registered (hamq/broker/registration.py).
A broker whose store directory another process holds says so in one line, naming the
holder's PID (exit code 2).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import attrs
import trio
import typer

from cli.common import fail, run
from hamq.acl import AclFileError
from hamq.broker import BrokerNode, ConfigError, load_config
from hamq.broker.config import read_secret_file
from hamq.controller import DEFAULT_CONTROLLER_PORT, ControllerConfig, ControllerServer
from hamq.controller.service import Controller
from hamq.remoting import RemotingConfig, format_address
from hamq.remoting.tls import TlsConfig
from hamq.store.message_store import StoreLockedError
from nameserver import DEFAULT_PORT, NameServer, NameServerConfig

RaftAddress = Annotated[
    str | None,
    typer.Option(
        "--raft-address", help="This controller's Raft address (host:port; default port + 1)."
    ),
]
RaftPeers = Annotated[
    str | None,
    typer.Option(
        "--raft-peers",
        help="Every controller's Raft address, ';'-separated (this one's included); "
        "none: a single controller.",
    ),
]
RaftSecretFile = Annotated[
    Path | None,
    typer.Option(
        "--raft-secret-file",
        envvar="HAMQ_RAFT_SECRET_FILE",
        help="A file holding the secret the controllers share (Raft messages are encrypted "
        "and authenticated with it); or the secret itself in HAMQ_RAFT_SECRET.",
    ),
]
InsecureRaft = Annotated[
    bool,
    typer.Option(
        "--insecure-raft",
        help="Run a group of controllers without a Raft secret: anyone who reaches a "
        "Raft port can then run code in the controller.",
    ),
]
ControllerDir = Annotated[
    Path | None,
    typer.Option("--controller-dir", help="Where the controller keeps its Raft log."),
]
GrpcPort = Annotated[
    int | None,
    typer.Option(
        "--grpc-port",
        min=0,
        max=65535,
        help="Serve RocketMQ 5's gRPC clients on this port (0: any free one; default off).",
    ),
]
MetricsPort = Annotated[
    int | None,
    typer.Option(
        "--metrics-port",
        min=0,
        max=65535,
        help="Serve Prometheus metrics over HTTP on this port (/metrics; 0: any free one).",
    ),
]


TlsCert = Annotated[
    Path | None,
    typer.Option(
        "--tls-cert",
        help="PEM certificate chain: serve TLS on every port (default: plain TCP); "
        "this server's own connections then use TLS too.",
    ),
]
TlsKey = Annotated[
    Path | None,
    typer.Option("--tls-key", help="PEM private key of --tls-cert (default: in that file)."),
]
TlsCa = Annotated[
    Path | None,
    typer.Option(
        "--tls-ca",
        help="PEM CA certificate(s) trusted for peers' certificates (else the system's).",
    ),
]
TlsVerifyClient = Annotated[
    bool,
    typer.Option(
        "--tls-verify-client",
        help="Require clients to present a certificate signed by --tls-ca (mutual TLS).",
    ),
]


def _remoting(
    cert: Path | None, key: Path | None, ca: Path | None, verify_client: bool
) -> RemotingConfig:
    """The remoting settings of --tls-*: plain TCP without --tls-cert."""
    if cert is None:
        if key is not None or ca is not None or verify_client:
            raise fail("--tls-key, --tls-ca and --tls-verify-client need --tls-cert", 2)
        return RemotingConfig()
    try:
        tls = TlsConfig(cert_file=cert, key_file=key, ca_file=ca, verify_client=verify_client)
    except ValueError as exc:
        raise fail(str(exc), 2) from None
    return RemotingConfig(tls=tls)


AclFile = Annotated[
    Path | None,
    typer.Option(
        "--acl-file",
        help="ACL accounts (RocketMQ's plain_acl.yml): registering, unregistering and "
        "heartbeating brokers, deleting topics and the controllers' elections then need a "
        "request signed by an admin account. Read again when it changes.",
    ),
]


def _metrics_note(host: str, port: int | None) -> str:
    """', metrics http://host:port/metrics' for a ready line, or nothing."""
    return "" if port is None else f", metrics http://{host}:{port}/metrics"


Unclean = Annotated[
    bool,
    typer.Option(
        "--elect-unclean-master/--no-elect-unclean-master",
        help="Elect a broker outside the SyncStateSet when no member of it is alive.",
    ),
]


def _raft_secret(secret_file: Path | None) -> str | None:
    """The shared Raft secret: the file's content (stripped), else $HAMQ_RAFT_SECRET."""
    if secret_file is None:
        return os.environ.get("HAMQ_RAFT_SECRET") or None
    try:
        return read_secret_file("--raft-secret-file", secret_file)
    except ConfigError as exc:
        raise fail(str(exc), 2) from None


def _controller_config(
    host: str,
    port: int,
    raft_address: str | None,
    raft_peers: str | None,
    data_dir: Path | None,
    unclean: bool,
    secret_file: Path | None,
    insecure: bool,
) -> ControllerConfig:
    if raft_address is None:
        if port == 0:
            raise fail("--raft-address is needed with --port 0", 2)
        raft_address = f"{host}:{port + 1}"
    peers = tuple(p.strip() for p in (raft_peers or "").split(";") if p.strip())
    try:
        return ControllerConfig(
            raft_address=raft_address,
            raft_peers=peers,
            data_dir=data_dir or Path("./data/controller") / raft_address.replace(":", "_"),
            enable_elect_unclean_master=unclean,
            raft_secret=_raft_secret(secret_file),
            insecure_raft=insecure,
        )
    except ValueError as exc:
        raise fail(str(exc), 2) from None


def broker(
    config: Annotated[
        Path | None,
        typer.Option("--config", "-c", help="A TOML file (see conf/broker.toml)."),
    ] = None,
    broker_name: Annotated[str | None, typer.Option("--name", help="Broker name.")] = None,
    cluster_name: Annotated[str | None, typer.Option("--cluster", help="Cluster name.")] = None,
    broker_id: Annotated[
        int | None, typer.Option("--broker-id", help="0 for a master, 1, 2, ... for slaves.")
    ] = None,
    host: Annotated[str | None, typer.Option("--host", help="Address to listen on.")] = None,
    port: Annotated[
        int | None, typer.Option("--port", "-p", help="Port to listen on (0: any free one).")
    ] = None,
    namesrv: Annotated[
        str | None,
        typer.Option(
            "--namesrv",
            "-n",
            envvar="HAMQ_NAMESRV",
            help="Nameserver address(es), ';'-separated; none: run one in this process.",
        ),
    ] = None,
    namesrv_port: Annotated[
        int | None,
        typer.Option("--namesrv-port", help="Port of the embedded nameserver (default 9876)."),
    ] = None,
    store_dir: Annotated[
        Path | None, typer.Option("--store-dir", help="Where the data goes (./data/store).")
    ] = None,
    flush: Annotated[str | None, typer.Option("--flush", help="ASYNC_FLUSH or SYNC_FLUSH.")] = None,
    metrics_port: MetricsPort = None,
    grpc_port: GrpcPort = None,
    tls_cert: TlsCert = None,
    tls_key: TlsKey = None,
    tls_ca: TlsCa = None,
    tls_verify_client: TlsVerifyClient = False,
) -> None:
    """Run a broker. With no nameserver address it embeds one: one command, a broker."""
    overrides: dict[str, Any] = {
        "broker_name": broker_name,
        "cluster_name": cluster_name,
        "broker_id": broker_id,
        "listen_host": host,
        "listen_port": port,
        "embedded_namesrv_port": namesrv_port,
        "store.store_dir": str(store_dir) if store_dir is not None else None,
        "store.flush_disk_type": flush,
        "metrics_port": metrics_port,
        "grpc_port": grpc_port,
        **_tls_overrides(tls_cert, tls_key, tls_ca, tls_verify_client),
    }
    if namesrv is not None:
        overrides["namesrv_addrs"] = [a.strip() for a in namesrv.split(";") if a.strip()]
    _serve_broker(_broker_node(config, overrides))


def _tls_overrides(
    cert: Path | None, key: Path | None, ca: Path | None, verify_client: bool
) -> dict[str, Any]:
    """The broker's --tls-* options, over the config file's [remoting.tls]."""
    return {
        "remoting.tls.cert_file": None if cert is None else str(cert),
        "remoting.tls.key_file": None if key is None else str(key),
        "remoting.tls.ca_file": None if ca is None else str(ca),
        "remoting.tls.verify_client": True if verify_client else None,
    }


def _broker_node(config: Path | None, overrides: dict[str, Any]) -> BrokerNode:
    """The broker of the config file and the options: a bad one ends the command here
    (exit code 2)."""
    try:
        return BrokerNode(load_config(config, overrides))
    except (ConfigError, AclFileError) as exc:
        raise fail(str(exc), 2) from None


def _serve_broker(node: BrokerNode) -> None:
    """Run ``node`` in the foreground, with its ready line; a store directory another
    broker holds is bad input (exit code 2), not a failure."""
    locked: BaseException | None = None

    async def main() -> None:
        nonlocal locked
        try:
            async with trio.open_nursery() as nursery:
                await nursery.start(node.run)
                await node.wait_registered()  # ready: clients can find it
                embedded = " (embedded)" if node.nameserver is not None else ""
                metrics = _metrics_note(node.config.listen_host, node.metrics_port)
                grpc = ""
                if node.ctx.grpc_port:
                    grpc = f", gRPC {format_address(node.config.listen_host, node.ctx.grpc_port)}"
                typer.echo(
                    f"hamq broker ready: broker {node.config.broker_name} at {node.address}, "
                    f"nameserver {';'.join(node.namesrv_addrs)}{embedded}, "
                    f"store {node.config.store.store_dir}{grpc}{metrics}"
                )
        except* StoreLockedError as refused:
            locked = _first_leaf(refused)

    run(main)
    if locked is not None:
        raise fail(str(locked), 2)


def _first_leaf(error: BaseException) -> BaseException:
    while isinstance(error, BaseExceptionGroup):
        error = error.exceptions[0]
    return error


def nameserver(
    host: Annotated[str, typer.Option("--host", help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[
        int, typer.Option("--port", "-p", min=0, max=65535, help="Port (0: any free one).")
    ] = DEFAULT_PORT,
    controller: Annotated[
        bool,
        typer.Option(
            "--controller/--no-controller",
            help="Embed a controller (enableControllerInNamesrv): brokers in controller "
            "mode name this nameserver's address as a controller.",
        ),
    ] = False,
    raft_address: RaftAddress = None,
    raft_peers: RaftPeers = None,
    controller_dir: ControllerDir = None,
    unclean: Unclean = False,
    raft_secret_file: RaftSecretFile = None,
    insecure_raft: InsecureRaft = False,
    metrics_port: MetricsPort = None,
    tls_cert: TlsCert = None,
    tls_key: TlsKey = None,
    tls_ca: TlsCa = None,
    tls_verify_client: TlsVerifyClient = False,
    acl_file: AclFile = None,
) -> None:
    """Run a nameserver. Several may run side by side; they never talk to each other
    (embedded controllers do, over Raft)."""
    embedded = None
    if controller:
        embedded = Controller(
            _controller_config(
                host,
                port,
                raft_address,
                raft_peers,
                controller_dir,
                unclean,
                raft_secret_file,
                insecure_raft,
            )
        )
    try:
        server = NameServer(
            NameServerConfig(
                host=host,
                port=port,
                metrics_port=metrics_port,
                remoting=_remoting(tls_cert, tls_key, tls_ca, tls_verify_client),
                acl_file=acl_file,  # (it covers the embedded controller's requests too)
            ),
            controller=embedded,
        )
    except AclFileError as exc:
        raise fail(str(exc), 2) from None

    def ready(bound: int) -> str:
        extra = f", controller raft {embedded.config.raft_address}" if embedded else ""
        extra += _metrics_note(host, server.metrics_port)
        return f"hamq nameserver ready: {host}:{bound}{extra}"

    _serve(server, ready)


def controller(
    host: Annotated[str, typer.Option("--host", help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[
        int, typer.Option("--port", "-p", min=0, max=65535, help="Port (0: any free one).")
    ] = DEFAULT_CONTROLLER_PORT,
    raft_address: RaftAddress = None,
    raft_peers: RaftPeers = None,
    data_dir: ControllerDir = None,
    unclean: Unclean = False,
    raft_secret_file: RaftSecretFile = None,
    insecure_raft: InsecureRaft = False,
    metrics_port: MetricsPort = None,
    tls_cert: TlsCert = None,
    tls_key: TlsKey = None,
    tls_ca: TlsCa = None,
    tls_verify_client: TlsVerifyClient = False,
    acl_file: AclFile = None,
) -> None:
    """Run a controller (automatic failover): 1 or 3 of them, Raft between them."""
    config = _controller_config(
        host,
        port,
        raft_address,
        raft_peers,
        data_dir,
        unclean,
        raft_secret_file,
        insecure_raft,
    )
    try:
        server = ControllerServer(
            attrs.evolve(config, acl_file=acl_file),
            host=host,
            port=port,
            metrics_port=metrics_port,
            remoting=_remoting(tls_cert, tls_key, tls_ca, tls_verify_client),
        )
    except AclFileError as exc:
        raise fail(str(exc), 2) from None

    _serve(
        server,
        lambda bound: (
            f"hamq controller ready: {host}:{bound}, raft "
            f"{server.controller.config.raft_address}"
            f"{_metrics_note(host, server.metrics_port)}"
        ),
    )


def _serve(server: NameServer | ControllerServer, ready: Callable[[int], str]) -> None:
    """Run ``server`` in the foreground until Ctrl-C or SIGTERM; once it serves, print
    ``ready(the port it listens on)`` (the ready line)."""

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            bound = await nursery.start(server.run)
            typer.echo(ready(bound))

    run(main)
