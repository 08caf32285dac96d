"""Who may replicate from a master, and how a peer on the HA port proves it is one.

A peer gets CommitLog bytes, and its reports count as acks, only once admitted; a
peer that is not gets nothing, is closed at once, and one log line names it and why.
What admits a peer (master.py's ``SlaveConnection._set_up`` applies it, ``judge`` is
the pure rule):

1. ``[ha] secret`` set: the peer must prove it knows the secret (``challenge_slave``
   and ``answer_master``: the HMAC exchange of hamq.protocol.ha_wire; the slave checks
   the master's proof as well). This is the robust proof: it holds whatever the
   addresses, on one host or behind NAT, and a slave of another broker group (another
   broker name in the MACs) fails it. With a secret nothing else is asked, except:
2. controller mode: the broker id of the auto-switch handshake must be a member of
   this broker group as the controllers know it (CONTROLLER_GET_SYNC_STATE_DATA), not
   this master's own id. The SyncStateSet is kept by those ids, so an id is never
   taken on the peer's word alone.
3. no secret: the registry must vouch for the peer: a member registered from the
   host the connection comes from — at the controllers (controller mode: the id, and
   that member's registered host), or at the nameservers (a classic slave: some slave,
   broker id 1 or more, of this group registered from that host; auto-switch: that
   broker id, from that host). Weaker: anyone on a registered slave's host, or anyone
   who can register a broker at a nameserver (no ACL), passes it.

A classic slave does not say its broker id (RocketMQ 4's protocol has no handshake);
``classic_slave_id`` names it from the registry after admission, for the metrics and
``ha-status``: the group's slave registered from the connection's host (of several
there, the lowest id no other connection has). Exact with one slave per host; with
several of the group on one host, which id goes with which connection is a guess,
but the ids shown are still those of the group's slaves.

The registry's answer is kept (``MemberCache``) and asked again when a peer is not in
it or when it is older than ``MAX_AGE_S`` — but never more than once per
``REFRESH_MIN_S``, whether it answered or not: a flood of strangers costs the registry
one question a second, even while it does not answer (each question then waits for its
time-out, and they would queue). When the registry cannot be reached, the last answer
still admits the members it names.
"""

from __future__ import annotations

import hmac
import logging
import math
import secrets
from collections.abc import Awaitable, Callable, Collection, Mapping

import attrs
import trio

from hamq.protocol import RemotingCommand, RequestCode, ResponseCode
from hamq.protocol.bodies import ClusterInfo, decode_body
from hamq.protocol.ha_wire import (
    AUTH_CHALLENGE_BYTES,
    AUTH_MAGIC,
    AUTH_NONCE_BYTES,
    AUTH_RESPONSE_BYTES,
    AUTH_RESULT_BYTES,
    AuthChallenge,
    AuthResponse,
    AuthResult,
    HAProtocolError,
    auth_mac,
    decode_auth_challenge,
    decode_auth_response,
    decode_auth_result,
    encode_auth_challenge,
    encode_auth_response,
    encode_auth_result,
)
from hamq.remoting import RemotingClient, RemotingError
from hamq.remoting.address import IPAddress, ip_of

log = logging.getLogger(__name__)

#: the registry is asked again for an unknown peer at most this often
REFRESH_MIN_S = 1.0
#: and in any case once its answer is this old
MAX_AGE_S = 30.0
#: how long one question to the nameservers may take
REGISTRY_TIMEOUT_S = 3.0


class ProofFailed(Exception):
    """The secret exchange failed; the text says how (for the log line)."""


class RegistryUnavailable(Exception):
    """The registry of the group's members could not be asked; the text says why."""


@attrs.frozen
class Peer:
    """A connection on the HA port, as far as it has shown itself."""

    #: ``host:port`` it comes from (for log lines)
    address: str
    host: IPAddress | None
    #: the auto-switch handshake's broker id (None: classic, which carries none)
    broker_id: int | None = None
    #: it proved it knows ``[ha] secret``
    proved_secret: bool = False


@attrs.frozen
class Registry:
    """Where a master learns its group's members: broker id -> registered address."""

    #: for log lines: "the controllers", "the nameservers"
    source: str
    #: this master's own id there (0 at the nameservers)
    self_id: Callable[[], int]
    #: the ids it gives are the group's identities (controller mode): an auto-switch
    #: peer's id is checked against them even when it proved the secret
    ids_authoritative: bool
    #: every member, this master included; RegistryUnavailable if it cannot be asked
    fetch: Callable[[], Awaitable[Mapping[int, str]]]


def judge(
    peer: Peer,
    members: Mapping[int, str],
    *,
    self_id: int,
    check_host: bool,
    broker_name: str,
    source: str,
) -> str | None:
    """Why ``peer`` is not a member of ``broker_name`` as ``members`` (id -> address,
    from ``source``) say, or None if it is. ``check_host``: the connection must come
    from the member's registered host (without a secret, that is all there is)."""
    others = {i: a for i, a in members.items() if i != self_id}
    if peer.broker_id is not None:
        if peer.broker_id == self_id:
            return f"it claims broker id {peer.broker_id}, this master's own"
        address = others.get(peer.broker_id)
        if address is None:
            return (
                f"broker id {peer.broker_id} is not a member of broker group {broker_name} "
                f"at {source} (members: {sorted(others) or 'none'})"
            )
        if check_host and ip_of(address) != peer.host:
            return (
                f"broker id {peer.broker_id} is registered at {address} at {source}, but "
                f"this connection comes from {peer.host}"
            )
        return None
    if not check_host:
        return None
    hosts = {ip_of(a) for a in others.values()}
    if peer.host is None or peer.host not in hosts:
        return (
            f"no slave of broker group {broker_name} is registered from {peer.host} at "
            f"{source} (slaves: {', '.join(sorted(others.values())) or 'none'})"
        )
    return None


def classic_slave_id(
    host: IPAddress | None,
    members: Mapping[int, str],
    *,
    self_id: int,
    taken: Collection[int] = (),
) -> int | None:
    """The broker id of a classic slave connecting from ``host`` (the module doc): the
    one slave of ``members`` (id -> registered address; ``self_id`` is the master)
    registered from that host, or of several there the lowest id not in ``taken`` (the
    ids other connections have), else the lowest; None if none is registered there."""
    here = sorted(i for i, a in members.items() if i != self_id and ip_of(a) == host)
    if host is None or not here:
        return None
    return next((i for i in here if i not in taken), here[0])


class MemberCache:
    """The registry's last answer, asked again when it does not name a peer or is older
    than MAX_AGE_S, at most every REFRESH_MIN_S (answered or not). One question at a
    time."""

    def __init__(self, registry: Registry) -> None:
        self.registry = registry
        self._members: dict[int, str] | None = None
        self._fetched_at = -math.inf
        #: when the registry last answered or failed to, and why it failed (None: it answered)
        self._asked_at = -math.inf
        self._problem: str | None = None
        self._lock = trio.Lock()

    async def members(self, names: Callable[[Mapping[int, str]], bool]) -> Mapping[int, str]:
        """The members; ``names(members)`` says whether an answer is good enough as it
        is. RegistryUnavailable only if the registry was never reached."""
        async with self._lock:
            now = trio.current_time()
            known = self._members
            fresh = now - self._fetched_at < MAX_AGE_S
            if known is not None and fresh and names(known):
                return known
            if now - self._asked_at < REFRESH_MIN_S:  # asked just now: that answer stands
                if known is None:
                    raise RegistryUnavailable(self._problem or "not asked yet")
                return known
            try:
                fetched = dict(await self.registry.fetch())
            except RegistryUnavailable as exc:
                self._asked_at = trio.current_time()  # (when its time-out ended)
                self._problem = str(exc)
                if known is None:
                    raise
                log.warning(
                    "cannot ask %s for this group's members (%s); using their last answer",
                    self.registry.source,
                    exc,
                )
                return known
            self._members, self._problem = fetched, None
            self._fetched_at = self._asked_at = trio.current_time()
            return fetched


def nameserver_registry(
    client: RemotingClient,
    namesrv_addrs: list[str],
    *,
    cluster: str,
    broker_name: str,
    timeout_s: float = REGISTRY_TIMEOUT_S,
) -> Registry:
    """A static master's registry: the brokers registered as ``broker_name`` of
    ``cluster`` at any of the nameservers (GET_BROKER_CLUSTER_INFO), all of them
    merged (a broker registered at one counts)."""

    async def fetch() -> Mapping[int, str]:
        members: dict[int, str] = {}
        problems: list[str] = []
        answered = False
        for addr in list(namesrv_addrs):
            request = RemotingCommand.request(RequestCode.GET_BROKER_CLUSTER_INFO)
            try:
                response = await client.invoke(addr, request, timeout_s)
                if response.code != ResponseCode.SUCCESS:
                    raise ValueError(f"answered code {response.code}: {response.remark}")
                info = decode_body(ClusterInfo, response.body)
            except (RemotingError, ValueError, TypeError, KeyError) as exc:
                problems.append(f"{addr}: {exc}")
                continue
            answered = True
            data = info.broker_addr_table.get(broker_name)
            if data is not None and data.cluster == cluster:
                for broker_id, address in data.broker_addrs.items():
                    members.setdefault(int(broker_id), address)
        if not answered:
            raise RegistryUnavailable("; ".join(problems) or "no nameserver is configured")
        return members

    return Registry("the nameservers", lambda: 0, False, fetch)


# ---------------------------------------------------------------- the secret exchange


async def receive_exactly(stream: trio.abc.ReceiveStream, size: int, what: str) -> bytes:
    """``size`` bytes and not one more (what follows belongs to the protocol after the
    exchange). ProofFailed if the peer closes first."""
    data = bytearray()
    while len(data) < size:
        chunk = await stream.receive_some(size - len(data))
        if not chunk:
            raise ProofFailed(f"it closed the connection before its {what}")
        data += chunk
    return bytes(data)


async def challenge_slave(stream: trio.abc.Stream, secret: bytes, broker_name: str) -> None:
    """The master's side: challenge, check the slave's proof, answer the verdict with
    the master's own proof. ProofFailed (after a refusal was sent, best effort) if the
    peer does not prove the secret; the caller closes the stream then."""
    master_nonce = secrets.token_bytes(AUTH_NONCE_BYTES)
    await stream.send_all(encode_auth_challenge(AuthChallenge(master_nonce)))
    head = await receive_exactly(stream, len(AUTH_MAGIC), "answer to the secret challenge")
    if head != AUTH_MAGIC:
        raise ProofFailed(
            f"it did not answer the HA secret challenge (it sent {head.hex()}...): a slave "
            "without [ha] secret?"
        )
    rest = await receive_exactly(
        stream, AUTH_RESPONSE_BYTES - len(AUTH_MAGIC), "answer to the secret challenge"
    )
    try:
        response = decode_auth_response(head + rest)
    except HAProtocolError as exc:
        raise ProofFailed(str(exc)) from None
    expected = auth_mac(secret, "slave", broker_name, master_nonce, response.nonce)
    if not hmac.compare_digest(expected, response.mac):
        with trio.move_on_after(1):  # a polite refusal; it may have gone already
            try:
                await stream.send_all(encode_auth_result(AuthResult(False, b"")))
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                pass
        raise ProofFailed(
            "wrong HA secret: its proof does not match this master's [ha] secret (another "
            f"secret, or a broker of another group than {broker_name})"
        )
    proof = auth_mac(secret, "master", broker_name, master_nonce, response.nonce)
    await stream.send_all(encode_auth_result(AuthResult(True, proof)))


async def answer_master(stream: trio.abc.Stream, secret: bytes, broker_name: str) -> None:
    """The slave's side: answer the master's challenge and check its proof.
    ProofFailed if it refuses, or proves no secret (then it is not this group's
    master, and nothing it would send is taken)."""
    data = await receive_exactly(stream, AUTH_CHALLENGE_BYTES, "secret challenge")
    try:
        challenge = decode_auth_challenge(data)
    except HAProtocolError:
        raise ProofFailed(
            f"the master sent no HA secret challenge (it sent {data[:8].hex()}...): it "
            "has no [ha] secret, while this slave has one"
        ) from None
    slave_nonce = secrets.token_bytes(AUTH_NONCE_BYTES)
    mac = auth_mac(secret, "slave", broker_name, challenge.nonce, slave_nonce)
    await stream.send_all(encode_auth_response(AuthResponse(slave_nonce, mac)))
    try:
        result = decode_auth_result(await receive_exactly(stream, AUTH_RESULT_BYTES, "verdict"))
    except HAProtocolError as exc:
        raise ProofFailed(f"the master's verdict is not one: {exc}") from None
    if not result.accepted:
        raise ProofFailed(
            "the master refused this slave's HA secret: the [ha] secret differs, or the "
            f"broker name ({broker_name})"
        )
    expected = auth_mac(secret, "master", broker_name, challenge.nonce, slave_nonce)
    if not hmac.compare_digest(expected, result.mac):
        raise ProofFailed(
            "the master's proof of the HA secret is wrong: it is not this group's master "
            "(or its [ha] secret differs); nothing is taken from it"
        )
