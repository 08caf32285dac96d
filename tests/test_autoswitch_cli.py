"""Automatic failover from the command line: ``hamq admin sync-state-set``,
``elect-master`` and ``broker-epoch`` against real processes, and ``hamq cluster up``
with nameservers that embed controllers and brokers in controller mode.

Everything runs on 127.0.0.1 with ports found free at run time, stores and Raft logs
under tmp_path; every wait is bounded and every process is killed by PID at the end
(tests/support/processes.py, tests/test_cluster.py's ``cluster_up``).
"""

from __future__ import annotations

import itertools
import os
import re
import signal
from pathlib import Path
from typing import Any

import pytest
import trio
from typer.testing import CliRunner

from cli.main import app
from cli.profiles import Kind, load_profile
from hamq.client import Message, Producer, SendStatus
from hamq.client.admin_views import epochs_from_ha_status as _from_ha_status
from tests.support.autoswitch import hamq_admin, sync_state, sync_state_when
from tests.support.brokers import SMALL_STORE
from tests.support.cluster import alive, cluster_up, wait_gone
from tests.support.processes import free_ports, hamq_server, write_toml
from tests.support.timing import wait_for

GROUP = "broker-t"
#: how long the controller may take to see both brokers in the SyncStateSet
SYNC_S = 30
runner = CliRunner()


def broker_toml(path: Path, store_dir: Path, namesrvs: list[str], **extra: Any) -> Path:
    """A broker of GROUP in controller mode; its nameservers are its controllers too."""
    return write_toml(
        path,
        {
            "broker_name": GROUP,
            "listen_port": 0,
            "namesrv_addrs": namesrvs,
            "enable_controller_mode": True,
            "controller_addrs": namesrvs,
            "all_ack_in_sync_state_set": True,
            **extra,
            "store": {"store_dir": str(store_dir), **SMALL_STORE},
        },
    )


async def until_in_sync(controller: str, members: int) -> dict[str, Any]:
    """GROUP's entry once ``members`` brokers are in its SyncStateSet (bounded)."""
    return await sync_state_when(
        controller, GROUP, lambda g: len(g.get("inSyncReplicas") or []) == members, SYNC_S
    )


def search(pattern: str, text: str) -> re.Match[str]:
    match = re.search(pattern, text, re.M)
    assert match, (pattern, text)
    return match


def epoch_rows(text: str) -> list[tuple[int, int, int]]:
    """(epoch, start, end) from the table ``hamq admin broker-epoch`` prints."""
    return [
        (int(a), int(b), int(c))
        for a, b, c in re.findall(r"^│\s*(\d+)\s*│\s*(\d+)\s*│\s*(\d+)\s*│$", text, re.M)
    ]


@pytest.mark.slow
async def test_sync_state_set_designated_election_and_epochs(tmp_path: Path) -> None:
    port, raft_port = free_ports(2)
    controller = f"127.0.0.1:{port}"
    async with hamq_server(
        "nameserver",
        "--port",
        str(port),
        "--controller",
        "--raft-address",
        f"127.0.0.1:{raft_port}",
        "--controller-dir",
        str(tmp_path / "controller"),
    ) as (_, ready):
        assert f"controller raft 127.0.0.1:{raft_port}" in ready
        first = broker_toml(tmp_path / "b1.toml", tmp_path / "b1", [controller])
        second = broker_toml(tmp_path / "b2.toml", tmp_path / "b2", [controller])
        async with (
            hamq_server("broker", "-c", str(first)) as (_, ready1),
            hamq_server("broker", "-c", str(second)) as (_, ready2),
        ):
            addrs = {search(r" at (\S+),", line).group(1) for line in (ready1, ready2)}
            group = await until_in_sync(controller, 2)
            by_id = {r["brokerId"]: r for r in group["inSyncReplicas"]}
            assert {r["brokerAddress"] for r in by_id.values()} == addrs
            assert all(r["alive"] for r in by_id.values()), group
            master, epoch = group["masterBrokerId"], group["masterEpoch"]
            (other,) = set(by_id) - {master}
            async with Producer("PG", controller, send_timeout_s=5) as producer:
                sent = [await producer.send(Message("Demo", b"m%d" % i)) for i in range(5)]
            assert [r.status for r in sent] == [SendStatus.SEND_OK] * 5

            code, out, err = await hamq_admin("sync-state-set", "--controller", controller)
            assert code == 0, err
            summary = search(rf"^{GROUP}: master {master} \((\S+)\), master epoch (\d+); ", out)
            assert summary.groups() == (by_id[master]["brokerAddress"], str(epoch)), out
            assert f"SyncStateSet {sorted(by_id)} epoch" in out, out

            # the controller refuses a broker that is not in the group, by code name
            code, out, err = await hamq_admin(
                "elect-master", "--controller", controller, "--broker", GROUP, "--broker-id", "99"
            )
            assert code == 1, out
            assert err.startswith(
                f"error: controller {controller} answered CONTROLLER_ELECT_MASTER_FAILED(2012): "
            ), err
            assert err.count("\n") == 1, err

            code, out, err = await hamq_admin(
                "elect-master",
                "--controller",
                controller,
                "--broker",
                GROUP,
                "--broker-id",
                str(other),
            )
            assert code == 0, err
            new_addr = by_id[other]["brokerAddress"]
            assert f"{GROUP}: broker {other} ({new_addr}) is master, master epoch {epoch + 1}" in (
                out
            ), out
            after = (await sync_state(controller))[GROUP]
            assert (after["masterBrokerId"], after["masterEpoch"]) == (other, epoch + 1), after
            assert after["masterAddress"] == new_addr

            # naming the master it has is a success that says so (the README's failover
            # walkthrough runs elect-master for broker 2, which may have won already)
            code, out, err = await hamq_admin(
                "elect-master",
                "--controller",
                controller,
                "--broker",
                GROUP,
                "--broker-id",
                str(other),
            )
            assert code == 0, err
            assert (
                f"{GROUP}: broker {other} ({new_addr}) is master already; nothing changed, "
                f"master epoch {epoch + 1}; "
            ) in out, out
            kept = (await sync_state(controller))[GROUP]
            assert (kept["masterBrokerId"], kept["masterEpoch"]) == (other, epoch + 1), kept

            # the new master writes the new epoch into its epoch table (bounded)
            async def new_epoch_shown() -> str | None:
                code, out, err = await hamq_admin("broker-epoch", "--broker", new_addr)
                assert code == 0, err
                rows = epoch_rows(out)
                return out if rows and rows[-1][0] == epoch + 1 else None

            out = await wait_for(new_epoch_shown, 15, every_s=0.3, what=f"epoch {epoch + 1}")
            rows = epoch_rows(out)
            # the messages were written in the old epoch, which the new master also has
            max_offset = int(search(r"^max offset (\d+)$", out).group(1))
            assert max_offset > 0, out
            old_epoch, new_epoch = rows[-2:]
            assert (old_epoch[0], old_epoch[2]) == (epoch, max_offset), out
            assert new_epoch == (epoch + 1, max_offset, max_offset), out
            for (_, _, end), (_, start, _) in itertools.pairwise(rows):
                assert end == start, out  # each epoch ends where the next starts
            assert f"epochs of {GROUP} at {new_addr}, id {other}" in out, out

            # the old master follows the new one and is back in the SyncStateSet
            group = await until_in_sync(controller, 2)
            assert (group["masterBrokerId"], group["masterEpoch"]) == (other, epoch + 1), group

            code, out, err = await hamq_admin(
                "sync-state-set", "--controller", controller, "--broker", "no-such-group"
            )
            assert code == 1
            assert "knows no broker group no-such-group (known: broker-t)" in err, err


@pytest.mark.slow
async def test_a_nameserver_without_a_controller_is_named_as_such() -> None:
    async with hamq_server("nameserver", "--port", "0") as (_, ready):
        namesrv = search(r"ready: (\S+)", ready).group(1)
        code, out, err = await hamq_admin("sync-state-set", "--controller", namesrv)
    assert code == 1, out
    assert err.startswith(
        f"error: no controller answered: controller {namesrv} answered "
        "REQUEST_CODE_NOT_SUPPORTED(3): "
    ), err
    assert err.rstrip().endswith("(not a controller, nor a nameserver started with --controller?)")


def test_no_controller_answering_is_one_line_naming_each() -> None:
    (port,) = free_ports(1)  # closed again: nothing listens there
    other = "127.0.0.1:1"
    result = runner.invoke(
        app, ["admin", "sync-state-set", "--controller", f"127.0.0.1:{port};{other}"]
    )
    assert result.exit_code == 1, result.output
    assert result.output.startswith("error: no controller answered: "), result.output
    assert f"127.0.0.1:{port}" in result.output and other in result.output
    assert result.output.count("\n") == 1, result.output


def test_the_controller_comes_from_hamq_controller() -> None:
    (port,) = free_ports(1)
    result = runner.invoke(
        app,
        ["admin", "elect-master", "--broker", "b", "--broker-id", "1"],
        env={"HAMQ_CONTROLLER": f"127.0.0.1:{port}"},
    )
    assert result.exit_code == 1, result.output
    assert f"error: no controller answered: 127.0.0.1:{port}" in result.output


def test_a_bad_address_is_refused_before_anything_is_sent() -> None:
    result = runner.invoke(app, ["admin", "broker-epoch", "--broker", "nowhere"])
    assert result.exit_code == 2
    assert "--broker: bad address 'nowhere'" in result.output


def test_an_unreachable_broker_is_one_line() -> None:
    (port,) = free_ports(1)
    result = runner.invoke(app, ["admin", "broker-epoch", "--broker", f"127.0.0.1:{port}"])
    assert result.exit_code == 1, result.output
    assert result.output.startswith(f"error: broker 127.0.0.1:{port}: "), result.output


def test_epochs_from_the_ha_status_end_where_the_next_starts() -> None:
    status = {
        "broker": "b",
        "brokerId": 2,
        "role": "SLAVE",
        "epochs": [[1, 0], [2, 100], [4, 250]],
        "slave": {"max_offset": 300},
    }
    table = _from_ha_status(status)
    assert table.entries == ((1, 0, 100), (2, 100, 250), (4, 250, 300))
    assert (table.broker_name, table.broker_id, table.role, table.max_offset) == (
        "b",
        2,
        "SLAVE",
        300,
    )
    empty = _from_ha_status({"broker": "b", "brokerId": -1, "epochs": []})
    assert empty.entries == () and empty.max_offset is None


# ---------------------------------------------------------------- hamq cluster up
def test_the_autoswitch_profile_loads() -> None:
    profile = load_profile("autoswitch")
    assert [c.kind for c in profile.children] == [Kind.NAMESERVER] * 3 + [Kind.BROKER] * 3
    nameserver = profile.children[0].args
    assert nameserver[:3] == ("nameserver", "--port", "9876")
    assert "--controller" in nameserver
    peers = nameserver[nameserver.index("--raft-peers") + 1]
    assert peers == "127.0.0.1:9886;127.0.0.1:9887;127.0.0.1:9888"
    secret = Path(nameserver[nameserver.index("--raft-secret-file") + 1])
    assert secret == profile.raft_secret_file and secret.name == "raft.secret"
    directory = Path(nameserver[nameserver.index("--controller-dir") + 1])
    assert directory.is_absolute() and directory.name == "nameserver-9876"
    assert all(c.broker_id is None for c in profile.children[3:])


def test_controller_mode_brokers_need_nameservers_with_controllers(tmp_path: Path) -> None:
    write_toml(tmp_path / "cluster.toml", {"nameserver_ports": [29876]})
    broker_toml(tmp_path / "b.toml", tmp_path / "b", ["127.0.0.1:29876"], listen_port=20911)
    result = runner.invoke(app, ["cluster", "up", "--profile", str(tmp_path)])
    assert result.exit_code == 2
    assert "names nameserver 127.0.0.1:29876, but" in result.output, result.output
    assert "does not set embed_controller = true" in result.output


def test_default_raft_ports_that_clash_are_refused(tmp_path: Path) -> None:
    write_toml(
        tmp_path / "cluster.toml", {"nameserver_ports": [29876, 29877], "embed_controller": True}
    )
    broker_toml(tmp_path / "b.toml", tmp_path / "b", ["127.0.0.1:29876"], listen_port=20911)
    result = runner.invoke(app, ["cluster", "up", "--profile", str(tmp_path)])
    assert result.exit_code == 2
    assert "raft port 29877 is also a nameserver's port" in result.output, result.output


@pytest.mark.slow
async def test_cluster_up_with_controllers_in_the_nameservers(tmp_path: Path) -> None:
    """Three nameservers with Raft between their controllers, two controller-mode
    brokers: up, both in the SyncStateSet, down in order on SIGINT."""
    ports = free_ports(10)
    ns_ports, raft_ports, broker_ports, ha_ports = ports[:3], ports[3:6], ports[6:8], ports[8:]
    controllers = [f"127.0.0.1:{p}" for p in ns_ports]
    profile = tmp_path / "auto"
    profile.mkdir()
    write_toml(
        profile / "cluster.toml",
        {
            "nameserver_ports": ns_ports,
            "embed_controller": True,
            "raft_ports": raft_ports,
            "controller_dir": str(tmp_path / "data" / "controller"),
        },
    )
    for name, port, ha_port in zip(("n0", "n1"), broker_ports, ha_ports, strict=True):
        broker_toml(
            profile / f"{name}.toml",
            tmp_path / "data" / name,
            controllers,
            listen_port=port,
            ha_listen_port=ha_port,
        )
    async with cluster_up(profile, tmp_path / "logs") as up:
        await up.read_until(r"^hamq cluster ready: auto, 5 process\(es\)", 30)
        pids = up.table_pids()
        assert set(pids) == {*(f"nameserver-{p}" for p in ns_ports), "n0", "n1"}, up.text
        assert re.search(r"│ n0 +│ broker +│ by controller +│ - +│ 127\.0\.0\.1:", up.text), up.text
        assert re.search(r"│ nameserver +│ \+ controller +│", up.text), up.text
        group = await until_in_sync(";".join(controllers), 2)
        assert group["masterBrokerId"] in {1, 2}, group
        for port in ns_ports:
            assert (tmp_path / "data" / "controller" / f"nameserver-{port}").is_dir()

        os.kill(up.proc.pid, signal.SIGINT)
        with trio.fail_after(30):
            code = await up.proc.wait()
        text = await up.read_to_end(5)
        assert code == 0, text + (tmp_path / "cluster-up.stderr").read_text()
        assert "stopping: controller-mode brokers, then nameservers" in text, text
        assert not await wait_gone(list(pids.values())), text


@pytest.mark.slow
async def test_cluster_up_restarts_a_killed_master_which_comes_back_as_a_slave(
    tmp_path: Path,
) -> None:
    """Controller mode: ``--restart`` is on by default. kill -9 of the master: one line,
    the controllers elect the other broker, ``up`` starts the dead one again (same
    arguments, same store) and it rejoins the SyncStateSet as a slave."""
    ns_port, raft_port, *broker_ports = free_ports(6)
    controller = f"127.0.0.1:{ns_port}"
    profile = tmp_path / "failover"
    profile.mkdir()
    write_toml(
        profile / "cluster.toml",
        {
            "nameserver_ports": [ns_port],
            "embed_controller": True,
            "raft_ports": [raft_port],
            "controller_dir": str(tmp_path / "data" / "controller"),
        },
    )
    addresses: dict[str, str] = {}
    for name, (port, ha_port) in (("n0", broker_ports[:2]), ("n1", broker_ports[2:])):
        broker_toml(
            profile / f"{name}.toml",
            tmp_path / "data" / name,
            [controller],
            listen_port=port,
            ha_listen_port=ha_port,
        )
        addresses[f"127.0.0.1:{port}"] = name
    async with cluster_up(profile, tmp_path / "logs") as up:
        await up.read_until(r"^hamq cluster ready: failover, 3 process\(es\).*restarts: on", 30)
        pids = up.table_pids()
        group = await until_in_sync(controller, 2)
        old_id, old_epoch = group["masterBrokerId"], group["masterEpoch"]
        master = addresses[group["masterAddress"]]
        (other,) = {"n0", "n1"} - {master}

        os.kill(pids[master], signal.SIGKILL)
        again = await up.read_until(
            rf"^  {master}: broker ready again at \S+ in [\d.]+ s \(pid (\d+), restart 1\)$", 45
        )
        errors = (tmp_path / "cluster-up.stderr").read_text().splitlines()
        assert errors == [
            f"warning: {master} (broker, pid {pids[master]}) exited unexpectedly (killed by "
            + "SIGKILL); starting it again in "
            + search(r"again in ([\d.]+ s)$", errors[0]).group(1)
        ], errors

        after = await sync_state_when(
            controller,
            GROUP,
            lambda g: g.get("masterEpoch", 0) > old_epoch and len(g["inSyncReplicas"]) == 2,
            SYNC_S,
        )
        assert addresses.get(after.get("masterAddress", "")) == other, after
        assert after["masterEpoch"] > old_epoch and after["masterBrokerId"] != old_id, after
        assert {r["brokerId"] for r in after["inSyncReplicas"]} >= {old_id}, after
        assert alive(int(again.group(1))) and alive(pids[other])
        assert alive(pids[f"nameserver-{ns_port}"])

        os.kill(up.proc.pid, signal.SIGINT)
        with trio.fail_after(30):
            code = await up.proc.wait()
        text = await up.read_to_end(5)
        assert code == 0, text + (tmp_path / "cluster-up.stderr").read_text()
        assert not await wait_gone([*pids.values(), int(again.group(1))]), text
