"""Where a topic's queues are served over gRPC: each broker group's master's endpoint.

A topic's broker groups come from the nameservers' route (GET_ROUTEINFO_BY_TOPIC, the
one a remoting client reads), this broker's own group from its own topic table (the
freshest: a topic it just created is not registered yet). Each group's endpoint is its
master's gRPC port at the master's host: this broker itself when it is that master;
else asked of the master (GET_BROKER_CONFIG: ``grpc_port``, the port it serves) and
kept for ``KNOWN_FOR_S`` per address, so that after a failover the new master's address
is asked in its turn, and a broker restarted with another port (or with gRPC turned on
or off) is asked again. A master that does not serve gRPC, or cannot be asked now,
leaves its group out of the answer (clients ask again).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import attrs
import trio

from hamq.broker.context import BrokerContext
from hamq.broker.live_config import parse_properties
from hamq.protocol import RemotingCommand, RequestCode, ResponseCode
from hamq.protocol.bodies import QueueData, TopicConfig, TopicRouteData, decode_body
from hamq.protocol.headers import GetRouteInfoRequestHeader
from hamq.remoting import RemotingClient, RemotingError, parse_address

log = logging.getLogger(__name__)

ASK_TIMEOUT_S = 3.0
#: how long a master's answer (its gRPC endpoint, or none) is kept
KNOWN_FOR_S = 30.0

Endpoint = tuple[str, int]


class _Unknown(Exception):
    """The master could not be asked now."""


@attrs.frozen
class GroupQueues:
    """A broker group's queues of a topic, and where they are served over gRPC."""

    broker_name: str
    endpoint: Endpoint
    read_queue_nums: int
    write_queue_nums: int
    perm: int


class GrpcRoutes:
    def __init__(
        self,
        ctx: BrokerContext,
        client: Callable[[], RemotingClient | None],
        master_address: Callable[[], str | None],
        namesrv_addrs: Callable[[], list[str]],
    ) -> None:
        self.ctx = ctx
        self._client = client
        self._master_address = master_address
        self._namesrv_addrs = namesrv_addrs
        #: master remoting address -> (when asked, its gRPC endpoint; None: it serves none)
        self._known: dict[str, tuple[float, Endpoint | None]] = {}
        #: masters asked for their gRPC endpoint (GET_BROKER_CONFIG sent)
        self.asked = 0

    async def topic(self, topic: str) -> list[GroupQueues]:
        """Every broker group of ``topic`` that has a master serving gRPC now."""
        groups: dict[str, GroupQueues] = {}
        route = await self._route(topic) or TopicRouteData()
        masters = {data.broker_name: data.master_addr() for data in route.broker_datas}
        own_name = self.ctx.config.broker_name
        config: TopicConfig | QueueData | None = self.ctx.topics.get(topic)
        for queues in route.queue_datas:
            name = queues.broker_name
            if name == own_name:
                if config is None:  # (a slave that has not copied it yet: the route's)
                    config = queues
                continue
            master = masters.get(name)
            endpoint = await self._endpoint_at(master) if master is not None else None
            if endpoint is not None:
                groups[name] = GroupQueues(
                    name, endpoint, queues.read_queue_nums, queues.write_queue_nums, queues.perm
                )
        own = await self.own_endpoint() if config is not None else None
        if config is not None and own is not None:
            groups[own_name] = GroupQueues(
                own_name, own, config.read_queue_nums, config.write_queue_nums, config.perm
            )
        return [groups[name] for name in sorted(groups)]

    async def own_endpoint(self) -> Endpoint | None:
        """This broker group's master's endpoint."""
        if self.ctx.roles.is_master:
            return (self.ctx.config.advertised_host, self.ctx.grpc_port)
        address = self._master_address()
        return await self._endpoint_at(address) if address is not None else None

    async def _endpoint_at(self, address: str) -> Endpoint | None:
        if address == self.ctx.address and self.ctx.roles.is_master:
            return (self.ctx.config.advertised_host, self.ctx.grpc_port)
        known = self._known.get(address)
        now = trio.current_time()
        if known is None or now - known[0] >= KNOWN_FOR_S:
            try:
                known = self._known[address] = (now, await self._ask_endpoint(address))
            except _Unknown:
                return None
        return known[1]

    async def _ask_endpoint(self, address: str) -> Endpoint | None:
        """The gRPC endpoint of the broker at ``address``; None if it serves none;
        _Unknown if it cannot be asked now."""
        self.asked += 1
        response = await self._ask(address, RemotingCommand.request(RequestCode.GET_BROKER_CONFIG))
        if response is None or response.code != ResponseCode.SUCCESS:
            raise _Unknown
        settings = parse_properties(response.body.decode("utf-8", "replace"))
        port = settings.get("grpc_port", "")
        if not port.isdigit() or not 0 < int(port) < 65536:
            return None
        return (parse_address(address)[0], int(port))

    async def _route(self, topic: str) -> TopicRouteData | None:
        """The nameservers' route of ``topic`` (the first that has one), else None."""
        for namesrv in self._namesrv_addrs():
            request = RemotingCommand.request(
                RequestCode.GET_ROUTEINFO_BY_TOPIC, GetRouteInfoRequestHeader(topic)
            )
            response = await self._ask(namesrv, request)
            if response is not None and response.code == ResponseCode.SUCCESS:
                try:
                    return decode_body(TopicRouteData, response.body)
                except ValueError as exc:
                    log.info("gRPC: %s's route of %s does not read: %s", namesrv, topic, exc)
        return None

    async def _ask(self, address: str, request: RemotingCommand) -> RemotingCommand | None:
        client = self._client()
        if client is None:
            return None
        try:
            return await client.invoke(address, request, ASK_TIMEOUT_S)
        except RemotingError as exc:
            log.info("gRPC routes: cannot ask %s: %s", address, exc)
            return None
