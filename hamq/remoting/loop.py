"""The running event loop's own primitives for the per-request hot path, looked up once.

hamq's connections and clients are written on AnyIO, so they run under Trio and asyncio
alike. AnyIO's wrappers cost on every call, though: ``anyio.Event()`` looks the backend
up each time, and its cancel scopes and clock wrap Trio's. A connection makes an Event
and a timeout scope per request and reads the clock per received chunk, so it takes
the running loop's primitives once, when it is made: under Trio, Trio's own (AnyIO's
Trio backend is built on exactly these, so they mix with AnyIO's freely); under
asyncio, AnyIO's (its asyncio Event class without the per-call lookup).
"""

from __future__ import annotations

import sys
from collections.abc import Awaitable, Callable
from contextlib import AbstractContextManager
from typing import Protocol

import anyio
import anyio.lowlevel
import attrs
import sniffio


class EventLike(Protocol):
    def set(self) -> None: ...

    def is_set(self) -> bool: ...

    def wait(self) -> Awaitable[object]: ...


class ScopeLike(Protocol):
    @property
    def cancelled_caught(self) -> bool: ...


@attrs.frozen
class LoopPrimitives:
    #: the name sniffio gives the loop: "trio" or "asyncio"
    name: str
    #: a new Event of the running loop
    event: Callable[[], EventLike]
    #: a cancel scope that ends its block after that many seconds (``cancelled_caught``)
    move_on_after: Callable[[float], AbstractContextManager[ScopeLike]]
    #: the loop's clock, seconds
    current_time: Callable[[], float]
    #: let the other tasks ready to run go first (a cancellation point)
    checkpoint: Callable[[], Awaitable[None]]


#: AnyIO's own primitives (a backend lookup per call), for an object made before it knows
#: the loop it will run in: it takes ``current_loop()`` when it starts
ANY_LOOP = LoopPrimitives(
    "", anyio.Event, anyio.move_on_after, anyio.current_time, anyio.lowlevel.checkpoint
)


def current_loop() -> LoopPrimitives:
    """The primitives of the event loop running this task."""
    name = sniffio.current_async_library()
    if name == "trio":
        trio = sys.modules["trio"]  # (imported: it is running)
        return LoopPrimitives(
            name, trio.Event, trio.move_on_after, trio.current_time, trio.lowlevel.checkpoint
        )
    return LoopPrimitives(
        name,
        type(anyio.Event()),
        anyio.move_on_after,
        anyio.current_time,
        anyio.lowlevel.checkpoint,
    )
