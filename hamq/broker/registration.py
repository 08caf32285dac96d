"""Talking to nameservers and clients on the broker's own initiative.

- Registration: REGISTER_BROKER to every configured nameserver, all at once, at start,
  every ``register_interval_s`` (30 s), and right after a topic changes; a nameserver
  that is down is logged and tried again alone, sooner (REGISTER_RETRY_S, doubling up
  to REGISTER_RETRY_MAX_S, 5 s): nameservers embedded in other brokers start after this
  one, and a nameserver restarted knows no broker, and clients asking them must find it
  soon. Between rounds, every NAMESRV_CHECK_S each nameserver that accepted is asked
  whether it still knows this broker's topic table (QUERY_DATA_VERSION, RocketMQ's
  check before a registration): one that restarted meanwhile says it changed, and gets
  the registration at once (without it, it would know no route to this broker until
  the next round). A nameserver that does not answer the check is left to the rounds.
  What a nameserver answers a slave (its master's address and HA address) is kept for
  replication. UNREGISTER_BROKER to each at a clean stop.
- ``registered`` is set once any nameserver has accepted a registration: clients can
  find the broker from then on (``hamq broker`` prints its ready line then). A broker
  is registered with one nameserver of several that answers; one whose nameservers all
  fail (down, a TLS certificate it cannot verify, an ACL refusal) keeps trying and is
  not registered.
- Each nameserver's failure is logged once per reason: a warning the first time it
  fails for a reason (at most MAX_REASONS_LOGGED reasons), nothing while it fails for
  reasons already said, and one line when it accepts again, after which the count
  starts afresh (a broker retrying every 2 s would otherwise log a line every 2 s for as
  long as its nameserver is down).
- Notification: when a consumer group's members change, each member gets
  NOTIFY_CONSUMER_IDS_CHANGED (oneway) so that it rebalances at once.
"""

from __future__ import annotations

import logging
import zlib
from collections.abc import Sequence

import trio

from hamq.broker.clients import ConsumerManager
from hamq.broker.context import BrokerContext
from hamq.protocol import RemotingCommand, RequestCode, ResponseCode, SerializeType, code_name
from hamq.protocol.bodies import RegisterBrokerBody, encode_body
from hamq.protocol.headers import (
    NotifyConsumerIdsChangedRequestHeader,
    QueryDataVersionRequestHeader,
    QueryDataVersionResponseHeader,
    RegisterBrokerRequestHeader,
    RegisterBrokerResponseHeader,
    UnregisterBrokerRequestHeader,
)
from hamq.remoting import RemotingClient, RemotingError

log = logging.getLogger(__name__)

NOTIFY_TIMEOUT_S = 3.0
#: the first pause before registering again after a nameserver did not accept
REGISTER_RETRY_S = 1.0
#: ... doubling up to this: a nameserver that was down (restarted: it knows no broker)
#: has every broker again within this long of being back, not register_interval_s
REGISTER_RETRY_MAX_S = 5.0
#: how often a nameserver that accepted is asked whether it still knows this broker
NAMESRV_CHECK_S = 3.0
#: how long that question may take
NAMESRV_CHECK_TIMEOUT_S = 2.0
#: how many different reasons a nameserver's failures are logged with, until it accepts
MAX_REASONS_LOGGED = 8


class Registrar:
    def __init__(
        self, ctx: BrokerContext, client: RemotingClient, namesrv_addrs: list[str]
    ) -> None:
        self.ctx = ctx
        self.client = client
        self.namesrv_addrs = namesrv_addrs
        self._changed = trio.Event()
        self.registrations = 0
        #: set once a nameserver accepted a registration (never cleared)
        self.registered = trio.Event()
        #: the reasons logged for each nameserver failing now (since it last accepted)
        self._failing: dict[str, set[str]] = {}
        #: the nameservers whose last registration did not go through (retried soon)
        self._missed: set[str] = set()
        #: from the nameservers' answers (a slave's master)
        self.master_addr: str | None = None
        self.master_ha_addr: str | None = None

    def topics_changed(self) -> None:
        """Topic-manager listener (and role changes): register again now."""
        self._changed.set()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        interval = self.ctx.config.register_interval_s
        retry = REGISTER_RETRY_S
        await self.register_all()
        round_due = trio.current_time() + interval
        task_status.started()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._check_loop)
            await self._register_loop(interval, round_due, retry)

    async def _register_loop(self, interval: float, round_due: float, retry: float) -> None:
        while True:
            missed = self._missed
            wait = round_due - trio.current_time()
            with trio.move_on_after(min(retry, wait) if missed else wait):
                await self._changed.wait()
            retry = min(retry * 2, REGISTER_RETRY_MAX_S) if missed else REGISTER_RETRY_S
            # a fresh event before registering: a change during it means once more
            changed, self._changed = self._changed.is_set(), trio.Event()
            if changed or trio.current_time() >= round_due:
                await self.register_all()
                round_due = trio.current_time() + interval
            else:  # (a retry: only those that did not accept, soon after they are back)
                await self._register([a for a in self.namesrv_addrs if a in missed])

    async def _check_loop(self) -> None:
        """Every NAMESRV_CHECK_S, ask each nameserver not missed whether it still knows
        this broker's topic table; register with those that do not (module doc)."""
        while True:
            await trio.sleep(NAMESRV_CHECK_S)
            if self.ctx.roles.broker_id < 0:
                continue
            forgotten = await self._forgotten()
            if forgotten:
                log.info("nameserver(s) %s no longer know this broker: registering", forgotten)
                await self._register([a for a in self.namesrv_addrs if a in forgotten])

    async def _forgotten(self) -> list[str]:
        """The nameservers, not missed, that say they do not know this broker as it is."""
        forgotten: list[str] = []

        async def ask(addr: str) -> None:
            if await self._forgotten_by(addr):
                forgotten.append(addr)

        async with trio.open_nursery() as nursery:
            for addr in self.namesrv_addrs:
                if addr not in self._missed:
                    nursery.start_soon(ask, addr)
        return forgotten

    async def _forgotten_by(self, addr: str) -> bool:
        """Whether the nameserver at ``addr`` says it does not know this broker's topic
        table as it is (False too when it does not answer, or cannot be asked)."""
        config = self.ctx.config
        header = QueryDataVersionRequestHeader(
            broker_name=config.broker_name,
            broker_addr=self.ctx.address,
            cluster_name=config.cluster_name,
            broker_id=self.ctx.roles.broker_id,
        )
        request = RemotingCommand.request(
            RequestCode.QUERY_DATA_VERSION,
            header,
            body=encode_body(self.ctx.topics.data_version),
        )
        try:
            response = await self.client.invoke(addr, request, NAMESRV_CHECK_TIMEOUT_S)
        except RemotingError:
            return False
        if response.code != ResponseCode.SUCCESS:
            return False  # (a nameserver without the code: the rounds keep it up to date)
        return response.header(QueryDataVersionResponseHeader).changed

    def _request(self) -> RemotingCommand:
        config = self.ctx.config
        body = encode_body(RegisterBrokerBody(self.ctx.topics.snapshot()))
        header = RegisterBrokerRequestHeader(
            broker_name=config.broker_name,
            broker_addr=self.ctx.address,
            cluster_name=config.cluster_name,
            ha_server_addr=self.ctx.ha_address,
            broker_id=self.ctx.roles.broker_id,
            heartbeat_timeout_millis=None,
            compressed=False,
            body_crc32=zlib.crc32(body) & 0x7FFFFFFF,
        )
        return RemotingCommand.request(RequestCode.REGISTER_BROKER, header, body=body)

    async def register_all(self) -> int:
        """Register with every nameserver at once; returns how many accepted. (Not
        before the broker knows its role: controller mode, before the controllers said.)"""
        return await self._register(self.namesrv_addrs)

    async def _register(self, addrs: Sequence[str]) -> int:
        """Register with the nameservers ``addrs`` at once; how many accepted (those
        that did not are ``_missed`` until they do)."""
        accepted = 0
        if self.ctx.roles.broker_id < 0:
            self._missed = set(addrs)
            return 0
        failures: dict[str, str] = {}

        async def one(addr: str) -> None:
            nonlocal accepted
            try:
                response = await self.client.invoke(
                    addr, self._request(), self.ctx.config.register_timeout_s
                )
            except RemotingError as exc:
                failures[addr] = f"registering with nameserver {addr} failed: {exc}"
                return
            if response.code != ResponseCode.SUCCESS:
                failures[addr] = (
                    f"nameserver {addr} refused the registration: "
                    f"{code_name(response.code, response=True)}: {response.remark}"
                )
                return
            accepted += 1
            if self._failing.pop(addr, None) is not None:
                log.info("registered with nameserver %s again", addr)
            answer = response.header(RegisterBrokerResponseHeader)
            if answer.master_addr:
                self.master_addr = answer.master_addr
                self.master_ha_addr = answer.ha_server_addr

        async with trio.open_nursery() as nursery:
            for addr in addrs:
                nursery.start_soon(one, addr)
        self._missed = (self._missed - set(addrs)) | set(failures)
        self.registrations += 1
        if accepted and not self.registered.is_set():
            log.info(
                "registered with %d of %d nameserver(s): %s",
                accepted,
                len(self.namesrv_addrs),
                ", ".join(a for a in self.namesrv_addrs if a not in failures),
            )
            self.registered.set()
        for addr, why in failures.items():
            self._failed(addr, why)
        return accepted

    def _failed(self, addr: str, why: str) -> None:
        """Log ``why`` unless it was said for ``addr`` since it last accepted (module
        doc)."""
        said = self._failing.setdefault(addr, set())
        if why in said or len(said) >= MAX_REASONS_LOGGED:
            return
        said.add(why)
        log.warning(
            "%s; retrying (said again only if the reason changes)%s",
            why,
            "" if self.registered.is_set() else "; clients find this broker once one accepts",
        )

    async def unregister_all(self, timeout_s: float = 3.0) -> None:
        config = self.ctx.config
        header = UnregisterBrokerRequestHeader(
            broker_name=config.broker_name,
            broker_addr=self.ctx.address,
            cluster_name=config.cluster_name,
            broker_id=self.ctx.roles.broker_id,
        )

        async def one(addr: str) -> None:
            try:
                await self.client.invoke(
                    addr, RemotingCommand.request(RequestCode.UNREGISTER_BROKER, header), timeout_s
                )
            except RemotingError as exc:
                log.info("unregistering from nameserver %s failed: %s", addr, exc)

        async with trio.open_nursery() as nursery:
            for addr in self.namesrv_addrs:
                nursery.start_soon(one, addr)


class Notifier:
    """Tells consumer groups that their members changed."""

    def __init__(self, consumers: ConsumerManager) -> None:
        self.consumers = consumers
        consumers.on_change.append(self.group_changed)
        self._pending: set[str] = set()
        self._wakeup = trio.Event()
        self.sent = 0

    def group_changed(self, group: str) -> None:
        """ConsumerManager listener."""
        self._pending.add(group)
        self._wakeup.set()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        while True:
            await self._wakeup.wait()
            self._wakeup = trio.Event()
            groups, self._pending = self._pending, set()
            for group in groups:
                for channel in self.consumers.channels(group):
                    request = RemotingCommand.request(
                        RequestCode.NOTIFY_CONSUMER_IDS_CHANGED,
                        NotifyConsumerIdsChangedRequestHeader(consumer_group=group),
                        oneway=True,
                        # as the client speaks (its heartbeat said); JSON every client reads
                        serialize_type=channel.connection.attributes.get(
                            "serialize_type", SerializeType.JSON
                        ),
                    )
                    try:
                        await channel.connection.invoke_oneway(request, NOTIFY_TIMEOUT_S)
                        self.sent += 1
                    except RemotingError as exc:
                        log.info(
                            "notifying %s of group %s failed: %s", channel.client_id, group, exc
                        )
