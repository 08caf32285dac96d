"""Routes as clients use them: which queues to send to, which to consume, where brokers are.

Pure state, no I/O (``ClientInstance`` fetches the routes and feeds them here).

- ``PublishInfo``: a topic's writable queues on brokers that have a master, sorted by
  broker name then queue id (what RocketMQ's clients build). Sends go round-robin over
  it from a random start; a retry avoids the broker that just failed.
  ``without_master`` names the broker groups of a route that have none (all of its
  queues' groups, when a topic exists but cannot be sent to: the master is down).
- ``subscribe_queues``: a topic's readable queues, the set a consumer group rebalances.
- A topic no nameserver knows is sent to through the template topic TBW102's route
  (``min(default_topic_queue_nums, template's write queues)`` per broker); the broker
  creates the topic on that first send and registers it.
- ``LatencyFaultTolerance``: optional; a broker whose send failed is avoided for
  ``isolation_s`` (30 s), one that answered slowly for the time Java's table gives
  (>= 550 ms: 30 s ... >= 15 s: 600 s).
- ``TimedOutAddresses``: always on; a broker address whose request timed out (a master
  that hangs) is avoided for as long as that request waited, or until it answers.
  Keyed by address, not broker name: after a failover the same broker name has a new
  master at another address.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable

import attrs

from hamq.protocol.bodies import (
    MASTER_ID,
    PERM_READ,
    PERM_WRITE,
    MessageQueue,
    TopicRouteData,
)

#: Java's MQFaultStrategy: latency (ms) at or above -> how long to avoid the broker (ms)
_LATENCY_STEPS_MS = ((15000, 600000), (3000, 180000), (2000, 120000), (1000, 60000), (550, 30000))


@attrs.define
class PublishInfo:
    topic: str
    queues: list[MessageQueue]
    route: TopicRouteData
    #: built from TBW102's route: the topic does not exist yet anywhere
    from_template: bool = False
    _next: itertools.count[int] = attrs.field(
        factory=lambda: itertools.count(random.randrange(1 << 16))
    )

    @property
    def ok(self) -> bool:
        return bool(self.queues)

    def select(
        self, last_broker: str | None = None, available: Callable[[str], bool] | None = None
    ) -> MessageQueue:
        """The next queue round-robin, avoiding ``last_broker`` and unavailable brokers
        when another choice exists."""
        if not self.queues:
            raise LookupError(f"topic {self.topic} has no writable queue")
        n = len(self.queues)
        start = next(self._next)
        if last_broker is None and available is None:
            return self.queues[start % n]  # (a first try with nothing to avoid)
        candidates = [self.queues[(start + i) % n] for i in range(n)]
        for queue in candidates:
            if queue.broker_name != last_broker and (
                available is None or available(queue.broker_name)
            ):
                return queue
        for queue in candidates:
            if queue.broker_name != last_broker:
                return queue
        return candidates[0]


def publish_info(
    topic: str, route: TopicRouteData, *, template_queue_nums: int | None = None
) -> PublishInfo:
    """Writable queues of ``route``; ``template_queue_nums`` when route is TBW102's."""
    masters = {b.broker_name for b in route.broker_datas if b.master_addr()}
    queues: list[MessageQueue] = []
    for data in sorted(route.queue_datas, key=lambda q: q.broker_name):
        if not data.perm & PERM_WRITE or data.broker_name not in masters:
            continue
        count = data.write_queue_nums
        if template_queue_nums is not None:
            count = min(count, template_queue_nums)
        queues += [MessageQueue(topic, data.broker_name, i) for i in range(count)]
    return PublishInfo(topic, queues, route, from_template=template_queue_nums is not None)


def without_master(route: TopicRouteData) -> list[str]:
    """The broker groups holding ``route``'s queues that have no master now, each with
    the brokers they have ("broker-a (only broker 1 at 127.0.0.1:10921)")."""
    brokers = {b.broker_name: b for b in route.broker_datas}
    named = []
    for name in sorted({q.broker_name for q in route.queue_datas}):
        data = brokers.get(name)
        if data is not None and data.master_addr():
            continue
        others = sorted(data.broker_addrs.items()) if data is not None else []
        have = ", ".join(f"broker {i} at {a}" for i, a in others) or "no broker registered"
        named.append(f"{name} (only {have})" if others else f"{name} ({have})")
    return named


def read_only(route: TopicRouteData) -> list[str]:
    """The broker groups whose queues of ``route`` may not be written to."""
    return sorted({q.broker_name for q in route.queue_datas if not q.perm & PERM_WRITE})


def subscribe_queues(topic: str, route: TopicRouteData) -> list[MessageQueue]:
    """Readable queues of ``route``, sorted: what a group's members divide among them."""
    queues = [
        MessageQueue(topic, data.broker_name, i)
        for data in route.queue_datas
        if data.perm & PERM_READ
        for i in range(data.read_queue_nums)
    ]
    return sorted(queues, key=lambda q: (q.broker_name, q.queue_id))


def broker_table(routes: list[TopicRouteData]) -> dict[str, dict[int, str]]:
    """broker name -> {broker id: address}, merged over routes."""
    table: dict[str, dict[int, str]] = {}
    for route in routes:
        for data in route.broker_datas:
            table[data.broker_name] = dict(data.broker_addrs)
    return table


def pick_address(
    addrs: dict[int, str], broker_id: int = MASTER_ID, *, only_this: bool = False
) -> str | None:
    """``broker_id``'s address; else (unless ``only_this``) the master, then any."""
    if broker_id in addrs:
        return addrs[broker_id]
    if only_this:
        return None
    if MASTER_ID in addrs:
        return addrs[MASTER_ID]
    return addrs[min(addrs)] if addrs else None


class LatencyFaultTolerance:
    def __init__(self, *, enabled: bool = False, isolation_s: float = 30.0) -> None:
        self.enabled = enabled
        self.isolation_s = isolation_s
        #: broker name -> the time (the event loop's clock, s) it may be used again
        self._until: dict[str, float] = {}

    def update(self, broker: str, latency_s: float, now: float, *, failed: bool) -> None:
        if not self.enabled:
            return
        avoid_s = self.isolation_s if failed else _avoid_for(latency_s)
        if avoid_s > 0:
            self._until[broker] = now + avoid_s
        else:
            self._until.pop(broker, None)

    def available(self, broker: str, now: float) -> bool:
        until = self._until.get(broker)
        return until is None or now >= until


def _avoid_for(latency_s: float) -> float:
    latency_ms = latency_s * 1000
    for at_least_ms, avoid_ms in _LATENCY_STEPS_MS:
        if latency_ms >= at_least_ms:
            return avoid_ms / 1000
    return 0.0


class TimedOutAddresses:
    """Broker addresses whose last request timed out, avoided until a time (the event
    loop's clock, s)."""

    def __init__(self) -> None:
        self._until: dict[str, float] = {}

    def __bool__(self) -> bool:
        """Whether any address is (or was, until asked again) avoided."""
        return bool(self._until)

    def add(self, addr: str, now: float, avoid_s: float) -> None:
        self._until[addr] = now + avoid_s

    def discard(self, addr: str) -> None:
        """``addr`` answered."""
        self._until.pop(addr, None)

    def avoided(self, addr: str, now: float) -> bool:
        until = self._until.get(addr)
        if until is None:
            return False
        if now >= until:
            del self._until[addr]
            return False
        return True
