"""Errors the remoting layer raises to its callers.

All derive from ``RemotingError`` and name the peer address, so a caller that talks
to many brokers can tell which one failed and move on.
"""

from __future__ import annotations


class RemotingError(Exception):
    """A remote call did not complete."""

    def __init__(self, addr: str, message: str) -> None:
        super().__init__(f"{addr}: {message}")
        self.addr = addr


class RemotingConnectError(RemotingError):
    """No connection could be opened to the address."""


class RemotingConnectionClosed(RemotingError):
    """The connection closed before the response arrived (or before sending)."""


class RemotingTimeoutError(RemotingError):
    """No response arrived within the caller's timeout."""


class RemotingFrameTooLarge(RemotingError):
    """A command that would exceed the configured maximum frame length; nothing was sent."""


def describe_failure(exc: BaseException) -> str:
    """A failed receive or send in words; the cause when the stream wrapped it."""
    text = str(exc)
    if not text and exc.__cause__ is not None:
        text = str(exc.__cause__) or type(exc.__cause__).__name__
    return text or type(exc).__name__
