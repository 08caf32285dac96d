"""Renewals: keeping what a push consumer works on invisible (``auto_renew``), as
RocketMQ's proxy does.

A push consumer receives with ``auto_renew`` and names no invisible time: it is given
60 s (AUTO_RENEW_INVISIBLE_MS) and counts on the server to keep each message invisible
until it acks it, nacks it, or sends it to the dead letter queue, however long its
handler takes. So each message it is given is tracked here, under the receipt handle
the client holds: the message's current handle and when to renew it. RENEW_AHEAD_S
before the message would come back, its invisible time is changed
(CHANGE_MESSAGE_INVISIBLETIME) to the next of RENEW_STEPS_MS (1 m, 3 m, 5 m, 10 m, 30 m,
1 h: the proxy's steps), which gives it a new handle. The client's own ack, nack or
dead-lettering is made with the current handle (``use``; one asked while a renewal is
under way waits for its answer).

Renewing ends RENEW_FOR_S (3 h) after delivery, leaving the message to come back when
due; after RENEW_ATTEMPTS failures in a row (the message acked by another way, the
broker no longer master: it comes back when due); and when the client's connection
closes (``forget``): what it held is then made visible again NACK_ON_CLOSE_MS later
(the proxy's 1 s), for the group's other consumers. At most MAX_LEASES messages are
tracked; past that a message is not renewed (it comes back after its 60 s).

Requests go through ``submit`` (the endpoint's own channel, signed with the account
that received the message), so the broker decides them as any remoting request.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import attrs
import trio

from hamq.acl import Credentials
from hamq.protocol import RemotingCommand, RequestCode, ResponseCode
from hamq.protocol.headers import (
    ChangeInvisibleTimeResponseHeader,
)
from hamq.protocol.pop import ReceiptHandle, change_invisible_header, changed_handle

log = logging.getLogger(__name__)

#: a push consumer's first lease (RocketMQ proxy's defaultInvisibleTimeMills)
AUTO_RENEW_INVISIBLE_MS = 60_000
#: the invisible times of successive renewals (the proxy's RenewStrategyPolicy)
RENEW_STEPS_MS = (60_000, 180_000, 300_000, 600_000, 1_800_000, 3_600_000)
#: renew this long before the message would come back (renewAheadTimeMillis)
RENEW_AHEAD_S = 10.0
#: no renewal past this long after delivery (renewMaxTimeMillis)
RENEW_FOR_S = 3 * 3600.0
#: renewals of one message that may fail in a row before it is left to come back
RENEW_ATTEMPTS = 3
#: how soon a failed renewal is tried again
RETRY_AFTER_S = 1.0
#: what a closed client's messages are made visible again in (invisibleTimeMillisWhenClear)
NACK_ON_CLOSE_MS = 1_000
#: messages tracked at most (across clients)
MAX_LEASES = 100_000
#: how often the leases are looked over
SCAN_EVERY_S = 1.0

#: hands a request to the broker: (request, the account to sign it with, its answer's callback)
Submit = Callable[
    [RemotingCommand, Credentials | None, Callable[[RemotingCommand | None], None]], None
]


@attrs.define(eq=False)
class _Lease:
    key: str  # (the receipt handle the client holds)
    owner: object  # (the client's channel: ``forget`` ends its leases)
    credentials: Credentials | None
    group: str
    topic: str  # (the topic the handle's message is in: the pop retry topic's, or the topic)
    handle: ReceiptHandle
    given_at: float
    renew_at: float
    step: int = 0
    failures: int = 0
    renewing: bool = False
    #: no longer tracked (used, forgotten or given up) while a renewal was under way
    ended: bool = False
    #: the client's uses made while a renewal was under way: given the handle after it
    waiting: list[Callable[[str], None]] = attrs.Factory(list)
    #: its client's connection closed: made visible again once the renewal is answered
    closed: bool = False


@attrs.frozen
class RenewalStatistics:
    #: messages tracked now
    leases: int
    #: renewals answered OK, and failed (refused, or no answer)
    renewed: int
    failed: int


class Renewals:
    def __init__(self, submit: Submit) -> None:
        self._submit = submit
        #: the receipt handle a client holds -> its message's lease
        self._leases: dict[str, _Lease] = {}
        self._renewals_ok = 0
        self._renewals_failed = 0

    def statistics(self) -> RenewalStatistics:
        return RenewalStatistics(len(self._leases), self._renewals_ok, self._renewals_failed)

    def track(
        self,
        client_handle: str,
        handle: ReceiptHandle,
        *,
        owner: object,
        credentials: Credentials | None,
        group: str,
        topic: str,
    ) -> None:
        """Keep the message ``client_handle`` names invisible while its client works
        on it (``topic``: the one its handle is in, ``handle`` its handle, parsed)."""
        if len(self._leases) >= MAX_LEASES:
            return
        now = trio.current_time()
        self._leases[client_handle] = _Lease(
            client_handle,
            owner,
            credentials,
            group,
            topic,
            handle,
            given_at=now,
            renew_at=now + handle.invisible_time / 1000 - RENEW_AHEAD_S,
        )

    def use(self, client_handle: str, then: Callable[[str], None]) -> None:
        """Call ``then`` with the handle to ack, nack or dead-letter the message by (its
        current one if tracked, which ends tracking it; after the renewal under way, if
        there is one)."""
        lease = self._leases.pop(client_handle, None)
        if lease is None:
            then(client_handle)
        elif lease.renewing:
            lease.ended = True
            lease.waiting.append(then)
        else:
            then(str(lease.handle))

    async def current(self, client_handle: str) -> str:
        """``use`` for a caller that can wait."""
        done = trio.Event()
        found: list[str] = []

        def then(text: str) -> None:
            found.append(text)
            done.set()

        self.use(client_handle, then)
        await done.wait()
        return found[0]

    def forget(self, owner: object) -> None:
        """``owner``'s connection closed: what it held is made visible again soon."""
        for client_handle, lease in list(self._leases.items()):
            if lease.owner is owner:
                del self._leases[client_handle]
                if lease.renewing:
                    lease.ended = lease.closed = True
                else:
                    self._change(lease, NACK_ON_CLOSE_MS, lambda _response: None)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        while True:
            await trio.sleep(SCAN_EVERY_S)
            self.renew_due()

    def renew_due(self) -> None:
        """Renew every lease due now (and let go of those past RENEW_FOR_S)."""
        now = trio.current_time()
        for client_handle, lease in list(self._leases.items()):
            if lease.renewing or lease.renew_at > now:
                continue
            if now - lease.given_at >= RENEW_FOR_S:
                del self._leases[client_handle]  # (it comes back when due)
                continue
            self._renew(lease)

    # ------------------------------------------------------------------ inside
    def _renew(self, lease: _Lease) -> None:
        lease.renewing = True
        invisible_ms = RENEW_STEPS_MS[min(lease.step, len(RENEW_STEPS_MS) - 1)]
        self._change(lease, invisible_ms, lambda response: self._renewed(lease, response))

    def _renewed(self, lease: _Lease, response: RemotingCommand | None) -> None:
        lease.renewing = False
        now = trio.current_time()
        if response is not None and response.code == ResponseCode.SUCCESS:
            self._renewals_ok += 1
            answer = response.header(ChangeInvisibleTimeResponseHeader)
            lease.handle = changed_handle(lease.handle, answer)
            lease.step += 1
            lease.failures = 0
            lease.renew_at = now + answer.invisible_time / 1000 - RENEW_AHEAD_S
        else:
            self._renewals_failed += 1
            lease.failures += 1
            lease.renew_at = now + RETRY_AFTER_S
            if lease.failures >= RENEW_ATTEMPTS and not lease.ended:
                log.info(
                    "gRPC: gave up renewing %s (%s)",
                    lease.handle,
                    "no answer" if response is None else response.remark,
                )
                self._leases.pop(lease.key, None)
        waiting, lease.waiting = lease.waiting, []
        for then in waiting:
            then(str(lease.handle))
        if lease.closed:
            self._change(lease, NACK_ON_CLOSE_MS, lambda _response: None)

    def _change(
        self,
        lease: _Lease,
        invisible_ms: int,
        on_answer: Callable[[RemotingCommand | None], None],
    ) -> None:
        header = change_invisible_header(lease.group, lease.topic, lease.handle, invisible_ms)
        request = RemotingCommand.request(RequestCode.CHANGE_MESSAGE_INVISIBLETIME, header)
        self._submit(request, lease.credentials, on_answer)
