"""The requests that need no nameserver: to controllers (``sync_state_data``,
``known_broker_groups``, ``elect_master``, ``ask_controllers``) and a broker's epochs
(``broker_epochs``), as ``hamq admin``'s failover commands make them.

Each call opens a remoting client of its own (requests signed with ``credentials``,
TLS per ``remoting``) and closes it before it returns; each request is bounded by
REQUEST_TIMEOUT_S. Controllers are asked in turn: one that cannot be reached, has no
Raft quorum (CONTROLLER_NOT_LEADER) or serves no controller
(REQUEST_CODE_NOT_SUPPORTED) passes the question on to the next; any other refusal
ends the call with its code and remark, as does no controller answering — except that
``elect_master`` of the broker that is the master already succeeds, saying so
(CONTROLLER_MASTER_STILL_EXIST naming that broker). Failures are ``ClientError``
(``InvalidArgumentError`` for a time out that is not positive); the answers are the
views of hamq/client/admin_views.py.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from hamq.acl import Credentials, signer
from hamq.client.admin_views import Election, EpochTable, epochs_from_cache, epochs_from_ha_status
from hamq.client.errors import ClientError
from hamq.client.message import check_timeout
from hamq.protocol import RemotingCommand, RequestCode, RequestError, ResponseCode, code_name
from hamq.protocol.bodies import EpochEntryCache, SyncStateSet, decode_body
from hamq.protocol.headers import ElectMasterRequestHeader, ReplicaInfoResponseHeader
from hamq.remoting import RemotingClient, RemotingConfig, RemotingError

#: how long one request to a controller or a broker may take (the controller requests)
REQUEST_TIMEOUT_S = 3.0


#: refusals that say "ask another controller"
_ASK_ANOTHER = (ResponseCode.CONTROLLER_NOT_LEADER, ResponseCode.REQUEST_CODE_NOT_SUPPORTED)


async def ask_controllers(
    addrs: Sequence[str],
    code: RequestCode,
    header: Any = None,
    body: bytes = b"",
    *,
    timeout_s: float = REQUEST_TIMEOUT_S,
    credentials: Credentials | None = None,
    remoting: RemotingConfig | None = None,
    answers: frozenset[int] = frozenset({ResponseCode.SUCCESS}),
) -> tuple[str, RemotingCommand]:
    """The first controller's SUCCESS answer (or one of ``answers``), with its address
    (see the module doc); ClientError naming each controller and what it said when none
    gives one. Requests are signed with ``credentials`` (an ACL account) when given;
    ``remoting`` holds TLS. InvalidArgumentError unless ``timeout_s`` (each request's)
    is positive."""
    check_timeout("timeout_s", timeout_s)
    problems = []
    async with _client(credentials, remoting) as client:
        for addr in addrs:
            request = RemotingCommand.request(code, header, body=body)
            try:
                response = await client.invoke(addr, request, timeout_s)
            except RemotingError as exc:
                problems.append(str(exc))
                continue
            if response.code in answers:
                return addr, response
            refusal = _refusal(addr, response)
            if response.code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED:
                refusal += " (not a controller, nor a nameserver started with --controller?)"
            if response.code not in _ASK_ANOTHER:
                raise ClientError(refusal)
            problems.append(refusal)
    raise ClientError("no controller answered: " + "; ".join(problems))


def _refusal(addr: str, response: RemotingCommand) -> str:
    return (
        f"controller {addr} answered {code_name(response.code, response=True)}: "
        f"{response.remark or 'no reason given'}"
    )


def _not_understood(addr: str, exc: Exception) -> ClientError:
    return ClientError(f"controller {addr}: an answer that is not understood: {exc}")


def _client(credentials: Credentials | None, remoting: RemotingConfig | None) -> RemotingClient:
    """A client for one admin call: signing with ``credentials``, TLS per ``remoting``."""
    hook = signer(credentials) if credentials is not None else None
    return RemotingClient(config=remoting, rpc_hook=hook)


async def sync_state_data(
    addrs: Sequence[str],
    broker_names: Sequence[str] = (),
    *,
    credentials: Credentials | None = None,
    remoting: RemotingConfig | None = None,
) -> tuple[str, dict[str, Any]]:
    """CONTROLLER_GET_SYNC_STATE_DATA for ``broker_names`` (default: every broker group):
    the answering controller and its answer, whose ``replicasInfoTable`` is broker name
    -> master, epochs and SyncStateSet. Groups the controller does not know are left out
    of the table (``known_broker_groups`` says which it knows)."""
    body = json.dumps(list(broker_names)).encode()
    addr, response = await ask_controllers(
        addrs,
        RequestCode.CONTROLLER_GET_SYNC_STATE_DATA,
        body=body,
        credentials=credentials,
        remoting=remoting,
    )
    try:
        answer = json.loads(response.body)
        if not isinstance(answer, dict) or not isinstance(answer["replicasInfoTable"], dict):
            raise TypeError("replicasInfoTable is not an object")
    except (ValueError, KeyError, TypeError) as exc:
        raise _not_understood(addr, exc) from None
    return addr, answer


async def known_broker_groups(
    addr: str, *, credentials: Credentials | None = None, remoting: RemotingConfig | None = None
) -> list[str]:
    """The broker groups the controller at ``addr`` knows."""
    _, answer = await sync_state_data([addr], credentials=credentials, remoting=remoting)
    return sorted(answer["replicasInfoTable"])


async def elect_master(
    addrs: Sequence[str],
    cluster: str,
    broker_name: str,
    broker_id: int,
    *,
    credentials: Credentials | None = None,
    remoting: RemotingConfig | None = None,
) -> Election:
    """Make broker ``broker_id`` of ``broker_name`` its master now (a designated
    election, CONTROLLER_ELECT_MASTER). A broker that is the master already is a
    success too: the Election says so (``elected`` False; the controller answered
    CONTROLLER_MASTER_STILL_EXIST naming it). ClientError with the controller's refusal
    otherwise."""
    header = ElectMasterRequestHeader(cluster, broker_name, broker_id, designate_elect=True)
    still = ResponseCode.CONTROLLER_MASTER_STILL_EXIST
    addr, response = await ask_controllers(
        addrs,
        RequestCode.CONTROLLER_ELECT_MASTER,
        header,
        credentials=credentials,
        remoting=remoting,
        answers=frozenset({ResponseCode.SUCCESS, still}),
    )
    try:
        info = response.header(ReplicaInfoResponseHeader)
        members = decode_body(SyncStateSet, response.body) if response.body else None
    except (RequestError, ValueError) as exc:
        if response.code == still:  # (a controller that does not say who the master is)
            raise ClientError(_refusal(addr, response)) from None
        raise _not_understood(addr, exc) from None
    master = info.master_broker_id
    if response.code == still and master != broker_id:
        raise ClientError(_refusal(addr, response))
    return Election(
        addr,
        broker_name,
        master if master is not None and master >= 0 else None,
        info.master_address,
        info.master_epoch,
        tuple(sorted(members.sync_state_set)) if members else (),
        info.sync_state_set_epoch,
        elected=response.code == ResponseCode.SUCCESS,
    )


async def broker_epochs(
    addr: str,
    *,
    timeout_s: float = REQUEST_TIMEOUT_S,
    credentials: Credentials | None = None,
    remoting: RemotingConfig | None = None,
) -> EpochTable:
    """A broker's epochs: GET_BROKER_EPOCH_CACHE (1007), or from GET_BROKER_HA_STATUS
    (907) where the broker has no such request. ClientError if it cannot be asked,
    refuses, or answers what does not decode; InvalidArgumentError unless ``timeout_s``
    is positive."""
    check_timeout("timeout_s", timeout_s)
    async with _client(credentials, remoting) as client:

        async def ask(code: RequestCode) -> RemotingCommand:
            try:
                return await client.invoke(addr, RemotingCommand.request(code), timeout_s)
            except RemotingError as exc:
                raise ClientError(f"broker {exc}") from None

        def refused(response: RemotingCommand) -> ClientError:
            name = code_name(response.code, response=True)
            return ClientError(f"broker {addr} answered {name}: {response.remark or ''}")

        response = await ask(RequestCode.GET_BROKER_EPOCH_CACHE)
        try:
            if response.code == ResponseCode.SUCCESS:
                return epochs_from_cache(decode_body(EpochEntryCache, response.body))
            if response.code != ResponseCode.REQUEST_CODE_NOT_SUPPORTED:
                raise refused(response)
            response = await ask(RequestCode.GET_BROKER_HA_STATUS)
            if response.code != ResponseCode.SUCCESS:
                raise refused(response)
            status = json.loads(response.body)
            if not isinstance(status, dict):
                raise TypeError("not a JSON object")
            return epochs_from_ha_status(status)
        except (RequestError, ValueError, TypeError) as exc:
            raise ClientError(f"broker {addr}: an answer that is not understood: {exc}") from None
