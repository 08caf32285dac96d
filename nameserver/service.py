"""NameServer: the route table behind a RemotingServer, plus housekeeping.

Stateless in the sense that matters: nothing is persisted and several nameservers
never talk to each other; each learns the cluster from the brokers that register
with it. Housekeeping drops a broker ``broker_timeout_ms`` (120 s) after it was last
heard, scanning every ``scan_interval_s`` (10 s), and at once when the connection it
registered over closes.

With a ``controller`` (``enableControllerInNamesrv``), the nameserver's server also
answers the controller's requests; BROKER_HEARTBEAT feeds both (a controller heartbeat
names its brokerId). The nameserver knows the controller only as an ``Embedded``
service (the protocol below): whoever composes them (the CLI) passes a
``hamq.controller.Controller``; this package never imports it.

With an ``acl_file`` (RocketMQ's plain_acl.yml format), what changes the route table or
the controller — REGISTER_BROKER, UNREGISTER_BROKER, BROKER_HEARTBEAT,
DELETE_TOPIC_IN_NAMESRV, the controller's elections and registrations — needs a request
signed by an admin account (hamq.acl.rights); route and cluster reads stay open. The
file is read again when it changes.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

import attrs
import trio
from attrs import validators as v
from prometheus_client.registry import Collector

from hamq.acl import NAMESERVER_POLICY, AclGuard
from hamq.metrics import MetricsServer, new_registry
from hamq.protocol import RemotingCommand, RequestCode
from hamq.protocol.headers import BrokerHeartbeatRequestHeader
from hamq.remoting import Connection, Dispatcher, RemotingConfig, RemotingServer
from nameserver.metrics import NameServerCollector
from nameserver.processors import NameServerProcessors
from nameserver.route_table import DEFAULT_BROKER_TIMEOUT_MS, RouteTable

log = logging.getLogger(__name__)

DEFAULT_PORT = 9876


def wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


@attrs.frozen
class NameServerConfig:
    host: str = "127.0.0.1"
    port: int = attrs.field(default=DEFAULT_PORT, validator=[v.ge(0), v.le(65535)])
    scan_interval_s: float = attrs.field(default=10.0, validator=v.gt(0.0))
    broker_timeout_ms: int = attrs.field(default=DEFAULT_BROKER_TIMEOUT_MS, validator=v.gt(0))
    #: Prometheus metrics over HTTP (``/metrics``) on ``host``; None: off, 0: a free port
    metrics_port: int | None = attrs.field(
        default=None, validator=v.optional([v.ge(0), v.le(65535)])
    )
    remoting: RemotingConfig = attrs.field(factory=RemotingConfig)
    #: the accounts (plain_acl.yml); None: no ACL (anyone may register a broker)
    acl_file: Path | None = attrs.field(default=None, converter=attrs.converters.optional(Path))


class Embedded(Protocol):
    """A service that shares the nameserver's port and connections: the controller."""

    def install(self, dispatcher: Dispatcher, *, heartbeat: bool = True) -> None: ...

    async def run(self, *, task_status: trio.TaskStatus[None] = ...) -> None: ...

    def connection_closed(self, conn: Connection) -> None: ...

    def heartbeat(self, request: RemotingCommand, conn: Connection) -> RemotingCommand: ...

    def collector(self) -> Collector:
        """Its metrics, served beside the nameserver's."""
        ...


@attrs.frozen
class NameServerStatistics:
    address: str
    brokers: int
    topics: int
    clusters: int
    brokers_expired: int


class NameServer:
    def __init__(
        self,
        config: NameServerConfig | None = None,
        *,
        clock: Callable[[], int] = wall_clock_ms,
        controller: Embedded | None = None,
    ) -> None:
        self.config = config or NameServerConfig()
        self.table = RouteTable()
        self._clock = clock
        self.controller = controller
        #: the ACL (config.acl_file; AclFileError here if the file cannot be used)
        self.acl = (
            AclGuard(self.config.acl_file, NAMESERVER_POLICY)
            if self.config.acl_file is not None
            else None
        )
        dispatcher = Dispatcher(guard=self.acl)
        self._processors = NameServerProcessors(self.table, clock, self.config.broker_timeout_ms)
        self._processors.install(dispatcher, heartbeat=controller is None)
        if controller is not None:
            controller.install(dispatcher, heartbeat=False)
            dispatcher.register(RequestCode.BROKER_HEARTBEAT, self._heartbeat)
        self.server = RemotingServer(
            dispatcher, host=self.config.host, port=self.config.port, config=self.config.remoting
        )
        self.server.on_close(self._connection_closed)
        self._expired = 0
        #: the port metrics are served on (None: off)
        self.metrics_port: int | None = None

    @property
    def address(self) -> str:
        return self.server.address

    async def run(self, *, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            if self.controller is not None:
                await nursery.start(self.controller.run)
            if self.acl is not None:
                await nursery.start(self.acl.run)
            port = await nursery.start(self.server.run)
            if self.config.metrics_port is not None:
                self.metrics_port = await nursery.start(self._metrics_server().run)
            nursery.start_soon(self._housekeeping)
            log.info("nameserver serving on %s", self.server.address)
            task_status.started(port)

    def _metrics_server(self) -> MetricsServer:
        """This nameserver's metrics, and its embedded controller's, on metrics_port."""
        registry = new_registry()
        registry.register(NameServerCollector(self))
        if self.controller is not None:
            registry.register(self.controller.collector())
        assert self.config.metrics_port is not None
        return MetricsServer(registry, self.config.host, self.config.metrics_port)

    def shutdown(self, grace_s: float = 5.0) -> None:
        self.server.shutdown(grace_s)

    async def _housekeeping(self) -> None:
        while True:
            await trio.sleep(self.config.scan_interval_s)
            self._expired += len(self.table.scan_inactive(self._clock()))

    def _connection_closed(self, conn: Connection) -> None:
        self.table.connection_closed(conn)
        if self.controller is not None:
            self.controller.connection_closed(conn)

    def _heartbeat(self, request: RemotingCommand, conn: Connection) -> RemotingCommand | None:
        if request.header(BrokerHeartbeatRequestHeader).broker_id is None:
            return self._processors.broker_heartbeat(request, conn)
        return self.controller.heartbeat(request, conn) if self.controller else None

    def statistics(self) -> NameServerStatistics:
        return NameServerStatistics(
            address=self.server.address,
            brokers=len(self.table.live),
            topics=len(self.table.topics),
            clusters=len(self.table.clusters),
            brokers_expired=self._expired,
        )
