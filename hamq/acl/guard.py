"""AclGuard: one server's ACL — the account table from its file, kept current, and the
check its dispatcher runs before every request.

The file is read when the guard is made: a file that cannot be used stops the server
from starting (AclFileError, one line). ``run`` then looks at the file every
``reload_interval_s`` (RocketMQ's watcher: 500 ms, by content; here by size, mtime and
inode): a changed file is read again (in a worker thread) and replaces the table when it
parses; when it does not (a typo, a half-written file, a deleted one) the error is
logged once per change of the file, and the accounts of the last good read stay.

A refused request is answered NO_PERMISSION with the refusal's remark; refusals are
counted by reason (check.py's ``Reason``), and logged as warnings at most once per
REFUSAL_LOG_INTERVAL_S (a RateLimitedLog: the next line says how many were not
logged; every one at debug level).
"""

from __future__ import annotations

import logging
import os
from collections import Counter
from pathlib import Path
from typing import Protocol

import attrs
import trio

from hamq.acl.accounts import AclFileError, AclTable, load_acl_file
from hamq.acl.check import MessageTopic, Refusal, check
from hamq.acl.rights import AclPolicy
from hamq.protocol import RemotingCommand, ResponseCode
from hamq.ratelimit import RateLimitedLog
from hamq.remoting.address import ip_of

log = logging.getLogger(__name__)

#: how often the file is looked at
RELOAD_INTERVAL_S = 1.0
#: refusals are logged at most this often
REFUSAL_LOG_INTERVAL_S = 10.0

_FileStamp = tuple[int, int, int] | None


class Peer(Protocol):
    """What the guard needs of a connection: the peer's ``host:port``."""

    @property
    def peer(self) -> str: ...


def _stamp(path: Path) -> _FileStamp:
    try:
        stat = os.stat(path)
    except OSError:
        return None
    return (stat.st_mtime_ns, stat.st_size, stat.st_ino)


@attrs.frozen
class AclStatistics:
    path: str
    accounts: int
    refused: int
    reloads: int
    reload_failures: int
    #: refusals by reason (check.py's Reason values), those that happened
    refused_by_reason: dict[str, int] = attrs.field(factory=dict)


class AclGuard:
    def __init__(
        self,
        path: Path,
        policy: AclPolicy,
        *,
        reload_interval_s: float = RELOAD_INTERVAL_S,
        message_topic: MessageTopic | None = None,
    ) -> None:
        """Read ``path`` now; AclFileError if it cannot be used. ``message_topic``: the
        topic of the stored message at an offset (a broker's store; check.py)."""
        self.path = Path(path)
        self.policy = policy
        self.message_topic = message_topic
        self.reload_interval_s = reload_interval_s
        self._stamp = _stamp(self.path)
        self.table: AclTable = load_acl_file(self.path)
        #: refusals by reason (Reason values)
        self.refusals: Counter[str] = Counter()
        self.reloads = 0
        self.reload_failures = 0
        self._warnings = RateLimitedLog(log, interval_s=REFUSAL_LOG_INTERVAL_S, burst=1)
        log.info(
            "ACL on (%s): %d account(s) from %s", policy.name, len(self.table.accounts), self.path
        )

    # ------------------------------------------------------------------ the check
    @property
    def refused(self) -> int:
        """Requests refused since the guard was made."""
        return self.refusals.total()

    def __call__(self, request: RemotingCommand, conn: Peer) -> RemotingCommand | None:
        """The dispatcher's guard: None to go on, else the NO_PERMISSION answer."""
        refusal = check(self.table, self.policy, request, ip_of(conn.peer), self.message_topic)
        if refusal is None:
            return None
        self.refusals[refusal.reason.value] += 1
        self._log_refusal(request, conn.peer, refusal)
        return request.response_to(ResponseCode.NO_PERMISSION, refusal.remark)

    def _log_refusal(self, request: RemotingCommand, peer: str, refusal: Refusal) -> None:
        log.debug("ACL refused %s from %s: %s", request.describe(), peer, refusal.remark)
        self._warnings.warning(
            "refused", "ACL refused %s from %s: %s", request.describe(), peer, refusal.remark
        )

    # ------------------------------------------------------------------ reloading
    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        while True:
            await trio.sleep(self.reload_interval_s)
            await self.reload_if_changed()

    async def reload_if_changed(self) -> bool:
        """Read the file again if it changed; whether the table was replaced."""
        stamp = _stamp(self.path)
        if stamp == self._stamp:
            return False
        self._stamp = stamp
        try:
            table = await trio.to_thread.run_sync(load_acl_file, self.path)
        except AclFileError as exc:
            self.reload_failures += 1
            log.error("%s; keeping the %d account(s) read before", exc, len(self.table.accounts))
            return False
        self.table = table
        self.reloads += 1
        log.info("ACL file %s reloaded: %d account(s)", self.path, len(table.accounts))
        return True

    def statistics(self) -> AclStatistics:
        return AclStatistics(
            path=str(self.path),
            accounts=len(self.table.accounts),
            refused=self.refused,
            reloads=self.reloads,
            reload_failures=self.reload_failures,
            refused_by_reason=dict(self.refusals),
        )
