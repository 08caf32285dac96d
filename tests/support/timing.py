"""Time in tests: a store/broker clock that follows Trio's clock, and the one way a test
waits for state that other tasks, threads or processes change (a bounded poll).

Under ``trio.testing.MockClock(autojump_threshold=0)`` both run in virtual time: the
clock jumps to the next sleep's deadline whenever every task waits, so a poll of a
minute's worth of store timers takes milliseconds of real time.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar, overload

import anyio
import trio

T = TypeVar("T")


def virtual_clock(base_ms: int = 1_700_000_000_000) -> Callable[[], int]:
    """A clock in ms that follows Trio's clock (so MockClock drives it), for the stores,
    brokers and nameservers that take a ``clock``."""
    return lambda: base_ms + int(trio.current_time() * 1000)


@overload
async def wait_for(
    condition: Callable[[], Awaitable[T]],
    timeout_s: float = ...,
    *,
    every_s: float = ...,
    what: str | Callable[[], str] = ...,
) -> T: ...


@overload
async def wait_for(
    condition: Callable[[], T],
    timeout_s: float = ...,
    *,
    every_s: float = ...,
    what: str | Callable[[], str] = ...,
) -> T: ...


async def wait_for(
    condition: Callable[[], Any],
    timeout_s: float = 10.0,
    *,
    every_s: float = 0.01,
    what: str | Callable[[], str] = "",
) -> Any:
    """Poll ``condition`` (a function, or an async one) every ``every_s`` until it
    returns something true, and return that. After ``timeout_s`` the test fails with an
    AssertionError naming ``what`` (a text, or a function making one from what was last
    seen) or else the condition — never a hang. On AnyIO: for tests on any event loop
    (on Trio, AnyIO's timeouts are Trio's, so MockClock drives them too)."""
    with anyio.move_on_after(timeout_s):
        while True:
            found = condition()
            if inspect.isawaitable(found):
                found = await found
            if found:
                return found
            await anyio.sleep(every_s)
    said = what() if callable(what) else what
    raise AssertionError(f"not within {timeout_s:g} s: {said or _name(condition)}")


def _name(condition: Callable[[], object]) -> str:
    """Where a lambda stands (file:line), or a function's name."""
    code = getattr(condition, "__code__", None)
    if code is not None and condition.__name__ == "<lambda>":
        return f"the condition at {code.co_filename.rsplit('/', 1)[-1]}:{code.co_firstlineno}"
    return getattr(condition, "__qualname__", repr(condition))
