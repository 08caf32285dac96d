"""The slave's side of the HA channel: connect to the master, take its CommitLog bytes.

A loop of sessions, each a TCP connection to the master's HA address (learnt from the
nameservers' registration answers, or configured). A session:
0. with ``[ha] secret``: the secret exchange (membership.py) — this slave proves it
   knows the secret and checks that the master does too (a master that cannot is not
   this group's: nothing is taken from it). ``_set_up`` is the one place a connection
   is set up (over TLS already when ``[remoting.tls]`` is set: ``open_stream``);
1. auto-switch: HANDSHAKE — the master answers its max offset and epoch table; the
   slave truncates its log to the last offset both agree on by epoch (nothing if its
   own epoch table is empty), then
2. TRANSFER — reports its max offset, appends every transfer whose offset is its max
   offset (``append_raw``; the store's reput task builds consume queues from them),
   records new epochs as data crosses into them, and reports again after each batch
   and every ``heartbeat_interval_s`` (5 s).
A transfer at another offset, an invalid message, or a master silent for
``housekeeping_interval_s`` (20 s) ends the session; the next one starts after a pause
that doubles from ``reconnect_initial_s`` up to ``reconnect_max_s``. Every state change
is logged (states.py). ``kick()`` ends the session at once and starts the next one
without a pause: a controller-mode broker calls it when its master changes.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import attrs
import trio

from hamq.ha.config import HAConfig
from hamq.ha.epoch import EpochFile, consistent_point
from hamq.ha.membership import ProofFailed, answer_master
from hamq.ha.states import StateMachine
from hamq.protocol.ha_wire import (
    HAProtocol,
    HAProtocolError,
    HAState,
    MasterHandshake,
    MasterMessageDecoder,
    SlaveHandshake,
    Transfer,
    encode_report,
    encode_slave_handshake,
)
from hamq.remoting import RemotingConfig
from hamq.remoting.tls import ClientTls, open_stream
from hamq.store import MessageStore, StoreError

log = logging.getLogger(__name__)

RECEIVE_BYTES = 1024 * 1024
#: a read at least this large means the master has a backlog for this slave
CATCH_UP_READ_BYTES = 256 * 1024
#: after each such read the store's dispatching waits this long for more (ReputService.defer_for)
DEFER_DISPATCH_PER_READ_S = 0.05
#: while transfers arrive back to back, reports go at most this often (each still acks
#: everything appended before it)
REPORT_EVERY_S = 0.005


class SessionEnded(Exception):
    """Why a session with the master ended (it is logged, and another one starts)."""


@attrs.frozen
class SlaveHAStatistics:
    state: str
    master_address: str | None
    max_offset: int
    confirm_offset: int
    bytes_received: int
    sessions: int
    last_error: str | None


class HAClient:
    def __init__(
        self,
        store: MessageStore,
        config: HAConfig,
        epochs: EpochFile,
        *,
        broker_id: int,
        master_address: Callable[[], str | None],
        parse_address: Callable[[str], tuple[str, int]],
        broker_name: str = "",
        remoting: RemotingConfig | None = None,
    ) -> None:
        self.store = store
        #: TLS to the master (the broker's [remoting.tls]); None: plain TCP
        self._tls = ClientTls.of((remoting or RemotingConfig()).tls)
        self.config = config
        self.epochs = epochs
        self.broker_id = broker_id
        #: the broker group's name (in the secret's MACs)
        self.broker_name = broker_name
        self._master_address = master_address
        self._parse_address = parse_address
        self.machine = StateMachine("HA slave")
        self.confirm_offset = 0
        self.bytes_received = 0
        self.sessions = 0
        self.last_error: str | None = None
        self._connected_to: str | None = None
        #: the current session received data
        self._transferred = False
        self._session_scope = trio.CancelScope()
        self._kicked = trio.Event()

    @property
    def state(self) -> HAState:
        return self.machine.state

    # ------------------------------------------------------------------ the loop
    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        pause = self.config.reconnect_initial_s
        try:
            while True:
                addr = self._master_address()
                if addr is None:
                    await self._pause(pause)  # not known yet: the registration tells
                    continue
                self._transferred = False
                self._session_scope = trio.CancelScope()
                try:
                    with self._session_scope:
                        await self._session(addr)
                except (
                    SessionEnded,
                    HAProtocolError,
                    OSError,
                    trio.BrokenResourceError,
                    trio.TooSlowError,
                    ValueError,  # a master address that does not parse
                ) as exc:
                    self.last_error = f"{addr}: {exc}"
                    log.warning("HA session with master %s ended: %s", addr, exc)
                finally:
                    self._connected_to = None
                    if self.state in (HAState.HANDSHAKE, HAState.TRANSFER):
                        self.machine.set(HAState.READY, "disconnected")
                if self._transferred or self._session_scope.cancelled_caught:
                    pause = self.config.reconnect_initial_s  # it worked, or was kicked
                await self._pause(pause)
                pause = min(pause * 2, self.config.reconnect_max_s)
        finally:
            self.machine.set(HAState.SHUTDOWN)

    async def _pause(self, seconds: float) -> None:
        with trio.move_on_after(seconds):
            await self._kicked.wait()
        self._kicked = trio.Event()

    def kick(self) -> None:
        """End the current session now and start the next at once (the master changed)."""
        self._session_scope.cancel()
        self._kicked.set()

    # ------------------------------------------------------------------ one session
    async def _session(self, addr: str) -> None:
        host, port = self._parse_address(addr)
        with trio.fail_after(self.config.connect_timeout_s):  # TooSlowError: next session
            stream = await open_stream(host, port, self._tls, peer=addr)
        self.sessions += 1
        self._connected_to = addr
        async with stream:
            await self._set_up(stream)
            try:
                # transfers are cut anywhere: continue from a record boundary
                await self.store.trim_partial_tail()
            except StoreError as exc:
                raise SessionEnded(f"this slave's log cannot continue: {exc}") from None
            decoder = MasterMessageDecoder(self.config.protocol)
            if self.config.protocol is HAProtocol.AUTOSWITCH:
                self.machine.set(HAState.HANDSHAKE, f"connected to {addr}")
                await stream.send_all(
                    encode_slave_handshake(
                        SlaveHandshake(self.config.sync_from_last_file, False, self.broker_id)
                    )
                )
                handshake = await self._receive_handshake(stream, decoder)
                await self._truncate_to_agreement(handshake)
                self.machine.set(HAState.TRANSFER, "epochs agreed")
            else:
                self.machine.set(HAState.TRANSFER, f"connected to {addr}")
            await self._transfer_loop(stream, decoder)

    async def _set_up(self, stream: trio.abc.Stream) -> None:
        """With ``[ha] secret``: prove it, and check the master's proof, within
        ``connect_timeout_s`` (SessionEnded saying what failed)."""
        secret = self.config.secret
        if not secret:
            return
        limit = self.config.connect_timeout_s
        try:
            with trio.fail_after(limit):
                await answer_master(stream, secret.encode("utf-8"), self.broker_name)
        except trio.TooSlowError:
            raise SessionEnded(
                f"the HA secret exchange did not complete within {limit:g}s (the master "
                "sent no challenge: has it no [ha] secret?)"
            ) from None
        except ProofFailed as exc:
            raise SessionEnded(str(exc)) from None

    async def _receive(self, stream: trio.abc.Stream) -> bytes | bytearray:
        idle_s = self.config.housekeeping_interval_s
        with trio.move_on_after(idle_s) as silent:
            data = await stream.receive_some(RECEIVE_BYTES)
        if silent.cancelled_caught:
            raise SessionEnded(f"the master was silent for {idle_s:g}s")
        if not data:
            raise SessionEnded("the master closed the connection")
        return data

    async def _receive_handshake(
        self, stream: trio.abc.Stream, decoder: MasterMessageDecoder
    ) -> MasterHandshake:
        while True:
            decoder.feed(await self._receive(stream))
            event = decoder.next_event()
            if isinstance(event, MasterHandshake):
                return event
            if event is not None:
                raise SessionEnded("the master sent a transfer before its handshake")

    async def _truncate_to_agreement(self, handshake: MasterHandshake) -> None:
        own_max = self.store.commitlog_max_offset
        if not self.epochs.entries:
            if own_max > self.store.commitlog_min_offset:
                raise SessionEnded(
                    f"this slave's log ([{self.store.commitlog_min_offset}, {own_max})) has "
                    "no epochs (written before auto-switch replication?): it cannot be "
                    "checked against the master's; clear the slave's store to copy afresh"
                )
            return
        point = consistent_point(
            self.epochs.entries, own_max, handshake.epochs, handshake.max_offset
        )
        if point < 0 and own_max == self.store.commitlog_min_offset == 0:
            point = 0  # nothing was written under those epochs: nothing to reconcile
        if point < 0:
            raise SessionEnded(
                f"no epoch in common with the master (ours {self.epochs.entries}, the "
                f"master's {list(handshake.epochs)}): this log cannot be reconciled; clear "
                "the slave's store to copy the master afresh"
            )
        if point < own_max:
            log.warning(
                "HA slave: log diverged from the master after offset %d: truncating [%d, %d)",
                point,
                point,
                own_max,
            )
            try:
                await self.store.truncate(point)
            except StoreError as exc:
                raise SessionEnded(
                    f"cannot truncate this slave's log to {point}, where it agrees with the "
                    f"master: {exc}; clear the slave's store to copy afresh"
                ) from None
        await self.epochs.truncate(point)  # epochs past the agreement go, data or not

    async def _transfer_loop(self, stream: trio.abc.Stream, decoder: MasterMessageDecoder) -> None:
        """Receive transfers and append them; report after each batch and when nothing
        was reported for ``heartbeat_interval_s``; end when the master is silent for
        ``housekeeping_interval_s``. One task: only the receive is cancelled (safely)
        when a report is due, never a send."""
        config = self.config
        last_report = last_heard = trio.current_time()

        async def report() -> None:
            nonlocal last_report
            failure = self.store.dispatch_failure
            if failure is not None:  # what came does not read as records: no ack for it
                raise SessionEnded(f"replicated data does not dispatch: {failure}")
            offset = self.store.commitlog_max_offset
            with trio.fail_after(config.housekeeping_interval_s):
                await stream.send_all(encode_report(config.protocol, offset))
            last_report = trio.current_time()

        await report()
        while True:
            if self.state is not HAState.TRANSFER:
                raise SessionEnded(f"left TRANSFER for {self.state.name}")
            silent_at = last_heard + config.housekeeping_interval_s
            data = None
            with trio.move_on_at(min(last_report + config.heartbeat_interval_s, silent_at)):
                data = await stream.receive_some(RECEIVE_BYTES)
            if data is None:  # nothing came in time: a heartbeat is due, or the master is gone
                if trio.current_time() >= silent_at:
                    raise SessionEnded(
                        f"the master was silent for {config.housekeeping_interval_s:g}s"
                    )
                await report()
                continue
            if not data:
                raise SessionEnded("the master closed the connection")
            last_heard = trio.current_time()
            if len(data) >= CATCH_UP_READ_BYTES:  # a backlog: the log first, queues after
                self.store.defer_dispatch(DEFER_DISPATCH_PER_READ_S)
            decoder.feed(data)
            if await self._take(decoder) and (
                decoder.buffered == 0 or trio.current_time() - last_report >= REPORT_EVERY_S
            ):
                # (mid-transfer, more is on its way: one report per REPORT_EVERY_S)
                await report()

    async def _take(self, decoder: MasterMessageDecoder) -> bool:
        """Append every whole transfer received — consecutive ones of one epoch in one
        write; True if any carried data. Every transfer, heartbeats too, must start where
        this slave's log ends (an empty log takes what the master starts it with)."""
        run: list[Transfer] = []
        run_end = -1
        appended = False
        while (event := decoder.next_event()) is not None:
            if not isinstance(event, Transfer):
                raise SessionEnded("the master sent a second handshake")
            if run and (event.offset != run_end or event.epoch != run[0].epoch):
                await self._append(run)
                run = []
            if not run:
                self._check_offset(event.offset)
            if event.body:
                run.append(event)
                run_end = event.offset + len(event.body)
            elif event.confirm_offset:
                self.confirm_offset = min(event.confirm_offset, self.store.commitlog_max_offset)
        if run:
            await self._append(run)
            appended = self._transferred = True
        return appended

    def _check_offset(self, offset: int) -> None:
        store = self.store
        own_max = store.commitlog_max_offset
        empty = own_max == store.commitlog_min_offset == 0
        if offset != own_max and not empty:
            raise SessionEnded(
                f"the master sent offset {offset}, this slave's log ends at {own_max}"
            )

    async def _append(self, run: list[Transfer]) -> None:
        """Append consecutive transfers of one epoch (recorded first, if new)."""
        store = self.store
        first = run[0]
        autoswitch = self.config.protocol is HAProtocol.AUTOSWITCH
        if autoswitch and first.epoch != self.epochs.last_epoch:
            await self.epochs.append(first.epoch, first.epoch_start_offset)
        try:
            store.append_raw(first.offset, *(t.body for t in run))
        except StoreError as exc:
            raise SessionEnded(f"appending at {first.offset} failed: {exc}") from None
        self.bytes_received += sum(len(t.body) for t in run)
        if autoswitch:
            self.confirm_offset = min(run[-1].confirm_offset, store.commitlog_max_offset)

    def statistics(self) -> SlaveHAStatistics:
        return SlaveHAStatistics(
            state=self.state.name,
            master_address=self._connected_to or self._master_address(),
            max_offset=self.store.commitlog_max_offset,
            confirm_offset=self.confirm_offset,
            bytes_received=self.bytes_received,
            sessions=self.sessions,
            last_error=self.last_error,
        )
