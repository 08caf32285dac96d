"""A send's timing contract between a producer and a broker (numbers only, pure).

A broker may wait before it answers a send: a SYNC_FLUSH broker for its fsync
(``[store] sync_flush_timeout_s``), a SYNC_MASTER for a slave's ack (``[ha]
sync_timeout_s``); both waits run at once. When a wait runs out the broker still
answers, FLUSH_DISK_TIMEOUT or FLUSH_SLAVE_TIMEOUT: the message is stored, short of
durable. A client that gives up on a try before that answer cannot tell a stored
message from a lost one, and its retry stores a second copy.

The rule: a client's per-try wait exceeds the broker's longest wait by at least
SEND_ANSWER_MARGIN_S (``send_wait_too_short``). This module is the one owner of the
numbers both sides check the rule with: StoreConfig and HAConfig take their default
waits from here (BROKER_*_WAIT_S), the client knows a broker's waits only as those
defaults and warns when its own tries are shorter; a broker configured
to wait longer than the producer's default try allows warns when it starts. It lives
in protocol/ because it is a contract of the wire between the two, and both may
import protocol/ (clients may not import the store or HA packages that configure the
waits).
"""

#: a SYNC_FLUSH broker's default wait for its fsync (``[store] sync_flush_timeout_s``)
BROKER_SYNC_FLUSH_WAIT_S = 5.0
#: a SYNC_MASTER's default wait for a slave's ack (``[ha] sync_timeout_s``, RocketMQ's 3 s)
BROKER_SYNC_SLAVE_WAIT_S = 3.0
#: the longest a broker waits by default before it answers a send
BROKER_SEND_WAIT_S = max(BROKER_SYNC_FLUSH_WAIT_S, BROKER_SYNC_SLAVE_WAIT_S)
#: time for the broker's answer to come back after its wait ran out
SEND_ANSWER_MARGIN_S = 1.0
#: how long hamq's producer waits for one try's answer by default: well past
#: BROKER_SEND_WAIT_S, so that only a broker that hangs is given up for another try
SEND_ATTEMPT_TIMEOUT_S = 10.0
#: how long one send may take by default, retries included: room for three tries
SEND_TIMEOUT_S = 30.0


def send_wait_too_short(try_s: float, broker_wait_s: float = BROKER_SEND_WAIT_S) -> bool:
    """True if a client waiting ``try_s`` for a try's answer may give up before a broker
    that waits ``broker_wait_s`` answers (the rule above)."""
    return try_s < broker_wait_s + SEND_ANSWER_MARGIN_S
