"""The controller of automatic failover (RocketMQ 5's controller mode;
docs/ARCHITECTURE.md#failover).

- state.py       the pure state machine: members, masters, epochs, SyncStateSets
- raft.py        that state replicated with pysyncobj across 1 or 3 controllers
- raft_transport.py  pysyncobj's connections between controllers, on hamq's sockets:
                 bounded, authenticated first, every wait timed out
- raft_wire.py   their wire format and handshake (pysyncobj's), sans-IO
- heartbeats.py  which brokers are alive (local to each controller)
- service.py     the remoting processors and the election loop
- server.py      ``hamq controller``: a controller with a server of its own
- metrics.py     its metrics (``hamq_controller_*``), read at scrape time
Brokers talk to it from hamq.broker.replicas.
"""

from hamq.controller.raft import ControllerUnavailable
from hamq.controller.server import DEFAULT_CONTROLLER_PORT, ControllerServer
from hamq.controller.service import Controller, ControllerConfig
from hamq.controller.state import ControllerError, ControllerState, ReplicaInfo

__all__ = [
    "DEFAULT_CONTROLLER_PORT",
    "Controller",
    "ControllerConfig",
    "ControllerError",
    "ControllerServer",
    "ControllerState",
    "ControllerUnavailable",
    "ReplicaInfo",
]
