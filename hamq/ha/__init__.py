"""Master/slave replication of the CommitLog (shared/DESIGN.md §5, PROTOCOL.md §7).

- config.py          HAConfig
- master.py          HAService: the master's side (accept slaves, push bytes, acks)
- slave.py           HAClient: the slave's side (connect, append, report)
- states.py          the slave's states and their transitions
- epoch.py           the epoch file and where two logs agree
- group_transfer.py  sends on a SYNC_MASTER waiting for a slave's ack
- membership.py      who may replicate from a master: the HA secret, the registry
The wire formats are sans-IO, in hamq.protocol.ha_wire.
"""

from hamq.ha.config import HAConfig
from hamq.ha.epoch import EpochFile, EpochFileError
from hamq.ha.master import HAService, MasterHAStatistics, SlaveStatistics
from hamq.ha.slave import HAClient, SlaveHAStatistics

__all__ = [
    "EpochFile",
    "EpochFileError",
    "HAClient",
    "HAConfig",
    "HAService",
    "MasterHAStatistics",
    "SlaveHAStatistics",
    "SlaveStatistics",
]
