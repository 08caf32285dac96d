"""What the client raises. Every error says what was wrong and where.

- ``ClientError``: the base of everything below.
- ``InvalidArgumentError``: the caller's input (topic name, body size, a selector's
  answer, an address) was refused before anything was sent. Also a ``ValueError``.
- ``BrokerError``: a broker answered with a refusal; ``code`` is RocketMQ's response
  code, ``remark`` the broker's reason, ``addr`` the broker.
- ``NoRouteError``: no nameserver knows the topic (and no broker may auto-create it),
  or it has no queue a send may go to; ``NoMasterError``, one of them: the topic exists
  but the broker groups serving it have no master now (the master is down; a failover
  may bring one).
- ``NameServerUnavailableError``: none of the configured nameservers answered.
- ``SendError``: every attempt of a send failed; ``__cause__`` is the last failure and
  ``attempts`` lists each one.
"""

from __future__ import annotations

from hamq.protocol import RequestError, code_name
from hamq.remoting import RemotingError


class ClientError(Exception):
    """Base of the client's errors."""


class InvalidArgumentError(ClientError, ValueError):
    """The caller's input was refused before anything was sent."""


class BrokerError(ClientError):
    def __init__(self, code: int, remark: str | None, addr: str) -> None:
        self.code = code
        self.remark = remark or ""
        self.addr = addr
        super().__init__(f"broker {addr} answered {code_name(code, response=True)}: {self.remark}")


class NoRouteError(ClientError):
    """No route for a topic."""


class NoMasterError(NoRouteError):
    """The topic exists, but no broker group serving it has a master now."""


class NameServerUnavailableError(ClientError):
    """No configured nameserver answered."""


class SendError(ClientError):
    def __init__(self, message: str, attempts: list[str]) -> None:
        self.attempts = attempts
        super().__init__(message + ("; attempts: " + " | ".join(attempts) if attempts else ""))


#: what talking to a server may raise: no answer (RemotingError), a refusal or a lookup
#: that failed (ClientError), an answer that does not decode (RequestError)
NETWORK_ERRORS = (RemotingError, ClientError, RequestError)
