"""The controller's state, replicated with Raft (pysyncobj) across 1 or 3 controllers.

``RaftState`` owns a pysyncobj ``SyncObj`` whose only consumer holds the
``ControllerState``. A change is one replicated call — ``apply(operation, kwargs)``
— that every controller runs in log order; the controller that submitted it waits
for its own copy to apply it and gets the result (pysyncobj forwards calls from a
follower to the leader). Reads (``state``) are local and may be a little behind the
leader's.

pysyncobj runs its own thread (autoTick) and talks to the other controllers through
hamq's transport (raft_transport.py: bounded, authenticated first, every wait timed
out; raft_wire.py has the wire format, which is pysyncobj's). The Trio side calls
``await call(...)``, which waits in a worker thread (abandoned if the caller is
cancelled). A call that cannot be committed within ``timeout_s`` — no leader, no
majority — raises ``ControllerUnavailable``; a refusal of the state machine raises
``ControllerError``. A leader that hears from no majority for 3 s steps down
(pysyncobj's ``leaderFallbackTimeout``; its default of 30 s had a cut-off leader call
itself leader for half a minute).

Durability: pysyncobj's journal (``raft.journal``) and full dumps (``raft.dump``) live
in the controller's data directory, so a restarted controller (or a single one)
keeps what it had.

Security: pysyncobj's messages are pickles, and unpickling a stranger's bytes runs the
stranger's code. So the Raft port binds the address given (never 0.0.0.0), and every
message is encrypted and authenticated with a shared secret (pysyncobj's ``password``:
Fernet, a key derived from the secret): a peer without the secret is disconnected
before anything it sent is unpickled, and what it can make the controller hold or do
meanwhile is bounded (raft_transport.py). A single controller, which talks to nobody,
gets a random secret of its own. A group without a secret runs only when the operator
asked for it (``insecure``) and says so in the log.
"""

from __future__ import annotations

import functools
import logging
import secrets
import threading
import time
from pathlib import Path
from typing import Any

import trio
from pysyncobj import FAIL_REASON, SyncObj, SyncObjConf, SyncObjConsumer, replicated
from pysyncobj.syncobj import SyncObjException

from hamq.controller.raft_transport import (
    RaftTransport,
    RaftTransportConfig,
    RaftTransportStatistics,
)
from hamq.controller.state import ControllerError, ControllerState
from hamq.protocol.codes import ResponseCode

log = logging.getLogger(__name__)

#: the state machine's methods a replicated call may name
OPERATIONS = frozenset({"apply_broker_id", "register", "elect_master", "alter_sync_state_set"})

_FAIL_REASONS = {
    getattr(FAIL_REASON, name): name
    for name in dir(FAIL_REASON)
    if not name.startswith("_") and isinstance(getattr(FAIL_REASON, name), int)
}


class ControllerUnavailable(Exception):
    """The controllers cannot commit a change now (no leader or no majority)."""


class _Replica(SyncObjConsumer):  # type: ignore[misc]
    """What pysyncobj replicates and dumps: the state machine, nothing else."""

    def __init__(self) -> None:
        super().__init__()
        self.state = ControllerState()

    @replicated  # type: ignore[untyped-decorator]
    def apply(self, operation: str, kwargs: dict[str, Any]) -> tuple[bool, Any]:
        if operation not in OPERATIONS:
            return False, ControllerError(
                ResponseCode.CONTROLLER_INVALID_REQUEST, f"unknown operation {operation!r}"
            )
        try:
            return True, getattr(self.state, operation)(**kwargs)
        except ControllerError as exc:
            return False, exc


class RaftSecretMissing(ValueError):
    """A group of controllers was to start without a shared secret."""


def require_raft_secret(partners: list[str], secret: str | None, insecure: bool) -> None:
    """Refuse a group of controllers without a shared secret, unless run ``insecure``."""
    if partners and not secret and not insecure:
        raise RaftSecretMissing(
            f"a group of {len(partners) + 1} controllers needs a shared Raft secret "
            "(--raft-secret-file or HAMQ_RAFT_SECRET): Raft messages are pickles, and "
            "without a secret anyone who reaches the Raft port can run code in the "
            "controller (--insecure-raft starts without one)"
        )


def raft_password(partners: list[str], secret: str | None, insecure: bool) -> str | None:
    """The password pysyncobj gets: the shared ``secret``; a random one for a single
    controller (nobody else has to know it); None only for a group run ``insecure``."""
    require_raft_secret(partners, secret, insecure)
    if secret:
        return secret
    return None if partners else secrets.token_urlsafe(32)


class RaftState:
    def __init__(
        self,
        self_address: str,
        peers: list[str],
        data_dir: Path,
        *,
        secret: str | None = None,
        insecure: bool = False,
        election_timeout_s: tuple[float, float] = (0.4, 1.0),
        transport: RaftTransportConfig | None = None,
    ) -> None:
        self.self_address = self_address
        self.partners = [p for p in peers if p != self_address]
        self.data_dir = data_dir
        self._replica = _Replica()
        password = raft_password(self.partners, secret, insecure)
        if password is None:
            log.warning(
                "Raft on %s runs WITHOUT a secret (--insecure-raft): anyone who reaches "
                "this port can run code in the controller",
                self_address,
            )
        low, high = election_timeout_s
        self.transport_config = transport or RaftTransportConfig()
        self._transport: RaftTransport | None = None
        self._conf = SyncObjConf(
            # the address given, not pysyncobj's default of every interface
            bindAddress=self_address,
            password=password,
            journalFile=str(data_dir / "raft.journal"),
            fullDumpFile=str(data_dir / "raft.dump"),
            useFork=False,  # no fork() in a process with threads
            raftMinTimeout=low,
            raftMaxTimeout=high,
            appendEntriesPeriod=0.05,
            # (3 s: a link is dead after 2 s, and an election takes up to 1 s more)
            leaderFallbackTimeout=max(self.transport_config.dead_after_s, high) + high,
            dynamicMembershipChange=False,
            bindRetryTime=0.5,
            maxBindRetries=6,
        )
        self._sync: SyncObj | None = None
        self._owner: threading.Thread | None = None
        self._stopping = threading.Event()

    @property
    def state(self) -> ControllerState:
        return self._replica.state

    def start(self) -> None:
        """Bind and start Raft (blocking: call it from a worker thread). The SyncObj is
        made on a thread of its own that lives until ``stop``: pysyncobj's tick thread
        ends when the thread that made it ends (Trio's worker threads come and go)."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        ready = threading.Event()
        failure: list[BaseException] = []

        def owner() -> None:
            try:
                sync = SyncObj(
                    self.self_address,
                    self.partners,
                    conf=self._conf,
                    consumers=[self._replica],
                    transportClass=functools.partial(
                        RaftTransport, config=self.transport_config, created=self._created
                    ),
                )
                sync.waitBinded()
            except Exception as exc:
                failure.append(
                    OSError(f"cannot start Raft on {self.self_address}: {exc!r} (in use?)")
                )
                ready.set()
                return
            self._sync = sync
            ready.set()
            self._stopping.wait()
            self._sync = None
            sync.destroy_synchronous()  # (the port is closed when stop returns)

        self._owner = threading.Thread(target=owner, name=f"raft {self.self_address}", daemon=True)
        self._owner.start()
        ready.wait()
        if failure:
            raise failure[0]

    def stop(self) -> None:
        """Stop Raft (blocking)."""
        self._stopping.set()
        if self._owner is not None:
            self._owner.join(timeout=10)
            self._owner = None

    def _created(self, transport: RaftTransport) -> None:
        self._transport = transport

    def transport_statistics(self) -> RaftTransportStatistics | None:
        """The Raft port's counters (None before start)."""
        return self._transport.statistics() if self._transport is not None else None

    def is_leader(self) -> bool:
        return self._sync is not None and bool(self._sync._isLeader())

    def majority_contact_age(self) -> float | None:
        """How long ago (s) this controller, as the Raft leader, last heard from a
        majority of the controllers (itself counted: a single controller, 0); None when
        it is not the leader. A leader cut off from the others answers ever older
        figures, and steps down after ``leaderFallbackTimeout``: what a broker's lease
        may count from (hamq/broker/roles.py's ``Lease``)."""
        sync = self._sync
        if sync is None or not sync._isLeader():
            return None
        if not self.partners:
            return 0.0
        # (pysyncobj's own bookkeeping: when each partner last answered this leader,
        # on time.monotonic; it sets them all when it becomes leader, on a majority's
        # votes)
        responses: dict[Any, float] = sync._SyncObj__lastResponseTime
        now = time.monotonic()
        ages = sorted(now - when for when in responses.values())
        needed = (len(self.partners) + 1) // 2  # partners that make a majority with it
        if len(ages) < needed:
            return None
        return max(0.0, ages[needed - 1])

    def leader(self) -> str | None:
        """The Raft address of the current leader, None when there is none."""
        if self._sync is None:
            return None
        leader = self._sync._getLeader()
        return str(leader.address) if leader is not None else None

    def status(self) -> dict[str, Any]:
        if self._sync is None:
            return {"state": "stopped"}
        status = self._sync.getStatus()
        return {
            "self": self.self_address,
            "leader": self.leader(),
            "isLeader": self.is_leader(),
            "term": status.get("raft_term"),
            "commitIndex": status.get("commit_idx"),
            "peers": sorted(self.partners),
        }

    async def call(self, operation: str, timeout_s: float = 3.0, **kwargs: Any) -> Any:
        """Run ``operation`` on every controller's state; its result here."""
        if self._sync is None:
            raise ControllerUnavailable("the controller is not running")
        submit = functools.partial(
            self._replica.apply, operation, kwargs, sync=True, timeout=timeout_s
        )
        try:
            ok, result = await trio.to_thread.run_sync(submit, abandon_on_cancel=True)
        except SyncObjException as exc:
            reason = exc.errorCode
            name = _FAIL_REASONS.get(reason, str(reason)) if isinstance(reason, int) else reason
            raise ControllerUnavailable(
                f"the controllers could not commit {operation} ({name}; leader "
                f"{self.leader() or 'unknown'})"
            ) from None
        if not ok:
            raise result
        return result
