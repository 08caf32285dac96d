"""``hamq cluster up``: nameservers and broker groups of a profile, as child processes.

The command only: it loads the profile (cli/profiles.py: the files of conf/<profile>,
checked whole), makes the log directory and the embedded controllers' Raft secret,
and hands the rest to the supervisor (cli/supervisor.py: start order, restarts, stop),
which runs each child through cli/children.py (process group, parent-death signal,
ready line, log ``<log-dir>/<profile>-<child>.log``).

Exit codes: 0 after a clean stop of children that all ran at that time, 1 when a
child failed to start, had ended by the stop (or all had), or had to be killed, 2 for
a bad profile (or a log directory or Raft secret that cannot be written).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import trio
import typer

from cli.common import HELP_MARKUP, fail
from cli.profiles import ProfileError, ensure_raft_secret, load_profile, profile_names
from cli.supervisor import RESTART_GIVE_UP, Supervisor

app = typer.Typer(
    help="Run a whole cluster from a profile (see conf/).",
    no_args_is_help=True,
    rich_markup_mode=HELP_MARKUP,
)


@app.command()
def up(
    ctx: typer.Context,
    profile: Annotated[
        str,
        typer.Option(
            "--profile",
            "-p",
            help=f"A profile under conf/ ({', '.join(profile_names()) or 'none'}) or a directory.",
        ),
    ],
    log_dir: Annotated[
        Path, typer.Option("--log-dir", help="Where the children's logs go.")
    ] = Path("data/logs"),
    restart: Annotated[
        bool | None,
        typer.Option(
            "--restart/--no-restart",
            help="Start a process that ends on its own again (after 0.5-4 s; not after "
            f"{RESTART_GIVE_UP} quick failures in a row). Default: on when the profile's "
            "brokers are in controller mode (they come back as slaves), off otherwise.",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Start a profile's nameservers (with their controllers), masters, slaves and
    controller-mode brokers and watch them; Ctrl-C stops them all (brokers first)."""
    try:
        loaded = load_profile(profile)
    except ProfileError as exc:
        raise fail(str(exc), 2) from None
    try:
        log_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise fail(f"--log-dir {log_dir}: {exc.strerror or exc}", 2) from None
    if loaded.raft_secret_file is not None:
        try:
            ensure_raft_secret(loaded.raft_secret_file)
        except OSError as exc:
            secret = loaded.raft_secret_file
            raise fail(f"cannot write {secret}: {exc.strerror or exc}", 2) from None
    log_level = (ctx.obj or {}).get("log_level", "info")
    if restart is None:
        restart = loaded.controller_mode
    code = trio.run(Supervisor(loaded, log_dir, log_level, restart=restart).run)
    if code:
        raise typer.Exit(code)
