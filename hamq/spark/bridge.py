"""Trio work for Spark's threads: items a Trio task emits, consumed from ordinary code.

Spark calls a data source's ``read`` and ``write`` in plain Python threads; hamq's
client is Trio. ``iterate_in_trio`` runs a producer in a Trio loop of its own (a daemon
thread); each item it emits is handed over through a small buffer, so the loop goes on
fetching (pulls from a broker) while the caller works on the last item. The loop ends
only once the caller has taken every item (the buffer's last ones included) and seen the
end, so no item is lost to a loop that finished first. Errors come out of the caller's
``next()`` as themselves; closing the iterator early cancels the loop and waits for it
to end.
"""

from __future__ import annotations

import threading
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, TypeVar

import trio

T = TypeVar("T")

#: how long closing waits for the loop to finish its cancellation
CLOSE_TIMEOUT_S = 30.0


class _Failed:
    def __init__(self, error: BaseException) -> None:
        self.error = error


def iterate_in_trio(
    produce: Callable[[Callable[[T], Awaitable[None]]], Awaitable[None]],
    *,
    name: str,
    buffer: int = 2,
) -> Iterator[T]:
    """The items ``produce(emit)`` emits (``await emit(item)``), run in a Trio loop
    thread of its own."""
    ready = threading.Event()
    loop: dict[str, Any] = {}

    async def main() -> None:
        send, receive = trio.open_memory_channel[T | _Failed](buffer)
        drained = trio.Event()
        with trio.CancelScope() as scope:
            loop.update(
                token=trio.lowlevel.current_trio_token(),
                scope=scope,
                receive=receive,
                drained=drained,
            )
            ready.set()
            async with send:
                try:
                    await produce(send.send)
                except Exception as exc:  # handed to the caller's thread
                    await send.send(_Failed(exc))
            # the caller still takes what the buffer holds, then sees the end
            await drained.wait()

    def run() -> None:
        try:
            trio.run(main)
        except BaseException as exc:  # the loop itself failed: the caller must hear of it
            loop["error"] = exc
        finally:
            ready.set()

    thread = threading.Thread(target=run, name=name, daemon=True)
    thread.start()
    ready.wait()
    try:
        while "error" not in loop:
            try:
                item = trio.from_thread.run(loop["receive"].receive, trio_token=loop["token"])
            except trio.EndOfChannel:
                trio.from_thread.run_sync(loop["drained"].set, trio_token=loop["token"])
                break
            except trio.RunFinishedError:
                break
            if isinstance(item, _Failed):
                raise item.error
            yield item
        if "error" in loop:
            raise loop["error"]
    finally:
        if thread.is_alive():
            try:
                trio.from_thread.run_sync(loop["scope"].cancel, trio_token=loop["token"])
            except trio.RunFinishedError:
                pass
            thread.join(CLOSE_TIMEOUT_S)
