"""The `redis-cli` lines shown to operators (doctor's fixes, `scheduler keys`' examples, the
server-settings warnings of a worker's start and `scheduler enqueue`) made to reach the server
the command was given: `-h`/`-p` or `-s`, `-n`, `--tls` and its files, `-c` on a Redis Cluster,
`--user` and `--askpass` (never the password itself: it would be shown on the terminal and kept
in the shell's history); `scheduler ...` lines get the `--url` (`"$REDIS_URL"` when the URL
holds a password). The checks write the bare lines; the flags are added where the lines are
shown, so the checks stay free of connection details."""

from __future__ import annotations

import inspect
import shlex
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import unquote, urlsplit

from scheduler.core.connection import parse_url

# URL option -> redis-cli flag taking its value (TLS files).
_TLS_FILES = {"ssl_ca_certs": "--cacert", "ssl_ca_path": "--cacertdir",
              "ssl_certfile": "--cert", "ssl_keyfile": "--key"}  # fmt: skip
_DEFAULT_HOSTS = ("localhost", "127.0.0.1")


def connection_flags(
    url: str, client: Any = None, master: tuple[str, int] | None = None
) -> list[str]:
    """redis-cli's flags for `url` ([] for the local default server). A Sentinel URL: the
    master `master` names, or that the sync `client` reaches now (asked of its sentinels); none
    at all when neither says (a line with `-n` or `--user` but no host would look aimed at the
    master and run on the local default server)."""
    target = parse_url(url)
    opts = target.options
    flags: list[str] = []
    if target.sentinel is not None:
        host_port = master or _sentinel_master(client)
        if host_port is None:
            return []
        flags += _host_flags(*host_port)
        tls = target.sentinel.tls
    else:
        parts = urlsplit(target.url)
        if parts.scheme == "unix":
            flags += ["-s", unquote(parts.path)]
        else:
            flags += _host_flags(parts.hostname or "localhost", parts.port or 6379)
        tls = parts.scheme == "rediss"
        user = unquote(parts.username) if parts.username else None
        password = parts.password is not None
        # The URL's user wins over ?username=, as redis-py logs in (its from_url).
        opts = {**opts, "username": user} if user else opts
        if password and "password" not in opts:
            opts = {**opts, "password": "?"}
    if target.cluster:
        flags.append("-c")
    if opts.get("db"):
        flags += ["-n", str(opts["db"])]
    if tls:
        flags.append("--tls")
        flags += [f for name, flag in _TLS_FILES.items() if opts.get(name)
                  for f in (flag, str(opts[name]))]  # fmt: skip
        if opts.get("ssl_cert_reqs") in ("none", 0):
            flags.append("--insecure")
    if opts.get("username"):
        flags += ["--user", str(opts["username"])]
    if opts.get("password"):
        flags.append("--askpass")
    return flags


def _host_flags(host: str, port: int) -> list[str]:
    named = [] if host in _DEFAULT_HOSTS else ["-h", host]
    return named + ([] if port == 6379 else ["-p", str(port)])


def at_node(flags: list[str], node: str) -> list[str]:
    """`flags` aimed at one cluster node ("host:port") instead of the URL's seed: a server
    setting (CONFIG SET) is each node's own, and `-c` follows no command but a key's."""
    rest, skip = [], False
    for i, flag in enumerate(flags):
        if skip:
            skip = False
        elif flag in ("-h", "-p", "-s"):
            skip = True
        elif flag != "-c":
            rest.append(flags[i])
    host, _, port = node.rpartition(":")
    return ["-h", host.strip("[]"), "-p", port, *rest]


def _sentinel_master(client: Any) -> tuple[str, int] | None:
    try:
        answer = client.connection_pool.get_master_address()
        if inspect.iscoroutine(answer):  # an asyncio client's: not asked from sync code
            answer.close()
            return None
        host, port = answer
        return str(host), int(port)
    except Exception:  # no client, or no sentinel answers: the line stays bare
        return None


def fix_line(fix: str, flags: list[str], node: str | None) -> str:
    """A finding's fix with its `redis-cli` words given `flags`, aimed at `node` when the
    finding was read from one cluster node."""
    return with_flags(fix, at_node(flags, node) if node else flags)


def _unquoted(text: str, start: int = 0) -> Iterator[int]:
    """The positions of `text` from `start` outside quotes, as a POSIX shell reads the line
    (shlex.quote's '...' and its '"'"'): stored data quoted in a line is never a command."""
    quote = ""
    for i in range(start, len(text)):
        ch = text[i]
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        else:
            yield i


def _commands(text: str, word: str, after: str, ok: Callable[[int], bool]) -> list[int]:
    """Where `word` starts a command in `text`: outside quotes, at the start or after one of
    `after`, and `ok` of the position after the word."""
    return [i for i in _unquoted(text) if text.startswith(word, i)
            and (i == 0 or text[i - 1] in after) and ok(i + len(word))]  # fmt: skip


def _insert(text: str, at: list[tuple[int, str]]) -> str:
    for i, piece in sorted(at, reverse=True):
        text = text[:i] + piece + text[i:]
    return text


def with_flags(text: str, flags: list[str]) -> str:
    """`text` with the flags after each `redis-cli` word that starts a command: at the start,
    or after a space, '(' or ';' outside quotes (a key name quoted in the line may hold the
    word itself: it is left as it is)."""
    if not flags:
        return text
    insert = " " + " ".join(shlex.quote(f) for f in flags)
    word = "redis-cli"
    starts = _commands(text, word, " (;", lambda e: e == len(text) or text[e] == " ")
    return _insert(text, [(i + len(word), insert) for i in starts])


_ENDS = ";()`#|"  # what ends a `scheduler ...` command in a fix's prose
# The CLI's commands (tests/faults/test_redis_cli_lines.py checks them against it).
COMMANDS = frozenset(("dashboard", "dead", "demo", "doctor", "enqueue", "jobs", "keys", "pause",
                      "queue", "resume", "schedules", "stats", "worker", "workers"))  # fmt: skip


def _command_end(text: str, start: int) -> int:
    """Where the `scheduler ...` command at `start` ends: before the prose after it (one of
    _ENDS, or ': '; a colon ending the text is an id's: ids may end in ':'), spaces left out."""
    end = next((i for i in _unquoted(text, start) if text[i] in _ENDS
                or (text[i] == ":" and text[i + 1 : i + 2] == " ")), len(text))  # fmt: skip
    return len(text[:end].rstrip(" "))


def positional(word: str) -> str:
    """A name or id as a positional word of a printed `scheduler ...` line: one shell word, and
    after `--` when it starts with '-' (click would read '-nightly' as the option -n)."""
    quoted = shlex.quote(word)
    return f"-- {quoted}" if word.startswith("-") else quoted


def _options_end(text: str, start: int, end: int) -> int:
    """Where options may still go in the command text[start:end]: before its ` -- ` (after it
    every word is a name, `--url` too), else at its end."""
    return next((i for i in _unquoted(text, start) if i < end and text.startswith(" --", i)
                 and text[i + 3 : i + 4] in ("", " ")), end)  # fmt: skip


def with_url(text: str, url_arg: str | None) -> str:
    """`text` with `--url <url_arg>` at the end of each `scheduler ...` command in it (before a
    ` -- `, which ends its options), so a pasted line acts on the server that was checked, not
    on REDIS_URL's or the default's."""
    if not url_arg:
        return text

    def a_command(after: int) -> bool:  # "the scheduler documentation" is prose
        return text[after:].split(" ", 1)[0].rstrip(":;)`") in COMMANDS

    at, last_end = [], -1
    for i in _commands(text, "scheduler ", " (`;", a_command):
        if i >= last_end:  # not a word inside the command before
            last_end = _command_end(text, i)
            at.append((_options_end(text, i, last_end), f" --url {url_arg}"))
    return _insert(text, at)
