"""An HA connection's states and the moves allowed between them (pure).

The slave's client (slave.py):

    READY ──connect (classic)──▶ TRANSFER ──drop──▶ READY
    READY ──connect (auto-switch)──▶ HANDSHAKE ──epochs agreed──▶ TRANSFER
    HANDSHAKE ──drop──▶ READY                                  any ──▶ SHUTDOWN

READY: not connected, connecting; SHUTDOWN: stopped for good. A master's connection
(master_session.py) goes HANDSHAKE ──answered──▶ TRANSFER (auto-switch) or starts in
TRANSFER (classic), and ends with the connection. The ordinals are RocketMQ's
HAConnectionState, which the auto-switch headers carry; its SUSPEND (3) keeps its
ordinal in hamq.protocol.ha_wire's HAState, but hamq never enters it: no move leads
to it, and no machine starts in it.
"""

from __future__ import annotations

import logging

from hamq.protocol.ha_wire import HAState

log = logging.getLogger(__name__)

ALLOWED: dict[HAState, frozenset[HAState]] = {
    HAState.READY: frozenset({HAState.HANDSHAKE, HAState.TRANSFER}),
    HAState.HANDSHAKE: frozenset({HAState.TRANSFER, HAState.READY}),
    HAState.TRANSFER: frozenset({HAState.READY}),
    HAState.SHUTDOWN: frozenset(),
}


class IllegalTransition(RuntimeError):
    pass


class StateMachine:
    def __init__(self, name: str, state: HAState = HAState.READY) -> None:
        if state not in ALLOWED:
            raise IllegalTransition(f"{name}: cannot start in {state.name}")
        self.name = name
        self.state = state

    def set(self, new: HAState, why: str = "") -> None:
        """Move to ``new``; IllegalTransition if the table does not allow it."""
        if new == self.state:
            return
        if new is not HAState.SHUTDOWN and new not in ALLOWED[self.state]:
            raise IllegalTransition(f"{self.name}: {self.state.name} -> {new.name} is not allowed")
        log.info("%s: %s -> %s%s", self.name, self.state.name, new.name, f" ({why})" if why else "")
        self.state = new
