"""Which brokers are alive, from their heartbeats: local to each controller, not replicated.

Brokers heartbeat every controller (BROKER_HEARTBEAT, every second), so whichever
controller leads knows them without waiting. A broker is alive until its lease
(``heartbeat_timeout_mills`` it sends, default 3 s) passes without a heartbeat, or at
once when the connection its last heartbeat came over closes (a killed broker's
sockets close with it: RocketMQ's onBrokerChannelClose). Time is passed in.

A broker not heard is not yet known dead while the controller has been listening
(``listen``, at its start) for less than a lease — the longest its group's live brokers
announce, else the default: a restarted controller (all three restarted at once, say)
has heard nobody yet, and a master that heartbeats every second would be taken for dead
in the first second (RocketMQ's controller waits likewise before it scans for inactive
masters). ``heard_long_enough`` says when that wait is over for a group.
"""

from __future__ import annotations

import attrs

from hamq.controller.state import Candidate


@attrs.define
class LiveBroker:
    cluster: str
    broker_name: str
    broker_id: int
    address: str
    epoch: int
    max_offset: int
    confirm_offset: int
    priority: int
    last_heard: float
    lease_s: float
    connection: object = None

    def candidate(self) -> Candidate:
        return Candidate(self.broker_id, self.epoch, self.max_offset, self.priority)


class LiveBrokers:
    def __init__(self, default_lease_s: float = 3.0) -> None:
        self.default_lease_s = default_lease_s
        self.brokers: dict[tuple[str, int], LiveBroker] = {}
        #: when the controller started listening to heartbeats (None: not yet)
        self.listening_since: float | None = None

    def listen(self, now: float) -> None:
        """The controller hears heartbeats from ``now`` on."""
        self.listening_since = now

    def lease_of(self, broker_name: str) -> float:
        """The longest lease the group's live brokers announce, else the default."""
        return max([b.lease_s for b in self.of_group(broker_name)], default=self.default_lease_s)

    def heard_long_enough(self, broker_name: str, now: float) -> bool:
        """Whether a member of ``broker_name`` that has not been heard is dead: the
        controller has listened for at least the group's lease (``lease_of``)."""
        since = self.listening_since
        return since is not None and now - since >= self.lease_of(broker_name)

    def heard(self, broker: LiveBroker) -> bool:
        """Record a heartbeat; True if the broker was not alive before."""
        key = (broker.broker_name, broker.broker_id)
        new = key not in self.brokers
        self.brokers[key] = broker
        return new

    def alive(self, broker_name: str, now: float) -> dict[int, Candidate]:
        return {
            b.broker_id: b.candidate()
            for b in self.brokers.values()
            if b.broker_name == broker_name and now - b.last_heard <= b.lease_s
        }

    def is_alive(self, broker_name: str, broker_id: int, now: float) -> bool:
        broker = self.brokers.get((broker_name, broker_id))
        return broker is not None and now - broker.last_heard <= broker.lease_s

    def get(self, broker_name: str, broker_id: int) -> LiveBroker | None:
        return self.brokers.get((broker_name, broker_id))

    def of_group(self, broker_name: str) -> list[LiveBroker]:
        return [b for b in self.brokers.values() if b.broker_name == broker_name]

    def expire(self, now: float) -> list[LiveBroker]:
        """Forget brokers whose lease ended; they are returned."""
        gone = [b for b in self.brokers.values() if now - b.last_heard > b.lease_s]
        for broker in gone:
            del self.brokers[(broker.broker_name, broker.broker_id)]
        return gone

    def connection_closed(self, connection: object) -> list[LiveBroker]:
        """Forget the brokers whose last heartbeat came over ``connection``."""
        gone = [b for b in self.brokers.values() if b.connection is connection]
        for broker in gone:
            del self.brokers[(broker.broker_name, broker.broker_id)]
        return gone
