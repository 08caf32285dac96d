"""When a stored message counts as safe: a send's durability wait, decided here only.

This is RocketMQ's ``handleDiskFlushAndHA``. Once a put has appended its message(s),
the answer waits — unless the message's WAIT property is "false" — for:

- the disk, with SYNC_FLUSH: the group-commit fsync that covers the message's end
  (flush.py), for at most ``[store] sync_flush_timeout_s``: else FLUSH_DISK_TIMEOUT;
- the replicas, when the injected ``ReplicaWaiter`` says a put waits for them now
  (hamq/ha/group_transfer.py decides who: a SYNC_MASTER one in-sync slave, a
  controller-mode master with allAckInSyncStateSet every other member of its
  SyncStateSet). With none to wait for the answer is SLAVE_NOT_AVAILABLE at once;
  otherwise an ack past the message's end within the replicas' timeout, else
  FLUSH_SLAVE_TIMEOUT.

Both waits run at once, and the replicas' status wins over the disk's (RocketMQ's
``thenCombine``): SLAVE_NOT_AVAILABLE or FLUSH_SLAVE_TIMEOUT, then FLUSH_DISK_TIMEOUT,
then PUT_OK. The message is stored in every case — the status says what is not yet
certain, and the remark (one wording for each, below) says so.

No task per put: both waits are callbacks, called by the flush round or the ack that
covers the message, or by the timer of the one deadline queue each side keeps. The
store never imports replication: the broker hands it a ``ReplicaWaiter``.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from hamq.store.config import FlushDiskType, StoreConfig

if TYPE_CHECKING:
    from hamq.store.flush import FlushService


class PutMessageStatus(enum.Enum):
    """What a put answers (RocketMQ's PutMessageStatus)."""

    PUT_OK = "PUT_OK"
    FLUSH_DISK_TIMEOUT = "FLUSH_DISK_TIMEOUT"
    FLUSH_SLAVE_TIMEOUT = "FLUSH_SLAVE_TIMEOUT"
    SLAVE_NOT_AVAILABLE = "SLAVE_NOT_AVAILABLE"
    SERVICE_NOT_AVAILABLE = "SERVICE_NOT_AVAILABLE"
    CREATE_MAPPED_FILE_FAILED = "CREATE_MAPPED_FILE_FAILED"
    MESSAGE_ILLEGAL = "MESSAGE_ILLEGAL"
    PROPERTIES_SIZE_EXCEEDED = "PROPERTIES_SIZE_EXCEEDED"


#: what a put's answer says when it did not get what it waited for (the message is stored)
SLAVE_NOT_AVAILABLE_REMARK = "no slave in sync (none connected, or too far behind); stored"


def flush_timeout_remark(timeout_s: float) -> str:
    return f"not on disk within {timeout_s:g}s; stored"


def replica_timeout_remark(timeout_s: float) -> str:
    return f"no slave had it within {timeout_s:g}s; stored"


class ReplicaWaiter(Protocol):
    """Who a put waits for besides the disk (implemented by hamq/ha/group_transfer.py)."""

    #: how long a put waits for the replicas' ack
    timeout_s: float

    def waits(self) -> bool:
        """Does a put wait for replicas now (this broker's role and replication mode)?"""

    def available(self) -> bool:
        """Is there a replica to wait for (else the answer is SLAVE_NOT_AVAILABLE)?"""

    def notify(self, end_offset: int, callback: Callable[[bool], None]) -> None:
        """``callback(True)`` once the replicas have everything below ``end_offset``,
        ``callback(False)`` after ``timeout_s``."""


#: a put's answer: its status and the remark that goes with it ("" for PUT_OK)
Answer = Callable[[PutMessageStatus, str], None]


class _Pending:
    """One put waiting for its disk and/or replicas: answers once both are known."""

    __slots__ = ("answer", "disk_ok", "durability", "left", "replicas_ok")

    def __init__(self, durability: Durability, answer: Answer, left: int) -> None:
        self.durability = durability
        self.answer = answer
        self.left = left
        self.disk_ok = True
        self.replicas_ok = True

    def disk(self, ok: bool) -> None:
        self.disk_ok = ok
        self._one_done()

    def replicas(self, ok: bool) -> None:
        self.replicas_ok = ok
        self._one_done()

    def _one_done(self) -> None:
        self.left -= 1
        if self.left == 0:
            self.answer(*self.durability.status(disk_ok=self.disk_ok, replicas_ok=self.replicas_ok))


class Durability:
    """The store's side of a put's answer: what it waits for, and what it says."""

    def __init__(self, config: StoreConfig) -> None:
        self.config = config
        self.sync_flush = config.flush_disk_type is FlushDiskType.SYNC_FLUSH
        #: the group commit (set once the store runs)
        self.flush: FlushService | None = None
        #: who else must have a message before it counts (None: nobody, as on a slave)
        self.replicas: ReplicaWaiter | None = None

    def waits(self, wait_store_ok: bool) -> bool:
        """Will a put of a message with this WAIT (``wait_store_ok``) wait at all? (A
        caller that must hold a place for the answer asks before it puts.)"""
        if not wait_store_ok:
            return False
        return self.sync_flush or (self.replicas is not None and self.replicas.waits())

    def wait(self, end_offset: int, wait_store_ok: bool, answer: Answer) -> bool:
        """After a put appended up to ``end_offset``: call ``answer(status, remark)`` once
        it is as safe as configured, or once waiting ran out. False (and ``answer`` is
        never called) when there is nothing to wait for: the put is PUT_OK now."""
        if not wait_store_ok:
            return False
        flush = self.flush if self.sync_flush else None
        replicas = self.replicas if self.replicas is not None and self.replicas.waits() else None
        if flush is None and replicas is None:
            return False
        if replicas is not None and not replicas.available():
            # stored, but no replica to wait for: answered at once, after the disk if it must
            if flush is None:
                answer(PutMessageStatus.SLAVE_NOT_AVAILABLE, SLAVE_NOT_AVAILABLE_REMARK)
            else:
                flush.notify_flushed(
                    end_offset,
                    lambda _ok: answer(
                        PutMessageStatus.SLAVE_NOT_AVAILABLE, SLAVE_NOT_AVAILABLE_REMARK
                    ),
                    self.config.sync_flush_timeout_s,
                )
            return True
        pending = _Pending(self, answer, (flush is not None) + (replicas is not None))
        if replicas is not None:
            replicas.notify(end_offset, pending.replicas)
        if flush is not None:
            flush.notify_flushed(end_offset, pending.disk, self.config.sync_flush_timeout_s)
        return True

    def status(self, *, disk_ok: bool, replicas_ok: bool) -> tuple[PutMessageStatus, str]:
        """The answer once both waits are over: the replicas' status wins over the disk's."""
        if not replicas_ok:
            assert self.replicas is not None
            return PutMessageStatus.FLUSH_SLAVE_TIMEOUT, replica_timeout_remark(
                self.replicas.timeout_s
            )
        if not disk_ok:
            return PutMessageStatus.FLUSH_DISK_TIMEOUT, flush_timeout_remark(
                self.config.sync_flush_timeout_s
            )
        return PutMessageStatus.PUT_OK, ""
