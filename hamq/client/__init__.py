"""hamq's client: producers, consumers and administration, on Trio or asyncio.

Written on AnyIO, so the same classes run natively in a Trio program (``trio.run``) and
in an asyncio one (``asyncio.run``, uvloop too): ``async with Producer(...)`` in either,
its tasks in the caller's event loop. The broker, nameserver and replication stay on
Trio; only the client is loop-agnostic.

The modules, one job each:

- producer.py         Producer: send, send_oneway, send_async, send_batch, ordered sends
- send_attempts.py    a send's tries: where each goes, retries, riding out a failover
- master_watch.py     a producer's check that the broker a try waits on is still master
- auto_batch.py       sends that wait behind others to one topic go as one batch
- transaction.py      TransactionProducer: send_in_transaction, check-backs
- consumer.py         PullConsumer, and the pull/offset requests both consumers make
- push_consumer.py    PushConsumer: a consumer group member's settings and counters
- push_run.py         one run of a PushConsumer: rebalancing, pulling, handling, offsets
- send_back.py        a push consumer's failed messages sent back for a retry
- simple_consumer.py  SimpleConsumer: pop consumption (receive, ack, invisible time)
- rebalance.py        queue allocation among a group's members (pure)
- admin.py            AdminClient: topics, routes, clusters, groups, messages, brokers
- admin_views.py      the values admin calls return, and their JSON
- controller_calls.py requests to controllers, and a broker's epochs (no nameserver)
- instance.py         what a client's parts share: nameservers, routes, heartbeats
- broker_requests.py  what brokers ask of a client: rebalance, reset, status, checks
- config.py           ClientConfig: nameservers, intervals, time outs, an ACL account
- route_cache.py      routes to queues, and the brokers a send avoids (pure)
- message.py          Message, SendResult, PullResult, ConsumeResult ...
- records.py          the records a pull returns undecoded, for readers of their own
- errors.py           what the client raises
- blocking.py         the same classes for code that is not async (a Trio thread behind)

For code that is not async, ``hamq.client.blocking`` offers the same classes.

Exported here too, so a client's user needs no other part of hamq: what configures its
connections (``RemotingConfig``, ``TlsConfig``: ``ClientConfig.remoting``), checks its
ACL account (``Credentials``, ``credentials_from``), names a broker group's master
(``MASTER_ID``) and what a failed connection raises (``RemotingError``).
"""

from hamq.acl import Credentials, credentials_from
from hamq.client.admin import AdminClient
from hamq.client.admin_views import QueueStatus
from hamq.client.config import ClientConfig
from hamq.client.consumer import PullConsumer
from hamq.client.errors import (
    BrokerError,
    ClientError,
    InvalidArgumentError,
    NameServerUnavailableError,
    NoMasterError,
    NoRouteError,
    SendError,
)
from hamq.client.message import (
    ConsumeResult,
    Message,
    MessageExt,
    PullResult,
    PullStatus,
    SendResult,
    SendStatus,
)
from hamq.client.producer import Producer, hash_selector
from hamq.client.push_consumer import ConsumeFrom, PushConsumer, PushConsumerStatistics
from hamq.client.simple_consumer import SimpleConsumer
from hamq.client.transaction import (
    LocalTransactionState,
    TransactionListener,
    TransactionProducer,
    TransactionSendResult,
)
from hamq.protocol.bodies import MASTER_ID, MessageQueue
from hamq.remoting import RemotingConfig, RemotingError
from hamq.remoting.tls import TlsConfig

__all__ = [
    "MASTER_ID",
    "AdminClient",
    "BrokerError",
    "ClientConfig",
    "ClientError",
    "ConsumeFrom",
    "ConsumeResult",
    "Credentials",
    "InvalidArgumentError",
    "LocalTransactionState",
    "Message",
    "MessageExt",
    "MessageQueue",
    "NameServerUnavailableError",
    "NoMasterError",
    "NoRouteError",
    "Producer",
    "PullConsumer",
    "PullResult",
    "PullStatus",
    "PushConsumer",
    "PushConsumerStatistics",
    "QueueStatus",
    "RemotingConfig",
    "RemotingError",
    "SendError",
    "SendResult",
    "SendStatus",
    "SimpleConsumer",
    "TlsConfig",
    "TransactionListener",
    "TransactionProducer",
    "TransactionSendResult",
    "credentials_from",
    "hash_selector",
]
