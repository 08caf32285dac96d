"""Progress at a terminal: ``LiveCount``, a count and its rate drawn live on stderr.

A command that runs long shows its progress on stderr, and only when stderr is a
terminal; a pipe or a file gets nothing but the command's summary line. The display
never writes to stdout: a command's output there stays what it printed.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from collections import deque
from types import TracebackType
from typing import IO, Any

import typer
from rich.console import Console
from rich.progress import (
    BarColumn,
    Progress,
    ProgressColumn,
    Task,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)
from rich.text import Text

#: how often the live display is drawn again, with the lines printed meanwhile above it
LIVE_REFRESH_PER_S = 8.0
#: the rate shown is over the last this many seconds (0 after so long without progress)
LIVE_RATE_WINDOW_S = 5.0
#: lines ``LiveCount.echo`` keeps for the next drawing at most; one more is drawn at once
LIVE_MAX_WAITING_LINES = 10_000


class _CountColumn(ProgressColumn):
    """``count/total``, or ``count`` when there is no total."""

    def render(self, task: Task) -> Text:
        done = int(task.completed)
        return Text(f"{done}/{int(task.total)}" if task.total is not None else f"{done}")


class _RateColumn(ProgressColumn):
    """The recent rate, in messages per second (the task's field ``rate``)."""

    def render(self, task: Task) -> Text:
        return Text(f"{task.fields.get('rate', 0.0):,.0f} msgs/s")


def _same_terminal(one: IO[str], other: IO[str]) -> bool:
    """Whether ``one`` and ``other`` are the same terminal (``hamq ...`` as typed)."""
    try:
        return (
            one.isatty()
            and other.isatty()
            and os.path.samestat(os.fstat(one.fileno()), os.fstat(other.fileno()))
        )
    except (OSError, ValueError, AttributeError):
        return False


class LiveCount:
    """A count of messages and its rate, drawn live on stderr while the ``with`` block
    runs, when stderr is a terminal (not a dumb one); otherwise it only counts.

    A thread of its own draws the display (rich's Progress) LIVE_REFRESH_PER_S times a
    second and it is erased at the end (the command's summary line follows). A command
    prints its output with ``echo``: to stdout as ``typer.echo`` does, unless stdout is
    the display's terminal; then the line waits for the next drawing, which prints the
    lines waiting above the display in one write (drawing the display again for every
    line would cost more than the line). So stdout anywhere else (a pipe, a file,
    another terminal) gets only what the command printed, and the Trio thread never
    writes to the terminal, except when LIVE_MAX_WAITING_LINES wait (then the terminal
    sets the pace). The log (and whatever goes to ``sys.stderr``) is printed above the
    display as well. Leaving the block, by an error or a cancellation too, prints the
    lines still waiting, stops the thread and restores the streams.
    """

    def __init__(self, description: str, total: int | None = None) -> None:
        self.description = description
        self.total = total
        self.count = 0
        self._started = time.perf_counter()
        self._ended: float | None = None
        self._progress: Progress | None = None
        self._task: TaskID | None = None
        #: stdout is the terminal the display is drawn on: ``echo`` lines wait here
        self._stdout_drawn_on = False
        self._waiting: list[str] = []
        self._waiting_lock = threading.Lock()
        #: held while drawing: lines are printed in order, by one thread at a time
        self._drawing = threading.Lock()
        self._stop = threading.Event()
        self._drawer: threading.Thread | None = None
        #: (time, count) at the drawings of the last LIVE_RATE_WINDOW_S
        self._samples: deque[tuple[float, int]] = deque()
        self._log_handlers: list[tuple[logging.StreamHandler[Any], IO[str]]] = []

    @property
    def elapsed_s(self) -> float:
        """Seconds in the block (so far)."""
        return (self._ended if self._ended is not None else time.perf_counter()) - self._started

    def rate(self) -> float:
        """Messages per second over the whole block."""
        elapsed = self.elapsed_s
        return self.count / elapsed if elapsed > 0 else 0.0

    def add(self, n: int = 1) -> None:
        self.count += n  # (the next drawing shows it)

    def echo(self, line: str) -> None:
        """Print ``line`` on stdout, above the display when it shares the terminal
        (BrokenPipeError when stdout's reader has gone, as ``typer.echo``)."""
        if self._progress is None or not self._stdout_drawn_on:
            typer.echo(line)
            return
        with self._waiting_lock:
            self._waiting.append(line)
            full = len(self._waiting) > LIVE_MAX_WAITING_LINES
        if full:
            self._draw(self._progress)

    def _recent_rate(self, now: float, count: int) -> float:
        """Messages per second over the last LIVE_RATE_WINDOW_S (called when drawing)."""
        samples = self._samples
        samples.append((now, count))
        while now - samples[0][0] > LIVE_RATE_WINDOW_S:
            samples.popleft()
        then, count_then = samples[0]
        return (count - count_then) / (now - then) if now > then else 0.0

    def _draw(self, progress: Progress) -> None:
        """Print the lines waiting above the display, and draw the display again."""
        with self._drawing:
            assert self._task is not None
            now, count = time.perf_counter(), self.count
            rate = self._recent_rate(now, count)
            progress.update(self._task, completed=count, rate=rate)
            with self._waiting_lock:
                lines, self._waiting = self._waiting, []
            if lines:
                progress.console.print(Text("\n".join(lines)), soft_wrap=True, highlight=False)
            else:
                progress.refresh()

    def _keep_drawing(self, progress: Progress) -> None:
        while not self._stop.wait(1 / LIVE_REFRESH_PER_S):
            try:
                self._draw(progress)
            except OSError:  # the terminal has gone
                return

    def __enter__(self) -> LiveCount:
        self._started, self._ended = time.perf_counter(), None
        console = Console(stderr=True)
        if not console.is_terminal or console.is_dumb_terminal:
            return self
        progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            _CountColumn(),
            _RateColumn(),
            TimeElapsedColumn(),
            console=console,
            auto_refresh=False,
            transient=True,
            redirect_stdout=False,
            redirect_stderr=True,
        )
        self._stdout_drawn_on = _same_terminal(sys.stdout, sys.stderr)
        self._task = progress.add_task(
            self.description, total=self.total, completed=self.count, rate=0.0
        )
        self._samples.clear()
        self._samples.append((self._started, self.count))
        progress.start()
        self._progress = progress
        # the log's handlers hold the stderr of their start: point them at the display's
        stderr: IO[str] | None = getattr(sys.stderr, "rich_proxied_file", None)
        if stderr is not None:
            for handler in logging.getLogger().handlers:
                if isinstance(handler, logging.StreamHandler) and handler.stream is stderr:
                    handler.setStream(sys.stderr)
                    self._log_handlers.append((handler, stderr))
        self._stop.clear()
        self._drawer = threading.Thread(
            target=self._keep_drawing, args=(progress,), name="hamq-live-count", daemon=True
        )
        self._drawer.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self._ended = time.perf_counter()
        progress, self._progress = self._progress, None
        if progress is None:
            return
        self._stop.set()
        if self._drawer is not None:
            self._drawer.join()
            self._drawer = None
        try:
            self._draw(progress)  # the lines still waiting, and the last count
        finally:
            for handler, stream in self._log_handlers:
                handler.setStream(stream)
            self._log_handlers.clear()
            progress.stop()
