"""The typer application behind the ``hamq`` command (cli/main.py is the root).

One module per command group, and the pieces a command needs beside it:

- main.py           the root app: global options, every group combined, how a command ends
- common.py         what the groups share: running Trio under signals, errors, options
- progress.py       LiveCount: a count and its rate drawn live on stderr at a terminal
- servers.py        ``hamq broker``, ``hamq nameserver``, ``hamq controller``
- produce.py        ``hamq produce``: a producer at the terminal
- bodies.py         produce's message bodies (BODY, --body-file, stdin), read and checked
- consume.py        ``hamq consume``: a push consumer at the terminal
- topic.py          ``hamq topic``: create, list, route, status, delete
- admin.py          ``hamq admin``: the commands (command line, requests, ``--json``)
- admin_output.py   what ``hamq admin`` prints for people: its tables and lines
- bench.py          ``hamq bench``: the benchmarks of benchmarks/
- cluster.py        ``hamq cluster up``: the command
- profiles.py       cluster profiles: the files of conf/<profile>, read and checked (no I/O
                    but files)
- supervisor.py     ``cluster up``'s supervisor: start order, restarts, stop in reverse
- children.py       one child process of ``cluster up``: spawned, ready, watched, signalled

``hamq cluster up``'s modules point one way: cluster.py → supervisor.py → children.py →
profiles.py; import-linter contracts in pyproject.toml keep that, and keep profiles.py
free of trio and subprocess.
"""
