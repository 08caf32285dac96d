"""Broker configuration: one frozen object, from a TOML file plus overrides.

A file looks like conf/broker.toml::

    broker_name = "broker-a"
    cluster_name = "DefaultCluster"
    listen_port = 10911
    namesrv_addrs = ["127.0.0.1:9876"]      # none: the broker embeds a nameserver
    # embed_namesrv = true                  # embed one (embedded_namesrv_port) as well

    [store]
    store_dir = "./data/store"
    flush_disk_type = "ASYNC_FLUSH"
    role = "ASYNC_MASTER"                   # SYNC_MASTER, SLAVE (broker_id 1, 2, ...)

    [ha]
    protocol = "classic"                    # or "autoswitch" (RocketMQ 5's)

Automatic failover (RocketMQ 5's controller mode): ``enable_controller_mode = true``
and ``controller_addrs``; the controllers then decide who is master (broker_id and
store.role's master/slave part are not used; a SYNC_MASTER role still makes sends
wait for a slave), and replication speaks the auto-switch protocol.

Every key is checked: an unknown key, a value of the wrong type or out of range is
reported with its name (all of them at once), and nothing starts. Types are strict:
``listen_port = "11011"`` is refused, not converted (the one conversion: an integer
where a float goes, ``register_interval_s = 30``). Names follow RocketMQ's
BrokerConfig in snake_case.

Secrets need not sit in the file: ``secret_key_file`` and ``[ha] secret_file`` name a
file holding ``secret_key`` / ``[ha] secret`` (its content, surrounding whitespace
dropped; a mounted secret, or a file only the broker's user may read: one warning when
others may). Relative paths (these and ``acl_file``) are taken from the configuration
file's directory. A file that cannot be read, is empty, or is given beside its key is
a ConfigError naming the key and the file.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import stat
import tomllib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import attrs
import cattrs
from attrs import validators as v
from cattrs.errors import ClassValidationError
from cattrs.v import format_exception

from hamq.acl import Credentials, Secret, credentials_from
from hamq.ha import HAConfig
from hamq.protocol.ha_wire import HAProtocol
from hamq.protocol.message import TOPIC_MAX_LENGTH
from hamq.protocol.send_timing import (
    SEND_ANSWER_MARGIN_S,
    SEND_ATTEMPT_TIMEOUT_S,
    send_wait_too_short,
)
from hamq.remoting import RemotingConfig, check_address, check_addresses
from hamq.store import BrokerRole, FlushDiskType, StoreConfig

log = logging.getLogger(__name__)


class ConfigError(ValueError):
    """A configuration that cannot be used; the text names every bad field."""


def _default_slave_read_lag() -> int:
    try:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        memory = 8 * 1024**3
    return int(memory * 0.4)


def _name(_instance: object, attribute: attrs.Attribute[Any], value: str) -> None:
    if (
        not value
        or len(value) > TOPIC_MAX_LENGTH
        or not all(c.isalnum() or c in "_-" for c in value)
    ):
        raise ValueError(
            f"{attribute.name} {value!r} must be 1-{TOPIC_MAX_LENGTH} letters, digits, _ or -"
        )


@attrs.frozen
class BrokerConfig:
    store: StoreConfig
    broker_name: str = attrs.field(default="broker-a", validator=_name)
    cluster_name: str = attrs.field(default="DefaultCluster", validator=_name)
    #: 0 is the master of its broker group, 1, 2, ... are slaves
    broker_id: int = attrs.field(default=0, validator=v.ge(0))
    listen_host: str = "127.0.0.1"
    listen_port: int = attrs.field(default=10911, validator=[v.ge(0), v.le(65535)])
    #: the address clients and other brokers use (STOREHOST); default: listen_host
    broker_ip: str | None = None
    #: nameservers to register with; none: start one in this process on embedded_namesrv_port
    namesrv_addrs: tuple[str, ...] = attrs.field(
        default=(), converter=tuple, validator=check_addresses
    )
    embedded_namesrv_port: int = attrs.field(default=9876, validator=[v.ge(0), v.le(65535)])
    #: run that nameserver in this process also when namesrv_addrs is set; the broker then
    #: registers with it and with namesrv_addrs (two brokers that each embed one and list
    #: both: a broker that dies leaves the other's nameserver to clients)
    embed_namesrv: bool = False
    register_interval_s: float = attrs.field(default=30.0, validator=v.gt(0.0))
    register_timeout_s: float = attrs.field(default=6.0, validator=v.gt(0.0))
    #: topics unknown to the broker are created from TBW102 on first send
    auto_create_topic_enable: bool = True
    auto_create_subscription_group: bool = True
    #: queues of TBW102, the template of auto-created topics
    default_topic_queue_nums: int = attrs.field(default=8, validator=[v.ge(1), v.le(1024)])
    #: most topics the broker holds (system topics aside); creating one more is refused
    max_topics: int = attrs.field(default=10_000, validator=v.ge(1))
    #: a consumer not heard from for this long is dropped from its group
    client_channel_expired_s: float = attrs.field(default=120.0, validator=v.gt(0.0))
    #: how long a long-polling pull may wait at most, whatever the client asks
    long_polling_max_s: float = attrs.field(default=30.0, validator=v.gt(0.0))
    #: most pops held waiting for messages at once (more: POLLING_FULL)
    pop_max_held: int = attrs.field(default=10_000, validator=v.ge(1))
    consumer_offset_persist_interval_s: float = attrs.field(default=5.0, validator=v.gt(0.0))
    #: transactions (hamq/broker/transactions.py): a half message is first checked back
    #: this long after it was stored (transactionTimeOut)
    transaction_timeout_s: float = attrs.field(default=6.0, validator=v.gt(0.0))
    #: how often the master looks for half messages to check back (transactionCheckInterval:
    #: 30 s since RocketMQ 5.1.1, 60 s before)
    transaction_check_interval_s: float = attrs.field(default=30.0, validator=v.gt(0.0))
    #: a half message checked this often without an answer goes to TRANS_CHECK_MAX_TIME_TOPIC
    transaction_check_max: int = attrs.field(default=15, validator=v.ge(1))
    #: queue locks of orderly consumers last this long unless renewed (RocketMQ: 60 s)
    rebalance_lock_max_live_s: float = attrs.field(default=60.0, validator=v.gt(0.0))
    remoting: RemotingConfig = attrs.field(factory=RemotingConfig)
    #: the HA channel's port: default listen_port + 1 (a free one when listen_port is 0)
    ha_listen_port: int | None = attrs.field(
        default=None, validator=v.optional([v.ge(0), v.le(65535)])
    )
    #: RocketMQ 5's gRPC endpoint (MessagingService, hamq/broker/grpc) on listen_host,
    #: with the remoting port's TLS and limits; None: off, 0: a free port
    grpc_port: int | None = attrs.field(default=None, validator=v.optional([v.ge(0), v.le(65535)]))
    #: Prometheus metrics over HTTP (``/metrics``) on listen_host; None: off, 0: a free port
    metrics_port: int | None = attrs.field(
        default=None, validator=v.optional([v.ge(0), v.le(65535)])
    )
    #: a slave's master HA address; default: what the nameservers say (haMasterAddress)
    ha_master_address: str | None = attrs.field(default=None, validator=v.optional(check_address))
    ha: HAConfig = attrs.field(factory=HAConfig)
    #: how often a slave copies topics, offsets, delay offsets and groups from its master
    metadata_sync_interval_s: float = attrs.field(default=10.0, validator=v.gt(0.0))
    #: a master sends consumers far behind the head to a slave (slaveReadEnable)
    slave_read_enable: bool = False
    #: how far behind is far: RocketMQ's accessMessageInMemoryMaxRatio, 40 % of memory
    slave_read_lag_bytes: int = attrs.field(
        factory=lambda: _default_slave_read_lag(), validator=v.ge(0)
    )
    #: RocketMQ 5's controller mode: the controllers say who is master (enableControllerMode)
    enable_controller_mode: bool = False
    #: the controllers (controllerAddr): standalone ones, or nameservers embedding one
    controller_addrs: tuple[str, ...] = attrs.field(
        default=(), converter=tuple, validator=check_addresses
    )
    #: how often the broker heartbeats every controller (brokerHeartbeatInterval)
    controller_heartbeat_interval_s: float = attrs.field(default=1.0, validator=v.gt(0.0))
    #: a broker not heard from for this long loses its lease (RocketMQ: 10 s)
    controller_lease_s: float = attrs.field(default=3.0, validator=v.gt(0.0))
    #: how long a request to a controller may take
    controller_timeout_s: float = attrs.field(default=3.0, validator=v.gt(0.0))
    #: a send is SEND_OK only once every member of the SyncStateSet has it
    all_ack_in_sync_state_set: bool = False
    #: sends are refused while the SyncStateSet (master included) has fewer members
    min_in_sync_replicas: int = attrs.field(default=1, validator=v.ge(1))
    #: a member of the SyncStateSet that has not acked what it was sent this long ago (or
    #: has had no connection for this long) leaves it; a joining slave has this long to
    #: catch up (RocketMQ's haMaxTimeSlaveNotCatchup, 15 s there: hamq/ha/sync_state_set.py)
    ha_max_time_slave_not_catchup_s: float = attrs.field(default=2.0, validator=v.gt(0.0))
    #: lower is preferred when the controller elects among equals (electionPriority)
    election_priority: int = attrs.field(default=0, validator=v.ge(0))
    #: check every request against acl_file's accounts (RocketMQ's aclEnable)
    acl_enable: bool = False
    #: the accounts, RocketMQ's plain_acl.yml format (relative: to the config file); read
    #: again when it changes
    acl_file: Path | None = None
    #: this broker's own account: it signs what it asks of nameservers, controllers and
    #: its master with it (an admin account, where those check the ACL)
    access_key: str | None = None
    secret_key: Secret | None = None

    def __attrs_post_init__(self) -> None:
        if self.acl_enable and self.acl_file is None:
            raise ValueError("acl_enable needs acl_file (the accounts, plain_acl.yml)")
        credentials_from(self.access_key, self.secret_key)  # both or neither
        if self.remoting.tls is not None and not self.remoting.tls.can_listen:
            raise ValueError(
                "remoting.tls needs cert_file: a broker listens (TLS on its ports needs "
                "its certificate, and its key in key_file or in cert_file)"
            )
        if self.enable_controller_mode:
            if not self.controller_addrs:
                raise ValueError(
                    "enable_controller_mode needs controller_addrs (the controllers, or "
                    "the nameservers that embed them)"
                )
        elif self.store.role.is_master != (self.broker_id == 0):
            raise ValueError(
                f"broker_id {self.broker_id} does not fit role {self.store.role.value}: "
                "a master is broker_id 0, a slave 1 or more"
            )
        host = self.advertised_host
        field = "broker_ip" if self.broker_ip else "listen_host"
        try:
            address = ipaddress.ip_address(host)
        except ValueError:
            raise ValueError(
                f"{field} {host!r} is not an IP address; set broker_ip to the address "
                "clients and other brokers reach this broker at"
            ) from None
        if address.is_unspecified:
            raise ValueError(
                f"{field} {host!r} is a wildcard; set broker_ip to the address clients "
                "and other brokers reach this broker at"
            )

    @property
    def credentials(self) -> Credentials | None:
        """What this broker signs its requests with (access_key and secret_key)."""
        return credentials_from(self.access_key, self.secret_key)

    @property
    def advertised_host(self) -> str:
        return self.broker_ip or self.listen_host

    @property
    def ha_port(self) -> int:
        if self.ha_listen_port is not None:
            return self.ha_listen_port
        return self.listen_port + 1 if self.listen_port else 0

    @property
    def role(self) -> BrokerRole:
        return self.store.role

    @property
    def is_master(self) -> bool:
        """Configured as master (in controller mode the controllers decide instead)."""
        return not self.enable_controller_mode and self.broker_id == 0 and self.store.role.is_master

    @property
    def send_waits(self) -> dict[str, float]:
        """What this broker waits for before it answers a send, when it is master:
        ``{setting: seconds}`` (empty: it answers once the message is stored)."""
        waits: dict[str, float] = {}
        if self.store.flush_disk_type is FlushDiskType.SYNC_FLUSH:
            waits["[store] sync_flush_timeout_s"] = self.store.sync_flush_timeout_s
        if self.store.role is BrokerRole.SYNC_MASTER or (
            self.enable_controller_mode and self.all_ack_in_sync_state_set
        ):
            waits["[ha] sync_timeout_s"] = self.ha.sync_timeout_s
        return waits

    def send_wait_warning(self) -> str | None:
        """Why producers at their default per-try wait (hamq's SEND_ATTEMPT_TIMEOUT_S)
        would give up on this broker's sends before it answers, or None. (A producer
        that gives up and retries stores a second copy; see the rule in
        hamq/protocol/send_timing.py.)"""
        waits = self.send_waits
        longest = max(waits.values(), default=0.0)
        if not send_wait_too_short(SEND_ATTEMPT_TIMEOUT_S, longest):
            return None
        named = ", ".join(f"{key} = {value:g}" for key, value in waits.items())
        below = SEND_ATTEMPT_TIMEOUT_S - SEND_ANSWER_MARGIN_S
        return (
            f"this broker waits up to {longest:g}s before it answers a send ({named}); "
            f"producers wait {SEND_ATTEMPT_TIMEOUT_S:g}s for an answer by default and would "
            f"give up first and retry, storing the message twice: keep the waits at most "
            f"{below:g}s, or raise the producers' send_attempt_timeout_s"
        )


class ConfigTypeError(TypeError):
    """A value of the wrong type; the text says which type was wanted and what came."""


_SCALARS: dict[type, str] = {bool: "boolean", int: "integer", float: "number", str: "string"}
_CONTAINERS: dict[type, str] = {list: "a list", tuple: "a list", dict: "a table"}


def _kind(value: object) -> str:
    """``the string '11011'``, ``the boolean True``, ``a list``: what a value is."""
    scalar = _SCALARS.get(type(value))
    if scalar is not None:
        return f"the {scalar} {value!r}"
    return _CONTAINERS.get(type(value), f"a {type(value).__name__}")


def _exactly(wanted: str, check: Callable[[object], bool], make: Callable[[Any], Any]) -> Any:
    """A structure hook that takes ``value`` only if ``check`` says it has the right
    type, and never converts between strings, numbers and booleans (cattrs' default
    for int does ``int("11011")``; a config file saying ``"11011"`` is a mistake)."""

    def hook(value: object, _type: object) -> Any:
        if not check(value):
            raise ConfigTypeError(f"must be {wanted}, not {_kind(value)}")
        return make(value)

    return hook


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _is_str(value: object) -> bool:
    return isinstance(value, str)


def _is_string_list(value: object) -> bool:
    return isinstance(value, list | tuple) and all(isinstance(v, str) for v in value)


def _converter() -> cattrs.Converter:
    """Every field type of the configuration, structured strictly (TOML gives each
    value its own type; a value of another type is refused, never coerced)."""
    conv = cattrs.Converter(forbid_extra_keys=True, detailed_validation=True)
    conv.register_structure_hook(int, _exactly("an integer", _is_int, int))
    conv.register_structure_hook(float, _exactly("a number", _is_number, float))
    conv.register_structure_hook(
        bool, _exactly("true or false", lambda v: isinstance(v, bool), bool)
    )
    conv.register_structure_hook(str, _exactly("a string", _is_str, str))
    conv.register_structure_hook(Secret, _exactly("a string", _is_str, Secret))
    conv.register_structure_hook(
        Path, _exactly("a path (a string)", lambda v: isinstance(v, str | Path), Path)
    )
    conv.register_structure_hook_func(
        lambda t: t == tuple[str, ...], _exactly("a list of strings", _is_string_list, tuple)
    )
    for enum_type in (BrokerRole, FlushDiskType, HAProtocol):
        conv.register_structure_hook(enum_type, _exactly("a string", _is_str, enum_type))
    return conv


_CONVERTER = _converter()


def _describe(exc: BaseException, type_: type | None) -> str:
    """A validator's own message when it has one (it names the value and the rule)."""
    if isinstance(exc, ValueError | ConfigTypeError) and str(exc):
        return str(exc)
    return format_exception(exc, type_)


def build_config(values: Mapping[str, Any]) -> BrokerConfig:
    """A BrokerConfig from plain values (a parsed TOML document with overrides)."""
    data = dict(values)
    store = data.setdefault("store", {})
    if not isinstance(store, Mapping):
        raise ConfigError(f"must be a table, not {_kind(store)} @ broker.store")
    data["store"] = {"store_dir": "./data/store", **store}
    try:
        return _CONVERTER.structure(data, BrokerConfig)
    except ClassValidationError as exc:
        problems = cattrs.transform_error(exc, path="broker", format_exception=_describe)
        raise ConfigError("; ".join(problems)) from None
    except (ValueError, TypeError) as exc:
        raise ConfigError(str(exc)) from None


#: (table, key): the secrets a ``<key>_file`` may hold instead (None: the top level)
SECRET_KEYS: tuple[tuple[str | None, str], ...] = ((None, "secret_key"), ("ha", "secret"))


def resolve_files(data: dict[str, Any], directory: Path) -> dict[str, Any]:
    """``data`` (a configuration file's values, changed in place and returned) with what
    it names resolved: ``acl_file`` and the secret files relative to ``directory`` (the
    file's own, not the working directory), and each secret file read into its key
    (see the module's text). ConfigError naming the key and the file."""
    acl_file = data.get("acl_file")
    if isinstance(acl_file, str) and acl_file:
        data["acl_file"] = str(directory / acl_file)  # (an absolute path stays itself)
    for table_name, key in SECRET_KEYS:
        table = data if table_name is None else data.get(table_name)
        if isinstance(table, dict) and f"{key}_file" in table:
            name = key if table_name is None else f"[{table_name}] {key}"
            if key in table:
                raise ConfigError(f"give {name} or {name}_file, not both")
            table[key] = _read_secret(f"{name}_file", table.pop(f"{key}_file"), directory)
    return data


def _read_secret(name: str, value: object, directory: Path) -> str:
    """The secret in the file ``value`` names, relative to ``directory``."""
    if not isinstance(value, str) or not value:
        raise ConfigError(f"{name} must be a path (a string), not {_kind(value)}")
    return read_secret_file(name, directory / value)


def read_secret_file(name: str, path: Path) -> str:
    """The secret ``path`` holds, surrounding whitespace dropped; one warning when users
    other than the owner may read it. ConfigError (``"<name> <path>: cannot read it
    (...)"``, ``"... is empty"``) when it cannot be used. ``name`` says where the path
    came from: ``secret_key_file``, ``--raft-secret-file``."""
    try:
        text = path.read_text(encoding="utf-8").strip()
        mode = path.stat().st_mode
    except OSError as exc:
        raise ConfigError(f"{name} {path}: cannot read it ({exc.strerror or exc})") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{name} {path} is not UTF-8 text") from None
    if not text:
        raise ConfigError(f"{name} {path} is empty")
    if mode & (stat.S_IRGRP | stat.S_IROTH):
        log.warning(
            "%s %s may be read by other users (mode %03o): chmod 600 %s",
            name,
            path,
            stat.S_IMODE(mode),
            path,
        )
    return text


def load_config(path: Path | None, overrides: Mapping[str, Any] | None = None) -> BrokerConfig:
    """Read ``path`` (TOML) if given (resolving what it names: ``resolve_files``), apply
    ``overrides`` (``store.x`` goes into [store], ``remoting.tls.x`` into [remoting.tls])."""
    data: dict[str, Any] = {}
    if path is not None:
        try:
            data = tomllib.loads(path.read_text())
        except OSError as exc:
            raise ConfigError(f"cannot read {path}: {exc}") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{path} is not valid TOML: {exc}") from None
        resolve_files(data, path.parent)
    for key, value in (overrides or {}).items():
        if value is None:
            continue
        # "store.role", "remoting.tls.cert_file": a key of a (nested) table
        *tables, leaf = key.split(".")
        table = data
        for name in tables:
            table = table.setdefault(name, {})
            if not isinstance(table, dict):
                raise ConfigError(f"{name} must be a table, not {_kind(table)}")
        table[leaf] = value
    return build_config(data)
