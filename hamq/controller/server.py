"""``hamq controller``: a controller on a remoting server of its own.

(Embedded in a nameserver instead, the controller's processors share the
nameserver's server: nameserver.NameServer with a ``controller``.)
"""

from __future__ import annotations

import logging

import trio

from hamq.controller.metrics import ControllerCollector
from hamq.controller.service import Controller, ControllerConfig
from hamq.metrics import MetricsServer, new_registry
from hamq.remoting import Dispatcher, RemotingConfig, RemotingServer

log = logging.getLogger(__name__)

#: RocketMQ's controller listens on 9878 by default
DEFAULT_CONTROLLER_PORT = 9878


class ControllerServer:
    def __init__(
        self,
        config: ControllerConfig,
        *,
        host: str = "127.0.0.1",
        port: int = DEFAULT_CONTROLLER_PORT,
        remoting: RemotingConfig | None = None,
        metrics_port: int | None = None,
    ) -> None:
        self.controller = Controller(config)
        self.host = host
        #: Prometheus metrics over HTTP on ``host``: None off, 0 a free port (then the
        #: port it got, once running)
        self.metrics_port = metrics_port
        dispatcher = Dispatcher()
        self.controller.install(dispatcher)
        self.server = RemotingServer(
            dispatcher, host=host, port=port, config=remoting or RemotingConfig()
        )
        self.server.on_close(self.controller.connection_closed)

    @property
    def address(self) -> str:
        return self.server.address

    async def run(self, *, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            await nursery.start(self.controller.run)
            port = await nursery.start(self.server.run)
            if self.metrics_port is not None:
                registry = new_registry()
                registry.register(ControllerCollector(self.controller))
                metrics = MetricsServer(registry, self.host, self.metrics_port)
                self.metrics_port = await nursery.start(metrics.run)
            log.info("controller serving on %s", self.server.address)
            task_status.started(port)
