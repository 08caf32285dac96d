"""The master's side of the HA channel: accept slaves, push CommitLog bytes, count acks.

A connection is first *set up* (``SlaveConnection._set_up``, the one place a
connection becomes a slave's; the listener's Acceptor has already counted it against
``max_connections`` and negotiated TLS): within ``connect_timeout_s`` the peer proves
``[ha] secret`` if the master has one, and in the auto-switch protocol sends its
HANDSHAKE (its broker id); then membership.py's rule decides whether it is a member
of this broker group. A peer that is not — or whose connection fails before it is
admitted — is closed having been sent no CommitLog byte, none of its reports is read,
and it is counted (``refused_peers``) and logged naming it and why, through a
RateLimitedLog: a flood of strangers writes a few lines per 10 s, not one each. Only
admitted slaves are in ``connections``: everything that decides a send (``transfer``:
who is in sync, what counts as acked, SLAVE_NOT_AVAILABLE) sees members only.

What is said on a connection, and what counts of it, is decided by its sans-IO
session (master_session.py's ``SlaveSession``: the handshake's answer, where sending
starts, which acks count, what to send next, when to drop the slave); a
``SlaveConnection`` does the I/O around it and obeys. Per admitted slave, two tasks
under the connection's nursery (and for a classic slave, whose protocol does not say
its broker id, a third that names it once from the registry: membership.py's
``classic_slave_id``):
- the reader feeds the session what the slave sends (in the auto-switch protocol the
  HANDSHAKE, read during the set-up, and answered once admitted; then reports of the
  slave's max offset). The first report sets where sending starts (0: the start of the
  master's last segment, or its first retained byte when ``sync_from_last_file`` is
  off; a slave past the master's log end, or inside a record, is refused with an error
  that says its log diverged). Every report is an ack: what the session says counts
  wakes SYNC_MASTER sends waiting for it (group_transfer.py) — only up to what the
  kernel took from this connection's sends (``sent_end``; auto-switch: from the start
  its handshake agreed on), never what was merely queued for it; a report past what
  was ever sent to it drops the slave. A slave silent for ``housekeeping_interval_s``
  (20 s) is dropped (the session's ``silent_at``). The session also keeps when the
  bytes it was sent left (``ack_clock``, sync_state_set.py): how long ago the oldest
  byte the slave has not acked was sent — how far behind it is in seconds, which the
  SyncStateSet's keeper (controller mode) and ``ha-status`` (``lag_s``) read.
- the writer sends what the session plans: CommitLog bytes from where the slave is, at
  most ``transfer_batch_bytes`` (32 KiB) and one segment per transfer, never across
  an epoch boundary, straight from the mapped segment (a memoryview, no copy: the
  session describes log ranges, ``_views`` maps them), gathered (sendmsg), each take
  of the kernel fed back (``took``); a heartbeat transfer (no body) when the kernel
  took nothing for ``heartbeat_interval_s`` (5 s). A put's bytes go first from the put
  itself (``notify_appended`` → ``push``: one non-blocking gathered write of the same
  transfers); the writer is woken for what that could not send, and the part the
  kernel did not take stays the session's ``pending``, sent before anything newer.

``transfer`` (group_transfer.py) is what the store's puts wait on: who must ack, and
the acks' waiters; ``floor`` is what retention may not delete past (the furthest-behind
slave's ack).

The service listens all the time but serves slaves only while ``active``: the broker's
role says so (hamq/broker/roles.py's ``serves_slaves``, read, never copied), and
``drop_slaves`` closes them when it stops being master. With a SyncStateSet
(allAckInSyncStateSet), the confirm offset is the least of its members' acks.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping, Sequence

import attrs
import trio

from hamq.ha.config import HAConfig
from hamq.ha.epoch import EpochFile
from hamq.ha.group_transfer import GroupTransfer, ReplicaPolicy, slave_ok
from hamq.ha.master_session import (
    LogRange,
    Part,
    Phase,
    SessionSettings,
    SlaveGone,
    SlaveSession,
)
from hamq.ha.membership import (
    MemberCache,
    Peer,
    ProofFailed,
    Registry,
    RegistryUnavailable,
    challenge_slave,
    classic_slave_id,
    judge,
)
from hamq.ha.states import StateMachine
from hamq.ha.sync_state_set import SlaveFacts
from hamq.protocol.ha_wire import EpochEntry, HAProtocolError, HAState
from hamq.ratelimit import RateLimitedLog
from hamq.remoting import RemotingConfig
from hamq.remoting.address import IPAddress, ip_of
from hamq.remoting.server import Acceptor
from hamq.store import MessageStore, StoreError
from hamq.store.durability import ReplicaGate
from hamq.store.role import ConfiguredRole, RoleReader

log = logging.getLogger(__name__)

RECEIVE_BYTES = 4096


class SlaveClosed(SlaveGone):
    """The slave closed the connection (a slave stopping: not a warning)."""


class SlaveRefused(SlaveGone):
    """The peer did not prove it is a member of this broker group: it got nothing."""


@attrs.frozen
class SlaveStatistics:
    address: str
    broker_id: int
    state: str
    ack_offset: int
    lag_bytes: int
    lag_s: float
    in_sync: bool
    bytes_sent: int


@attrs.frozen
class MasterHAStatistics:
    address: str
    protocol: str
    max_offset: int
    acked_offset: int
    waiting_sends: int
    slaves: tuple[SlaveStatistics, ...]
    #: peers refused on the HA port (not members of this group), and the last reason
    refused_peers: int = 0
    last_refusal: str | None = None
    #: connections closed at accept for being over max_connections
    connections_refused: int = 0
    tls_handshake_failures: int = 0


class _ServiceLog:
    """The master's log as a session reads it (master_session.MasterLog): the store's
    and the epoch file's facts, and the service's confirm offset."""

    __slots__ = ("_service",)

    def __init__(self, service: HAService) -> None:
        self._service = service

    @property
    def min_offset(self) -> int:
        return self._service.store.commitlog_min_offset

    @property
    def max_offset(self) -> int:
        return self._service.store.commitlog_max_offset

    @property
    def segment_bytes(self) -> int:
        return self._service.store.config.commitlog_segment_bytes

    @property
    def confirm_offset(self) -> int:
        return self._service.confirm_offset

    @property
    def epochs(self) -> Sequence[EpochEntry]:
        return self._service.epochs.entries

    def is_record_boundary(self, offset: int) -> bool:
        return self._service.store.is_record_boundary(offset)


class SlaveConnection:
    """One slave's connection: the I/O around its SlaveSession (master_session.py)."""

    def __init__(
        self,
        service: HAService,
        stream: trio.abc.Stream,
        peer: str,
        peer_host: IPAddress | None = None,
    ) -> None:
        self.service = service
        self.stream = stream
        self.peer = peer
        self.peer_host = peer_host
        config = service.config
        self.session = SlaveSession(
            config.protocol,
            _ServiceLog(service),
            SessionSettings(
                transfer_batch_bytes=config.transfer_batch_bytes,
                heartbeat_interval_s=config.heartbeat_interval_s,
                housekeeping_interval_s=config.housekeeping_interval_s,
                sync_from_last_file=config.sync_from_last_file,
            ),
            name=peer,
            now=trio.current_time(),
        )
        #: set once the session streams (its first report): the writer starts
        self._started = trio.Event()
        self.scope = trio.CancelScope()

    # (what HAService reads of a connection: the session's)
    @property
    def machine(self) -> StateMachine:
        return self.session.machine

    @property
    def broker_id(self) -> int:
        return self.session.broker_id

    @broker_id.setter
    def broker_id(self, broker_id: int) -> None:
        self.session.broker_id = broker_id

    @property
    def ack_offset(self) -> int:
        return self.session.ack_offset

    @property
    def acked_upto(self) -> int:
        return self.session.acked_upto

    @property
    def last_report(self) -> float:
        return self.session.last_report

    async def serve(self) -> None:
        service = self.service
        try:
            with self.scope:
                await self._set_up()
                service.connections.add(self)
                try:
                    async with trio.open_nursery() as nursery:
                        nursery.start_soon(self._reader)
                        nursery.start_soon(self._writer)
                        if self.broker_id < 0:  # (classic: its protocol does not say)
                            nursery.start_soon(self._identify)
                finally:
                    service.connections.discard(self)
        except* SlaveRefused as group:
            service.refused(self.peer, str(group.exceptions[0]))
        except* (
            SlaveGone,
            HAProtocolError,
            trio.BrokenResourceError,
            trio.TooSlowError,
            OSError,
        ) as group:
            reason = group.exceptions[0]
            level = logging.INFO if isinstance(reason, SlaveClosed) else logging.WARNING
            log.log(level, "HA slave %s dropped: %s", self.peer, reason)
        finally:
            with trio.CancelScope(shield=True):
                await trio.aclose_forcefully(self.stream)

    # ------------------------------------------------------------------ set-up
    async def _set_up(self) -> None:
        """Admit the peer or refuse it (SlaveRefused) before it is sent any log byte or
        any report of it is read: within ``connect_timeout_s`` it proves ``[ha] secret``
        (if this master has one) and, auto-switch, sends its HANDSHAKE; then the
        membership rule (membership.py); then the handshake is answered."""
        service = self.service
        session = self.session
        limit = service.config.connect_timeout_s
        secret = service.config.secret
        try:
            with trio.fail_after(limit):
                if secret:
                    await challenge_slave(self.stream, secret.encode("utf-8"), service.broker_name)
                if session.phase is Phase.HANDSHAKE:
                    await self._receive_handshake()
        except trio.TooSlowError:
            raise SlaveRefused(f"it did not complete the HA set-up within {limit:g}s") from None
        except (ProofFailed, HAProtocolError, SlaveGone) as exc:
            raise SlaveRefused(str(exc)) from None
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
            # (a stranger's reset is a refusal like any other: counted, rate-limited)
            raise SlaveRefused(f"its connection failed during the HA set-up: {exc}") from None
        handshake = session.handshake
        peer = Peer(
            self.peer,
            self.peer_host,
            handshake.broker_id if handshake is not None else None,
            proved_secret=bool(secret),
        )
        refusal = await service.refusal(peer)
        if refusal is not None:
            raise SlaveRefused(refusal)
        if not service.active:
            raise SlaveRefused("this broker is not master (any more)")
        session.admit(trio.current_time())  # (auto-switch: the handshake's answer)
        await self._send_pending()
        log.info(
            "HA slave %s admitted%s",
            self.peer,
            f" (broker id {peer.broker_id})" if peer.broker_id is not None else "",
        )

    async def _identify(self) -> None:
        """A classic slave's broker id, from the registry (membership.py), for the
        metrics and ha-status; in the background, so that a registry slow to answer
        delays no replication. Left -1 when the registry cannot say."""
        found = await self.service.classic_slave_id(self)
        if found is not None:
            self.broker_id = found
            log.info("HA slave %s is broker %d of the group (by its host)", self.peer, found)

    async def _receive_handshake(self) -> None:
        """Read until the session has the auto-switch HANDSHAKE (the first thing a slave
        sends, after the secret); nothing after it is read yet."""
        session = self.session
        while session.handshake is None:
            data = await self.stream.receive_some(RECEIVE_BYTES)
            if not data:
                raise SlaveRefused("it closed the connection before its HANDSHAKE")
            session.receive(data, trio.current_time())

    # ------------------------------------------------------------------ reading
    async def _reader(self) -> None:
        session = self.session
        data: bytes | bytearray = b""  # (first, what came with the HANDSHAKE)
        while True:
            self._count(session.receive(data, trio.current_time()))
            if session.streaming:
                self._started.set()
            with trio.move_on_at(session.silent_at) as silent:
                data = await self.stream.receive_some(RECEIVE_BYTES)
            if silent.cancelled_caught:
                session.tick(trio.current_time())
                data = b""
            elif not data:
                raise SlaveClosed("closed the connection")

    def _count(self, acked: int | None) -> None:
        """Obey the session's "an ack to count": it wakes the sends waiting for it."""
        if acked is not None:
            self.service.transfer.slave_acked(acked)

    # ------------------------------------------------------------------ writing
    def _views(self, parts: Sequence[Part]) -> list[bytes | memoryview]:
        """The session's parts as buffers to send: log ranges straight from the mapped
        segments (no copy). SlaveGone if the log cannot be read there."""
        store = self.service.store
        views: list[bytes | memoryview] = []
        for part in parts:
            if isinstance(part, LogRange):
                try:
                    data = store.get_data(part.start, part.size)
                except StoreError as exc:
                    raise SlaveGone(
                        f"cannot read commitlog offset {part.start} for it: {exc}"
                    ) from None
                if len(data) != part.size:
                    raise SlaveGone(
                        f"no commitlog data at offset {part.start + len(data)} (deleted?)"
                    )
                views.append(data)
            else:
                views.append(part)
        return views

    async def _send_pending(self) -> None:
        """Send the session's ``pending`` until the kernel has taken it all, gathered
        (sendmsg), without copying; each take is fed to the session. (Over a stream
        without sendmsg, such as TLS: ``send_all`` each part.)"""
        session = self.session
        # a slave that reads nothing for housekeeping_interval_s is as good as gone
        with trio.fail_after(self.service.config.housekeeping_interval_s):
            stream = self.stream
            if not isinstance(stream, trio.SocketStream):  # TLS
                while session.pending:
                    [view] = self._views(session.pending[:1])
                    await stream.send_all(view)
                    self._count(session.took(len(view), trio.current_time()))
                return
            while session.pending:
                sent = await stream.socket.sendmsg(self._views(session.pending))
                self._count(session.took(sent, trio.current_time()))

    def push(self) -> bool:
        """Send what the slave lacks now, from the caller (the store's append listener),
        with one non-blocking gathered write: a put's bytes leave at once instead of
        after the writer task's turn comes (under load, several scheduling rounds of
        other tasks' work later; that wait was most of a SYNC_MASTER send's latency).
        True if nothing is left for the writer; False when the writer must do it: it is
        sending already (the session's ``pending`` is not empty), the stream is not plain
        TCP (TLS), the kernel took only part (the rest stays pending, sent first), or
        anything failed (the writer meets the failure again and drops the slave, as it
        would have)."""
        session = self.session
        if not session.streaming or session.sending:
            return False
        stream = self.stream
        if not isinstance(stream, trio.SocketStream):
            return False
        now = trio.current_time()
        parts = session.next_send(now, heartbeat=False)
        if parts is None:
            return True
        try:
            try:
                sent = os.writev(stream.socket.fileno(), self._views(parts))
            except BlockingIOError:
                sent = 0
        except (SlaveGone, OSError):
            return False  # (nothing went: it stays pending for the writer)
        self._count(session.took(sent, now))
        return not session.sending

    async def _writer(self) -> None:
        await self._started.wait()
        session = self.session
        while True:
            if session.next_send(trio.current_time()) is not None:
                await self._send_pending()
                continue
            with trio.move_on_at(session.heartbeat_at):
                await self.service.wait_appended()

    def facts(self, now: float) -> SlaveFacts:
        """What the SyncStateSet's keeper needs of this slave (sync_state_set.py)."""
        return self.session.facts(now)

    def statistics(self) -> SlaveStatistics:
        session = self.session
        max_offset = self.service.store.commitlog_max_offset
        ack = session.ack_offset
        lag = max(0, max_offset - ack) if ack >= 0 else max_offset
        return SlaveStatistics(
            address=self.peer,
            broker_id=session.broker_id,
            state=session.machine.state.name,
            ack_offset=ack,
            lag_bytes=lag,
            lag_s=round(session.ack_clock.behind_s(trio.current_time()), 3),
            in_sync=self.service.slave_in_sync(self),
            bytes_sent=session.bytes_sent,
        )


class HAService:
    def __init__(
        self,
        store: MessageStore,
        config: HAConfig,
        epochs: EpochFile,
        *,
        host: str,
        port: int,
        format_address: Callable[[str, int], str],
        broker_name: str = "",
        remoting: RemotingConfig | None = None,
    ) -> None:
        self.store = store
        self.config = config
        self.epochs = epochs
        self.host = host
        self.port = port
        self._format_address = format_address
        #: the broker group's name (in the secret's MACs, and in refusals)
        self.broker_name = broker_name
        #: admitted slaves only (a connection joins once set up)
        self.connections: set[SlaveConnection] = set()
        #: who the group's members are (set by the broker once it can ask; until then
        #: only a peer that proved the secret is admitted)
        self._members: MemberCache | None = None
        self.refused_peers = 0
        self.last_refusal: str | None = None
        #: who a put waits for, and what counts as acked (the store's ReplicaGate)
        self.transfer = GroupTransfer(
            config.sync_timeout_s,
            in_sync=self._any_slave_in_sync,
            acked_upto=lambda: [(c.broker_id, c.acked_upto) for c in self.connections],
            end=lambda: self.store.commitlog_max_offset,
            replicated=store.durability.replicated,
        )
        self._appended = trio.lowlevel.ParkingLot()
        #: whose role says whether slaves are served (the broker's: hamq/broker/roles.py)
        self._role: RoleReader = ConfiguredRole(False)
        #: every line a stranger can provoke at will (refusals, the listener's)
        self.warnings = RateLimitedLog(log)
        #: the listener's connection cap and TLS (the broker's [remoting] settings)
        self._acceptor = Acceptor("HA service", remoting or RemotingConfig(), self.warnings)

    @property
    def address(self) -> str:
        return self._format_address(self.host, self.port)

    def use_role(self, role: RoleReader) -> None:
        """Whose role says whether this service serves slaves (until set: none)."""
        self._role = role

    @property
    def active(self) -> bool:
        """Serving slaves: as the broker's role says (``serves_slaves``)."""
        return self._role.serves_slaves

    # ------------------------------------------------------------------ who puts wait for
    @property
    def replica_gate(self) -> ReplicaGate:
        """What the store asks whether a put waits for replicas (group_transfer.py)."""
        return self.transfer

    @property
    def replica_policy(self) -> ReplicaPolicy:
        return self.transfer.policy

    @property
    def must_ack(self) -> frozenset[int]:
        """SYNC_STATE_SET: the members other than this broker whose acks a put waits for."""
        return self.transfer.must_ack

    def set_replica_policy(
        self, policy: ReplicaPolicy, members: frozenset[int] = frozenset(), self_id: int = 0
    ) -> None:
        """Puts wait for ``policy``'s replicas from now on (group_transfer.py)."""
        self.transfer.set_policy(policy, members, self_id)

    async def run(self, *, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
        try:
            listeners = await trio.open_tcp_listeners(self.port, host=self.host)
        except OSError as exc:
            raise OSError(
                exc.errno, f"cannot listen for HA on {self.address}: {exc.strerror or exc}"
            ) from None
        self.port = listeners[0].socket.getsockname()[1]
        self._acceptor.name = f"HA service {self.address}"
        log.info(
            "HA service (%s) listening on %s; slaves are admitted by %s",
            self.config.protocol.value,
            self.address,
            "[ha] secret" if self.config.secret else "their registration (no [ha] secret)",
        )
        async with trio.open_nursery() as nursery:
            task_status.started(self.port)
            await self._acceptor.serve(listeners, self._serve, nursery)

    async def _serve(self, stream: trio.abc.Stream, peer: str) -> None:
        peer_host = ip_of(peer)  # None for "unknown peer"
        if not self.active:
            self.warnings.log(
                logging.INFO,
                "inactive",
                "HA connection from %s closed: this broker is not master",
                peer,
            )
            await trio.aclose_forcefully(stream)
            return
        log.debug("HA connection from %s", peer)  # (an admitted slave gets an INFO line)
        await SlaveConnection(self, stream, peer, peer_host).serve()

    # ------------------------------------------------------------------ membership
    def use_registry(self, registry: Registry) -> None:
        """Where this master learns its group's members (membership.py)."""
        self._members = MemberCache(registry)

    async def refusal(self, peer: Peer) -> str | None:
        """Why ``peer`` may not replicate from this master, or None (membership.py's
        rule: the secret, else the registry; in controller mode the id always)."""
        cache = self._members
        if peer.proved_secret and (
            cache is None or peer.broker_id is None or not cache.registry.ids_authoritative
        ):
            return None
        if cache is None:
            return (
                "this master does not know its group's members yet (and has no [ha] "
                "secret to admit slaves by)"
            )
        registry = cache.registry

        def rule(members: Mapping[int, str]) -> str | None:
            return judge(
                peer,
                members,
                self_id=registry.self_id(),
                check_host=not peer.proved_secret,
                broker_name=self.broker_name,
                source=registry.source,
            )

        try:
            members = await cache.members(lambda known: rule(known) is None)
        except RegistryUnavailable as exc:
            return f"{registry.source} cannot be asked whether it is a member: {exc}"
        return rule(members)

    async def classic_slave_id(self, connection: SlaveConnection) -> int | None:
        """The broker id of the classic slave on ``connection`` as the registry has it
        (membership.py's ``classic_slave_id``), None if it cannot say."""
        cache = self._members
        if cache is None:
            return None
        self_id = cache.registry.self_id()

        def names(members: Mapping[int, str]) -> bool:
            return classic_slave_id(connection.peer_host, members, self_id=self_id) is not None

        try:
            members = await cache.members(names)
        except RegistryUnavailable:
            return None
        # (no checkpoint from here to the caller's assignment: two slaves identified at
        # once see each other's id)
        taken = {c.broker_id for c in self.connections if c is not connection}
        return classic_slave_id(connection.peer_host, members, self_id=self_id, taken=taken)

    def refused(self, peer: str, reason: str) -> None:
        """Count a refused peer and log it (rate-limited: strangers come in floods)."""
        self.refused_peers += 1
        self.last_refusal = f"{peer}: {reason}"
        self.warnings.warning("refused", "HA peer %s refused: %s", peer, reason)

    def drop_slaves(self) -> None:
        """Close every slave's connection (this broker is no longer master: its role
        says so already, so none is admitted again)."""
        for connection in self.connections:
            connection.scope.cancel()

    # ------------------------------------------------------------------ appends and acks
    def notify_appended(self) -> None:
        """Store append listener (once a put): each slave is sent the new bytes now
        (``SlaveConnection.push``); the writers are woken for what could not go."""
        pushed = True
        for connection in self.connections:
            pushed = connection.push() and pushed
        if not pushed and len(self._appended):
            self._appended.unpark_all()

    async def wait_appended(self) -> None:
        await self._appended.park()

    @property
    def confirm_offset(self) -> int:
        """What every in-sync replica has: with a SyncStateSet the least of its members'
        acks, else the least ack of in-sync slaves (the master's own end when none is)."""
        if self.transfer.policy is ReplicaPolicy.SYNC_STATE_SET:
            replicated = self.transfer.replicated_offset()
            return min(max(replicated, 0), self.store.commitlog_max_offset)
        acks = [c.ack_offset for c in self.connections if self.slave_in_sync(c)]
        return min([*acks, self.store.commitlog_max_offset])

    def slave_facts(self, now: float) -> dict[int, SlaveFacts]:
        """broker id -> what the SyncStateSet's keeper needs of that slave
        (sync_state_set.py), for every admitted slave in TRANSFER that has an id; of
        several connections of one id (a reconnect while the old one lingers), the one
        that reported last."""
        newest: dict[int, SlaveConnection] = {}
        for connection in self.connections:
            if connection.broker_id < 0 or connection.machine.state is not HAState.TRANSFER:
                continue
            other = newest.get(connection.broker_id)
            if other is None or connection.last_report > other.last_report:
                newest[connection.broker_id] = connection
        return {broker_id: c.facts(now) for broker_id, c in newest.items()}

    def slave_in_sync(self, connection: SlaveConnection) -> bool:
        return slave_ok(
            transferring=connection.machine.state is HAState.TRANSFER,
            ack_offset=connection.ack_offset,
            log_end=self.store.commitlog_max_offset,
            max_gap=self.config.max_gap_not_in_sync_bytes,
        )

    def _any_slave_in_sync(self) -> bool:
        return any(self.slave_in_sync(c) for c in self.connections)

    def floor(self) -> int:
        """Retention may not delete what an in-sync slave still needs. (A slave further
        behind than max_gap_not_in_sync_bytes does not hold the disk hostage; if what it
        needs is deleted, it must be rebuilt from an empty store.)"""
        acks = [c.ack_offset for c in self.connections if self.slave_in_sync(c)]
        return min(acks) if acks else self.store.commitlog_max_offset

    def statistics(self) -> MasterHAStatistics:
        return MasterHAStatistics(
            address=self.address,
            protocol=self.config.protocol.value,
            max_offset=self.store.commitlog_max_offset,
            acked_offset=self.store.durability.replicated_offset,
            waiting_sends=self.store.durability.waiting_for_replicas,
            slaves=tuple(
                sorted((c.statistics() for c in self.connections), key=lambda s: s.address)
            ),
            refused_peers=self.refused_peers,
            last_refusal=self.last_refusal,
            connections_refused=self._acceptor.refused,
            tls_handshake_failures=self._acceptor.handshake_failures,
        )
