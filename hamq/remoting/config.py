"""Tunables of the remoting layer, loaded once and passed down (no globals).

Units are in the names: ``_s`` seconds, ``_bytes`` bytes.
"""

from __future__ import annotations

from typing import Any

import attrs
from attrs import validators as v

from hamq.protocol import DEFAULT_MAX_FRAME_LENGTH
from hamq.remoting.tls import TlsConfig


def _positive_or_none(_instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if value is not None and not (isinstance(value, int | float) and value > 0):
        raise ValueError(f"{attribute.name} must be a positive number of seconds or None")


@attrs.frozen
class RemotingConfig:
    #: Frames longer than this are refused (decoder) or not sent (RemotingFrameTooLarge).
    max_frame_length: int = attrs.field(
        default=DEFAULT_MAX_FRAME_LENGTH, validator=[v.ge(8), v.le(2**31 - 1)]
    )
    #: Requests a peer may have awaiting an answer on one connection (async or deferred
    #: processors); past it a request is answered SYSTEM_BUSY at once.
    max_in_flight_per_connection: int = attrs.field(default=1024, validator=v.ge(1))
    #: A connection with nothing received for this long is closed (RocketMQ: 120 s).
    idle_timeout_s: float | None = attrs.field(default=120.0, validator=_positive_or_none)
    #: A frame begun must be complete this long after its first byte arrived, or the
    #: connection is closed: a peer trickling a byte a second ("slowloris") never
    #: looks idle, and would hold its connection (and a file descriptor) for ever.
    frame_timeout_s: float | None = attrs.field(default=30.0, validator=_positive_or_none)
    #: Connections a listener holds open at most (TLS handshakes under way included);
    #: one more is closed as soon as it is accepted, with a (rate-limited) log line.
    #: Each listener counts its own: a broker's remoting port and its HA port (a flood
    #: on one never locks slaves or clients out of the other).
    max_connections: int = attrs.field(default=10_000, validator=v.ge(1))
    #: TLS on listeners and connections (hamq/remoting/tls.py); None: plain TCP.
    tls: TlsConfig | None = None
    #: How long opening a TCP connection may take (RocketMQ connectTimeoutMillis: 3 s).
    connect_timeout_s: float = attrs.field(default=3.0, validator=v.gt(0.0))
    #: Pending output above which our own requests wait for the peer to read.
    write_buffer_high_water_bytes: int = attrs.field(default=4 * 1024 * 1024, validator=v.ge(1))
    #: Pending output past which the peer counts as not reading and the connection is
    #: closed. The reader never stops reading to wait for output (two peers doing
    #: that to each other would wait forever), so this bounds the memory instead.
    max_send_buffer_bytes: int = attrs.field(default=64 * 1024 * 1024, validator=v.ge(1024))
    #: Bytes asked of the socket per receive.
    receive_size_bytes: int = attrs.field(default=64 * 1024, validator=v.ge(1024))
