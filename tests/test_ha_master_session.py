"""The master's HA session (hamq/ha/master_session.py), driven with bytes and events
only: no sockets, no Trio. What it answers is decoded as a slave would decode it
(hamq.protocol.ha_wire's MasterMessageDecoder), with the log bytes filled in from a
fake log, so the tests see the bytes that would cross the wire."""

from __future__ import annotations

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hamq.ha.master_session import (
    FRAMES_PER_SEND,
    POLICIES,
    LogRange,
    Phase,
    SessionSettings,
    SlaveGone,
    SlaveSession,
)
from hamq.protocol.ha_wire import (
    EpochEntry,
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

CLASSIC, AUTOSWITCH = HAProtocol.CLASSIC, HAProtocol.AUTOSWITCH
BOTH = pytest.mark.parametrize("protocol", [CLASSIC, AUTOSWITCH], ids=["classic", "autoswitch"])
KIB = 1024
PATTERN = bytes(range(251))


@attrs.define
class FakeLog:
    """A master's log as the session reads it; records start every ``record`` bytes."""

    max_offset: int = 10 * KIB
    min_offset: int = 0
    segment_bytes: int = 64 * KIB
    confirm_offset: int = 0
    epochs: list[EpochEntry] = attrs.field(factory=lambda: [EpochEntry(1, 0)])
    record: int = 100

    def is_record_boundary(self, offset: int) -> bool:
        return offset % self.record == 0

    def data(self, start: int, end: int) -> bytes:
        """The log's bytes: each byte is its offset mod 251 (a transfer's body says
        where it came from)."""
        size = end - start
        return (PATTERN * (size // 251 + 2))[start % 251 : start % 251 + size]


def new_session(
    protocol: HAProtocol,
    master_log: FakeLog | None = None,
    *,
    batch: int = 32 * KIB,
    sync_from_last_file: bool = True,
    now: float = 0.0,
) -> tuple[SlaveSession, FakeLog]:
    master_log = master_log or FakeLog()
    settings = SessionSettings(
        transfer_batch_bytes=batch,
        heartbeat_interval_s=5.0,
        housekeeping_interval_s=20.0,
        sync_from_last_file=sync_from_last_file,
    )
    return SlaveSession(protocol, master_log, settings, name="slave", now=now), master_log


def handshake(broker_id: int = 1, *, sync_from_last_file: bool = True) -> bytes:
    return encode_slave_handshake(SlaveHandshake(sync_from_last_file, False, broker_id))


def started(
    protocol: HAProtocol, at: int, master_log: FakeLog | None = None, **options: object
) -> SlaveSession:
    """A session whose slave reported ``at`` first (auto-switch: after its handshake,
    answered and taken by the kernel)."""
    session, master_log = new_session(protocol, master_log, **options)  # type: ignore[arg-type]
    if protocol is AUTOSWITCH:
        # (its HANDSHAKE says sync_from_last_file: the master's setting does not count)
        sync = bool(options.get("sync_from_last_file", True))
        session.receive(handshake(sync_from_last_file=sync), 0.0)
        session.admit(0.0)
        wire(session, master_log)
    session.receive(encode_report(protocol, at), 0.0)
    assert session.streaming
    return session


def wire(
    session: SlaveSession,
    master_log: FakeLog,
    took: int | None = None,
    now: float = 0.0,
    decoder: MasterMessageDecoder | None = None,
) -> list[object]:
    """Let the kernel take ``took`` bytes (None: all) of what is pending, and decode
    them as the slave would (with ``decoder``, continuing its stream): the events (a
    partial message stays in the decoder)."""
    data = b"".join(
        master_log.data(p.start, p.end) if isinstance(p, LogRange) else p for p in session.pending
    )
    data = data if took is None else data[:took]
    session.took(len(data), now)
    decoder = decoder or MasterMessageDecoder(session.policy.protocol)
    decoder.feed(data)
    events: list[object] = []
    while (event := decoder.next_event()) is not None:
        events.append(event)
    return events


def transfers(events: list[object]) -> list[tuple[int, int, int, int]]:
    """(offset, size, epoch, epoch start) of each transfer, its body checked."""
    out = []
    for event in events:
        assert isinstance(event, Transfer)
        assert bytes(event.body) == FakeLog().data(event.offset, event.offset + len(event.body))
        out.append((event.offset, len(event.body), event.epoch, event.epoch_start_offset))
    return out


# ---------------------------------------------------------------- the handshake


def test_autoswitch_the_handshake_is_answered_only_once_admitted_and_nothing_after_it_is_read() -> (
    None
):
    master_log = FakeLog(max_offset=9000, epochs=[EpochEntry(1, 0), EpochEntry(3, 4000)])
    session, _ = new_session(AUTOSWITCH, master_log)
    assert session.machine.state is HAState.HANDSHAKE and session.phase is Phase.HANDSHAKE
    both = handshake(7, sync_from_last_file=False) + encode_report(AUTOSWITCH, 0)
    assert session.receive(both[:10], 1.0) is None  # (half a handshake)
    assert session.handshake is None
    assert session.receive(both[10:], 1.0) is None
    assert session.handshake == SlaveHandshake(False, False, 7)
    # not admitted yet: its report is not read, nothing is sent
    assert session.ack_offset == -1 and session.next_send(100.0) is None
    session.admit(0.0)
    assert session.machine.state.name == "TRANSFER" and session.broker_id == 7
    assert wire(session, master_log) == [
        MasterHandshake(9000, 3, (EpochEntry(1, 0), EpochEntry(3, 4000)))
    ]
    # now the report that came with it: (sync_from_last_file off, from the handshake)
    assert session.receive(b"", 2.0) == 0  # auto-switch: it holds its start
    assert session.streaming and session.next_offset == 0 and session.sent_end == 0


def test_autoswitch_a_report_before_the_handshake_is_refused() -> None:
    session, _ = new_session(AUTOSWITCH)
    with pytest.raises(SlaveGone, match="reported its offset before its HANDSHAKE"):
        session.receive(encode_report(AUTOSWITCH, 0), 0.0)


def test_autoswitch_a_second_handshake_drops_the_slave() -> None:
    session = started(AUTOSWITCH, 0)
    with pytest.raises(SlaveGone, match="a HANDSHAKE in state TRANSFER"):
        session.receive(handshake(), 1.0)


def test_classic_has_no_handshake_and_garbage_is_a_protocol_error() -> None:
    session, _ = new_session(CLASSIC)
    assert session.machine.state is HAState.TRANSFER and session.phase is Phase.START
    session.admit(0.0)  # (nothing to answer)
    assert session.pending == []
    autoswitch, _ = new_session(AUTOSWITCH)
    with pytest.raises(HAProtocolError):
        autoswitch.receive(b"\x00\x00\x00\x09" + bytes(12), 0.0)


def test_the_two_protocols_differ_by_their_policies_only() -> None:
    assert POLICIES[CLASSIC].handshake_first is False and POLICIES[CLASSIC].holds_its_start is False
    assert POLICIES[AUTOSWITCH].handshake_first and POLICIES[AUTOSWITCH].holds_its_start


# ---------------------------------------------------------------- where sending starts


@BOTH
@pytest.mark.parametrize(
    ("reported", "sync_from_last_file", "start"),
    [
        (0, True, 192 * KIB),  # an empty slave: the start of the last segment
        (0, False, 20 * KIB),  # ... or the first retained byte
        (150 * KIB, True, 150 * KIB),  # a record boundary: from there
        (200 * KIB, True, 200 * KIB),  # the log's end: nothing to send yet
    ],
)
def test_where_sending_starts(
    protocol: HAProtocol, reported: int, sync_from_last_file: bool, start: int
) -> None:
    master_log = FakeLog(
        max_offset=200 * KIB, min_offset=20 * KIB, record=KIB, segment_bytes=64 * KIB
    )
    session = started(protocol, reported, master_log, sync_from_last_file=sync_from_last_file)
    assert session.next_offset == start
    # auto-switch: the slave holds its start (its acks count from there); classic: nothing
    assert session.sent_end == (start if protocol is AUTOSWITCH else -1)
    if start < master_log.max_offset:
        assert session.next_send(0.0) is not None
        assert transfers(wire(session, master_log))[0][0] == start


@BOTH
@pytest.mark.parametrize(
    ("reported", "refusal"),
    [
        (10 * KIB + 100, "past this master's log end 10240"),
        (250, "inside a record of this master's log"),
    ],
)
def test_a_slave_whose_log_diverged_is_refused_at_its_first_report(
    protocol: HAProtocol, reported: int, refusal: str
) -> None:
    with pytest.raises(SlaveGone, match=refusal):
        started(protocol, reported)


# ---------------------------------------------------------------- acks


@BOTH
def test_an_ack_counts_only_up_to_what_the_kernel_took(protocol: HAProtocol) -> None:
    master_log = FakeLog(max_offset=10_000)
    session = started(protocol, 2000, master_log)
    base = 2000 if protocol is AUTOSWITCH else -1  # what counts before any byte is sent
    assert session.acked_upto == base
    assert session.next_send(1.0) is not None and session.next_offset == 10_000
    header = len(session.pending[0])  # type: ignore[arg-type]
    # (its first report, 2000, counts as the kernel takes bytes past it; auto-switch:
    # it counted already)
    assert session.took(header + 3000, 1.0) == (None if protocol is AUTOSWITCH else 2000)
    assert session.sent_end == 5000 and session.sending
    # the slave says it has everything it was meant to get: only 5000 counts
    assert session.receive(encode_report(protocol, 10_000), 2.0) == 5000
    assert session.ack_offset == 10_000 and session.acked_upto == 5000
    # the rest goes: the report counts in full as the kernel takes it
    assert session.took(5000, 3.0) == 10_000
    assert session.acked_upto == 10_000 and not session.sending
    assert session.bytes_sent == 8000
    # an older report changes nothing
    assert session.receive(encode_report(protocol, 9000), 4.0) is None
    assert session.acked_upto == 10_000


@BOTH
def test_a_report_past_what_was_ever_sent_drops_the_slave(protocol: HAProtocol) -> None:
    master_log = FakeLog(max_offset=10_000)
    session = started(protocol, 0, master_log)
    session.next_send(0.0)
    wire(session, master_log, took=100)  # (what was meant counts as sent, not more)
    session.receive(encode_report(protocol, 10_000), 1.0)
    with pytest.raises(SlaveGone, match="reported offset 10001, past what was ever sent"):
        session.receive(encode_report(protocol, 10_001), 1.0)


@BOTH
def test_only_the_newest_report_of_a_chunk_counts(protocol: HAProtocol) -> None:
    master_log = FakeLog(max_offset=10_000)
    session = started(protocol, 0, master_log)
    session.next_send(0.0)
    wire(session, master_log)
    reports = b"".join(encode_report(protocol, o) for o in (1000, 7000, 4000))
    assert session.receive(reports, 1.0) == 4000
    assert session.ack_offset == 4000 and session.last_report == 1.0


def test_the_ack_clock_runs_from_when_the_kernel_took_the_bytes() -> None:
    master_log = FakeLog(max_offset=4000)
    session = started(CLASSIC, 0, master_log, sync_from_last_file=False)
    session.next_send(10.0)
    wire(session, master_log, now=10.0)
    assert session.facts(12.5).behind_s == 2.5  # sent at 10, not acked
    session.receive(encode_report(CLASSIC, 4000), 13.0)
    facts = session.facts(14.0)
    assert (facts.acked_upto, facts.behind_s, facts.last_report) == (4000, 0.0, 13.0)


# ---------------------------------------------------------------- what is sent


@BOTH
def test_a_transfer_never_crosses_an_epoch_boundary(protocol: HAProtocol) -> None:
    # data from before the first epoch (a log older than epochs) stops at it, too
    master_log = FakeLog(
        max_offset=9000,
        epochs=[EpochEntry(2, 3000), EpochEntry(3, 5000), EpochEntry(4, 5000)],
    )
    session = started(protocol, 0, master_log, sync_from_last_file=False)
    session.next_send(0.0)
    sent = transfers(wire(session, master_log))
    if protocol is CLASSIC:  # (the classic header has no epoch)
        assert sent == [(0, 3000, 0, 0), (3000, 2000, 0, 0), (5000, 4000, 0, 0)]
    else:
        assert sent == [(0, 3000, 0, 0), (3000, 2000, 2, 3000), (5000, 4000, 4, 5000)]


@BOTH
def test_transfers_stop_at_segments_and_the_batch_and_a_send_at_frames_per_send(
    protocol: HAProtocol,
) -> None:
    master_log = FakeLog(max_offset=100 * KIB, segment_bytes=10 * KIB, record=KIB)
    session = started(protocol, 5 * KIB, master_log, batch=4 * KIB)
    session.next_send(0.0)
    sent = transfers(wire(session, master_log))
    assert [(o, s) for o, s, _, _ in sent[:4]] == [
        (5 * KIB, 4 * KIB),
        (9 * KIB, 1 * KIB),  # the segment ends at 10 KiB
        (10 * KIB, 4 * KIB),
        (14 * KIB, 4 * KIB),
    ]
    assert all(s <= 4 * KIB and o // (10 * KIB) == (o + s - 1) // (10 * KIB) for o, s, _, _ in sent)
    many = FakeLog(max_offset=1000 * KIB, record=KIB)
    session = started(protocol, 0, many, batch=KIB, sync_from_last_file=False)
    session.next_send(0.0)
    assert len(transfers(wire(session, many))) == FRAMES_PER_SEND
    assert session.next_offset == FRAMES_PER_SEND * KIB


@BOTH
def test_what_the_kernel_did_not_take_goes_first_and_nothing_overtakes_it(
    protocol: HAProtocol,
) -> None:
    master_log = FakeLog(max_offset=3000)
    session = started(protocol, 0, master_log, sync_from_last_file=False)
    slave = MasterMessageDecoder(protocol)
    session.next_send(0.0)
    assert wire(session, master_log, took=1000, decoder=slave) == []  # (part of a transfer)
    taken = session.sent_end
    assert 0 < taken < 1000 and session.sending
    master_log.max_offset = 8000  # the log grew
    before = list(session.pending)
    assert session.next_send(1.0) == before and session.next_offset == 3000
    assert before[0] == LogRange(taken, 3000)
    epoch = 1 if protocol is AUTOSWITCH else 0
    assert transfers(wire(session, master_log, decoder=slave)) == [(0, 3000, epoch, 0)]
    assert session.sent_end == 3000 and not session.sending
    session.next_send(2.0)
    assert transfers(wire(session, master_log, decoder=slave)) == [(3000, 5000, epoch, 0)]


@BOTH
def test_a_heartbeat_when_the_kernel_took_nothing_for_the_interval(protocol: HAProtocol) -> None:
    master_log = FakeLog(max_offset=2000, confirm_offset=1500, epochs=[EpochEntry(6, 0)])
    session = started(protocol, 2000, master_log)
    assert session.next_send(4.9) is None and session.heartbeat_at == 5.0
    assert session.next_send(5.0, heartbeat=False) is None  # (a put pushes no heartbeat)
    assert session.next_send(5.0) is not None
    [beat] = wire(session, master_log, now=5.0)
    assert isinstance(beat, Transfer) and (beat.offset, bytes(beat.body)) == (2000, b"")
    if protocol is AUTOSWITCH:
        assert (beat.epoch, beat.confirm_offset) == (6, 1500)
    assert session.heartbeat_at == 10.0 and session.next_send(9.0) is None
    master_log.max_offset = 2500  # log to send: no heartbeat, the bytes
    session.next_send(20.0)
    assert transfers(wire(session, master_log, now=20.0))[0][:2] == (2000, 500)


def test_nothing_is_sent_before_the_first_report() -> None:
    session, _ = new_session(CLASSIC)
    assert session.next_send(100.0) is None and not session.streaming


@BOTH
def test_a_slave_silent_for_the_housekeeping_interval_is_dropped(protocol: HAProtocol) -> None:
    session, _ = new_session(protocol)
    session.receive(handshake() if protocol is AUTOSWITCH else b"", 1.0)
    session.admit(2.0)  # the set-up had its own timer: this one starts at admission
    assert session.silent_at == 22.0
    session.receive(b"", 2.5)  # (nothing received: the timer does not move)
    assert session.silent_at == 22.0
    session.receive(encode_report(protocol, 0), 3.0)
    assert session.silent_at == 23.0
    session.tick(22.9)
    with pytest.raises(SlaveGone, match="silent for 20s"):
        session.tick(23.0)


@settings(max_examples=60, deadline=None)
@given(
    protocol=st.sampled_from([CLASSIC, AUTOSWITCH]),
    takes=st.lists(st.integers(0, 40_000), min_size=1, max_size=40),
    growth=st.lists(st.integers(0, 30_000), min_size=1, max_size=40),
)
def test_whatever_the_kernel_takes_the_slave_gets_the_log_in_order_and_acks_never_run_ahead(
    protocol: HAProtocol, takes: list[int], growth: list[int]
) -> None:
    master_log = FakeLog(max_offset=1000, segment_bytes=16 * KIB, epochs=[EpochEntry(1, 0)])
    session = started(protocol, 0, master_log, batch=4 * KIB, sync_from_last_file=False)
    decoder = MasterMessageDecoder(protocol)
    received = bytearray()
    for step, take in enumerate(takes):
        master_log.max_offset += growth[step % len(growth)]
        if session.next_send(float(step)) is None:
            continue
        data = b"".join(
            master_log.data(p.start, p.end) if isinstance(p, LogRange) else p
            for p in session.pending
        )[:take]
        session.took(len(data), float(step))
        decoder.feed(data)
        while (event := decoder.next_event()) is not None:
            assert isinstance(event, Transfer) and event.offset == len(received)
            received += event.body
        assert session.acked_upto <= session.sent_end <= session.next_offset  # type: ignore[operator]
        # the slave acks what it decoded: it counts no further than the kernel took
        session.receive(encode_report(protocol, len(received)), float(step))
        assert session.acked_upto == min(len(received), session.sent_end)
    assert bytes(received) == master_log.data(0, len(received))
