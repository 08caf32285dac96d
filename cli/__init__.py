"""The typer application behind the ``hamq`` command (cli/main.py is the root)."""
