"""``hamq cluster up``'s supervisor: it starts a profile's children in order, keeps them
running, and stops them in the reverse order.

Order: nameservers, then masters (broker_id 0), then slaves, then brokers in controller
mode (``enable_controller_mode``: the controllers pick their ids and their master) start,
each awaited until its one ``hamq ... ready:`` line (cli/children.py; a broker says it
once a nameserver accepted its registration: one started before the nameservers it
names, unless it embeds one of them, would not be ready in time); then ``up`` waits
until every nameserver knows every master and slave (asked over TLS with the brokers'
settings when they have ``[remoting.tls]``; nameservers embedded in brokers learn of the
brokers started before theirs within seconds; at most REGISTERED_TIMEOUT_S, then a
warning) before it prints the table and says ready. They stop in reverse kind order:
controller-mode brokers, slaves, masters, nameservers; SIGTERM, then at most
STOP_TIMEOUT_S per group, then SIGKILL. SIGINT, SIGTERM and SIGHUP (a closed terminal)
stop them; a second SIGINT or SIGTERM kills what is left.

Supervision: a child that cannot start stops them all (exit 1). One that ends later
is reported in one line and the others keep running; with restarts on (``--restart``;
the default for controller-mode profiles, whose brokers come back as slaves) it is
started again, same command line and log, after ``restart_delay``: longer after each
quick failure (before ready, or less than QUICK_FAILURE_S after), and not at all
after RESTART_GIVE_UP of them in a row (one line says so); a restart appends to the
log after a ``---- hamq cluster up:`` line.

Invariants: every child is recorded the moment it is spawned and is waited for before
``run`` returns, on every path (a child that fails, a bad start, Ctrl-C, a second
Ctrl-C). ``run``'s exit code: 0 after a clean stop of children that all ran at that
time, 1 when a child failed to start, had ended by the stop (or all had), or had to be
killed.
"""

from __future__ import annotations

import contextlib
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import trio
import typer
from rich.console import Console
from rich.table import Table

from cli.children import KILL_WAIT_S, Child, describe_exit, log_tail, open_log, spawn
from cli.profiles import START_ORDER, ChildSpec, Kind, Profile
from hamq.protocol import ProtocolError, RemotingCommand, RequestCode, ResponseCode
from hamq.protocol.bodies import BodyError, ClusterInfo, decode_body
from hamq.remoting import RemotingClient, RemotingError

console = Console()

#: how long ``up`` waits, once all are ready, for every nameserver to know every broker
REGISTERED_TIMEOUT_S = 15.0
STOP_TIMEOUT_S = 15.0
#: a child that ends before it is ready, or sooner than this after, failed quickly
QUICK_FAILURE_S = 10.0
#: the pause before a restart, by quick failures in a row (the last one repeats)
RESTART_DELAYS_S = (0.5, 1.0, 2.0, 4.0)
#: after this many quick failures in a row a child is not started again
RESTART_GIVE_UP = 4

#: how the stop report names each kind, in the plural
_PLURAL = {
    Kind.NAMESERVER: "nameservers",
    Kind.MASTER: "masters",
    Kind.SLAVE: "slaves",
    Kind.BROKER: "controller-mode brokers",
}


def restart_delay(quick_failures: int) -> float | None:
    """The pause before starting a child again after ``quick_failures`` quick failures in
    a row (0: it had been running for a while), or None: do not start it again."""
    if quick_failures >= RESTART_GIVE_UP:
        return None
    return RESTART_DELAYS_S[min(quick_failures, len(RESTART_DELAYS_S) - 1)]


class ChildFailed(Exception):
    """A child that could not be started: ``up`` stops the others."""

    def __init__(self, child: Child, what: str) -> None:
        super().__init__(f"{child.title} {what}")
        self.child = child


class NothingLeft(Exception):
    """Every child has ended and none will be started again."""


def _say(message: str, *, err: bool = False) -> None:
    """Print, but never let a closed terminal or pipe stop the cluster from stopping."""
    try:
        typer.echo(message, err=err)
    except OSError:
        pass


class Supervisor:
    """Starts, watches (and restarts) and stops the children of one profile (``run``)."""

    def __init__(self, profile: Profile, log_dir: Path, log_level: str, *, restart: bool) -> None:
        self.profile = profile
        self.log_dir = log_dir
        self.log_level = log_level
        self.restart = restart
        self.children: list[Child] = []
        self.exit_code = 0
        #: children that ended and will not be started again
        self._ended = 0
        #: a second signal while stopping: SIGKILL whatever is left, now
        self._hurry = False
        self._stop_wait: trio.CancelScope | None = None

    async def run(self) -> int:
        """Up until a signal (or a child that cannot start, or none left), then down;
        the exit code."""
        with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM, signal.SIGHUP) as signals:
            try:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(self._until_signalled, signals, nursery.cancel_scope)
                    await self._up(nursery)
                    await trio.sleep_forever()  # the supervisors raise NothingLeft
            except* ChildFailed as group:
                for exc in _leaves(group):
                    assert isinstance(exc, ChildFailed)
                    self._report_failure(exc)
                self.exit_code = 1
            except* NothingLeft:
                _say("error: every process has ended; nothing left to run", err=True)
                self.exit_code = 1
            except* OSError as group:  # a log file or a first spawn that failed
                for exc in _leaves(group):
                    _say(f"error: {exc}", err=True)
                self.exit_code = 1
            finally:
                with trio.CancelScope(shield=True):
                    await self._down(signals)
        return self.exit_code

    async def _until_signalled(self, signals: AsyncIterator[int], scope: trio.CancelScope) -> None:
        async for signum in signals:
            _say(f"{signal.Signals(signum).name}: stopping the cluster", err=True)
            scope.cancel()
            return

    # ------------------------------------------------------------ up
    @property
    def _restart_note(self) -> str:
        return "restarts: on" if self.restart else "restarts: off"

    async def _up(self, nursery: trio.Nursery) -> None:
        p = self.profile
        _say(
            f"starting profile {p.name} ({p.directory}): {len(p.children)} process(es); "
            f"logs in {self.log_dir}/{p.name}-<name>.log; {self._restart_note}"
        )
        for spec in p.children:
            child = await self._start(spec)
            nursery.start_soon(self._supervise, child)
        await self._until_registered()
        self._print_table()

    def _namesrvs(self) -> list[str]:
        """The nameservers clients use: the profile's, and those the brokers name."""
        namesrvs: list[str] = []
        for child in self.children:
            for addr in [child.address] if child.spec.kind is Kind.NAMESERVER else child.namesrvs:
                if addr != "-" and addr not in namesrvs:
                    namesrvs.append(addr)
        return namesrvs

    async def _until_registered(self) -> None:
        """Wait until every nameserver knows every master and slave. A nameserver
        embedded in a broker that started after another one learns of that one only at
        its next registration (retried within seconds), and a client asking it meanwhile
        would find no route. Late (REGISTERED_TIMEOUT_S): one warning line; the cluster
        runs on."""
        brokers = {c.address for c in self.children if c.spec.kind in (Kind.MASTER, Kind.SLAVE)}
        standalone = {c.address for c in self.children if c.spec.kind is Kind.NAMESERVER}
        namesrvs = self._namesrvs()
        if all(addr in standalone for addr in namesrvs):
            return  # (nameservers that started first know every broker from its start)
        unknown = ["the nameservers did not answer"]
        async with RemotingClient(config=self.profile.remoting) as client:
            with trio.move_on_after(REGISTERED_TIMEOUT_S):
                while True:
                    unknown = await _not_registered(client, namesrvs, brokers)
                    if not unknown:
                        return
                    await trio.sleep(0.1)
        _say(
            f"warning: after {REGISTERED_TIMEOUT_S:g} s {'; '.join(unknown)}: a client asking "
            "such a nameserver may find no route until the next registration",
            err=True,
        )

    def _command(self, spec: ChildSpec) -> list[str]:
        return [sys.executable, "-m", "cli.main", "--log-level", self.log_level, *spec.args]

    async def _start(self, spec: ChildSpec) -> Child:
        """The first start: rotate the log, spawn, wait until ready. Raises ChildFailed
        (the child recorded, for ``_down``) or OSError (nothing started)."""
        log_path = self.log_dir / f"{self.profile.name}-{spec.name}.log"
        log = open_log(log_path)
        try:
            process = spawn(self._command(spec), log)
        except BaseException:
            log.close()
            raise
        child = Child(spec, process, log_path, log)  # spawned means recorded: no await between
        self.children.append(child)
        started = trio.current_time()
        problem = await child.until_ready()
        if problem is not None:
            raise ChildFailed(child, problem)
        _say(
            f"  {spec.name}: {spec.kind.value} ready at {child.address} "
            f"in {trio.current_time() - started:.1f} s (pid {process.pid})"
        )
        return child

    # ------------------------------------------------------------ supervising
    async def _supervise(self, child: Child) -> None:
        """Copy the child's stdout to its log until it ends; an end now is unexpected:
        one line says so. With restarts on, start it again after ``restart_delay`` of
        its quick failures in a row (ended before it was ready, or less than
        QUICK_FAILURE_S after); give up after RESTART_GIVE_UP of them. Raises
        NothingLeft once every child has ended for good."""
        quick = 0
        problem = await child.until_exit()
        while True:
            ready_at = child.ready_at
            if ready_at is None or trio.current_time() - ready_at < QUICK_FAILURE_S:
                quick += 1
            else:
                quick = 0
            delay = restart_delay(quick) if self.restart else None
            if delay is None:
                self._given_up(child, problem, quick)
                return
            _say(f"warning: {child.title} {problem}; starting it again in {delay:g} s", err=True)
            await trio.sleep(delay)
            problem = await self._restart(child) or await child.until_exit()

    async def _restart(self, child: Child) -> str | None:
        """Start the child's command again, its output appended to the same log; None
        once it is ready, else what went wrong (it does not run then)."""
        child.restarts += 1
        child.ready_at = None
        child.write_log(
            f"---- hamq cluster up: {child.title} had ended; start {child.restarts + 1}\n".encode()
        )
        started = trio.current_time()
        try:
            process = spawn(self._command(child.spec), child.log)
        except OSError as exc:
            return f"could not be started again ({exc.strerror or exc})"
        child.process = process  # spawned means recorded: no await between
        problem = await child.until_ready()
        if problem is not None:
            process.kill()  # a late one still runs
            with trio.move_on_after(KILL_WAIT_S):
                await process.wait()
            await process.aclose()
            return problem
        _say(
            f"  {child.spec.name}: {child.spec.kind.value} ready again at {child.address} "
            f"in {trio.current_time() - started:.1f} s (pid {process.pid}, "
            f"restart {child.restarts})"
        )
        return None

    def _given_up(self, child: Child, problem: str, quick: int) -> None:
        if self.restart:
            verdict = f"{quick} quick failures in a row: not starting it again"
        else:
            verdict = "not started again (--no-restart), the others keep running"
        _say(f"error: {child.title} {problem}; {verdict}; its log: {child.log_path}", err=True)
        self._ended += 1
        if self._ended == len(self.profile.children):
            raise NothingLeft

    def _print_table(self) -> None:
        columns = ("name", "kind", "role", "broker id", "address", "pid")
        rows = [
            (
                child.spec.name,
                child.spec.kind.value,
                child.spec.role,
                "-" if child.spec.broker_id is None else str(child.spec.broker_id),
                child.address,
                str(child.process.pid),
            )
            for child in self.children
        ]
        table = Table(title=f"hamq cluster {self.profile.name}")
        for column in columns:
            table.add_column(column)
        for row in rows:
            table.add_row(*row)
        # never cut a name, an address or a pid short, however narrow the output (a pipe
        # counts as 80 columns): each column as wide as its widest cell, plus the borders
        widths = [len(column) for column in columns]
        for row in rows:
            widths = [max(w, len(cell)) for w, cell in zip(widths, row, strict=True)]
        width = max(console.width, sum(widths) + 3 * len(widths) + 1)
        with contextlib.suppress(OSError):
            Console(width=width).print(table)
        namesrvs = self._namesrvs()
        namesrv = ";".join(namesrvs)
        hint = f"clients: --namesrv {namesrv if len(namesrvs) < 2 else repr(namesrv)}"
        tls = self.profile.remoting.tls if self.profile.remoting is not None else None
        if tls is not None:  # (a root option: hamq --tls-ca CA produce ...)
            hint += f"; TLS: hamq --tls-ca {tls.ca_file or '<the CA of the servers>'} ..."
        _say(hint)
        _say(
            f"hamq cluster ready: {self.profile.name}, {len(self.children)} process(es); "
            f"logs in {self.log_dir}; {self._restart_note}; Ctrl-C stops them all"
        )

    def _report_failure(self, exc: ChildFailed) -> None:
        child = exc.child
        lines = log_tail(child.log_path)
        _say(f"error: {exc}; the last lines of {child.log_path}:", err=True)
        for line in lines or ["(empty)"]:
            _say(f"    {line}", err=True)

    # ------------------------------------------------------------ down
    async def _down(self, signals: AsyncIterator[int]) -> None:
        """Stop every child: controller-mode brokers, slaves, masters, nameservers;
        report how each ended."""
        present = {child.spec.kind for child in self.children}
        kinds = [_PLURAL[kind] for kind in reversed(START_ORDER) if kind in present]
        if kinds:
            _say(f"stopping: {', then '.join(kinds)}")
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._hurry_on_signal, signals)
                for kind in reversed(START_ORDER):
                    group = [c for c in self.children if c.spec.kind is kind]
                    if group:
                        await self._stop_group(group)
                nursery.cancel_scope.cancel()
        finally:
            for child in self.children:
                child.log.close()
                await child.process.aclose()

    async def _hurry_on_signal(self, signals: AsyncIterator[int]) -> None:
        async for signum in signals:
            if signum == signal.SIGHUP:  # a closing terminal may send two: not a hurry
                continue
            _say(f"{signal.Signals(signum).name} again: killing what is left", err=True)
            self._hurry = True
            if self._stop_wait is not None:
                self._stop_wait.cancel()

    async def _stop_group(self, group: list[Child]) -> None:
        """SIGTERM (SIGKILL in a hurry) to each, at most STOP_TIMEOUT_S, then SIGKILL."""
        running = []
        for child in group:
            code = child.process.returncode
            if code is None:
                running.append(child)
            elif not child.outcome:
                child.outcome = f"had already ended ({describe_exit(code)})"
                self.exit_code = 1
        sig = signal.SIGKILL if self._hurry else signal.SIGTERM
        started = trio.current_time()
        took: dict[int, float] = {}

        async def wait(child: Child) -> None:
            await child.process.wait()
            took[id(child)] = trio.current_time() - started

        for child in running:
            child.process.send_signal(sig)
        with trio.move_on_after(STOP_TIMEOUT_S) as self._stop_wait:
            async with trio.open_nursery() as waiting:
                for child in running:
                    waiting.start_soon(wait, child)
        self._stop_wait = None
        waited = trio.current_time() - started
        stubborn = [c for c in running if c.process.returncode is None]
        for child in stubborn:
            child.process.kill()
        with trio.move_on_after(KILL_WAIT_S):
            async with trio.open_nursery() as waiting:
                for child in stubborn:
                    waiting.start_soon(child.process.wait)
        for child in running:
            code = child.process.returncode
            if code is None:
                child.outcome = f"still running after SIGKILL (pid {child.process.pid})"
            elif child in stubborn:
                child.outcome = f"still running {waited:.1f} s after {sig.name}; SIGKILLed"
            else:
                seconds = took.get(id(child), waited)
                child.outcome = f"ended {seconds:.1f} s after {sig.name} ({describe_exit(code)})"
            if code not in (0, -signal.SIGTERM):  # (SIGTERM before its handler was set)
                self.exit_code = 1
        for child in group:
            _say(f"  {child.title}: {child.outcome}")


async def _not_registered(
    client: RemotingClient, namesrvs: list[str], brokers: set[str]
) -> list[str]:
    """Which nameserver does not know which of ``brokers`` (by address) yet: ``"ns
    does not know b1, b2"`` or ``"ns does not answer (...)"`` each; a nameserver that
    refuses the question (ACL) is not asked again."""
    unknown = []
    for namesrv in namesrvs:
        request = RemotingCommand.request(RequestCode.GET_BROKER_CLUSTER_INFO)
        try:
            response = await client.invoke(namesrv, request, 3.0)
            if response.code != ResponseCode.SUCCESS:
                continue
            info = decode_body(ClusterInfo, response.body)
        except (RemotingError, ProtocolError, BodyError) as exc:
            unknown.append(f"{namesrv} does not answer ({exc})")
            continue
        known = {a for data in info.broker_addr_table.values() for a in data.broker_addrs.values()}
        if missing := sorted(brokers - known):
            unknown.append(f"{namesrv} does not know {', '.join(missing)}")
    return unknown


def _leaves(group: BaseExceptionGroup[Any]) -> list[BaseException]:
    out: list[BaseException] = []
    for exc in group.exceptions:
        out += _leaves(exc) if isinstance(exc, BaseExceptionGroup) else [exc]
    return out
