"""Trio I/O around hamq.protocol: connections, the processor table, server and client.

- connection.py  one stream, both directions: dispatch, invoke, backpressure
- dispatch.py    Dispatcher: request code -> processor (inline or async)
- server.py      RemotingServer
- client.py      RemotingClient
- config.py      RemotingConfig
- errors.py      RemotingError and its kinds
"""

from hamq.remoting.address import (
    check_address,
    check_addresses,
    format_address,
    parse_address,
)
from hamq.remoting.client import RemotingClient
from hamq.remoting.config import RemotingConfig
from hamq.remoting.connection import Connection, ConnectionStatistics, Responder
from hamq.remoting.dispatch import AsyncProcessor, Dispatcher, InlineProcessor
from hamq.remoting.errors import (
    RemotingConnectError,
    RemotingConnectionClosed,
    RemotingError,
    RemotingFrameTooLarge,
    RemotingTimeoutError,
)
from hamq.remoting.server import RemotingServer, ServerStatistics

__all__ = [
    "AsyncProcessor",
    "Connection",
    "ConnectionStatistics",
    "Dispatcher",
    "InlineProcessor",
    "RemotingClient",
    "RemotingConfig",
    "RemotingConnectError",
    "RemotingConnectionClosed",
    "RemotingError",
    "RemotingFrameTooLarge",
    "RemotingServer",
    "RemotingTimeoutError",
    "Responder",
    "ServerStatistics",
    "check_address",
    "check_addresses",
    "format_address",
    "parse_address",
]
