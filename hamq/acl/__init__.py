"""Access control compatible with RocketMQ's ACL 1.0: signed requests, accounts in a
plain_acl.yml, permissions per topic and group, address whitelists.

- signing.py     the signature (HmacSHA1 over the sorted ext fields + body), Credentials,
                 the client's signing hook (Secret, the masked text of a secret key, is
                 hamq.protocol.secret's, re-exported here)
- permission.py  PUB / SUB / DENY
- addresses.py   whitelist patterns
- accounts.py    the plain_acl.yml file -> AclTable
- rights.py      what a request needs (by code), and which codes each server checks
- check.py       the decision: None, or a Refusal (its reason, the NO_PERMISSION remark)
- guard.py       AclGuard: the table kept current, the dispatcher's check

Everything but guard.py is pure: no I/O, no tasks.
"""

from hamq.acl.accounts import Account, AclFileError, AclTable, load_acl_file, parse_acl
from hamq.acl.addresses import AddressPattern, parse_pattern
from hamq.acl.check import Reason, Refusal, check
from hamq.acl.guard import AclGuard, AclStatistics
from hamq.acl.permission import Perm, parse_perm
from hamq.acl.rights import (
    ADMIN_CODES,
    BROKER_POLICY,
    CONTROLLER_POLICY,
    NAMESERVER_POLICY,
    AclPolicy,
)
from hamq.acl.signing import (
    ACCESS_KEY,
    SECURITY_TOKEN,
    SIGNATURE,
    Credentials,
    credentials_from,
    sign,
    signature,
    signature_matches,
    signer,
)
from hamq.protocol.secret import Secret
from hamq.remoting.client import RpcHook

__all__ = [
    "ACCESS_KEY",
    "ADMIN_CODES",
    "BROKER_POLICY",
    "CONTROLLER_POLICY",
    "NAMESERVER_POLICY",
    "SECURITY_TOKEN",
    "SIGNATURE",
    "Account",
    "AclFileError",
    "AclGuard",
    "AclPolicy",
    "AclStatistics",
    "AclTable",
    "AddressPattern",
    "Credentials",
    "Perm",
    "Reason",
    "Refusal",
    "RpcHook",
    "Secret",
    "check",
    "credentials_from",
    "load_acl_file",
    "parse_acl",
    "parse_pattern",
    "parse_perm",
    "sign",
    "signature",
    "signature_matches",
    "signer",
]
