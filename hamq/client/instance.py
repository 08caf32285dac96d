"""ClientInstance: what producers and consumers of one client share.

One per Producer / PushConsumer / PullConsumer / AdminClient. It holds the remoting
client (one connection per address), the nameserver list, the route cache and the
broker address table, and runs two background tasks in its own nursery:
- every ``poll_name_server_interval_s`` (30 s) it refreshes every known topic's route;
- every ``heartbeat_broker_interval_s`` (30 s) it sends HEART_BEAT to every known
  broker, naming its producer groups and consumer groups (with subscriptions).

Nameservers: one is used at a time, starting at a random one; when it fails (cannot
connect, times out, connection drops, or the address is a broker's or a controller's)
the next one is tried at once, and so on round the list; the one that answered is kept
(and the failures before it logged, once). ``NameServerUnavailableError`` only when
none answers, naming each address and why. A nameserver that answers can still be
behind: cut off with a deposed master, it names that master, or (the master registered
there under its own id once fenced) none. So a route with a broker group whose master
is missing or refused a send lately (SERVICE_NOT_AVAILABLE: it lost its controller
lease, or is a slave now; ``master_refused``, for REFUSED_MASTER_S or until it takes a
send) is asked of the other nameservers too; one whose route has fewer such groups is
used from then on (logged).

What brokers ask of a client over its connections (a consumer group's members
changed, offsets reset, a consumer's status, a transaction check) is answered by
hamq/client/broker_requests.py, from the registries kept here: ``consumers`` and
``transaction_producers`` by group. The configuration is hamq/client/config.py's.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import random
import time
from collections.abc import Callable
from types import TracebackType
from typing import Any, Self

import anyio
import anyio.abc

from hamq.acl import signer
from hamq.client.broker_requests import BrokerRequests, GroupMember, TransactionChecker
from hamq.client.config import ClientConfig
from hamq.client.errors import (
    NETWORK_ERRORS,
    BrokerError,
    ClientError,
    NameServerUnavailableError,
    NoMasterError,
    NoRouteError,
)
from hamq.client.route_cache import (
    PublishInfo,
    broker_table,
    pick_address,
    publish_info,
    read_only,
    subscribe_queues,
    without_master,
)
from hamq.protocol import RemotingCommand, RequestCode, ResponseCode, SerializeType
from hamq.protocol.bodies import (
    MASTER_ID,
    BodyError,
    HeartbeatData,
    MessageQueue,
    ProducerData,
    TopicRouteData,
    decode_body,
    encode_body,
)
from hamq.protocol.headers import GetRouteInfoRequestHeader, UnregisterClientRequestHeader
from hamq.protocol.message import DEFAULT_TOPIC
from hamq.remoting import Connection, Dispatcher, RemotingClient, RemotingError
from hamq.remoting.client import RpcHook
from hamq.remoting.loop import ANY_LOOP, LoopPrimitives, current_loop

log = logging.getLogger(__name__)

#: how long a master that refused a send (SERVICE_NOT_AVAILABLE) makes a route that still
#: names it worth asking the other nameservers about (the module doc)
REFUSED_MASTER_S = 10.0


class ClientInstance:
    def __init__(self, config: ClientConfig) -> None:
        self.config = config
        name = config.instance_name or f"{os.getpid()}#{time.monotonic_ns()}"
        self.client_id = f"{config.client_ip}@{name}"
        self.producer_groups: set[str] = set()
        #: consumers by group: heartbeats name them, brokers' requests reach them
        self.consumers: dict[str, GroupMember] = {}
        #: transaction producers by group: who answers a broker's CHECK_TRANSACTION_STATE
        self.transaction_producers: dict[str, TransactionChecker] = {}
        dispatcher = Dispatcher()
        BrokerRequests(self.consumers, self.transaction_producers).register(dispatcher)
        credentials = config.credentials
        self._rpc_hook: RpcHook | None = signer(credentials) if credentials is not None else None
        self.remoting = RemotingClient(
            dispatcher=dispatcher, config=config.remoting, rpc_hook=self._rpc_hook
        )
        self.routes: dict[str, TopicRouteData] = {}
        self.brokers: dict[str, dict[int, str]] = {}
        self._publish: dict[str, PublishInfo] = {}
        self._namesrv_index = random.randrange(len(config.namesrv_addrs))
        #: the nameserver in use has answered once (a later failure is worth a warning)
        self._namesrv_answered = False
        self._refreshed_after_failure: dict[str, float] = {}
        #: master address -> when it last refused a send (``master_refused``)
        self._refused_masters: dict[str, float] = {}
        self._stack: contextlib.AsyncExitStack | None = None
        self._nursery: anyio.abc.TaskGroup | None = None
        #: the running loop's Event and clock, taken when the instance starts
        #: (hamq.remoting.loop)
        self.loop: LoopPrimitives = ANY_LOOP

    # ------------------------------------------------------------------ lifecycle
    async def __aenter__(self) -> ClientInstance:
        self.loop = current_loop()
        async with contextlib.AsyncExitStack() as stack:
            await stack.enter_async_context(self.remoting)
            self._nursery = await stack.enter_async_context(anyio.create_task_group())
            self._nursery.start_soon(
                self._every, self.config.poll_name_server_interval_s, self.refresh_routes
            )
            self._nursery.start_soon(
                self._every, self.config.heartbeat_broker_interval_s, self.heartbeat
            )
            self._stack = stack.pop_all()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        assert self._stack is not None and self._nursery is not None
        self._nursery.cancel_scope.cancel()
        stack, self._stack, self._nursery = self._stack, None, None
        # The block's own exception is not handed to the nursery, so it propagates
        # as itself rather than wrapped in an ExceptionGroup.
        await stack.aclose()
        return None

    @property
    def nursery(self) -> anyio.abc.TaskGroup:
        """Where the instance's owners run their own background tasks (an AnyIO task group:
        a Trio nursery under Trio)."""
        if self._nursery is None:
            raise RuntimeError("the client is not started: use it as `async with`")
        return self._nursery

    async def _every(self, interval_s: float, job: Callable[[], Any]) -> None:
        while True:
            await anyio.sleep(interval_s)
            await job()

    # ------------------------------------------------------------------ nameservers
    @property
    def namesrv_addr(self) -> str:
        """The nameserver in use."""
        return self.config.namesrv_addrs[self._namesrv_index]

    async def invoke_namesrv(self, request: RemotingCommand) -> RemotingCommand:
        """Ask the nameserver in use; on failure the next ones, round the list.

        NameServerUnavailableError when none answers; it names each address once with
        what went wrong (cannot connect, timed out, or not a nameserver at all: an
        address that does not serve nameserver requests and turns out to be a broker
        or a controller). A failure followed by an answer is logged once: a warning
        once a nameserver has answered, else at info (a client started while one of its
        nameservers is down, as the CLI's default list of two often finds).
        """
        addrs = self.config.namesrv_addrs
        failures: list[str] = []
        not_nameservers: list[str] = []
        for i in range(len(addrs)):
            index = (self._namesrv_index + i) % len(addrs)
            addr = addrs[index]
            try:
                response = await self.remoting.invoke(addr, request, self.config.request_timeout_s)
                if response.code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED:
                    other = await self._what_serves(addr)
                    if other is not None:
                        not_nameservers.append(
                            f"{addr} is not a nameserver (it looks like {other})"
                        )
                        continue
            except RemotingError as exc:
                failures.append(str(exc))
                continue
            if index != self._namesrv_index:
                # a warning when one that answered stops answering; the first choice
                # (random) failing is news only at info: the other choice would not tell
                log.log(
                    logging.WARNING if self._namesrv_answered else logging.INFO,
                    "now using nameserver %s: %s",
                    addr,
                    "; ".join(failures + not_nameservers),
                )
                self._namesrv_index = index
            self._namesrv_answered = True
            return response
        if not failures:
            raise NameServerUnavailableError("; ".join(not_nameservers))
        raise NameServerUnavailableError(
            "no nameserver answered: " + "; ".join(failures + not_nameservers)
        )

    async def _what_serves(self, addr: str) -> str | None:
        """What answers at ``addr``, which did not serve a nameserver request: "a
        broker", "a controller", or None when it is a nameserver after all (one that
        lacks that request) or does not say."""
        probes = (
            (
                self.request(
                    RequestCode.GET_ROUTEINFO_BY_TOPIC, GetRouteInfoRequestHeader(DEFAULT_TOPIC)
                ),
                None,
            ),
            (self.request(RequestCode.GET_BROKER_RUNTIME_INFO), "a broker"),
            (self.request(RequestCode.CONTROLLER_GET_METADATA_INFO), "a controller"),
        )
        for probe, what in probes:
            try:
                response = await self.remoting.invoke(addr, probe, self.config.request_timeout_s)
            except RemotingError:
                return None
            if response.code != ResponseCode.REQUEST_CODE_NOT_SUPPORTED:
                return what
        return None

    async def fetch_route(self, topic: str, addr: str | None = None) -> TopicRouteData | None:
        """The topic's route from a nameserver (the one in use, or the next that answers;
        ``addr`` alone if given); None if no broker serves it. NameServerUnavailableError
        (RemotingError when ``addr`` is given), BrokerError for another refusal,
        BodyError for a body that does not decode."""
        request = self.request(RequestCode.GET_ROUTEINFO_BY_TOPIC, GetRouteInfoRequestHeader(topic))
        if addr is None:
            response = await self.invoke_namesrv(request)
        else:
            response = await self.remoting.invoke(addr, request, self.config.request_timeout_s)
        if response.code == ResponseCode.TOPIC_NOT_EXIST:
            return None
        if response.code != ResponseCode.SUCCESS:
            raise BrokerError(response.code, response.remark, addr or self.namesrv_addr)
        return decode_body(TopicRouteData, response.body)

    async def update_route(self, topic: str, *, keep_known: bool = False) -> TopicRouteData | None:
        """Look ``topic``'s route up and cache it. None if the nameserver does not know
        the topic: the cached route is dropped then — unless ``keep_known`` (a refresh in
        the background), when the known route stays and is returned: a nameserver that
        has just restarted knows no topic until the brokers register with it again, and
        RocketMQ's clients keep their route then too. Raises as ``fetch_route``."""
        route = await self.fetch_route(topic)
        if route is not None and (stale := self._stale_groups(route)):
            route = await self._route_elsewhere(topic, route, stale)
        if route is None and keep_known and topic in self.routes:
            return self.routes[topic]
        if route is None:
            self.routes.pop(topic, None)
            if topic in self._publish and not self._publish[topic].from_template:
                del self._publish[topic]
            return None
        if self.routes.get(topic) != route:
            self.routes[topic] = route
            self.brokers.update(broker_table([route]))
            if topic in self._publish:
                self._publish[topic] = publish_info(topic, route)
        return route

    def master_refused(self, addr: str) -> None:
        """The master at ``addr`` refused a send as not (or no longer) the master
        (SERVICE_NOT_AVAILABLE): routes naming it are checked with the other nameservers
        for REFUSED_MASTER_S (the module doc)."""
        self._refused_masters[addr] = self.loop.current_time()

    def master_answered(self, addr: str) -> None:
        """The master at ``addr`` took a send: it is a master again."""
        if self._refused_masters:
            self._refused_masters.pop(addr, None)

    def _stale_groups(self, route: TopicRouteData) -> int:
        """How many of ``route``'s broker groups name no master, or one that refused a
        send within REFUSED_MASTER_S."""
        if self._refused_masters:
            since = self.loop.current_time() - REFUSED_MASTER_S
            for addr, when in list(self._refused_masters.items()):
                if when < since:
                    del self._refused_masters[addr]
        masters = [b.master_addr() for b in route.broker_datas]
        return sum(1 for m in masters if m is None or m in self._refused_masters)

    async def _route_elsewhere(
        self, topic: str, route: TopicRouteData, stale: int
    ) -> TopicRouteData:
        """``route`` (from the nameserver in use) has ``stale`` broker groups without a
        master that takes sends: the other nameservers are asked, and the route with
        the fewest such groups, if fewer, is used (and its nameserver from then on);
        else ``route`` (no nameserver knows better: a failover under way)."""
        addrs = self.config.namesrv_addrs
        best: tuple[int, int, TopicRouteData] | None = None
        for i in range(1, len(addrs)):
            index = (self._namesrv_index + i) % len(addrs)
            try:
                other = await self.fetch_route(topic, addrs[index])
            except (RemotingError, BrokerError, BodyError) as exc:
                log.debug("asking nameserver %s for %s failed: %s", addrs[index], topic, exc)
                continue
            if other is None:
                continue
            other_stale = self._stale_groups(other)
            if other_stale < (stale if best is None else best[0]):
                best = (other_stale, index, other)
                if other_stale == 0:
                    break
        if best is None:
            return route
        log.warning(
            "now using nameserver %s: the route of %s from %s has %d broker group(s) "
            "without a master that takes sends, its %d (cut off from a new master?)",
            addrs[best[1]],
            topic,
            self.namesrv_addr,
            stale,
            best[0],
        )
        self._namesrv_index = best[1]
        return best[2]

    async def refresh_route_after_failure(self, topic: str, *, keep_known: bool = False) -> None:
        """Look a topic's route up again after a broker failed, at most once a second
        (many queues failing at once ask the nameserver once); ``keep_known`` as
        ``update_route``'s. Raises as ``fetch_route``."""
        now = self.loop.current_time()
        if now - self._refreshed_after_failure.get(topic, -math.inf) < 1.0:
            return
        self._refreshed_after_failure[topic] = now
        await self.update_route(topic, keep_known=keep_known)

    def refresh_route_soon(self, topic: str) -> None:
        """Look a topic's route up again in the background, at most once a second,
        keeping the known route if no nameserver answers or knows the topic (a broker
        answered in a way that suggests its group's master moved)."""
        self.nursery.start_soon(self._refresh_quietly, topic)

    async def _refresh_quietly(self, topic: str) -> None:
        try:
            await self.refresh_route_after_failure(topic, keep_known=True)
        except NETWORK_ERRORS as exc:
            log.info("looking the route of %s up again failed: %s", topic, exc)

    async def refresh_routes(self) -> None:
        for topic in sorted(set(self.routes) | set(self._publish)):
            try:
                await self.update_route(topic)
            except NETWORK_ERRORS as exc:
                log.warning("refreshing the route of %s failed: %s", topic, exc)

    def cached_publish_info(self, topic: str) -> PublishInfo | None:
        info = self._publish.get(topic)
        return info if info is not None and info.ok else None

    async def publish_info(self, topic: str, template_queue_nums: int) -> PublishInfo:
        """Where to send ``topic``; through TBW102's route if the topic is new.

        Raises:
            NoMasterError: the topic exists, but no broker group serving it has a master
                now (and no broker auto-creates it elsewhere); it names those groups.
            NoRouteError: no nameserver knows the topic and no broker auto-creates
                topics, or none of its queues may be written to.
            NameServerUnavailableError: no nameserver answered.
        """
        info = self.cached_publish_info(topic)
        if info is not None:
            return info
        route = await self.update_route(topic)
        if route is not None:
            info = self._publish[topic] = publish_info(topic, route)
            if info.ok:
                return info
        template = await self.fetch_route(DEFAULT_TOPIC)
        if template is not None:
            self.brokers.update(broker_table([template]))
            info = publish_info(topic, template, template_queue_nums=template_queue_nums)
            if info.ok:
                self._publish[topic] = info
                return info
        if route is not None:  # the topic exists: say why it cannot be sent to
            if masterless := without_master(route):
                raise NoMasterError(
                    f"topic {topic} exists, but no broker group serving it has a master "
                    f"now: {'; '.join(masterless)} (nameserver {self.namesrv_addr})"
                )
            raise NoRouteError(
                f"topic {topic} exists, but none of its queues may be written to "
                f"(read-only on {', '.join(read_only(route))}; nameserver {self.namesrv_addr})"
            )
        raise NoRouteError(
            f"No route info of this topic: {topic} (no broker serves it and none "
            f"auto-creates topics; nameserver {self.namesrv_addr})"
        )

    def forget_publish_info(self, topic: str) -> None:
        """After a send failed: look the route up again next time."""
        self._publish.pop(topic, None)

    async def subscribe_queues(self, topic: str, *, refresh: bool = False) -> list[MessageQueue]:
        route = self.routes.get(topic)
        if route is None or refresh:
            route = await self.update_route(topic)
        if route is None:
            raise NoRouteError(f"No route info of this topic: {topic}")
        return subscribe_queues(topic, route)

    # ------------------------------------------------------------------ brokers
    def broker_addr(
        self, broker_name: str, broker_id: int = MASTER_ID, *, only_this: bool = False
    ) -> str | None:
        return pick_address(self.brokers.get(broker_name, {}), broker_id, only_this=only_this)

    async def find_broker_addr(self, queue: MessageQueue, broker_id: int = MASTER_ID) -> str:
        """The address of ``queue``'s broker (``broker_id``, else the master, else any),
        looking the topic's route up again if it is not known; NoRouteError if none."""
        addr = self.broker_addr(queue.broker_name, broker_id)
        if addr is None:
            await self.update_route(queue.topic)
            addr = self.broker_addr(queue.broker_name, broker_id)
        if addr is None:
            raise NoRouteError(f"no address known for broker {queue.broker_name} ({queue})")
        return addr

    async def find_master_addr(self, queue: MessageQueue) -> str:
        """The address of the master of ``queue``'s broker group (where sends go: never a
        slave), looking the topic's route up again if none is known; NoMasterError when
        the route names none (a failover under way), NoRouteError when it has no such
        group."""
        addr = self.broker_addr(queue.broker_name, only_this=True)
        if addr is None:
            await self.update_route(queue.topic)
            addr = self.broker_addr(queue.broker_name, only_this=True)
        if addr is None:
            if self.brokers.get(queue.broker_name):
                raise NoMasterError(f"broker group {queue.broker_name} has no master now ({queue})")
            raise NoRouteError(f"no address known for broker {queue.broker_name} ({queue})")
        return addr

    def request(
        self, code: int, header: Any = None, *, body: bytes = b"", oneway: bool = False
    ) -> RemotingCommand:
        """A request in the configured headers; as JSON when they are ROCKETMQ's binary
        ones and ``code`` does not fit their 16-bit code (pop's 200050...)."""
        kind = self.config.serialize_type
        if kind is SerializeType.ROCKETMQ and not -(2**15) <= code < 2**15:
            kind = SerializeType.JSON
        return RemotingCommand.request(code, header, body=body, oneway=oneway, serialize_type=kind)

    async def invoke(
        self, addr: str, request: RemotingCommand, timeout_s: float | None = None
    ) -> RemotingCommand:
        """``request`` to ``addr``, its answer within ``timeout_s`` (None: the config's
        ``request_timeout_s``; a time left of 0 or less times out at once, it is not
        the default); RemotingError as RemotingClient.invoke."""
        if timeout_s is None:
            timeout_s = self.config.request_timeout_s
        return await self.remoting.invoke(addr, request, timeout_s)

    async def invoke_oneway_on(
        self, conn: Connection, request: RemotingCommand, timeout_s: float | None = None
    ) -> None:
        """``request`` oneway over ``conn`` (a connection a broker's request came on),
        signed as every request is; RemotingError as Connection.invoke_oneway."""
        if self._rpc_hook is not None:
            self._rpc_hook(conn.peer, request)
        if timeout_s is None:
            timeout_s = self.config.request_timeout_s
        await conn.invoke_oneway(request, timeout_s)

    async def invoke_ok(
        self, addr: str, request: RemotingCommand, timeout_s: float | None = None
    ) -> RemotingCommand:
        """``invoke``; BrokerError unless the answer is SUCCESS."""
        response = await self.invoke(addr, request, timeout_s)
        if response.code != ResponseCode.SUCCESS:
            raise BrokerError(response.code, response.remark, addr)
        return response

    def _all_broker_addrs(self, *, masters_only: bool) -> list[str]:
        addrs = set()
        for ids in self.brokers.values():
            for broker_id, addr in ids.items():
                if broker_id == MASTER_ID or not masters_only:
                    addrs.add(addr)
        return sorted(addrs)

    async def heartbeat(self) -> None:
        """HEART_BEAT to every broker (only masters when no consumer needs slaves)."""
        if not self.producer_groups and not self.consumers:
            return
        data = HeartbeatData(
            self.client_id,
            [ProducerData(g) for g in sorted(self.producer_groups)],
            [member.consumer_data() for member in self.consumers.values()],
        )
        body = encode_body(data)

        async def one(addr: str) -> None:
            try:
                await self.invoke_ok(addr, self.request(RequestCode.HEART_BEAT, body=body))
            except NETWORK_ERRORS as exc:
                log.warning("heartbeat to broker %s failed: %s", addr, exc)

        async with anyio.create_task_group() as nursery:
            for addr in self._all_broker_addrs(masters_only=not self.consumers):
                nursery.start_soon(one, addr)

    async def unregister(self, *, producer_group: str = "", consumer_group: str = "") -> None:
        """UNREGISTER_CLIENT to every broker (a leaving consumer's group rebalances)."""
        header = UnregisterClientRequestHeader(self.client_id, producer_group, consumer_group)

        async def one(addr: str) -> None:
            try:
                await self.invoke_ok(addr, self.request(RequestCode.UNREGISTER_CLIENT, header))
            except NETWORK_ERRORS as exc:
                log.info("unregistering from broker %s failed: %s", addr, exc)

        async with anyio.create_task_group() as nursery:
            for addr in self._all_broker_addrs(masters_only=False):
                nursery.start_soon(one, addr)


class InstanceOwner:
    """What Producer, PullConsumer and AdminClient share: a ClientInstance that lives
    for their ``async with`` block. ``_stopping`` runs first at the end (shielded and
    bounded by the subclass when it talks to servers)."""

    config: ClientConfig
    _instance: ClientInstance | None = None
    #: how errors name it
    _kind = "client"

    async def __aenter__(self) -> Self:
        instance = ClientInstance(self.config)
        await instance.__aenter__()
        self._instance = instance
        self._started(instance)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        instance = self.instance
        try:
            await self._stopping(instance)
        finally:
            self._instance = None
            await instance.__aexit__(exc_type, exc, tb)
        return None

    def _started(self, instance: ClientInstance) -> None:
        """Set up what needs the instance."""

    async def _stopping(self, instance: ClientInstance) -> None:
        """Say goodbye while the instance still runs."""

    @property
    def instance(self) -> ClientInstance:
        if self._instance is None:
            raise ClientError(f"the {self._kind} is not started: use it as `async with`")
        return self._instance
