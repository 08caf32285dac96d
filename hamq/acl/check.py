"""The decision: may this request, from this address, go through?
(PlainPermissionManager.validate and checkPerm, in RocketMQ's order.)

1. a request the policy does not check passes;
2. from an address in globalWhiteRemoteAddresses: passes;
3. no AccessKey (or an empty one, as the C++ client sends without credentials): refused;
4. an AccessKey no account has: refused;
5. from the account's whiteRemoteAddress: passes (no signature needed, as RocketMQ);
6. a Signature that is missing or was not made with the account's secret key: refused;
7. publishing to RMQ_SYS_TRACE_TOPIC: passes (message traces, as RocketMQ);
8. an admin code from an account that is not admin: refused;
9. an admin account that lists no topic or group permissions: passes; otherwise each
   topic and group the request touches needs its permission (the account's entry for
   it, else its default): the first one missing is refused. A request that reads a
   stored message by its offset (a send-back) needs SUB on that message's topic too,
   and an END_TRANSACTION PUB on its half message's real topic, which
   ``message_topic`` (the broker's store) tells; no message there: nothing more
   (the processor refuses it); no ``message_topic``: refused, it cannot be checked.

A refusal is a ``Refusal``: its ``reason`` (what kind of failure, for counting: a
flood of bad signatures is an attack, a missing permission more likely a
misconfiguration) and its ``remark`` for the NO_PERMISSION answer, which names the
missing right and never the secret or the expected signature. The remark is logged
too, so what the peer wrote in it (an access key, a topic or group name, unchecked
yet) is shown escaped and cut to SHOWN_CHARS: no forged log lines, no megabyte ones.
"""

from __future__ import annotations

import enum
from collections.abc import Callable

import attrs

from hamq.acl.accounts import Account, AclTable
from hamq.acl.addresses import Address
from hamq.acl.permission import Perm, allows, perm_text
from hamq.acl.rights import TRACE_TOPIC, AclPolicy, Needs, Resource, topic_resources
from hamq.acl.signing import ACCESS_KEY, signature_matches
from hamq.protocol import RemotingCommand, RequestCode

#: at most this much of a name the peer sent is shown in a remark
SHOWN_CHARS = 64


def _shown(text: str) -> str:
    """``text`` as it may appear in a remark and a log line."""
    if len(text) <= SHOWN_CHARS and text.isprintable():
        return text
    return repr(text[:SHOWN_CHARS]) + ("..." if len(text) > SHOWN_CHARS else "")


class Reason(enum.Enum):
    """Why a request was refused; the values are metric labels."""

    UNSIGNED = "unsigned"
    UNKNOWN_ACCESS_KEY = "unknown_access_key"
    BAD_SIGNATURE = "bad_signature"
    NOT_ADMIN = "not_admin"
    NO_PERMISSION = "no_permission"


@attrs.frozen
class Refusal:
    reason: Reason
    #: the NO_PERMISSION answer's remark
    remark: str


def _code(code: int) -> str:
    try:
        return RequestCode(code).name
    except ValueError:
        return f"code {code}"


#: the topic of the stored message at a commit-log offset, None if no message is there
MessageTopic = Callable[[int], str | None]


def _missing(account: Account, resources: tuple[Resource, ...]) -> Resource | None:
    for resource in resources:
        owned = (
            account.topic_perm(resource.name)
            if resource.kind == "topic"
            else account.group_perm(resource.name)
        )
        if not allows(owned, resource.perm):
            return resource
    return None


def _traces(needs: Needs) -> bool:
    return any(
        r.kind == "topic" and r.name == TRACE_TOPIC and r.perm == Perm.PUB for r in needs.resources
    )


def check(
    table: AclTable,
    policy: AclPolicy,
    request: RemotingCommand,
    address: Address | None,
    message_topic: MessageTopic | None = None,
) -> Refusal | None:
    """None if ``request`` from ``address`` may go through, else why not."""
    needs = policy.needs(request)
    if needs is None:
        return None
    if any(pattern.matches(address) for pattern in table.global_white):
        return None
    access_key = request.ext_fields.get(ACCESS_KEY)
    if not access_key:
        where = address if address is not None else "an unknown address"
        return Refusal(
            Reason.UNSIGNED,
            f"No AccessKey: the request is not signed and {where} is not whitelisted",
        )
    account = table.accounts.get(access_key)
    if account is None:
        return Refusal(Reason.UNKNOWN_ACCESS_KEY, f"No account for AccessKey {_shown(access_key)}")
    if account.white_remote_address.matches(address):
        return None
    if not signature_matches(request, account.secret_key):
        return Refusal(Reason.BAD_SIGNATURE, f"Signature check failed for AccessKey {access_key}")
    if _traces(needs):
        return None
    if needs.admin and not account.admin:
        return Refusal(
            Reason.NOT_ADMIN, f"AccessKey {access_key} is not admin ({_code(request.code)})"
        )
    if account.admin and not account.lists_resources:
        return None
    resources = needs.resources
    if needs.message_offset is not None:
        if message_topic is None:
            return Refusal(
                Reason.NO_PERMISSION,
                f"the topic of the message at offset {needs.message_offset} cannot be checked here",
            )
        topic = message_topic(needs.message_offset)
        if topic is not None:
            resources += tuple(topic_resources(topic, needs.message_perm))
    missing = _missing(account, resources)
    if missing is not None:
        return Refusal(
            Reason.NO_PERMISSION,
            f"No {perm_text(missing.perm)} permission for {missing.kind} {_shown(missing.name)} "
            f"(AccessKey {access_key})",
        )
    return None
