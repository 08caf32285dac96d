"""The master's side of one slave's HA connection, sans-IO: what it knows of the
slave, and what to send it next.

A ``SlaveSession`` is fed events and answers with decisions; master.py's
``SlaveConnection`` does the I/O around it (the socket, the timers) and obeys:

- ``receive(data, now)``: bytes from the slave (decoded here, hamq.protocol.ha_wire).
  Answers the ack to count (``acked_upto`` grew: wake the sends waiting for it), or
  None; raises ``SlaveGone`` when the slave must be dropped, saying why.
- ``next_send(now)``: what to send now, as ``pending``: control bytes (a header, the
  handshake's answer) and ``LogRange`` s of the CommitLog, which the I/O layer sends
  straight from the mapped segments (memoryviews, no copy). None: nothing to send.
  "The log grew" is a call of ``next_send``: the session reads the log's facts
  (a ``MasterLog``) at each decision.
- ``took(n, now)``: the kernel took the first ``n`` bytes of ``pending``. Answers the ack
  to count (a report can arrive before the send that carried its bytes returns: it
  counts as the kernel takes them), or None.
- ``tick(now)``: the reader's timer; SlaveGone if the slave has been silent for
  ``housekeeping_interval_s``. ``silent_at`` and ``heartbeat_at`` say when to call.

**Phases** (``Phase``; ``PHASES`` is the table of moves, each logged):

    HANDSHAKE ──its HANDSHAKE, admitted (admit)──▶ START ──first report──▶ STREAMING
    START (classic: no handshake) ──first report──▶ STREAMING

HANDSHAKE (auto-switch only): nothing is read past the slave's HANDSHAKE until the I/O
layer admits the peer (``admit``: the answer, the master's max offset and epoch table,
goes into ``pending``); a report before it is refused. START: the first report sets
where sending starts. STREAMING: every report is an ack. A HANDSHAKE after the first
drops the slave. ``machine`` (states.py) is the connection's HAState as ha-status and
the sends' rules see it: HANDSHAKE, then TRANSFER once answered (classic: TRANSFER).

**Classic vs auto-switch** is a ``Policy``, not branches: whether a HANDSHAKE opens
the connection, and whether the slave holds the log up to its start (auto-switch: its
handshake truncated it to where its log agrees with this master's epochs; classic: its
first report says where its log ends, not that it holds what this master wrote there,
so only what this connection sends counts).

**The start** (first report at offset ``s``): past the master's log end, or inside a
record, the slave is dropped: its log diverged. ``s = 0``: an empty slave starts at the
master's last segment (``sync_from_last_file``) or at its first retained byte.

**Acks**: ``next_offset`` is where the next transfer starts (the end of what was ever
put in ``pending``: a report up to it is a slave's, one past it drops the slave);
``sent_end`` is the end of the log bytes the kernel took (-1: none; auto-switch: the
start). A report sets ``ack_offset``; what counts (``acked_upto``) is the least of the
two, and only grows. ``ack_clock`` (sync_state_set.py) marks when bytes left.

**Sending**: one send holds at most ``FRAMES_PER_SEND`` transfers, each of at most
``transfer_batch_bytes``, within one segment and within one epoch (never across an
epoch boundary: a transfer's header names its epoch). What the kernel did not take
stays in ``pending`` and goes before anything newer; nothing else is planned while
``pending`` is not empty (``sending``), so whoever sends (the writer task, or the
put itself) owns it alone. When the slave has everything and the kernel took nothing
for ``heartbeat_interval_s``, a heartbeat (a transfer with no body) goes.
"""

from __future__ import annotations

import bisect
import enum
import logging
import math
from collections.abc import Sequence
from typing import Protocol

import attrs

from hamq.ha.states import StateMachine
from hamq.ha.sync_state_set import AckClock, SlaveFacts
from hamq.protocol.ha_wire import (
    EpochEntry,
    HAProtocol,
    HAState,
    MasterHandshake,
    SlaveHandshake,
    SlaveMessageDecoder,
    SlaveReport,
    encode_master_handshake,
    encode_transfer_header,
)

log = logging.getLogger(__name__)

#: transfers gathered into one send while a slave is behind (32 x 32 KiB = 1 MiB)
FRAMES_PER_SEND = 32


class SlaveGone(Exception):
    """The slave closed, went silent, sent something invalid or cannot be served."""


class MasterLog(Protocol):
    """What a session reads of the master's log when it decides (the store's and the
    epoch file's facts, in memory)."""

    @property
    def min_offset(self) -> int: ...

    @property
    def max_offset(self) -> int: ...

    @property
    def segment_bytes(self) -> int: ...

    @property
    def confirm_offset(self) -> int: ...

    @property
    def epochs(self) -> Sequence[EpochEntry]: ...

    def is_record_boundary(self, offset: int) -> bool: ...


@attrs.frozen
class Policy:
    """What differs between the two protocols."""

    protocol: HAProtocol
    #: a HANDSHAKE opens the connection, answered with the master's epochs
    handshake_first: bool
    #: the slave holds the log up to where sending starts (its acks count from there)
    holds_its_start: bool


POLICIES = {
    HAProtocol.CLASSIC: Policy(HAProtocol.CLASSIC, handshake_first=False, holds_its_start=False),
    HAProtocol.AUTOSWITCH: Policy(
        HAProtocol.AUTOSWITCH, handshake_first=True, holds_its_start=True
    ),
}


class Phase(enum.Enum):
    HANDSHAKE = "waiting for the slave's HANDSHAKE"
    START = "waiting for the slave's first report"
    STREAMING = "streaming"


PHASES: dict[Phase, frozenset[Phase]] = {
    Phase.HANDSHAKE: frozenset({Phase.START}),
    Phase.START: frozenset({Phase.STREAMING}),
    Phase.STREAMING: frozenset(),
}


@attrs.frozen
class LogRange:
    """CommitLog bytes [start, end) to send as they are."""

    start: int
    end: int

    @property
    def size(self) -> int:
        return self.end - self.start


Part = bytes | LogRange


@attrs.frozen
class SessionSettings:
    """The HA settings a session decides by (HAConfig's)."""

    transfer_batch_bytes: int
    heartbeat_interval_s: float
    housekeeping_interval_s: float
    sync_from_last_file: bool


class SlaveSession:
    """One slave connection's state, fed with events (see the module's comment)."""

    def __init__(
        self,
        protocol: HAProtocol,
        master_log: MasterLog,
        settings: SessionSettings,
        *,
        name: str,
        now: float,
    ) -> None:
        """Args:
        protocol: the HA protocol the master speaks (its Policy).
        master_log: the master's log, read at each decision.
        settings: the batch size, the intervals, ``sync_from_last_file`` (the
            auto-switch HANDSHAKE overrides the latter).
        name: the peer, as log lines name it.
        now: the time (Trio's clock in the I/O layer), for the silence timer.
        """
        self.policy = POLICIES[protocol]
        self.log = master_log
        self.settings = settings
        self.name = name
        self.phase = Phase.HANDSHAKE if self.policy.handshake_first else Phase.START
        self.machine = StateMachine(
            f"HA connection {name}",
            HAState.HANDSHAKE if self.policy.handshake_first else HAState.TRANSFER,
        )
        self._decoder = SlaveMessageDecoder(protocol)
        #: the auto-switch HANDSHAKE, once received
        self.handshake: SlaveHandshake | None = None
        #: the slave's broker id (auto-switch: its HANDSHAKE's; classic: -1 until the
        #: I/O layer names it from the registry)
        self.broker_id = -1
        self.sync_from_last_file = settings.sync_from_last_file
        #: the slave's last report (at most ``next_offset``; -1: none yet)
        self.ack_offset = -1
        #: where the next transfer starts (None until the first report)
        self.next_offset: int | None = None
        #: the end of the log bytes the kernel took (-1: none; auto-switch: from the start)
        self.sent_end = -1
        #: what counts of the slave's acks: its report, at most ``sent_end``
        self.acked_upto = -1
        #: what to send, in order; the first part may be what is left of a partial take
        self.pending: list[Part] = []
        #: when the kernel last took bytes for this slave (heartbeats: when idle)
        self.last_sent = now
        #: when the slave last reported (-inf: not yet), and last sent anything
        self.last_report = -math.inf
        self.last_heard = now
        self.bytes_sent = 0
        self.ack_clock = AckClock()

    # ------------------------------------------------------------------ facts
    @property
    def streaming(self) -> bool:
        return self.phase is Phase.STREAMING

    @property
    def sending(self) -> bool:
        """Bytes are waiting for the kernel: nothing new is planned until they go."""
        return bool(self.pending)

    @property
    def silent_at(self) -> float:
        """When the slave, silent until then, is dropped (``tick``)."""
        return self.last_heard + self.settings.housekeeping_interval_s

    @property
    def heartbeat_at(self) -> float:
        """When a heartbeat is due if the kernel takes nothing before."""
        return self.last_sent + self.settings.heartbeat_interval_s

    def facts(self, now: float) -> SlaveFacts:
        """What the SyncStateSet's keeper needs of this slave (sync_state_set.py)."""
        return SlaveFacts(self.acked_upto, self.ack_clock.behind_s(now), self.last_report)

    # ------------------------------------------------------------------ events
    def receive(self, data: bytes | bytearray, now: float) -> int | None:
        """Bytes from the slave (``b""``: decode what is buffered only).

        Returns:
            The new ``acked_upto`` when it grew (an ack to count), else None.

        Raises:
            SlaveGone: the slave must be dropped (a report before its HANDSHAKE, a second
                HANDSHAKE, a start its log cannot continue from, a report past what was
                ever sent to it). The session is then of no further use.
            HAProtocolError: bytes that are no message of the protocol (the decoder is
                poisoned).
        """
        if data:
            self._decoder.feed(data)
            self.last_heard = now
        if self.phase is Phase.HANDSHAKE:
            if self.handshake is None:
                event = self._decoder.next_event()
                if isinstance(event, SlaveReport):
                    raise SlaveGone("it reported its offset before its HANDSHAKE")
                self.handshake = event
            return None  # (nothing more is read until it is admitted)
        report = None
        while (event := self._decoder.next_event()) is not None:
            if isinstance(event, SlaveHandshake):
                raise SlaveGone(f"a HANDSHAKE in state {self.machine.state.name}")
            report = event  # only the newest report matters
        return None if report is None else self._report(report, now)

    def admit(self, now: float) -> None:
        """The peer is a member: auto-switch, its HANDSHAKE is answered (``pending``:
        the master's max offset and epoch table) and the slave is in TRANSFER. The
        silence timer starts now (the set-up had its own).

        Raises:
            SlaveGone: auto-switch, and its HANDSHAKE has not arrived.
        """
        self.last_heard = now
        if self.phase is not Phase.HANDSHAKE:
            return
        handshake = self.handshake
        if handshake is None:
            raise SlaveGone("it was admitted before its HANDSHAKE arrived")
        self.broker_id = handshake.broker_id
        self.sync_from_last_file = handshake.sync_from_last_file
        epochs = tuple(self.log.epochs)
        answer = MasterHandshake(self.log.max_offset, epochs[-1].epoch if epochs else 0, epochs)
        self.pending.append(encode_master_handshake(answer))
        self._move(Phase.START)
        self.machine.set(HAState.TRANSFER, "handshake answered")

    def next_send(self, now: float, *, heartbeat: bool = True) -> list[Part] | None:
        """What to send now (``pending``), or None when there is nothing: what the kernel
        did not take of the last send first, else the log the slave lacks (transfers;
        ``next_offset`` moves past them), else, with ``heartbeat`` and when the kernel
        took nothing for ``heartbeat_interval_s``, a heartbeat. Nothing before the
        first report."""
        if self.pending:
            return self.pending
        offset = self.next_offset
        if offset is None:
            return None
        end = self.log.max_offset
        if offset < end:
            self._plan(offset, end)
        elif heartbeat and now >= self.heartbeat_at:
            epochs = self.log.epochs
            self.pending.append(
                self._header(offset, 0, epochs[-1] if epochs else None, self.log.confirm_offset)
            )
        return self.pending or None

    def took(self, sent: int, now: float) -> int | None:
        """The kernel took the first ``sent`` bytes of ``pending``: they leave it, and
        ``sent_end`` follows the log bytes among them.

        Returns:
            The new ``acked_upto`` when it grew (an ack to count), else None.
        """
        pending = self.pending
        taken = 0
        log_end = -1
        while pending and sent:
            part = pending[0]
            size = part.size if isinstance(part, LogRange) else len(part)
            step = min(sent, size)
            sent -= step
            if isinstance(part, LogRange):
                taken += step
                log_end = part.start + step
            if step == size:
                pending.pop(0)
            elif isinstance(part, LogRange):
                pending[0] = LogRange(part.start + step, part.end)
            else:
                pending[0] = part[step:]
        if sent:
            raise ValueError(f"the kernel cannot have taken {sent} bytes more than were sent")
        self.last_sent = now
        self.bytes_sent += taken
        if log_end > self.sent_end:
            self.sent_end = log_end
            self.ack_clock.sent(log_end, now)
            return self._count_ack()
        return None

    def tick(self, now: float) -> None:
        """The reader's timer.

        Raises:
            SlaveGone: nothing came from the slave for ``housekeeping_interval_s``.
        """
        if now >= self.silent_at:
            raise SlaveGone(f"silent for {self.settings.housekeeping_interval_s:g}s")

    # ------------------------------------------------------------------ decisions
    def _move(self, phase: Phase) -> None:
        if phase not in PHASES[self.phase]:
            raise AssertionError(f"HA session {self.name}: {self.phase.name} -> {phase.name}")
        log.debug("HA session %s: %s -> %s", self.name, self.phase.name, phase.name)
        self.phase = phase

    def _report(self, report: SlaveReport, now: float) -> int | None:
        offset = report.max_offset
        if self.next_offset is None:
            start = self._start(offset)
            self.next_offset = start
            if self.policy.holds_its_start:
                self.sent_end = start
            self.last_sent = now
            self._move(Phase.STREAMING)
            log.info("HA slave %s: sending from commitlog offset %d", self.name, start)
        elif offset > self.next_offset:
            raise SlaveGone(
                f"it reported offset {offset}, past what was ever sent to it "
                f"({self.next_offset}): not a slave's report"
            )
        self.ack_offset = offset
        self.last_report = now
        return self._count_ack()

    def _count_ack(self) -> int | None:
        acked = min(self.ack_offset, self.sent_end)
        if acked > self.acked_upto:
            self.acked_upto = acked
            self.ack_clock.acked(acked)
            return acked
        return None

    def _start(self, offset: int) -> int:
        """Where sending starts for a slave whose log ends at ``offset``; SlaveGone if
        its log cannot continue this master's."""
        master_log = self.log
        master_max = master_log.max_offset
        if offset > master_max:
            raise SlaveGone(
                f"its log ends at {offset}, past this master's log end {master_max}: it "
                "has bytes this master does not have (an older master's tail); the "
                "auto-switch protocol truncates such a slave, classic replication "
                "cannot — clear the slave's store or use ha_protocol = 'autoswitch'"
            )
        if offset and offset >= master_log.min_offset and not master_log.is_record_boundary(offset):
            raise SlaveGone(
                f"its log ends at {offset}, inside a record of this master's log: the two "
                "logs diverged; clear the slave's store or use ha_protocol = 'autoswitch'"
            )
        if offset:
            return offset
        if self.sync_from_last_file:
            last_file_start = master_max - master_max % master_log.segment_bytes
            return max(last_file_start, master_log.min_offset)
        return master_log.min_offset

    def _plan(self, offset: int, end: int) -> None:
        """Transfers from ``offset`` towards ``end`` into ``pending``: at most
        FRAMES_PER_SEND, each of at most ``transfer_batch_bytes``, within one segment
        and one epoch. ``next_offset`` moves past them (a report up to there is a
        slave's: the bytes are on their way)."""
        master_log = self.log
        batch = self.settings.transfer_batch_bytes
        segment = master_log.segment_bytes
        epochs = master_log.epochs
        starts = [e.start_offset for e in epochs]
        confirm = master_log.confirm_offset
        pending = self.pending
        for _ in range(FRAMES_PER_SEND):
            if offset >= end:
                break
            # (the newest epoch starting at or before offset wrote it; the first start
            # past offset ends its part, or that of the data from before every epoch)
            later = bisect.bisect_right(starts, offset)
            epoch = epochs[later - 1] if later else None
            stop = min(end, offset + batch, offset - offset % segment + segment)
            if later < len(starts):
                stop = min(stop, starts[later])
            pending.append(self._header(offset, stop - offset, epoch, confirm))
            pending.append(LogRange(offset, stop))
            offset = stop
        self.next_offset = offset

    def _header(
        self, offset: int, size: int, epoch: EpochEntry | None, confirm_offset: int
    ) -> bytes:
        return encode_transfer_header(
            self.policy.protocol,
            offset,
            size,
            epoch=epoch.epoch if epoch else 0,
            epoch_start_offset=epoch.start_offset if epoch else 0,
            confirm_offset=confirm_offset,
        )
