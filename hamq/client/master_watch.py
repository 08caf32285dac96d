"""MasterWatch: a producer's tries waiting for an answer, and the check that the
broker each waits on is still its group's master.

A master that hangs (stopped, not dead: its connections stay open) answers nothing.
While a try has waited MASTER_CHECK_AFTER_S (1 s) or more, ``check`` looks its
topic's route up again (at most once a second per topic, keeping the known route when
no nameserver answers) and, once the route names another master for that broker group
(the controllers elected one meanwhile), closes the connection to the old address:
every try waiting there fails at once and the producer sends it again, to the new
master. ``run`` checks every MASTER_CHECK_EVERY_S in the producer's client instance's
task group, for as long as the producer is open.

Invariants: ``started`` and ``ended`` bracket each try (the producer calls ``ended``
in a ``finally``), so the table holds only tries under way; a connection is closed
only for an address some try waits on and a route that names another master for its
group (never for a route without a master: a failover under way).
"""

from __future__ import annotations

import itertools
import logging

import anyio

from hamq.client.errors import NETWORK_ERRORS
from hamq.client.instance import ClientInstance
from hamq.protocol.bodies import MASTER_ID, MessageQueue

log = logging.getLogger(__name__)

#: a try waiting this long has the producer check that its broker is still the master
MASTER_CHECK_AFTER_S = 1.0
#: how often the producer looks for such tries
MASTER_CHECK_EVERY_S = 0.5


class MasterWatch:
    """The tries waiting for an answer, by broker address, and the check that their
    broker is still its group's master (the module doc): a try waiting since before
    ``MASTER_CHECK_AFTER_S`` ago has its topic's route looked up again (at most once a
    second per topic), and an address the route no longer names as its group's master
    (it names another) has its connection closed, which fails its tries at once."""

    def __init__(self) -> None:
        #: address -> try key -> (when it started, topic, broker name)
        self._waiting: dict[str, dict[int, tuple[float, str, str]]] = {}
        self._keys = itertools.count()
        #: connections closed because their broker was no longer the master
        self.closed = 0

    def started(self, addr: str, now: float, target: MessageQueue) -> int:
        key = next(self._keys)
        self._waiting.setdefault(addr, {})[key] = (now, target.topic, target.broker_name)
        return key

    def ended(self, addr: str, key: int) -> None:
        tries = self._waiting.get(addr)
        if tries is not None:
            tries.pop(key, None)
            if not tries:
                del self._waiting[addr]

    def waiting_since(self, before: float) -> list[tuple[str, str, str]]:
        """(address, topic, broker name) of each try started before ``before``."""
        return sorted(
            {
                (addr, topic, broker)
                for addr, tries in self._waiting.items()
                for started, topic, broker in tries.values()
                if started < before
            }
        )

    async def run(self, instance: ClientInstance) -> None:
        while True:
            await anyio.sleep(MASTER_CHECK_EVERY_S)
            await self.check(instance)

    async def check(self, instance: ClientInstance) -> None:
        """One look (``run`` looks every MASTER_CHECK_EVERY_S)."""
        now = instance.loop.current_time()
        stuck = self.waiting_since(now - MASTER_CHECK_AFTER_S)
        if not stuck:
            return
        for topic in sorted({topic for _, topic, _ in stuck}):
            try:
                await instance.refresh_route_after_failure(topic, keep_known=True)
            except NETWORK_ERRORS as exc:
                log.info("looking the route of %s up again failed: %s", topic, exc)
        for addr, _topic, broker in stuck:
            master = instance.broker_addr(broker, MASTER_ID, only_this=True)
            if master is None or master == addr or addr not in self._waiting:
                continue
            log.warning(
                "%s is no longer the master of %s (the route names %s): sends waiting "
                "there go to the new master",
                addr,
                broker,
                master,
            )
            self.closed += 1
            instance.remoting.close_connection(
                addr, f"no longer the master of {broker}: the route names {master}"
            )
