"""Dividing a topic's queues among the members of a consumer group (pure).

Every member computes the same answer from the same inputs: the topic's queues and
the group's client ids, both sorted. ``allocate_average`` is RocketMQ's
AllocateMessageQueueAveragely: contiguous blocks, the first ``len(queues) % members``
members get one queue more; with more members than queues the last ones get none.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

Q = TypeVar("Q")


def allocate_average(queues: Sequence[Q], client_ids: Sequence[str], me: str) -> list[Q]:
    """The queues ``me`` consumes; none if ``me`` is not (yet) a member."""
    if me not in client_ids or not queues:
        return []
    index = list(client_ids).index(me)
    n, members = len(queues), len(client_ids)
    extra = n % members
    size = 1 if n <= members else n // members + (1 if index < extra else 0)
    start = index * size if index < extra else index * size + extra
    count = min(size, n - start)
    return [queues[(start + i) % n] for i in range(max(count, 0))]
