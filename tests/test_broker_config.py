"""A broker's configuration file: a value of the wrong type is refused naming its key
(every one at once), by ``build_config`` / ``load_config`` and by the ``hamq broker``
command (one line, exit 2); numbers where floats go, and the right types, load.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from hamq.broker import ConfigError, build_config, load_config
from tests.support.processes import hamq_command, write_toml


@pytest.mark.parametrize(
    ("values", "key"),
    [
        ({"listen_port": "11011"}, "broker.listen_port"),
        ({"broker_id": True}, "broker.broker_id"),
        ({"listen_port": 11011.0}, "broker.listen_port"),
        ({"register_interval_s": "30"}, "broker.register_interval_s"),
        ({"auto_create_topic_enable": "false"}, "broker.auto_create_topic_enable"),
        ({"slave_read_enable": 1}, "broker.slave_read_enable"),
        ({"broker_name": 7}, "broker.broker_name"),
        ({"namesrv_addrs": "127.0.0.1:9876"}, "broker.namesrv_addrs"),
        ({"namesrv_addrs": [9876]}, "broker.namesrv_addrs"),
        (
            {"store": {"flush_interval_commitlog_s": "0.5"}},
            "broker.store.flush_interval_commitlog_s",
        ),
        ({"store": {"role": 0}}, "broker.store.role"),
        ({"store": {"store_dir": 5}}, "broker.store.store_dir"),
        ({"ha": {"sync_timeout_s": "3"}}, "broker.ha.sync_timeout_s"),
        ({"ha": {"sync_from_last_file": "yes"}}, "broker.ha.sync_from_last_file"),
        ({"remoting": {"idle_timeout_s": "never"}}, "broker.remoting.idle_timeout_s"),
    ],
)
def test_config_values_of_the_wrong_type_are_refused_by_key(
    values: dict[str, Any], key: str
) -> None:
    store = {"store_dir": "./data/store", **values.pop("store", {})}
    with pytest.raises(ConfigError, match=re.escape(f"@ {key}")):
        build_config({**values, "store": store})


def test_every_wrong_type_is_named_at_once(tmp_path: Path) -> None:
    path = tmp_path / "broker.toml"
    path.write_text('listen_port = "11011"\nbroker_id = "0"\n[store]\nstore_dir = "x"\n')
    with pytest.raises(ConfigError) as refused:
        load_config(path)
    assert "listen_port" in str(refused.value) and "broker_id" in str(refused.value)


def test_numbers_where_floats_go_and_right_types_still_load(tmp_path: Path) -> None:
    config = build_config(
        {
            "listen_port": 11011,
            "register_interval_s": 30,  # an int where a float goes
            "namesrv_addrs": ["127.0.0.1:9876"],
            "auto_create_topic_enable": False,
            "store": {"store_dir": str(tmp_path), "role": "SYNC_MASTER", "file_reserved_time_h": 1},
            "ha": {"sync_timeout_s": 2, "protocol": "autoswitch"},
            "remoting": {"idle_timeout_s": 60.5},
        }
    )
    assert config.listen_port == 11011 and config.register_interval_s == 30.0
    assert isinstance(config.register_interval_s, float)
    assert config.namesrv_addrs == ("127.0.0.1:9876",)
    assert config.store.store_dir == tmp_path and config.ha.sync_timeout_s == 2.0


@pytest.mark.slow
async def test_a_config_value_of_the_wrong_type_is_refused_by_the_command(tmp_path: Path) -> None:
    config = write_toml(
        tmp_path / "broker.toml", {"listen_port": "11011", "store": {"store_dir": "x"}}
    )
    result = await hamq_command("broker", "-c", str(config))
    assert result.returncode == 2
    text = result.stderr.decode()
    assert text.startswith("error: ") and "listen_port" in text and "'11011'" in text, text
    assert len(text.splitlines()) == 1
