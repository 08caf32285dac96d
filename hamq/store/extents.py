"""Queue extents: what each consume queue held at the last clean stop.

File ``<store>/config/queueExtents.json``, written at every clean stop::

    {"commitlogOffset": <how far the log was dispatched then>,
     "queues": {"<topic>": {"<queue id>": [min offset, max offset, first], ...}, ...}}

``first`` is the CommitLog offset of the queue's entry ``min offset``. At the next start
(``QueueExtents.problems``) they say which queues lost files that the log's tail cannot show: a
queue whose files end before its recorded max offset, or whose first entries are gone
while the records they point at are still in the log, is rebuilt from the log
(hamq/store/queue_check.py, at recovery); and a rebuilt queue that the log cannot bring back to its
recorded max offset continues from there (``standing``: the floors recovery keeps the
queue offsets above): offsets it handed out are not handed out again.

Every value is a lower bound of what the queues hold later (offsets only grow; a min
offset grows with retention): after a crash the file is older than the queues, and
what it says still holds. Two things break that, and are dealt with:
- a truncation (an HA replica cut back to its master's log) shrinks queues: the store
  removes the file then (``forget_extents``), and the next clean stop writes it again;
- a topic deletion destroys its queues: the extents of a topic deleted at or after
  ``commitlogOffset`` are ignored (hamq/store/deletions.py).
Written with ``save_with_backup``; a damaged file without a usable backup is ignored
(with an error in the log): the extents only add checks.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping
from pathlib import Path

import attrs

from hamq.protocol.message import topic_error
from hamq.store.checkpoint import backup_path, load_with_backup, save_with_backup
from hamq.store.consume_queue import ConsumeQueue
from hamq.store.deletions import TopicDeletions
from hamq.store.segment import StoreError

log = logging.getLogger(__name__)


@attrs.frozen
class Extent:
    """What a queue held: entries [min_offset, max_offset), entry min_offset at
    CommitLog offset ``first``."""

    min_offset: int
    max_offset: int
    first: int


@attrs.frozen
class QueueExtents:
    #: how far the CommitLog was dispatched when they were written
    commitlog_offset: int
    queues: Mapping[tuple[str, int], Extent]

    def encode(self) -> bytes:
        topics: dict[str, dict[str, list[int]]] = {}
        for (topic, queue_id), e in sorted(self.queues.items()):
            topics.setdefault(topic, {})[str(queue_id)] = [e.min_offset, e.max_offset, e.first]
        return json.dumps(
            {"commitlogOffset": self.commitlog_offset, "queues": topics}, separators=(",", ":")
        ).encode()

    @classmethod
    def decode(cls, data: bytes) -> QueueExtents:
        """ValueError names what is wrong."""
        try:
            parsed = json.loads(data)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise ValueError(f"not JSON: {exc}") from None
        if not isinstance(parsed, dict):
            raise ValueError("not a JSON object")
        offset, topics = parsed.get("commitlogOffset"), parsed.get("queues")
        if not isinstance(offset, int) or offset < 0 or not isinstance(topics, dict):
            raise ValueError("no commitlogOffset number or queues object")
        queues: dict[tuple[str, int], Extent] = {}
        for topic, table in topics.items():
            if topic_error(topic) is not None or not isinstance(table, dict):
                raise ValueError(f"bad topic {topic!r}")
            for queue_id, values in table.items():
                if (
                    not queue_id.isdigit()
                    or not isinstance(values, list)
                    or len(values) != 3
                    or not all(isinstance(v, int) and v >= 0 for v in values)
                    or values[0] > values[1]
                ):
                    raise ValueError(f"bad extent of {topic}/{queue_id}: {values!r}")
                queues[topic, int(queue_id)] = Extent(*values)
        return cls(offset, queues)

    def standing(self, deletions: TopicDeletions) -> dict[tuple[str, int], Extent]:
        """The extents that still hold: those of topics not deleted since they were
        written."""
        written = self.commitlog_offset
        return {
            key: extent
            for key, extent in self.queues.items()
            if deletions.offsets.get(key[0], -1) < written
        }

    def problems(
        self,
        queues: Mapping[tuple[str, int], ConsumeQueue],
        deletions: TopicDeletions,
        commitlog_min_offset: int,
    ) -> dict[tuple[str, int], str]:
        """The queues whose files lost what they held: they end before their recorded
        max offset, or start after their recorded min offset while the record of that
        entry is still in the log. Each with what is wrong."""
        found = {}
        for key, extent in self.standing(deletions).items():
            queue = queues.get(key)
            low, high = (queue.min_offset, queue.max_offset) if queue else (0, 0)
            if high < extent.max_offset:
                found[key] = (
                    f"its files end at entry {high}; at the last clean stop it had entries "
                    f"up to {extent.max_offset}"
                )
            elif low > extent.min_offset and extent.first >= commitlog_min_offset:
                found[key] = (
                    f"its files start at entry {low}; at the last clean stop it started at "
                    f"entry {extent.min_offset}, whose record (at {extent.first}) the "
                    f"commitlog still has"
                )
        return found

    @classmethod
    def of(cls, queues: Iterable[ConsumeQueue], commitlog_offset: int) -> QueueExtents:
        """The extents of ``queues`` now (those holding entries)."""
        found = {}
        for queue in queues:
            entry = queue.entry(queue.min_offset)
            if entry is not None:
                found[queue.topic, queue.queue_id] = Extent(
                    queue.min_offset, queue.max_offset, entry[0]
                )
        return cls(commitlog_offset, found)


def load_extents(path: Path) -> QueueExtents | None:
    """The extents in ``path`` (None if there are none, or they cannot be read: logged).
    Blocking."""
    try:
        return load_with_backup(path, QueueExtents.decode)
    except StoreError as exc:  # (damaged, and so is the backup: start without)
        log.error("%s; starting without the queue extents it held", exc)
        return None


def save_extents(path: Path, extents: QueueExtents) -> None:
    """Blocking (fsyncs)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    save_with_backup(path, extents.encode())


def forget_extents(path: Path) -> None:
    """Remove the file and its backup: queues shrank (a truncation). Blocking."""
    path.unlink(missing_ok=True)
    backup_path(path).unlink(missing_ok=True)
