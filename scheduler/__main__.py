"""`python -m scheduler`: the `scheduler` command (a worker pool starts its children this way)."""

from scheduler.cli.main import main

main(prog_name="scheduler")
