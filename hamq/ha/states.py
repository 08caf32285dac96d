"""The HA slave client's states and the moves allowed between them (pure).

    READY ──connect (classic)──▶ TRANSFER ──drop──▶ READY
    READY ──connect (auto-switch)──▶ HANDSHAKE ──epochs agreed──▶ TRANSFER
    HANDSHAKE ──drop──▶ READY        READY ◀──▶ SUSPEND        any ──▶ SHUTDOWN

READY: not connected, connecting; SUSPEND: replication paused (RocketMQ's; reserved for
role changes); SHUTDOWN: stopped for good. A master's connection goes HANDSHAKE ->
TRANSFER (auto-switch) or starts in TRANSFER (classic). The ordinals are RocketMQ's
HAConnectionState, which the auto-switch headers carry.
"""

from __future__ import annotations

import logging

from hamq.protocol.ha_wire import HAState

log = logging.getLogger(__name__)

ALLOWED: dict[HAState, frozenset[HAState]] = {
    HAState.READY: frozenset({HAState.HANDSHAKE, HAState.TRANSFER, HAState.SUSPEND}),
    HAState.HANDSHAKE: frozenset({HAState.TRANSFER, HAState.READY}),
    HAState.TRANSFER: frozenset({HAState.READY}),
    HAState.SUSPEND: frozenset({HAState.READY}),
    HAState.SHUTDOWN: frozenset(),
}


class IllegalTransition(RuntimeError):
    pass


class StateMachine:
    def __init__(self, name: str, state: HAState = HAState.READY) -> None:
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
