"""hamq's client: producers, consumers and administration, on Trio or asyncio.

Written on AnyIO, so the same classes run natively in a Trio program (``trio.run``) and
in an asyncio one (``asyncio.run``, uvloop too): ``async with Producer(...)`` in either,
its tasks in the caller's event loop. The broker, nameserver and replication stay on
Trio; only the client is loop-agnostic.

- producer.py       Producer: send, send_oneway, send_async, send_batch, ordered sends
- transaction.py    TransactionProducer: send_in_transaction, check-backs
- consumer.py       PullConsumer, and the pull/offset requests both consumers make
- push_consumer.py  PushConsumer: a consumer group member with rebalancing
- admin.py          AdminClient: topics, routes, clusters
- instance.py       what they share: nameservers, routes, heartbeats
- route_cache.py    routes to queues (pure); rebalance.py: queue allocation (pure)
- message.py        Message, SendResult, PullResult, ConsumeResult ...
- records.py        the records a pull returns undecoded, for readers of their own
- blocking.py       the same, for code that is not async (a Trio thread behind it)

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
    "TlsConfig",
    "TransactionListener",
    "TransactionProducer",
    "TransactionSendResult",
    "credentials_from",
    "hash_selector",
]
