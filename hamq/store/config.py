"""The message store's configuration: loaded once, frozen, passed down.

Names follow RocketMQ's ``MessageStoreConfig`` in snake_case; units are in the names.
"""

from __future__ import annotations

import enum
from pathlib import Path

import attrs
from attrs import validators as v

from hamq.protocol.record import END_FILE_MIN_BLANK_LENGTH
from hamq.protocol.send_timing import BROKER_SYNC_FLUSH_WAIT_S

GIB = 1024 * 1024 * 1024
MIB = 1024 * 1024

#: RocketMQ's default ``messageDelayLevel``.
DEFAULT_DELAY_LEVELS = "1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h"


class FlushDiskType(enum.Enum):
    ASYNC_FLUSH = "ASYNC_FLUSH"
    SYNC_FLUSH = "SYNC_FLUSH"


class BrokerRole(enum.Enum):
    ASYNC_MASTER = "ASYNC_MASTER"
    SYNC_MASTER = "SYNC_MASTER"
    SLAVE = "SLAVE"

    @property
    def is_master(self) -> bool:
        return self is not BrokerRole.SLAVE


_UNITS_MS = {"s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}


def parse_delay_levels(text: str) -> tuple[int, ...]:
    """``"1s 5s 1m 2h"`` -> delays in ms, level 1 first. ValueError names a bad item."""
    delays = []
    for item in text.split():
        number, unit = item[:-1], item[-1:]
        if unit not in _UNITS_MS or not number.isdigit() or int(number) <= 0:
            raise ValueError(
                f"delay level {item!r} in {text!r} is not a positive number "
                f"followed by s, m, h or d"
            )
        delays.append(int(number) * _UNITS_MS[unit])
    if not delays:
        raise ValueError("message_delay_level names no levels")
    return tuple(delays)


def _delay_levels(_instance: object, _attribute: object, value: str) -> None:
    parse_delay_levels(value)


@attrs.frozen
class StoreConfig:
    #: the store's root directory: commitlog/, consumequeue/, index/, config/, checkpoint
    store_dir: Path = attrs.field(converter=Path)
    role: BrokerRole = BrokerRole.ASYNC_MASTER
    flush_disk_type: FlushDiskType = FlushDiskType.ASYNC_FLUSH
    #: size of one CommitLog segment file (RocketMQ: 1 GiB)
    commitlog_segment_bytes: int = attrs.field(default=GIB, validator=v.ge(64 * 1024))
    #: entries per ConsumeQueue file, 20 bytes each (RocketMQ: 300,000)
    consume_queue_entries_per_file: int = attrs.field(default=300_000, validator=v.ge(16))
    #: hash slots and entries per index file (RocketMQ: 5,000,000 and 20,000,000)
    index_hash_slots: int = attrs.field(default=5_000_000, validator=v.ge(1))
    index_max_entries: int = attrs.field(default=20_000_000, validator=v.ge(2))
    #: largest body a message may have (RocketMQ maxMessageSize: 4 MiB)
    max_message_bytes: int = attrs.field(default=4 * MIB, validator=v.ge(1))
    flush_interval_commitlog_s: float = attrs.field(default=0.5, validator=v.gt(0.0))
    flush_interval_consume_queue_s: float = attrs.field(default=1.0, validator=v.gt(0.0))
    #: how long a SYNC_FLUSH put waits for its fsync before FLUSH_DISK_TIMEOUT
    sync_flush_timeout_s: float = attrs.field(default=BROKER_SYNC_FLUSH_WAIT_S, validator=v.gt(0.0))
    #: CommitLog files older than this may be deleted (RocketMQ fileReservedTime: 72 h)
    file_reserved_time_h: float = attrs.field(default=72.0, validator=v.gt(0.0))
    clean_interval_s: float = attrs.field(default=10.0, validator=v.gt(0.0))
    message_delay_level: str = attrs.field(default=DEFAULT_DELAY_LEVELS, validator=_delay_levels)
    #: how often delay offsets are persisted (the slave copies them every 10 s)
    delay_offset_persist_interval_s: float = attrs.field(default=10.0, validator=v.gt(0.0))
    #: the latest delivery time a timer message may ask for, from now (RocketMQ
    #: timerMaxDelaySec: 3 days); later ones are refused
    timer_max_delay_s: float = attrs.field(default=3 * 86_400.0, validator=v.gt(0.0))
    #: most timer messages waiting at once (each costs about 100 bytes of memory until
    #: delivered); a send past it is refused (RocketMQ's WHEEL_TIMER_FLOW_CONTROL)
    timer_max_pending: int = attrs.field(default=1_000_000, validator=v.ge(1))
    #: most bytes and messages one get_message returns (RocketMQ: 256 KiB in memory)
    max_transfer_bytes: int = attrs.field(default=256 * 1024, validator=v.ge(1))
    max_transfer_count: int = attrs.field(default=32, validator=v.ge(1))
    #: pulls check each record's body CRC and pass over a record that fails it (as one
    #: that does not decode is always passed over); RocketMQ checks CRCs at recovery
    #: (checkCRCOnRecover), hamq's consumers on every pull: a record sent with a bad CRC
    #: would fail their whole batch. Each record is checked once per run of the process
    #: (about 1.5 us per KiB of body), when first pulled; none that this process
    #: appended itself (it computed their CRCs).
    check_crc_on_read: bool = True

    def __attrs_post_init__(self) -> None:
        room = self.commitlog_segment_bytes - END_FILE_MIN_BLANK_LENGTH
        if self.max_message_bytes + 64 * 1024 > room:
            raise ValueError(
                f"commitlog_segment_bytes {self.commitlog_segment_bytes} cannot hold a message "
                f"of max_message_bytes {self.max_message_bytes} plus its header"
            )

    @property
    def delay_levels_ms(self) -> tuple[int, ...]:
        return parse_delay_levels(self.message_delay_level)

    @property
    def commitlog_dir(self) -> Path:
        return self.store_dir / "commitlog"

    @property
    def consume_queue_dir(self) -> Path:
        return self.store_dir / "consumequeue"

    @property
    def index_dir(self) -> Path:
        return self.store_dir / "index"

    @property
    def config_dir(self) -> Path:
        return self.store_dir / "config"
