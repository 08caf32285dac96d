"""Request signatures of RocketMQ's ACL 1.0 (AclClientRPCHook, PlainAccessValidator).

A signed request carries three ext fields besides its own::

    AccessKey      the account's access key
    SecurityToken  optional; signed like any other field and never checked (as RocketMQ)
    Signature      base64(HmacSHA1(secretKey, content))

``content`` is the value of every other ext field in the order of the keys (Java's
TreeMap order; the keys are ASCII names, for which Python's order is the same),
concatenated, UTF-8 encoded, then the body's bytes. ``Signature`` itself is left out.
The checking side also leaves out ``_UNIQUE_KEY_QUERY`` (PlainAccessValidator.parse
does, AclClientRPCHook does not sign without it), so a request carrying that field is
accepted signed either way.

Values are signed as text: a number the C++ client writes as a JSON number (``queueId:
0``) is signed as its decimal text (``SetDeclaredFieldOfCommandHeader``), which is what
hamq's header decoder turns it into. The C++ client also signs its ``OnsChannel`` field
(``"ALIYUN"``), an ext field like any other here.

Pure functions, no I/O: signing changes the command it is given and nothing else.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from collections.abc import Mapping

import attrs

from hamq.protocol import RemotingCommand
from hamq.protocol.secret import Secret
from hamq.remoting.client import RpcHook

ACCESS_KEY = "AccessKey"
SIGNATURE = "Signature"
SECURITY_TOKEN = "SecurityToken"
#: RocketMQ's MixAll.UNIQUE_MSG_QUERY_FLAG: left out of the content by the checking side
UNIQUE_MSG_QUERY_FLAG = "_UNIQUE_KEY_QUERY"


def _nonempty(_instance: object, attribute: attrs.Attribute[str], value: str) -> None:
    if not isinstance(value, str) or not value:
        raise ValueError(f"{attribute.name} must be a non-empty string")


@attrs.frozen
class Credentials:
    """An account's keys, as a client signs with them (RocketMQ's SessionCredentials)."""

    access_key: str = attrs.field(validator=_nonempty)
    secret_key: str = attrs.field(validator=_nonempty, repr=False)
    security_token: str | None = None


def credentials_from(
    access_key: str | None, secret_key: str | Secret | None, security_token: str | None = None
) -> Credentials | None:
    """Credentials from optional settings: None when neither key is given; ValueError
    naming the missing one when only one is."""
    secret = secret_key.reveal() if isinstance(secret_key, Secret) else secret_key
    if not access_key and not secret:
        return None
    if not access_key:
        raise ValueError("a secret key is given without an access key")
    if not secret:
        raise ValueError(f"access key {access_key!r} is given without a secret key")
    return Credentials(access_key, secret, security_token or None)


def content(
    fields: Mapping[str, str], body: bytes | bytearray | memoryview, *, skip: frozenset[str]
) -> bytes:
    """The bytes a signature covers: the values of ``fields`` but ``skip``, by key, then
    the body."""
    text = "".join(fields[key] for key in sorted(fields) if key not in skip)
    return text.encode("utf-8") + bytes(body)


#: what the signing side leaves out (AclClientRPCHook) and what the checking side does
SIGNED_SKIP = frozenset({SIGNATURE})
CHECKED_SKIP = frozenset({SIGNATURE, UNIQUE_MSG_QUERY_FLAG})


def signature(data: bytes, secret_key: str) -> str:
    """base64(HmacSHA1(secret_key, data)), RocketMQ's AclSigner.calSignature."""
    digest = hmac.new(secret_key.encode("utf-8"), data, hashlib.sha1).digest()
    return base64.b64encode(digest).decode("ascii")


def sign(request: RemotingCommand, credentials: Credentials) -> None:
    """Add AccessKey (SecurityToken) and Signature to ``request``'s ext fields. Signing
    again (a retry) replaces the signature."""
    fields = request.ext_fields
    fields[ACCESS_KEY] = credentials.access_key
    if credentials.security_token is not None:
        fields[SECURITY_TOKEN] = credentials.security_token
    fields.pop(SIGNATURE, None)
    data = content(fields, request.body, skip=SIGNED_SKIP)
    fields[SIGNATURE] = signature(data, credentials.secret_key)


def signature_matches(request: RemotingCommand, secret_key: str) -> bool:
    """Whether ``request``'s Signature was made with ``secret_key`` over its content."""
    given = request.ext_fields.get(SIGNATURE)
    if not given:
        return False
    wanted = given.encode("utf-8", "replace")
    forms = [CHECKED_SKIP]
    if UNIQUE_MSG_QUERY_FLAG in request.ext_fields:  # signed by AclClientRPCHook
        forms.append(SIGNED_SKIP)
    for skip in forms:
        expected = signature(content(request.ext_fields, request.body, skip=skip), secret_key)
        if hmac.compare_digest(expected.encode("ascii"), wanted):
            return True
    return False


def signer(credentials: Credentials) -> RpcHook:
    """A remoting client's hook that signs every request with ``credentials``."""

    def hook(_address: str, request: RemotingCommand) -> None:
        sign(request, credentials)

    return hook
