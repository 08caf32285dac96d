"""Topic deletions: where in the CommitLog each deleted topic was deleted.

Deleting a topic (``MessageStore.delete_topic``) appends a record of
TOPIC_DELETION_TOPIC whose body is the topic's name, in the same synchronous step that
sets the topic's next queue offsets back to 0 (no send slips in between). That record
is the deletion: it is replicated as every record is, so a slave deletes the topic at
the same place of the log as its master, and it is as durable as the log.

The reput task applies a deletion when it dispatches its record (``TopicDeletions.apply``):
the topic's consume queues are destroyed, and the table (topic -> the record's offset)
is saved to ``<store>/config/topicDeletions.json`` before any later record is
dispatched. From then on every record of the topic before that offset is dead
(``dead``): never dispatched again (a rebuild of the queues from the log passes over
it), never found by a key or by its id, never delivered from a delay level or by a
transaction's commit. The records of the topic after it are a new topic, whose queue
offsets start at 0 (RocketMQ's deleteTopic destroys the queues too).

Invariants:
- a topic's offset in the table only grows (a second deletion of the same topic moves
  it on; one offset is enough, every earlier record is before it too);
- applying a deletion the table already covers (recovery dispatching its record again)
  changes nothing;
- the file's JSON is ``{"deletions": {"<topic>": <commitlog offset>, ...}}``, written
  with ``save_with_backup`` (hamq/store/checkpoint.py); an entry whose offset the log's
  start has passed is dropped at the next save (none of the topic's old records is left).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from hamq.protocol.message import topic_error
from hamq.store.checkpoint import load_with_backup, save_with_backup

log = logging.getLogger(__name__)


def decode_deletions(data: bytes) -> dict[str, int]:
    """The table from the file's bytes; ValueError names what is wrong."""
    try:
        parsed = json.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"not JSON: {exc}") from None
    table = parsed.get("deletions") if isinstance(parsed, dict) else None
    if not isinstance(table, dict):
        raise ValueError("no deletions object")
    deletions = {}
    for topic, offset in table.items():
        if topic_error(topic) is not None or not isinstance(offset, int) or offset < 0:
            raise ValueError(f"bad entry {topic!r}: {offset!r}")
        deletions[topic] = offset
    return deletions


def encode_deletions(deletions: dict[str, int]) -> bytes:
    return json.dumps({"deletions": dict(sorted(deletions.items()))}, indent=1).encode()


class TopicDeletions:
    """The table of deleted topics, loaded at start (``load``) and kept by the reput
    task (``apply``); everything that reads records by offset asks ``dead``."""

    def __init__(self, path: Path) -> None:
        self.path = path
        #: topic -> the CommitLog offset of its (last) deletion record
        self.offsets: dict[str, int] = {}

    def load(self) -> None:
        """Blocking. MetadataFileError (a StoreError) names a damaged file without a
        usable backup."""
        self.offsets = load_with_backup(self.path, decode_deletions) or {}

    def dead(self, topic: str, physical_offset: int) -> bool:
        """Whether the record of ``topic`` at ``physical_offset`` was deleted with it."""
        deleted = self.offsets.get(topic)
        return deleted is not None and physical_offset < deleted

    def apply(self, topic: str, physical_offset: int, commitlog_min_offset: int) -> bool:
        """Record the deletion of ``topic`` at ``physical_offset`` and save the table
        (blocking: an fsync); False if the table covered it already. OSError from the
        save leaves the table in memory as it was."""
        if self.offsets.get(topic, -1) >= physical_offset:
            return False
        offsets = {t: o for t, o in self.offsets.items() if o > commitlog_min_offset}
        offsets[topic] = physical_offset
        self.path.parent.mkdir(parents=True, exist_ok=True)
        save_with_backup(self.path, encode_deletions(offsets))
        self.offsets = offsets
        log.warning("topic %s deleted at commitlog offset %d", topic, physical_offset)
        return True
