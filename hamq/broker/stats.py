"""What a broker counts as it works: read by metrics and admin, never reset.

- per topic: messages and bytes stored (in) and delivered by pulls (out); bytes are
  whole stored records, as RocketMQ's broker stats count them;
- every send answer by SendStatus (SEND_OK, FLUSH_DISK_TIMEOUT, FLUSH_SLAVE_TIMEOUT,
  SLAVE_NOT_AVAILABLE), with a histogram of its latency (seconds, from the request's
  arrival to its answer); sends refused with nothing stored, by response code;
- pull requests by outcome (a response code's name, or HELD for a long poll), counted
  once each: a held pull's later answer adds messages out, not a second request;
- damaged records pulls passed over, by topic (each time a pull meets one).

Plain counters on the hot path (a dict look-up and a few additions, no locks: one Trio
thread). Nothing here knows Prometheus: hamq/broker/metrics.py reads a broker's
counters at scrape time.
"""

from __future__ import annotations

from bisect import bisect_left
from collections import Counter

from hamq.protocol import ResponseCode

#: histogram bucket upper bounds (s); a last, implicit bucket holds the rest (+Inf)
LATENCY_BUCKETS_S = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
)


#: response codes' names by number (an enum lookup costs ten times a dict's: every send
#: and pull counts its answer by name)
_CODE_NAMES: dict[int, str] = {code.value: code.name for code in ResponseCode}


def code_name(code: int) -> str:
    """A response code's name (``SYSTEM_BUSY``), or its number if it has none."""
    return _CODE_NAMES.get(code) or str(code)


class TopicCounters:
    __slots__ = ("bytes_in", "bytes_out", "messages_in", "messages_out")

    def __init__(self) -> None:
        self.messages_in = 0
        self.bytes_in = 0
        self.messages_out = 0
        self.bytes_out = 0


class LatencyHistogram:
    """Counts per bucket of LATENCY_BUCKETS_S (not cumulative; the last is +Inf)."""

    __slots__ = ("counts", "sum_s")

    def __init__(self) -> None:
        self.counts = [0] * (len(LATENCY_BUCKETS_S) + 1)
        self.sum_s = 0.0

    def observe(self, seconds: float) -> None:
        self.counts[bisect_left(LATENCY_BUCKETS_S, seconds)] += 1
        self.sum_s += seconds

    @property
    def count(self) -> int:
        return sum(self.counts)


class BrokerStats:
    def __init__(self) -> None:
        self.topics: dict[str, TopicCounters] = {}
        #: SendStatus name -> latency of the answers with that status
        self.sends: dict[str, LatencyHistogram] = {}
        #: response code name -> sends refused so (nothing stored)
        self.sends_refused: Counter[str] = Counter()
        #: outcome -> pull requests
        self.pulls: Counter[str] = Counter()
        #: topic -> damaged records pulls passed over (a record not decoding, a bad CRC)
        self.damaged_skipped: Counter[str] = Counter()

    def _topic(self, topic: str) -> TopicCounters:
        counters = self.topics.get(topic)
        if counters is None:
            counters = self.topics[topic] = TopicCounters()
        return counters

    def stored(self, topic: str, messages: int, size: int) -> None:
        counters = self._topic(topic)
        counters.messages_in += messages
        counters.bytes_in += size

    def delivered(self, topic: str, messages: int, size: int) -> None:
        counters = self._topic(topic)
        counters.messages_out += messages
        counters.bytes_out += size

    def answered(self, status: str, latency_s: float) -> None:
        histogram = self.sends.get(status)
        if histogram is None:
            histogram = self.sends[status] = LatencyHistogram()
        histogram.observe(latency_s)

    def refused(self, code: str) -> None:
        self.sends_refused[code] += 1

    def pulled(self, outcome: str) -> None:
        self.pulls[outcome] += 1

    def skipped_damaged(self, topic: str, records: int) -> None:
        self.damaged_skipped[topic] += records

    def forget_topic(self, topic: str) -> None:
        """A deleted topic's counters go with it (metrics' label sets stay bounded)."""
        self.topics.pop(topic, None)
        self.damaged_skipped.pop(topic, None)

    @property
    def messages_in(self) -> int:
        return sum(c.messages_in for c in self.topics.values())

    @property
    def messages_out(self) -> int:
        return sum(c.messages_out for c in self.topics.values())
