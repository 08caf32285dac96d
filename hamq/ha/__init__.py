"""Master/slave replication of the CommitLog (docs/ARCHITECTURE.md#replication,
docs/PROTOCOL.md#ha-wire).

- config.py          HAConfig
- master.py          HAService: the master's side (accept slaves, push bytes, acks)
- master_session.py  one slave connection's state and decisions, sans-IO (master.py's I/O obeys)
- slave.py           HAClient: the slave's side (connect, append, report)
- states.py          a connection's HAState and the moves allowed between them
- epoch.py           the epoch file and where two logs agree
- group_transfer.py  who a put waits for (SYNC_MASTER, SyncStateSet) and their acks
- sync_state_set.py  who belongs in a controller-mode master's SyncStateSet (pure)
- membership.py      who may replicate from a master: the HA secret, the registry
The wire formats are sans-IO, in hamq.protocol.ha_wire.
"""

from hamq.ha.config import HAConfig
from hamq.ha.epoch import EpochFile, EpochFileError
from hamq.ha.group_transfer import GroupTransfer, ReplicaPolicy
from hamq.ha.master import HAService, MasterHAStatistics, SlaveStatistics
from hamq.ha.slave import HAClient, SlaveHAStatistics

__all__ = [
    "EpochFile",
    "EpochFileError",
    "GroupTransfer",
    "HAClient",
    "HAConfig",
    "HAService",
    "MasterHAStatistics",
    "ReplicaPolicy",
    "SlaveHAStatistics",
    "SlaveStatistics",
]
