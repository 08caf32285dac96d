"""``hamq controller``: a controller on a remoting server of its own.

(Embedded in a nameserver instead, the controller's processors share the
nameserver's server: nameserver.NameServer with a ``controller``.)
"""

from __future__ import annotations

import logging

import trio

from hamq.controller.service import Controller, ControllerConfig
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
    ) -> None:
        self.controller = Controller(config)
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
            log.info("controller serving on %s", self.server.address)
            task_status.started(port)
