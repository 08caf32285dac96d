"""Consumer offsets: where each group is in each queue.

Keyed as RocketMQ keys them, ``topic@group`` -> queue id -> next offset to consume,
and persisted as ``config/consumerOffset.json`` every few seconds (RocketMQ: 5 s).
Offsets only move by commits (UPDATE_CONSUMER_OFFSET, or a pull with the commit
flag); a commit of a lower offset is applied too, as in RocketMQ (a consumer resetting
itself). Offsets do not hold back retention (RocketMQ's rule): a group that lags past
the oldest segment goes on from the oldest message kept.
"""

from __future__ import annotations

from pathlib import Path

from hamq.broker.state import StateFile
from hamq.protocol.bodies import ConsumerOffsetSerializeWrapper

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

    def merge_newer(self, wrapper: ConsumerOffsetSerializeWrapper) -> int:
        """A slave takes its master's offsets, never going back: an offset already past
        the master's (committed here while the master was away) stays. RocketMQ slaves
        overwrite, which consumes again what was consumed from the slave. Returns how
        many offsets moved."""
        moved = 0
        for key, queues in wrapper.offset_table.items():
            mine = self.table.setdefault(key, {})
            for queue_id, offset in queues.items():
                if offset > mine.get(queue_id, -1):
                    mine[queue_id] = offset
                    moved += 1
        if moved:
            self.mark_dirty()
        return moved
