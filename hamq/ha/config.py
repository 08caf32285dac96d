"""HA settings: one frozen object, from the broker's configuration (RocketMQ's names)."""

from __future__ import annotations

import attrs
from attrs import validators as v

from hamq.protocol.ha_wire import HAProtocol

KIB = 1024
MIB = 1024 * KIB


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
    sync_timeout_s: float = attrs.field(default=3.0, validator=v.gt(0))
    #: a slave that has nothing starts at the master's last segment (False: at its first
    #: retained byte)
    sync_from_last_file: bool = True
    #: how long a slave waits before it connects again, doubling up to the maximum
    reconnect_initial_s: float = attrs.field(default=0.5, validator=v.gt(0))
    reconnect_max_s: float = attrs.field(default=5.0, validator=v.gt(0))
    connect_timeout_s: float = attrs.field(default=3.0, validator=v.gt(0))
