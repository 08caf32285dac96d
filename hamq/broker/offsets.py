"""Consumer offsets: where each group is in each queue.

Keyed as RocketMQ keys them, ``topic@group`` -> queue id -> next offset to consume,
and persisted as ``config/consumerOffset.json`` every few seconds (RocketMQ: 5 s).
Offsets only move by commits (UPDATE_CONSUMER_OFFSET, or a pull with the commit
flag); a commit of a lower offset is applied too, as in RocketMQ (a consumer resetting
itself). Offsets do not hold back retention (RocketMQ's rule): a group that lags past
the oldest segment goes on from the oldest message kept.

An operator's reset (INVOKE_BROKER_TO_RESET_OFFSET) is a commit that also marks the
queue with the time of the reset (``resets``, persisted beside the offsets as
``resetTable``). A slave copies its master's offsets never going back, except where
the master's mark is newer than the slave's: there it takes the master's offset as
it is, and the mark with it. So a reset reaches the slave (at its next metadata sync)
and a failover after it goes on from the reset offsets, not from the old ones.
"""

from __future__ import annotations

from pathlib import Path

from hamq.broker.state_file import StateFile
from hamq.protocol.bodies import ConsumerOffsetSerializeWrapper

TOPIC_GROUP_SEPARATOR = "@"


class ConsumerOffsetManager(StateFile[ConsumerOffsetSerializeWrapper]):
    def __init__(self, path: Path) -> None:
        super().__init__(path, ConsumerOffsetSerializeWrapper)
        self.table: dict[str, dict[int, int]] = {}
        #: ``topic@group`` -> queue id -> when (ms) its offset was last reset
        self.resets: dict[str, dict[int, int]] = {}

    def restore(self, saved: ConsumerOffsetSerializeWrapper | None) -> None:
        if saved is not None:
            self.table = {key: dict(queues) for key, queues in saved.offset_table.items()}
            self.resets = {key: dict(queues) for key, queues in saved.reset_table.items()}

    def snapshot(self) -> ConsumerOffsetSerializeWrapper:
        return ConsumerOffsetSerializeWrapper(
            {k: dict(v) for k, v in self.table.items()},
            reset_table={k: dict(v) for k, v in self.resets.items()},
        )

    def commit(self, group: str, topic: str, queue_id: int, offset: int) -> None:
        queues = self.table.setdefault(f"{topic}{TOPIC_GROUP_SEPARATOR}{group}", {})
        if queues.get(queue_id) != offset:
            queues[queue_id] = offset
            self.mark_dirty()

    def reset(self, group: str, topic: str, queue_id: int, offset: int, now_ms: int) -> None:
        """An operator's reset: commit ``offset`` and mark the queue (see above)."""
        self.commit(group, topic, queue_id, offset)
        marks = self.resets.setdefault(f"{topic}{TOPIC_GROUP_SEPARATOR}{group}", {})
        marks[queue_id] = max(now_ms, marks.get(queue_id, 0) + 1)  # (always newer)
        self.mark_dirty()

    def query(self, group: str, topic: str, queue_id: int) -> int:
        """The committed offset, -1 if the group never committed one for this queue."""
        return self.table.get(f"{topic}{TOPIC_GROUP_SEPARATOR}{group}", {}).get(queue_id, -1)

    def forget_topic(self, topic: str) -> None:
        """Drop every group's offsets (and reset marks) in ``topic``: it was deleted,
        and its queues start again at 0 (RocketMQ's cleanOffsetByTopic)."""
        prefix = f"{topic}{TOPIC_GROUP_SEPARATOR}"
        keys = [key for key in self.table if key.startswith(prefix)]
        for key in keys:
            del self.table[key]
            self.resets.pop(key, None)
        if keys:
            self.mark_dirty()

    def topics_of(self, group: str) -> list[str]:
        """The topics ``group`` committed offsets in (RocketMQ's whichTopicByConsumer)."""
        suffix = f"{TOPIC_GROUP_SEPARATOR}{group}"
        return sorted(key[: -len(suffix)] for key in self.table if key.endswith(suffix))

    def merge_newer(self, wrapper: ConsumerOffsetSerializeWrapper) -> int:
        """A slave takes its master's offsets, never going back: an offset already past
        the master's (committed here while the master was away) stays. RocketMQ slaves
        overwrite, which consumes again what was consumed from the slave. An offset the
        master reset since the slave last took one is taken as it is, back or not.
        Returns how many offsets moved."""
        moved = 0
        for key, queues in wrapper.offset_table.items():
            mine = self.table.setdefault(key, {})
            their_marks = wrapper.reset_table.get(key, {})
            my_marks = self.resets.get(key, {})
            for queue_id, offset in queues.items():
                mark = their_marks.get(queue_id, 0)
                if mark > my_marks.get(queue_id, 0):
                    self.resets.setdefault(key, {})[queue_id] = mark
                    if mine.get(queue_id) != offset:
                        mine[queue_id] = offset
                        moved += 1
                    self.mark_dirty()
                elif offset > mine.get(queue_id, -1):
                    mine[queue_id] = offset
                    moved += 1
        if moved:
            self.mark_dirty()
        return moved
