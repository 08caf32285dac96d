"""A running broker's configuration: shown (GET_BROKER_CONFIG), and changed where that is
safe (UPDATE_BROKER_CONFIG).

The text both requests carry is Java's properties format, one ``key=value`` a line
(``key: value`` too; blank lines and ``#`` / ``!`` comments skipped). Keys are the
configuration file's (``long_polling_max_s``, nested ones as ``store.flush_disk_type``);
RocketMQ's camelCase spelling of the same name is taken as well (``slaveReadEnable``).
A value is read as a TOML value (``30``, ``2.5``, ``true``, ``"text"``), else as a
plain string, and then checked exactly as the configuration file's are: the same
types (``"30"`` is a string, not a number) and the same ranges, with the same words.
GET_BROKER_CONFIG shows each setting as text (``flatten``: ``true``, ``30.0``, a list
``;``-separated, nothing for None); ``typed_settings`` reads that text back by the
settings' types (``hamq admin broker-config --json``: a broker named ``123`` stays a
string, which no reading of the text alone could tell).

Only LIVE_KEYS change: settings read afresh each time they are used (per request, or
per round of a loop: the round under way finishes with the old value). Every other
setting is read once at start (ports, names, the store, HA, client housekeeping ...)
and is refused by name: a change that took nothing would only look as if it worked.
An update is all or nothing: one refused key and none changes. Changes live in memory
only: a restart reads the configuration file again.
"""

from __future__ import annotations

import functools
import json
import logging
import math
import re
import tomllib
import typing
from collections.abc import Callable, Mapping
from enum import Enum
from pathlib import Path
from typing import Any

import attrs
from attrs import AttrsInstance

from hamq.broker.config import BrokerConfig, ConfigError, build_config
from hamq.broker.context import BrokerContext
from hamq.protocol import RequestError, ResponseCode

log = logging.getLogger(__name__)


def _set_lock_lifetime(ctx: BrokerContext, value: Any) -> None:
    ctx.locks.max_live_ms = int(value * 1000)


#: settings that take effect at once, with where each is read (and, for the one held by
#: a manager, how the manager is told)
LIVE_KEYS: dict[str, str] = {
    "long_polling_max_s": "each pull that waits (processors/pull.py)",
    "slave_read_enable": "each pull (processors/pull.py)",
    "slave_read_lag_bytes": "each pull (processors/pull.py)",
    "register_interval_s": "after the next registration (registration.py)",
    "register_timeout_s": "each registration (registration.py)",
    "metadata_sync_interval_s": "after a slave's next metadata sync (slave_sync.py)",
    "rebalance_lock_max_live_s": "each queue lock (clients.py)",
}
_APPLY: dict[str, Callable[[BrokerContext, Any], None]] = {
    "rebalance_lock_max_live_s": _set_lock_lifetime,
}
_CAMEL = re.compile(r"(?<=[a-z0-9])([A-Z])")
_COMMENT = ("#", "!")


class ConfigUpdateError(RequestError):
    """An update refused as a whole; the text names every refused key and why."""


def parse_properties(text: str) -> dict[str, str]:
    """``key=value`` lines (Java's properties, without escapes) as a dict; a line with
    no separator is a key with an empty value, as Java reads it."""
    values: dict[str, str] = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith(_COMMENT):
            continue
        cut = min((line.find(c) for c in "=:" if c in line), default=-1)
        key, value = (line, "") if cut < 0 else (line[:cut], line[cut + 1 :])
        values[key.strip()] = value.strip()
    return values


def format_properties(values: Mapping[str, str]) -> str:
    return "".join(f"{key}={value}\n" for key, value in sorted(values.items()))


def config_key(name: str) -> str:
    """The configuration's name for ``name``: snake_case as is, camelCase converted."""
    return _CAMEL.sub(lambda m: "_" + m.group(1).lower(), name).lower() if name else name


def _value(text: str) -> Any:
    """A property's value as the configuration file would hold it."""
    try:
        return tomllib.loads(f"value = {text}")["value"]
    except (tomllib.TOMLDecodeError, RecursionError):  # RecursionError: '[' * 100000
        return text


def _shown(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, Enum):
        return str(value.value)
    if isinstance(value, tuple | list):
        return ";".join(_shown(v) for v in value)
    if isinstance(value, Path):
        return str(value)
    return str(value)


def flatten(obj: AttrsInstance, prefix: str = "") -> dict[str, str]:
    """Every setting of a configuration object as text, nested ones as ``store.x``."""
    values: dict[str, str] = {}
    for field in attrs.fields(type(obj)):
        value = getattr(obj, field.name)
        if attrs.has(type(value)):
            values.update(flatten(value, f"{prefix}{field.name}."))
        else:
            values[f"{prefix}{field.name}"] = _shown(value)
    return values


@functools.cache
def _setting_types(cls: type[AttrsInstance] = BrokerConfig, prefix: str = "") -> dict[str, Any]:
    """Each setting's type, by its ``flatten`` key: the nested configurations' too, an
    optional one (``remoting.tls``) both as itself and as its settings."""
    hints = typing.get_type_hints(cls)
    types: dict[str, Any] = {}
    for field in attrs.fields(cls):
        hint = hints[field.name]
        nested = [t for t in typing.get_args(hint) or (hint,) if attrs.has(t)]
        if not attrs.has(hint):
            types[f"{prefix}{field.name}"] = hint
        for inner in nested:
            types.update(_setting_types(inner, f"{prefix}{field.name}."))
    return types


def _typed(hint: Any, text: str) -> Any:
    """``text``, shown by ``_shown``, as a value of type ``hint``; the text itself when
    it is none of them."""
    args = typing.get_args(hint)
    if type(None) in args:
        if text == "":
            return None
        others = [a for a in args if a is not type(None)]
        hint = others[0] if len(others) == 1 else str
    if hint is bool:
        return {"true": True, "false": False}.get(text, text)
    if hint is int or hint is float:
        try:
            number = hint(text)
        except ValueError:
            return text
        return number if math.isfinite(number) else text
    if typing.get_origin(hint) is tuple:
        return text.split(";") if text else []
    return text  # str, Path, an Enum's value, a Secret's mask


def typed_settings(values: Mapping[str, str]) -> dict[str, Any]:
    """GET_BROKER_CONFIG's ``key=value`` text (``flatten``'s) back in the settings' types,
    for JSON: numbers, booleans, lists (``namesrv_addrs``), None for a setting not set
    (shown as nothing); strings as they are. A key this version of hamq does not have
    (another broker's) keeps its text."""
    types = _setting_types()
    return {key: _typed(types[key], text) if key in types else text for key, text in values.items()}


class LiveConfig:
    """The broker's configuration as the config requests see it; ``version`` counts
    the updates (RocketMQ's DataVersion)."""

    def __init__(self, ctx: BrokerContext) -> None:
        self.ctx = ctx
        self.counter = 0
        self.updated_ms = ctx.clock()

    @property
    def version(self) -> str:
        return json.dumps(
            {"counter": self.counter, "stateVersion": 0, "timestamp": self.updated_ms},
            separators=(",", ":"),
        )

    def text(self) -> str:
        settings = flatten(self.ctx.config)
        if self.ctx.grpc_port:  # (the port bound: what a slave's gRPC routes ask for)
            settings["grpc_port"] = str(self.ctx.grpc_port)
        return format_properties(settings)

    def update(self, text: str) -> dict[str, str]:
        """Apply the ``key=value`` lines of ``text``; the changes made, as text.

        ConfigUpdateError, with nothing changed, if any key is unknown, cannot change
        while the broker runs (NO_PERMISSION when that is all), or has a bad value
        (INVALID_PARAMETER)."""
        wanted = parse_properties(text)
        if not wanted:
            raise ConfigUpdateError(ResponseCode.INVALID_PARAMETER, "no key=value given")
        known = flatten(self.ctx.config)
        changes: dict[str, Any] = {}
        bad: list[str] = []
        fixed: list[str] = []
        for name, raw in wanted.items():
            key = config_key(name)
            if key not in known:
                bad.append(f"{name}: no such setting")
            elif key not in LIVE_KEYS:
                fixed.append(
                    f"{key} cannot change while the broker runs (it is read once, at "
                    "start: change the configuration file and restart)"
                )
            else:
                try:
                    checked = build_config({key: _value(raw)})
                except ConfigError as exc:
                    problem = re.sub(r" @ broker\S*$", "", str(exc))
                    bad.append(f"{key}={raw}: {problem}")
                else:
                    changes[key] = getattr(checked, key)
        if bad or fixed:
            code = ResponseCode.INVALID_PARAMETER if bad else ResponseCode.NO_PERMISSION
            raise ConfigUpdateError(code, "; ".join(bad + fixed) + "; nothing changed")
        self.ctx.config = attrs.evolve(self.ctx.config, **changes)
        for key, value in changes.items():
            apply = _APPLY.get(key)
            if apply is not None:
                apply(self.ctx, value)
            log.info("configuration: %s = %s (was %s)", key, _shown(value), known[key])
        self.counter += 1
        self.updated_ms = self.ctx.clock()
        return {key: _shown(value) for key, value in changes.items()}
