"""``hamq bench``: run the benchmarks of benchmarks/ from a source checkout."""

from __future__ import annotations

import enum
import subprocess
import sys
from pathlib import Path
from typing import Annotated

import typer

from cli.common import HELP_MARKUP

app = typer.Typer(
    help="Run hamq's benchmarks (from a source checkout).",
    no_args_is_help=True,
    rich_markup_mode=HELP_MARKUP,
)

BENCHMARKS_DIR = Path(__file__).resolve().parent.parent / "benchmarks"


class Backend(enum.StrEnum):
    """The event loop a benchmark's clients run on (its brokers are Trio in any case)."""

    trio = "trio"
    asyncio = "asyncio"
    uvloop = "uvloop"  # asyncio on uvloop (not on Windows)


def _run(name: str, args: list[str]) -> None:
    script = BENCHMARKS_DIR / f"{name}.py"
    if not script.is_file():
        typer.echo(
            f"error: {script} not found; benchmarks run from a source checkout of hamq",
            err=True,
        )
        raise typer.Exit(2)
    raise typer.Exit(subprocess.call([sys.executable, str(script), *args]))


@app.command()
def remoting(
    quick: Annotated[bool, typer.Option(help="One round of 1-second cells.")] = False,
    duration: Annotated[float, typer.Option(min=0.2, help="Seconds per cell.")] = 2.0,
    rounds: Annotated[int, typer.Option(min=1, help="Measurements per cell (median).")] = 3,
) -> None:
    """Round trips per second of hamq's remoting layer against plain Trio."""
    args = ["--quick"] if quick else ["--duration", str(duration), "--rounds", str(rounds)]
    _run("remoting", args)


@app.command()
def store(
    quick: Annotated[bool, typer.Option(help="Fewer messages, one round.")] = False,
    rounds: Annotated[int, typer.Option(min=1, help="Measurements per figure (median).")] = 3,
) -> None:
    """Message store appends, group commit and reads against plain files."""
    _run("store", ["--quick"] if quick else ["--rounds", str(rounds)])


@app.command("produce-consume")
def produce_consume(
    quick: Annotated[bool, typer.Option(help="Fewer messages, one round.")] = False,
    rounds: Annotated[int, typer.Option(min=1, help="Measurements per figure (median).")] = 3,
    pin: Annotated[
        bool, typer.Option(help="Pin the broker to CPU 1, the clients to CPU 0.")
    ] = False,
    backend: Annotated[
        Backend,
        typer.Option(
            help="The event loop the clients run on: trio, asyncio, or uvloop (asyncio on "
            "uvloop). The broker is a Trio process in any case."
        ),
    ] = Backend.trio,
    grpc: Annotated[
        bool,
        typer.Option(
            help="The gRPC rows: RocketMQ's official Python 5.x client (its virtualenv, "
            ".venv-rmq5, is made from the package index on first use)."
        ),
    ] = True,
) -> None:
    """Producer and consumer throughput and latency against a broker in its own process."""
    args = ["--quick"] if quick else ["--rounds", str(rounds)]
    args += ["--backend", backend.value]
    if not grpc:
        args.append("--no-grpc")
    _run("produce_consume", [*args, "--pin"] if pin else args)


@app.command()
def replication(
    quick: Annotated[
        bool, typer.Option(help="A 128 MiB catch-up log, fewer messages, one round.")
    ] = False,
    rounds: Annotated[int, typer.Option(min=1, help="Measurements per figure (median).")] = 3,
) -> None:
    """SYNC_MASTER vs ASYNC_MASTER sends with a slave, slave catch-up against loopback TCP."""
    _run("replication", ["--quick"] if quick else ["--rounds", str(rounds)])


@app.command()
def failover(
    kills: Annotated[int, typer.Option(min=1, help="How many times the master is killed.")] = 10,
) -> None:
    """Automatic failover: kill -9 of the master to the first SEND_OK on the new master."""
    _run("failover", ["--kills", str(kills)])


@app.command()
def nemesis(
    duration: Annotated[
        str, typer.Option(help="How long the faults are held in all: 90s, 30m, 2h.")
    ] = "5m",
    seed: Annotated[int | None, typer.Option(help="The schedule's seed (random).")] = None,
    nemesis: Annotated[
        str, typer.Option("--nemesis", help="Which nemeses, comma-separated (all).")
    ] = "",
    each: Annotated[bool, typer.Option(help="Every nemesis once instead.")] = False,
    hold: Annotated[float, typer.Option(min=0.5, help="Seconds each is held (--each).")] = 5.0,
    cpp: Annotated[bool, typer.Option(help="RocketMQ's C++ client sends too.")] = False,
    json_path: Annotated[
        Path | None, typer.Option("--json", help="Write the report to this file.")
    ] = None,
) -> None:
    """Partitions, kills, pauses, clock skew and a full disk against a controller-mode
    cluster in network namespaces (root): lost, duplicated, reordered, divergent, and
    the seconds with no SEND_OK per fault."""
    args = ["--duration", duration, "--hold", str(hold)]
    if seed is not None:
        args += ["--seed", str(seed)]
    if nemesis:
        args += ["--nemesis", nemesis]
    if each:
        args.append("--each")
    if cpp:
        args.append("--cpp")
    if json_path is not None:
        args += ["--json", str(json_path)]
    _run("nemesis", args)


@app.command("spark-read")
def spark_read(
    quick: Annotated[bool, typer.Option(help="100,000 messages, one round.")] = False,
    messages: Annotated[int, typer.Option(min=1000, help="Messages in the topic.")] = 1_000_000,
    rounds: Annotated[int, typer.Option(min=1, help="Measurements per figure (median).")] = 3,
) -> None:
    """A Spark batch read of a topic (the "hamq" data source) against reading parquet."""
    if quick:
        messages, rounds = 100_000, 1
    _run("spark_read", ["--messages", str(messages), "--rounds", str(rounds)])
