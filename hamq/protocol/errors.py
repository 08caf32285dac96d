"""Errors raised by the sans-IO protocol layer.

- ``ProtocolError``: the byte stream cannot be trusted any more (bad frame length,
  a header that does not parse). The I/O layer closes that connection and nothing else.
- ``HeaderError``: a well-framed command whose ext fields do not fit the typed header
  class (missing required field, a value of the wrong kind). The stream is fine; the
  request is answered with ``code`` and the message as its remark.
"""

from __future__ import annotations

from hamq.protocol.codes import ResponseCode


class ProtocolError(Exception):
    """The peer sent bytes that are not a valid RocketMQ remoting frame."""


class RequestError(Exception):
    """A request that is refused with a given response code and remark.

    Processors raise it (or a subclass) to answer a request with a specific code;
    the remoting layer turns it into a response with ``code`` and ``str(self)``.
    """

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


class HeaderError(RequestError):
    """Ext fields that do not make a valid typed header; names every bad field."""

    def __init__(self, message: str) -> None:
        super().__init__(ResponseCode.INVALID_PARAMETER, message)
