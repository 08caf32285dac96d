"""BrokerNode: one broker as one Trio nursery.

Start-up, in order: the message store (recovery first; it takes no sends yet), the
managers' JSON state, an embedded nameserver when no nameserver address is
configured or ``embed_namesrv`` asks for one, replication (a master's HA service on the
HA port), the remoting server (reporting its port), the background services (long
polling, notifications, transactions, client housekeeping, persisting state),
registration with every nameserver (a warning if sends wait longer than producers
do); then the broker
takes its configured role (roles.py: a master starts a new epoch at the end of its log
and takes sends), and a slave starts its HA client and the metadata sync, which follow
the master the registration names.
``await nursery.start(node.run)`` returns once all of them serve. A start that fails
(a port in use) or is stopped half-way leaves no new epoch behind. Serving is not yet
being findable: ``wait_registered`` returns once a nameserver has accepted the broker's
registration (``hamq broker``'s ready line waits for it; registration.py retries, and
says once why a nameserver does not accept). An embedded nameserver accepts at once;
in controller mode the first registration follows the controllers' first word.

With ``acl_enable`` every request passes the ACL (hamq/acl: signed by an account of
``acl_file`` with the rights it needs) before its processor, and an embedded nameserver
takes registrations only from admin accounts; the broker signs what it asks of
nameservers, controllers and its master with ``access_key`` / ``secret_key``.

In controller mode (``enable_controller_mode``) the roles are the controllers' to
decide: the node starts as a slave without a master, with both HA sides ready (the HA
service listens but serves no one), and the replicas manager (replicas.py) moves its
role (roles.py) to master or slave as the controllers say.

Shutdown (``run`` cancelled): everything but the store stops first; then the state is
written, the broker unregisters from its nameservers, and only then the store stops
(flush, checkpoint). The store runs in a shielded scope of its own for that reason:
no request can reach it after it closed its files.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import trio

from hamq.acl import BROKER_POLICY, AclGuard, signer
from hamq.broker.clients import ConsumerManager, ProducerManager, RebalanceLockManager
from hamq.broker.config import BrokerConfig
from hamq.broker.context import BrokerContext
from hamq.broker.grpc import GrpcEndpoint, GrpcRoutes
from hamq.broker.long_polling import PullHoldService
from hamq.broker.metrics import BrokerCollector
from hamq.broker.offsets import ConsumerOffsetManager
from hamq.broker.pop import PopService
from hamq.broker.processors.admin import AdminProcessor
from hamq.broker.processors.clients import ClientProcessor
from hamq.broker.processors.pop import PopProcessor
from hamq.broker.processors.pull import PullProcessor
from hamq.broker.processors.send import SendProcessor
from hamq.broker.processors.transaction import EndTransactionProcessor
from hamq.broker.registration import Notifier, Registrar
from hamq.broker.replicas import ReplicasManager
from hamq.broker.roles import Roles
from hamq.broker.slave_sync import SlaveSync
from hamq.broker.subscriptions import SubscriptionGroupManager
from hamq.broker.topics import TopicConfigManager
from hamq.broker.transactions import TransactionService
from hamq.grpc import GrpcConfig, GrpcServer
from hamq.ha import EpochFile, HAClient, HAService
from hamq.ha.epoch import FILE_NAME as EPOCH_FILE_NAME
from hamq.ha.membership import nameserver_registry
from hamq.metrics import MetricsServer, new_registry
from hamq.protocol.ha_wire import HAProtocol
from hamq.protocol.message import PROPERTY_REAL_TOPIC, TRANS_HALF_TOPIC, MessageIdGenerator
from hamq.remoting import (
    Connection,
    Dispatcher,
    RemotingClient,
    RemotingServer,
    format_address,
    parse_address,
)
from hamq.store import MessageStore, StoreError
from hamq.store.files import raise_open_files_limit
from hamq.store.values import wall_clock_ms
from nameserver import NameServer, NameServerConfig
from nameserver.metrics import NameServerCollector

log = logging.getLogger(__name__)

#: how often silent clients are looked for
CLIENT_SCAN_INTERVAL_S = 10.0


@attrs.frozen
class BrokerStatistics:
    address: str
    role: str
    namesrv_addrs: tuple[str, ...]
    topics: int
    consumer_groups: int
    producer_groups: int
    held_pulls: int
    pulls_answered_on_arrival: int
    pulls_answered_on_timeout: int
    registrations: int
    notifications_sent: int


class BrokerNode:
    def __init__(self, config: BrokerConfig, *, clock: Callable[[], int] = wall_clock_ms) -> None:
        self.config = config
        self._clock = clock
        # the store takes no sends (and delivers no delayed messages) until the broker's
        # role (roles.py, which the store reads) makes it master: at the end of start-up,
        # or when the controllers say
        self.store = MessageStore(
            config.store,
            clock=self._clock,
            retention_floor=lambda: self.roles.retention_floor(),
            confirm_offset=lambda: self.roles.confirm_offset(),
            on_recovered=self._recovered,
        )
        self.epochs = EpochFile(Path(config.store.store_dir) / EPOCH_FILE_NAME)
        self.ha_service, self.ha_client = self._replication()
        self.slave_sync: SlaveSync | None = None
        self.replicas: ReplicasManager | None = None
        self.roles = Roles(
            config,
            self.store,
            self.epochs,
            ha_service=self.ha_service,
            ha_client=self.ha_client,
            address=lambda: self.ctx.address,
        )
        consumers = ConsumerManager()
        self.notifier = Notifier(consumers)
        self.ctx = self._context(consumers)
        #: the ACL (acl_enable): every request is checked against acl_file's accounts
        self.acl: AclGuard | None = None
        if config.acl_enable and config.acl_file is not None:
            self.acl = AclGuard(config.acl_file, BROKER_POLICY, message_topic=self._message_topic)
        self.dispatcher = Dispatcher(guard=self.acl)
        self.pull = PullProcessor(self.ctx)
        self.transactions = TransactionService(
            config,
            self.store,
            self.ctx.offsets,
            self.ctx.producers,
            clock=self._clock,
            store_host=lambda: self.ctx.store_host,
        )
        self.roles.master_services.append(self.transactions)
        pop = PopProcessor(self.ctx, lambda: self.pops)
        #: pop consumption's state, held pops and revive (hamq/broker/pop.py)
        self.pops = PopService(
            self.store,
            self.ctx.topics,
            cluster=config.cluster_name,
            max_retries=self._max_retries,
            store_host=lambda: self.ctx.store_host,
            answer_held=pop.answer_held,
            max_held=config.pop_max_held,
        )
        self.ctx.pops_in_flight = self.pops.state.in_flight
        for processor in (
            SendProcessor(self.ctx),
            EndTransactionProcessor(self.ctx, self.transactions),
            self.pull,
            pop,
            ClientProcessor(self.ctx),
            AdminProcessor(self.ctx),
        ):
            processor.install(self.dispatcher)
        self.ctx.pull_holds = PullHoldService(self.pull.execute_held)
        self.server = RemotingServer(
            self.dispatcher,
            host=config.listen_host,
            port=config.listen_port,
            config=config.remoting,
        )
        self.server.on_close(self._connection_closed)
        #: the client of other brokers and nameservers (while the broker runs)
        self._client: RemotingClient | None = None
        #: RocketMQ 5's gRPC endpoint (grpc_port), on the same processors
        self.grpc: GrpcEndpoint | None = None
        self.grpc_server: GrpcServer | None = None
        if config.grpc_port is not None:
            self.grpc = GrpcEndpoint(
                self.ctx,
                self.dispatcher,
                acl=self.acl,
                routes=GrpcRoutes(
                    self.ctx,
                    lambda: self._client,
                    self._master_address,
                    lambda: list(self.namesrv_addrs),
                ),
                connection_closed=self._connection_closed,
            )
            self.grpc_server = GrpcServer(
                self.grpc.methods(),
                host=config.listen_host,
                port=config.grpc_port,
                config=GrpcConfig(
                    remoting=config.remoting, max_message_bytes=config.remoting.max_frame_length
                ),
            )
            self.grpc_server.on_close.append(self.grpc.connection_ended)
        self.nameserver: NameServer | None = None
        #: the port metrics are served on (None: off)
        self.metrics_port: int | None = None
        self.registrar: Registrar | None = None
        #: the nameservers this broker registers with (the embedded one's address once up)
        self.namesrv_addrs: list[str] = list(config.namesrv_addrs)
        self._store_scope = trio.CancelScope(shield=True)
        self._state_changed = trio.Event()

    def _replication(self) -> tuple[HAService | None, HAClient | None]:
        """A master's HA service and a slave's HA client; a controlled broker, which may
        become either, has both (speaking the auto-switch protocol)."""
        config = self.config
        controlled = config.enable_controller_mode
        ha_config = config.ha
        if controlled:
            ha_config = attrs.evolve(config.ha, protocol=HAProtocol.AUTOSWITCH)
        service = client = None
        if config.is_master or controlled:
            service = HAService(
                self.store,
                ha_config,
                self.epochs,
                host=config.listen_host,
                port=config.ha_port,
                format_address=format_address,
                broker_name=config.broker_name,
                remoting=config.remoting,  # TLS and max_connections on the HA port too
            )
            self.store.append_listeners.append(service.notify_appended)
        if not config.is_master:
            client = HAClient(
                self.store,
                ha_config,
                self.epochs,
                broker_id=config.broker_id,
                master_address=self._master_ha_address,
                parse_address=parse_address,
                broker_name=config.broker_name,
                remoting=config.remoting,  # TLS to the master's HA port
            )
        return service, client

    def _max_retries(self, group: str) -> int:
        """How many times a group's popped message comes back before its DLQ."""
        config = self.ctx.subscriptions.table.get(group)
        return config.retry_max_times if config is not None else 16

    def _context(self, consumers: ConsumerManager) -> BrokerContext:
        config = self.config
        store_dir = Path(config.store.store_dir)
        ctx = BrokerContext(
            config=config,
            store=self.store,
            topics=TopicConfigManager(
                store_dir / "config" / "topics.json",
                self._clock,
                default_queue_nums=config.default_topic_queue_nums,
                auto_create=config.auto_create_topic_enable,
                delay_levels=len(config.store.delay_levels_ms),
                max_topics=config.max_topics,
            ),
            offsets=ConsumerOffsetManager(store_dir / "config" / "consumerOffset.json"),
            subscriptions=SubscriptionGroupManager(
                store_dir / "config" / "subscriptionGroup.json",
                auto_create=config.auto_create_subscription_group,
            ),
            consumers=consumers,
            producers=ProducerManager(),
            locks=RebalanceLockManager(int(config.rebalance_lock_max_live_s * 1000)),
            clock=self._clock,
            ids=MessageIdGenerator(config.advertised_host),
            roles=self.roles,
            ha=self.ha_service,
        )
        ctx.ha_status = self.ha_status
        return ctx

    @property
    def address(self) -> str:
        return self.ctx.address

    async def wait_registered(self) -> None:
        """Until a nameserver has accepted this broker's registration (the module doc);
        call it once ``run`` has started."""
        if self.registrar is None:
            raise RuntimeError("the broker is not running: start run() first")
        await self.registrar.registered.wait()

    # ------------------------------------------------------------------ replication
    def _master_ha_address(self) -> str | None:
        """Where a slave replicates from: the controllers' master, or configured, else
        what the nameservers say."""
        if self.replicas is not None:
            return self.replicas.master_ha_address
        if self.config.ha_master_address:
            return self.config.ha_master_address
        return self.registrar.master_ha_addr if self.registrar else None

    def _master_address(self) -> str | None:
        if self.replicas is not None:
            return self.replicas.master_address
        return self.registrar.master_addr if self.registrar else None

    def _message_topic(self, offset: int) -> str | None:
        """The topic of the message at commit-log ``offset`` (a half message's: its real
        topic), None if none starts there (the ACL checks a send-back and an
        END_TRANSACTION against it)."""
        try:
            message = self.store.look_message_by_offset(offset)
        except StoreError:
            return None
        if message.topic == TRANS_HALF_TOPIC:
            return message.properties.get(PROPERTY_REAL_TOPIC)
        return message.topic

    async def _recovered(self) -> None:
        """Store hook, before anything is appended: the epochs are read."""
        await trio.to_thread.run_sync(self.epochs.load)

    async def _take_configured_role(self) -> None:
        """A statically configured broker, at the end of its start-up (bound, serving,
        registered once): a master starts a new epoch at the end of its log and takes
        sends; a slave replicates. A start that fails or is stopped before this point
        writes no epoch. (Such masters number epochs themselves; two masters of one
        group started apart could pick the same epoch — the controller, with automatic
        failover, is the single authority that avoids it; replicas.py has its epochs.)"""
        if self.config.is_master:
            await self.roles.become_master(self.epochs.last_epoch + 1, "configured master")
        else:
            await self.roles.become_slave("configured slave")

    async def _start_replication(self, nursery: trio.Nursery) -> None:
        """A master listens for slaves; a slave's client and metadata sync start once it
        is registered (they wait for the master's address)."""
        if self.ha_service is not None:
            self.ctx.ha_port = await nursery.start(self.ha_service.run)

    def _connection_closed(self, conn: Connection) -> None:
        self.ctx.consumers.connection_closed(conn)
        self.ctx.producers.connection_closed(conn)

    # ------------------------------------------------------------------ lifecycle
    async def run(self, *, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
        raise_open_files_limit()  # before the store maps its files (it sizes its use by it)
        async with trio.open_nursery() as outer:
            await outer.start(self._run_store)
            try:
                await self._serve(task_status)
            finally:
                with trio.CancelScope(shield=True):
                    await self._persist_state()
                self._store_scope.cancel()  # now the store may stop

    async def _run_store(
        self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        with self._store_scope:
            await self.store.run(task_status=task_status)

    async def _serve(self, task_status: trio.TaskStatus[int]) -> None:
        ctx = self.ctx
        for state in (ctx.topics, ctx.offsets, ctx.subscriptions):
            await state.load()
        ctx.topics.on_change.append(self._topics_changed)
        assert ctx.pull_holds is not None
        self.store.on_dispatch(ctx.pull_holds.on_dispatch)
        self.store.on_topic_deleted(self._topic_deleted)
        assert self.store.recovery is not None
        for topic in self.store.recovery.topics_deleted:  # (applied before this ran)
            self._topic_deleted(topic)
        async with trio.open_nursery() as nursery:
            embedded = await self._start_embedded_nameserver(nursery)
            await self._start_replication(nursery)
            await self._start_services(nursery)
            client_dispatcher = Dispatcher()
            credentials = self.config.credentials
            async with RemotingClient(
                config=self.config.remoting,
                dispatcher=client_dispatcher,
                rpc_hook=signer(credentials) if credentials is not None else None,
            ) as client:
                self._client = client
                registrar = self._join_group(client, client_dispatcher)
                try:
                    # the registrar's tasks end inside the client's block, never after
                    async with trio.open_nursery() as registering:
                        await self._register_and_take_role(registering, client)
                        task_status.started(ctx.port)
                finally:
                    # the others are told; an embedded one stops with us anyway
                    others = [a for a in self.namesrv_addrs if a != embedded]
                    if others:
                        registrar.namesrv_addrs = others
                        with trio.CancelScope(shield=True):
                            await registrar.unregister_all()

    async def _start_embedded_nameserver(self, nursery: trio.Nursery) -> str | None:
        """A nameserver in this broker when none is configured or ``embed_namesrv`` asks
        for one: its address (first in ``namesrv_addrs``), else None."""
        config = self.config
        if config.namesrv_addrs and not config.embed_namesrv:
            return None
        self.nameserver = NameServer(
            NameServerConfig(
                host=config.listen_host,
                port=config.embedded_namesrv_port,
                remoting=config.remoting,  # TLS and limits as the broker's
                acl_file=config.acl_file if self.acl is not None else None,
            )
        )
        port = await nursery.start(self.nameserver.run)
        embedded = format_address(config.advertised_host, port)
        self.namesrv_addrs = [embedded, *(a for a in config.namesrv_addrs if a != embedded)]
        return embedded

    async def _start_services(self, nursery: trio.Nursery) -> None:
        """The ACL, the remoting server (its port is the broker's), metrics, long
        polling, notifications, transactions, client housekeeping, persisting state."""
        ctx = self.ctx
        if self.acl is not None:
            await nursery.start(self.acl.run)
        ctx.port = await nursery.start(self.server.run)
        if self.grpc is not None and self.grpc_server is not None:
            await nursery.start(self.grpc.run)
            ctx.grpc_port = await nursery.start(self.grpc_server.run)
        if self.config.metrics_port is not None:
            collector = BrokerCollector(self)
            self.metrics_port = await nursery.start(self._metrics_server(collector).run)
            nursery.start_soon(collector.measure_disk)
        assert ctx.pull_holds is not None
        await nursery.start(ctx.pull_holds.run)
        await nursery.start(self.notifier.run)
        await nursery.start(self.transactions.run)
        await nursery.start(self.pops.run)
        nursery.start_soon(self._housekeeping)
        nursery.start_soon(self._persist_loop)

    def _join_group(self, client: RemotingClient, client_dispatcher: Dispatcher) -> Registrar:
        """The registrar (told of every role change), in controller mode the replicas
        manager, and who may replicate from this broker while it is master."""
        config = self.config
        registrar = self.registrar = Registrar(self.ctx, client, list(self.namesrv_addrs))
        self.roles.listeners.append(registrar.topics_changed)
        if config.enable_controller_mode:
            assert self.ha_client is not None
            self.replicas = ReplicasManager(
                self.ctx,
                client,
                self.epochs,
                self.ha_client,
                confirm_offset=self.roles.confirm_offset,
            )
            self.replicas.install(client_dispatcher)
        if self.ha_service is not None:
            self.ha_service.use_registry(
                self.replicas.ha_registry()
                if self.replicas is not None
                else nameserver_registry(
                    client,
                    list(self.namesrv_addrs),
                    cluster=config.cluster_name,
                    broker_name=config.broker_name,
                )
            )
        return registrar

    async def _register_and_take_role(self, nursery: trio.Nursery, client: RemotingClient) -> None:
        """Register (the controllers first, in controller mode), take the configured role
        (or wait for the controllers' word), then start a slave's replication."""
        assert self.registrar is not None
        if self.replicas is not None:
            await nursery.start(self.replicas.run)
        await nursery.start(self.registrar.run)
        if self.replicas is None:
            await self._take_configured_role()
        if self.ha_client is not None:
            self.slave_sync = SlaveSync(self.ctx, client, self._master_address, self._persist_soon)
            await nursery.start(self.ha_client.run)
            await nursery.start(self.slave_sync.run)
        log.info(
            "broker %s (%s, cluster %s) serving on %s, nameservers %s",
            self.config.broker_name,
            "controller mode" if self.replicas else self.config.role.value,
            self.config.cluster_name,
            self.ctx.address,
            ", ".join(self.namesrv_addrs),
        )
        if warning := self.config.send_wait_warning():
            log.warning("%s", warning)

    def _metrics_server(self, collector: BrokerCollector) -> MetricsServer:
        """This broker's metrics, and its embedded nameserver's, on metrics_port."""
        registry = new_registry()
        registry.register(collector)
        if self.nameserver is not None:
            registry.register(NameServerCollector(self.nameserver))
        assert self.config.metrics_port is not None
        return MetricsServer(registry, self.config.listen_host, self.config.metrics_port)

    def _topics_changed(self) -> None:
        if self.registrar is not None:
            self.registrar.topics_changed()
        self._persist_soon()

    def _topic_deleted(self, topic: str) -> None:
        """The store applied ``topic``'s deletion (here, or replicated from the master):
        its consumer offsets and statistics go too (its queues start again at 0)."""
        self.ctx.offsets.forget_topic(topic)
        self.ctx.stats.forget_topic(topic)
        self._persist_soon()

    def _persist_soon(self) -> None:
        self._state_changed.set()  # (the persist loop replaces the event every round)

    async def _persist_state(self) -> None:
        for state in (self.ctx.topics, self.ctx.offsets, self.ctx.subscriptions):
            try:
                await state.persist()
            except OSError:
                log.exception("writing %s failed; trying again later", state.path)

    async def _persist_loop(self) -> None:
        while True:
            with trio.move_on_after(self.config.consumer_offset_persist_interval_s):
                await self._state_changed.wait()
            self._state_changed = trio.Event()
            await self._persist_state()

    async def _housekeeping(self) -> None:
        timeout_ms = int(self.config.client_channel_expired_s * 1000)
        while True:
            await trio.sleep(CLIENT_SCAN_INTERVAL_S)
            now = self._clock()
            self.ctx.consumers.scan_expired(now, timeout_ms)
            self.ctx.producers.scan_expired(now, timeout_ms)

    def ha_status(self) -> dict[str, Any]:
        """The replication side of this broker (GET_BROKER_HA_STATUS, ``hamq admin ha-status``)."""
        status: dict[str, Any] = {
            "broker": self.config.broker_name,
            "brokerId": self.roles.broker_id,
            "address": self.ctx.address,
            "role": self.roles.broker_role.value,
            "epochs": [[e.epoch, e.start_offset] for e in self.epochs.entries],
        }
        if self.replicas is not None:
            status["controller"] = self.replicas.status()
        master, slave = self.roles.master_ha_statistics(), self.roles.slave_ha_statistics()
        if master is not None:
            status["master"] = attrs.asdict(master)
        if slave is not None:
            status["slave"] = attrs.asdict(slave)
        if self.slave_sync is not None:
            status["metadataSync"] = attrs.asdict(self.slave_sync.statistics())
        return status

    def statistics(self) -> BrokerStatistics:
        holds = self.ctx.pull_holds
        return BrokerStatistics(
            address=self.ctx.address,
            role=self.roles.broker_role.value,
            namesrv_addrs=tuple(self.registrar.namesrv_addrs) if self.registrar else (),
            topics=len(self.ctx.topics.table),
            consumer_groups=len(self.ctx.consumers.groups),
            producer_groups=len(self.ctx.producers.groups),
            held_pulls=holds.held if holds is not None else 0,
            pulls_answered_on_arrival=holds.answered_on_arrival if holds is not None else 0,
            pulls_answered_on_timeout=holds.answered_on_timeout if holds is not None else 0,
            registrations=self.registrar.registrations if self.registrar else 0,
            notifications_sent=self.notifier.sent,
        )
