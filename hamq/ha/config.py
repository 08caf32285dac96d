"""HA settings: one frozen object, from the broker's configuration (RocketMQ's names).

``secret`` (``[ha] secret``) is the broker group's shared HA secret: with it a master
admits on its HA port only peers that prove they know it (an HMAC challenge-response,
hamq.protocol.ha_wire; the secret never crosses the wire), and a slave checks that its
master knows it too. It is a ``Secret`` (hamq.protocol.secret): printed, logged or
listed (GET_BROKER_CONFIG) as ``******``.
"""

from __future__ import annotations

from typing import Any

import attrs
from attrs import validators as v

from hamq.protocol.ha_wire import HAProtocol
from hamq.protocol.secret import Secret
from hamq.protocol.send_timing import BROKER_SYNC_SLAVE_WAIT_S

KIB = 1024
MIB = 1024 * KIB
#: a shorter secret could be guessed offline from one observed exchange
MIN_SECRET_CHARS = 16


def _secret_length(_instance: object, _attribute: attrs.Attribute[Any], value: Secret) -> None:
    length = len(value.reveal())
    if value and length < MIN_SECRET_CHARS:
        raise ValueError(
            f"[ha] secret must be at least {MIN_SECRET_CHARS} characters (it has "
            f"{length}): use a long random string, e.g. the output of `openssl rand "
            "-hex 32`, the same on the master and its slaves"
        )


@attrs.frozen
class HAConfig:
    protocol: HAProtocol = HAProtocol.CLASSIC
    #: the most CommitLog bytes in one transfer (haTransferBatchSize)
    transfer_batch_bytes: int = attrs.field(default=32 * KIB, validator=v.ge(1024))
    #: a heartbeat (master) or report (slave) when nothing else was sent for this long
    heartbeat_interval_s: float = attrs.field(default=5.0, validator=v.gt(0))
    #: a peer silent for this long is dropped (haHousekeepingInterval)
    housekeeping_interval_s: float = attrs.field(default=20.0, validator=v.gt(0))
    #: a slave further behind than this is not in sync (haMaxGapNotInSync)
    max_gap_not_in_sync_bytes: int = attrs.field(default=256 * MIB, validator=v.ge(0))
    #: how long a SYNC_MASTER send waits for a slave's ack (RocketMQ slaveTimeout: 3 s)
    sync_timeout_s: float = attrs.field(default=BROKER_SYNC_SLAVE_WAIT_S, validator=v.gt(0))
    #: a slave that has nothing starts at the master's last segment (False: at its first
    #: retained byte)
    sync_from_last_file: bool = True
    #: how long a slave waits before it connects again, doubling up to the maximum
    reconnect_initial_s: float = attrs.field(default=0.5, validator=v.gt(0))
    reconnect_max_s: float = attrs.field(default=5.0, validator=v.gt(0))
    #: how long connecting may take, and then the set-up (the secret exchange, the
    #: auto-switch handshake) on either side
    connect_timeout_s: float = attrs.field(default=3.0, validator=v.gt(0))
    #: the broker group's shared HA secret (empty: none; slaves are then admitted by
    #: their registration, see hamq/ha/membership.py)
    secret: Secret = attrs.field(default=Secret(""), converter=Secret, validator=_secret_length)
