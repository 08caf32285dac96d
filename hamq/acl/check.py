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
   it, else its default): the first one missing is refused.

A refusal is the remark for the NO_PERMISSION answer: it names the missing right and
never the secret or the expected signature.
"""

from __future__ import annotations

from hamq.acl.accounts import Account, AclTable
from hamq.acl.addresses import Address
from hamq.acl.permission import Perm, allows, perm_text
from hamq.acl.rights import TRACE_TOPIC, AclPolicy, Needs, Resource
from hamq.acl.signing import ACCESS_KEY, signature_matches
from hamq.protocol import RemotingCommand, RequestCode


def _code(code: int) -> str:
    try:
        return RequestCode(code).name
    except ValueError:
        return f"code {code}"


def _missing(account: Account, needs: Needs) -> Resource | None:
    for resource in needs.resources:
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
    table: AclTable, policy: AclPolicy, request: RemotingCommand, address: Address | None
) -> str | None:
    """None if ``request`` from ``address`` may go through, else why not."""
    needs = policy.needs(request)
    if needs is None:
        return None
    if any(pattern.matches(address) for pattern in table.global_white):
        return None
    access_key = request.ext_fields.get(ACCESS_KEY)
    shown = address if address is not None else "an unknown address"
    if not access_key:
        return f"No AccessKey: the request is not signed and {shown} is not whitelisted"
    account = table.accounts.get(access_key)
    if account is None:
        return f"No account for AccessKey {access_key}"
    if account.white_remote_address.matches(address):
        return None
    if not signature_matches(request, account.secret_key):
        return f"Signature check failed for AccessKey {access_key}"
    if _traces(needs):
        return None
    if needs.admin and not account.admin:
        return f"AccessKey {access_key} is not admin ({_code(request.code)})"
    if account.admin and not account.lists_resources:
        return None
    missing = _missing(account, needs)
    if missing is not None:
        return (
            f"No {perm_text(missing.perm)} permission for {missing.kind} {missing.name} "
            f"(AccessKey {access_key})"
        )
    return None
