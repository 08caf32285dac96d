"""Consumer offsets: where each group is in each queue.

Keyed as RocketMQ keys them, ``topic@group`` -> queue id -> next offset to consume,
and persisted as ``config/consumerOffset.json`` every few seconds (RocketMQ: 5 s).
Offsets only move by commits (UPDATE_CONSUMER_OFFSET, or a pull with the commit
flag); a commit of a lower offset is applied too, as in RocketMQ (a consumer resetting
itself). The lowest CommitLog offset any group still needs is what retention keeps.
"""

from __future__ import annotations

from pathlib import Path

from hamq.broker.state import StateFile
from hamq.protocol.bodies import ConsumerOffsetSerializeWrapper
from hamq.store import MessageStore

TOPIC_GROUP_SEPARATOR = "@"


class ConsumerOffsetManager(StateFile[ConsumerOffsetSerializeWrapper]):
    def __init__(self, path: Path) -> None:
        super().__init__(path, ConsumerOffsetSerializeWrapper)
        self.table: dict[str, dict[int, int]] = {}

    def restore(self, saved: ConsumerOffsetSerializeWrapper | None) -> None:
        if saved is not None:
            self.table = {key: dict(queues) for key, queues in saved.offset_table.items()}

    def snapshot(self) -> ConsumerOffsetSerializeWrapper:
        return ConsumerOffsetSerializeWrapper({k: dict(v) for k, v in self.table.items()})

    def commit(self, group: str, topic: str, queue_id: int, offset: int) -> None:
        queues = self.table.setdefault(f"{topic}{TOPIC_GROUP_SEPARATOR}{group}", {})
        if queues.get(queue_id) != offset:
            queues[queue_id] = offset
            self.mark_dirty()

    def query(self, group: str, topic: str, queue_id: int) -> int:
        """The committed offset, -1 if the group never committed one for this queue."""
        return self.table.get(f"{topic}{TOPIC_GROUP_SEPARATOR}{group}", {}).get(queue_id, -1)

    def groups_of(self, topic: str) -> list[str]:
        prefix = f"{topic}{TOPIC_GROUP_SEPARATOR}"
        return sorted(key[len(prefix) :] for key in self.table if key.startswith(prefix))

    def delete_group(self, group: str) -> None:
        suffix = f"{TOPIC_GROUP_SEPARATOR}{group}"
        for key in [k for k in self.table if k.endswith(suffix)]:
            del self.table[key]
            self.mark_dirty()

    def lowest_needed_commitlog_offset(self, store: MessageStore) -> int:
        """The lowest CommitLog offset a committed group offset still points at."""
        lowest = store.commitlog_max_offset
        for key, queues in self.table.items():
            topic = key.rpartition(TOPIC_GROUP_SEPARATOR)[0]
            for queue_id, offset in queues.items():
                queue = store.queues.get(topic, queue_id)
                entry = queue.entry(offset) if queue is not None else None
                if entry is not None:
                    lowest = min(lowest, entry[0])
        return lowest
