"""Warnings that a hostile or broken peer can repeat at will, logged at a bounded rate.

A fuzzer sending malformed frames, a thousand slowloris connections, accept() failing
with EMFILE every 100 ms: each would otherwise write a line per event and fill the disk
the broker needs. ``RateLimitedLog`` lets ``burst`` lines of one kind (a ``key``)
through per ``interval_s``; the rest of that window are counted, and the count is said
on the next line of that kind that gets through ("... (41 more like this not logged
before it)"). No timer: nothing is logged when nothing happens. Kinds are independent, so
a flood of one never hides another.

A line is also cut to MAX_LINE_CHARS: what it quotes of the peer's bytes (a header
key, a name) is the peer's to choose, and could be megabytes.

Not thread-safe; one per server (owned by it, passed down to its connections). A
module of its own, below every layer: the remoting and HA servers, the ACL, the
processors and the metrics endpoint all log through it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import attrs

#: by default: 5 lines of a kind per 10 s
DEFAULT_INTERVAL_S = 10.0
DEFAULT_BURST = 5
#: a longer line is cut (saying how much was)
MAX_LINE_CHARS = 1000


@attrs.define
class _Window:
    started: float
    logged: int = 0
    suppressed: int = 0


class RateLimitedLog:
    def __init__(
        self,
        logger: logging.Logger,
        *,
        interval_s: float = DEFAULT_INTERVAL_S,
        burst: int = DEFAULT_BURST,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if interval_s <= 0 or burst < 1:
            raise ValueError("interval_s must be positive and burst at least 1")
        self.logger = logger
        self.interval_s = interval_s
        self.burst = burst
        self._clock = clock
        self._windows: dict[str, _Window] = {}
        #: lines not written, by kind, since this object was made
        self.suppressed: dict[str, int] = {}

    def log(self, level: int, key: str, message: str, *args: object) -> bool:
        """Log ``message % args`` unless ``key`` had its ``burst`` this window; whether
        it was written."""
        now = self._clock()
        window = self._windows.get(key)
        earlier = 0
        if window is None or now - window.started >= self.interval_s:
            if window is not None:
                earlier = window.suppressed
            window = self._windows[key] = _Window(now)
        if window.logged >= self.burst:
            window.suppressed += 1
            self.suppressed[key] = self.suppressed.get(key, 0) + 1
            return False
        window.logged += 1
        text = message % args if args else message
        if len(text) > MAX_LINE_CHARS:
            text = f"{text[:MAX_LINE_CHARS]}... ({len(text) - MAX_LINE_CHARS} characters cut)"
        if earlier:
            text += f" ({earlier} more like this not logged before it)"
        self.logger.log(level, "%s", text)
        return True

    def warning(self, key: str, message: str, *args: object) -> bool:
        return self.log(logging.WARNING, key, message, *args)
