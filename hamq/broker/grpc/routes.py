"""Where a broker group's gRPC endpoint is now: its master's.

A master answers itself. A slave asks its master (the one replication follows) for its
configuration once (GET_BROKER_CONFIG: ``grpc_port``, the port it serves gRPC on) and
keeps the answer for that address; after a failover the new master's address is asked
in its turn. A master that does not serve gRPC, or cannot be asked, leaves the group
without an endpoint for now (QueryRoute then says so; clients ask again).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from hamq.broker.context import BrokerContext
from hamq.broker.live_config import parse_properties
from hamq.protocol import RemotingCommand, RequestCode, ResponseCode
from hamq.remoting import RemotingClient, RemotingError, parse_address

log = logging.getLogger(__name__)

ASK_TIMEOUT_S = 3.0


class _Unknown(Exception):
    """The master could not be asked now."""


class MasterEndpoint:
    def __init__(
        self,
        ctx: BrokerContext,
        client: Callable[[], RemotingClient | None],
        master_address: Callable[[], str | None],
    ) -> None:
        self.ctx = ctx
        self._client = client
        self._master_address = master_address
        #: master remoting address -> its gRPC (host, port); None: it serves none
        self._known: dict[str, tuple[str, int] | None] = {}

    async def __call__(self) -> tuple[str, int] | None:
        if self.ctx.roles.is_master:
            return (self.ctx.config.advertised_host, self.ctx.grpc_port)
        address = self._master_address()
        if address is None:
            return None
        if address not in self._known:
            try:
                self._known[address] = await self._ask(address)
            except _Unknown:
                return None
        return self._known[address]

    async def _ask(self, address: str) -> tuple[str, int] | None:
        """The master's gRPC endpoint; None if it serves none; _Unknown if it cannot tell."""
        client = self._client()
        if client is None:
            raise _Unknown
        try:
            response = await client.invoke(
                address, RemotingCommand.request(RequestCode.GET_BROKER_CONFIG), ASK_TIMEOUT_S
            )
        except RemotingError as exc:
            log.info("gRPC: cannot ask master %s for its endpoint: %s", address, exc)
            raise _Unknown from None
        if response.code != ResponseCode.SUCCESS:
            raise _Unknown
        settings = parse_properties(response.body.decode("utf-8", "replace"))
        port = settings.get("grpc_port", "")
        if not port.isdigit() or not 0 < int(port) < 65536:
            return None
        return (parse_address(address)[0], int(port))
