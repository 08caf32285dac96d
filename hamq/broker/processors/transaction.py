"""END_TRANSACTION (37): a producer commits, rolls back, or does not know yet.

Sent oneway by producers (their own decision, or the answer to a check-back), so the
answer — SUCCESS, or the refusal with its reason — reaches only a producer that asked
for one; refusals are logged, at a bounded rate (a peer can send them at will).
Refused: on a broker that is not master (SLAVE_NOT_AVAILABLE, as RocketMQ), on a
controller-mode master that has lost its lease (SERVICE_NOT_AVAILABLE, as its sends:
hamq/broker/roles.py), and an end naming no half message of the group it claims
(SYSTEM_ERROR). What it does:
hamq/broker/transactions.py.
"""

from __future__ import annotations

import logging

import trio

from hamq.broker.context import BrokerContext
from hamq.broker.transactions import TransactionService
from hamq.protocol import RemotingCommand, RequestCode, RequestError, ResponseCode
from hamq.protocol.headers import EndTransactionRequestHeader
from hamq.ratelimit import RateLimitedLog
from hamq.remoting import Connection, Dispatcher

log = logging.getLogger(__name__)


class EndTransactionProcessor:
    def __init__(self, ctx: BrokerContext, transactions: TransactionService) -> None:
        self.ctx = ctx
        self.transactions = transactions
        self.warnings = RateLimitedLog(log)

    def install(self, dispatcher: Dispatcher) -> None:
        dispatcher.register(RequestCode.END_TRANSACTION, self.end)

    def end(self, request: RemotingCommand, conn: Connection) -> RemotingCommand | None:
        try:
            if not self.ctx.roles.is_master:
                raise RequestError(
                    ResponseCode.SLAVE_NOT_AVAILABLE,
                    f"the broker[{self.ctx.config.broker_name} at {self.ctx.address}] is not "
                    "master: end transactions at the master",
                )
            refusal = self.ctx.roles.refusal(trio.current_time())
            if refusal is not None and refusal.code == ResponseCode.SERVICE_NOT_AVAILABLE:
                raise RequestError(refusal.code, refusal.why)  # (a fenced master)
            header = request.header(EndTransactionRequestHeader)
            self.transactions.end(header, conn.peer)
        except RequestError as exc:
            self.warnings.warning("refused", "END_TRANSACTION from %s refused: %s", conn.peer, exc)
            raise
        return None if request.is_oneway else request.response_to()
