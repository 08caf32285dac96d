"""The HA channel's wire formats, with bytes (docs/PROTOCOL.md#ha-wire)."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hamq.protocol.ha_wire import (
    EpochEntry,
    HAProtocol,
    HAProtocolError,
    MasterHandshake,
    MasterMessageDecoder,
    SlaveHandshake,
    SlaveMessageDecoder,
    SlaveReport,
    Transfer,
    encode_master_handshake,
    encode_report,
    encode_slave_handshake,
    encode_transfer_header,
)

OFFSETS = st.integers(0, 2**63 - 1)
EPOCHS = st.integers(0, 2**31 - 1)


def test_classic_layouts_byte_by_byte() -> None:
    assert encode_report(HAProtocol.CLASSIC, 0x0102) == bytes.fromhex("0000000000000102")
    header = encode_transfer_header(HAProtocol.CLASSIC, 4096, 3)
    assert header == bytes.fromhex("000000000000100000000003")
    decoder = MasterMessageDecoder(HAProtocol.CLASSIC)
    decoder.feed(header + b"abc" + encode_transfer_header(HAProtocol.CLASSIC, 4099, 0))
    assert decoder.next_event() == Transfer(4096, b"abc")
    assert decoder.next_event() == Transfer(4099, b"")  # a heartbeat
    assert decoder.next_event() is None


def test_autoswitch_layouts_byte_by_byte() -> None:
    assert encode_slave_handshake(SlaveHandshake(True, False, 2)) == bytes.fromhex(
        "00000001000100000000000000000002"
    )
    assert encode_report(HAProtocol.AUTOSWITCH, 7) == bytes.fromhex("000000020000000000000007")
    handshake = MasterHandshake(100, 2, (EpochEntry(1, 0), EpochEntry(2, 64)))
    assert encode_master_handshake(handshake) == bytes.fromhex(
        "00000001" "00000018" "0000000000000064" "00000002"
        "00000001" "0000000000000000" "00000002" "0000000000000040"
    )  # fmt: skip
    header = encode_transfer_header(
        HAProtocol.AUTOSWITCH, 64, 2, epoch=2, epoch_start_offset=64, confirm_offset=50
    )
    assert header == bytes.fromhex(
        "000000020000000200000000000000400000000200000000000000400000000000000032"
    )


@pytest.mark.parametrize("protocol", list(HAProtocol))
@given(
    data=st.data(),
    reports=st.lists(OFFSETS, max_size=5),
    transfers=st.lists(
        st.tuples(OFFSETS, st.binary(max_size=40), EPOCHS, OFFSETS, OFFSETS), max_size=5
    ),
)
def test_messages_round_trip_however_the_stream_is_cut(
    protocol: HAProtocol,
    data: st.DataObject,
    reports: list[int],
    transfers: list[tuple[int, bytes, int, int, int]],
) -> None:
    autoswitch = protocol is HAProtocol.AUTOSWITCH
    up = b"".join(encode_report(protocol, r) for r in reports)
    expected_up: list[object] = [SlaveReport(r) for r in reports]
    if autoswitch:
        handshake = SlaveHandshake(True, False, 3)
        up = encode_slave_handshake(handshake) + up
        expected_up.insert(0, handshake)
    down = b""
    expected_down: list[object] = []
    for offset, body, epoch, start, confirm in transfers:
        if not autoswitch:
            epoch = start = confirm = 0
        down += encode_transfer_header(
            protocol,
            offset,
            len(body),
            epoch=epoch,
            epoch_start_offset=start,
            confirm_offset=confirm,
        )
        down += body
        expected_down.append(Transfer(offset, body, epoch, start, confirm))
    for stream, decoder, expected in (
        (up, SlaveMessageDecoder(protocol), expected_up),
        (down, MasterMessageDecoder(protocol), expected_down),
    ):
        events: list[object] = []
        pos = 0
        while pos < len(stream):
            step = data.draw(st.integers(1, max(1, len(stream) - pos)))
            decoder.feed(stream[pos : pos + step])
            pos += step
            while (event := decoder.next_event()) is not None:
                events.append(event)
        assert events == expected
        assert decoder.buffered == 0


@pytest.mark.parametrize("protocol", list(HAProtocol))
@given(junk=st.binary(max_size=200))
def test_junk_only_ever_raises_ha_protocol_errors(protocol: HAProtocol, junk: bytes) -> None:
    for decoder in (SlaveMessageDecoder(protocol), MasterMessageDecoder(protocol, max_body=4096)):
        decoder.feed(junk)
        try:
            while decoder.next_event() is not None:
                pass
        except HAProtocolError:
            with pytest.raises(HAProtocolError):  # poisoned
                decoder.next_event()


@pytest.mark.parametrize(
    ("decoder", "data", "named"),
    [
        (
            SlaveMessageDecoder(HAProtocol.AUTOSWITCH),
            bytes.fromhex("00000009") + bytes(12),
            "state 9",
        ),
        (
            SlaveMessageDecoder(HAProtocol.CLASSIC),
            (-5).to_bytes(8, "big", signed=True),
            "offset -5",
        ),
        (
            MasterMessageDecoder(HAProtocol.CLASSIC, max_body=100),
            encode_transfer_header(HAProtocol.CLASSIC, 0, 101),
            "101 bytes (limit 100)",
        ),
        (
            MasterMessageDecoder(HAProtocol.AUTOSWITCH),
            bytes.fromhex("0000000100000005") + bytes(12),
            "not whole epoch entries",
        ),
    ],
)
def test_impossible_messages_are_named(
    decoder: SlaveMessageDecoder | MasterMessageDecoder, data: bytes, named: str
) -> None:
    decoder.feed(data)
    with pytest.raises(HAProtocolError, match=re.escape(named)):
        decoder.next_event()
