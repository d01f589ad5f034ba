"""The exit codes of every `scheduler` command, the worker included: one table, one meaning
per code. The CLI's help, README and docs/security.md show this table."""

from __future__ import annotations

EXIT_OK = 0
EXIT_FAILED = 1  # findings, a refusal, or (the worker) a crash
EXIT_USAGE = 2  # bad usage, input or settings (a URL no retry mends); nothing was written
EXIT_UNREACHABLE = 3  # cannot reach Redis, or it refuses for now (try again later)
EXIT_IMPORT = 4  # the worker's registry cannot be imported
EXIT_FORBIDDEN = 5  # the Redis user lacks a permission (ACL), or Redis refused for good
EXIT_FORCED = 130  # the worker was stopped by a second signal without waiting

# The worker's historical names, same values.
EXIT_ERROR = EXIT_FAILED
EXIT_REDIS = EXIT_UNREACHABLE
EXIT_REDIS_REFUSED = EXIT_FORBIDDEN

# fmt: skip below: the one exit-code table, one row per code as README and docs/security.md show it.
EXIT_CODES: tuple[tuple[int, str], ...] = (
    (EXIT_OK, "ok; the worker stopped cleanly (SIGTERM/SIGINT, --burst, --max-jobs/-memory-mb, "
              "scheduler workers stop or quiet)"),
    (EXIT_FAILED, "findings (doctor), a refusal (unknown queue, job or schedule; declined "
                  "confirmation; --strict and Redis settings that can lose jobs; a key edited "
                  "into something no version wrote), or the worker crashed"),
    (EXIT_USAGE, "bad usage, input or settings (a URL no retry mends: the server's TLS "
                 "certificate refused, a database it lacks, a cluster node's plain URL); nothing "
                 "was written"),
    (EXIT_UNREACHABLE, "cannot reach Redis, or it refuses for now (maxmemory, NOREPLICAS, a "
                      "failover, a slot being moved; the refused call wrote nothing): try again"),
    (EXIT_IMPORT, "the worker's registry cannot be imported (its module calling sys.exit() "
                  "included) or registers no task"),
    (EXIT_FORBIDDEN, "the Redis user lacks a permission (ACL), or its password was refused; "
                    "see docs/security.md"),
    (EXIT_FORCED, "the worker was forced to stop by a second signal"),
)  # fmt: skip

# Beside the table, not a row: any code above 128 is the shell's for a death by a signal.
SIGNAL_NOTE = (
    "128+N: killed by signal N where no handler could take it (143: SIGTERM in the worker's "
    "first ~0.6 s, before its handlers are in place; 137: SIGKILL, the "
    "OOM killer's): a lease it held lapses and its job runs again; nothing is lost"
)

# The table as every command's --help shows it (click's epilog; `\b`: not re-wrapped). Built
# here, once: `scheduler --help` (cli/main.py) shows it without importing cli/common.py.
EXIT_CODES_HELP = "\b\nExit codes (every command, the worker too):\n" + "\n".join(
    [*(f"  {code:>3}  {meaning}" for code, meaning in EXIT_CODES), "  " + SIGNAL_NOTE]
)
