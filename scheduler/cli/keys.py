"""`scheduler keys`: a queue's key names, types and sizes, ready to paste into redis-cli. A
partitioned queue keeps its jobs in its partitions (each an ordinary queue): its layout record
is shown, then each partition's keys."""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from typing import Any

import click
import redis
from rich.console import Group
from rich.table import Table

from scheduler.admin.inspection import (
    MAX_KEYS,
    fixed_keys,
    key_families,
    queue_exists,
    server_now_ms,
    stored_layout,
)
from scheduler.admin.redis_cli import at_node, connection_flags, with_flags
from scheduler.cli.common import (
    AdminCommand,
    cell,
    connect,
    console,
    emit_json,
    fmt_ms,
    json_option,
    queue_option,
    url_option,
)
from scheduler.cli.dead_view import exit_unread, unread_field
from scheduler.client.partitioned import not_answering
from scheduler.core.connection import UNREACHABLE, is_cluster
from scheduler.core.errors import slot_move_text
from scheduler.core.keys import QueueKeys
from scheduler.core.partitions import meta_key


def queue_keys(client: redis.Redis, name: str, max_keys: int = MAX_KEYS) -> dict[str, Any]:
    """One ordinary queue's keys (a plain queue, or one partition): the --json shape.
    `families_cut`: the count stopped at `max_keys` with keys left, so the family counts are
    lower bounds."""
    k, q = QueueKeys(name), shlex.quote
    # In this order (what a user without the operator role is refused first: TYPE, not SCAN).
    exists = queue_exists(client, k, server_now_ms(client, k))
    fixed = [i.to_json() for i in fixed_keys(client, k)]
    families, cut = key_families(client, k, max_keys=max_keys)
    return {
        "queue": name,
        "prefix": k.prefix,
        "exists": exists,
        "keys": fixed,
        "families": [f.to_json() for f in families],
        "families_cut": cut,
        "max_keys": max_keys,
        "examples": [
            f"redis-cli ZRANGE {q(k.due)} 0 9 WITHSCORES",
            f"redis-cli ZRANGE {q(k.leased)} 0 9 WITHSCORES",
            f"redis-cli ZRANGE {q(k.dead)} 0 9 REV WITHSCORES",
            f"redis-cli HGETALL {q(k.job('<id>'))}",
            f"redis-cli --scan --pattern {q(k.pattern())}",
        ],
    }


def partitioned_keys(name: str, parts: list[dict[str, Any]]) -> dict[str, Any]:
    """A partitioned queue: its own prefix holds only the layout record; `partitions` holds
    each partition's queue_keys, and `exists` says whether any of them has keys."""
    record = meta_key(name)
    return {
        "queue": name,
        "prefix": QueueKeys(name).prefix,
        "exists": any(p["exists"] for p in parts),
        "layout_key": record,
        "keys": [],
        "families": [],
        "families_cut": any(p["families_cut"] for p in parts),
        "max_keys": parts[0]["max_keys"] if parts else MAX_KEYS,
        "examples": [f"redis-cli GET {shlex.quote(record)}"],
        "partitions": parts,
    }


def _tables(view: dict[str, Any], title: str) -> Group:
    q = shlex.quote
    t = Table(title=title + ("" if view["exists"] else " (no keys yet)"))
    for col in ("key", "type", "size", "ttl", "contents"):
        t.add_column(col, overflow="fold", no_wrap=col == "key")
    for i in view["keys"]:
        ttl = "-" if i["ttl_ms"] is None else fmt_ms(i["ttl_ms"])
        t.add_row(cell(q(i["key"])), cell(i["type"]), str(i["size"]), ttl, i["about"])
    cut = cut_note(view)
    f = Table(title="per-item keys" + (" (counts cut short)" if cut else ""))
    for col in ("pattern", "count", "contents"):
        f.add_column(col, overflow="fold", no_wrap=col == "pattern")
    for fam in view["families"]:
        count = str(fam["count"]) + ("+" if cut else "")
        f.add_row(cell(q(fam["pattern"])), count, fam["about"])
    notes = [cut] if cut else []
    examples = "\n".join(view["examples"])
    return Group(t, f, *(cell(n) for n in notes), cell(examples, keep_newlines=True))


def cut_note(view: dict[str, Any]) -> str:
    """The line that says a key count stopped at its bound ("" when it did not)."""
    if not view["families_cut"]:
        return ""
    return (
        f"the count stopped at {view['max_keys']:,} keys: the queue has more, not counted "
        "(each count above is at least that); --max-keys N counts further"
    )


@click.command("keys", cls=AdminCommand)
@url_option
@queue_option
@json_option
@click.option(
    "--max-keys",
    type=click.IntRange(min=1),
    default=MAX_KEYS,
    show_default=True,
    help="Stop counting the per-item keys after this many (per partition); a count cut "
    "short says so.",
)
def keys_command(url: str, queue: str, as_json: bool, max_keys: int) -> None:
    """The key names of a queue, ready to paste into redis-cli, with their types and sizes
    (of each partition, for a partitioned queue)."""
    client = connect(url)
    layout = stored_layout(client, queue)
    not_read: list[str] = []  # partitions whose node does not answer: named, exit 3
    if layout is None:
        view = queue_keys(client, queue, max_keys)
    else:
        parts, not_read = answering_keys(client, layout.names, max_keys)
        view = partitioned_keys(queue, parts)
    # The examples reach the server, pasted as shown: on a cluster the node holding the queue's
    # slot (`--scan` is no keyed command: `-c` would not take it there).
    flags = connection_flags(url, client)
    for v in (view, *view.get("partitions", ())):
        node = _node(client, v["queue"])
        here = at_node(flags, node) if node else flags
        v["examples"] = [with_flags(e, here) for e in v["examples"]]
    if as_json:
        emit_json({"partitions": None, **view, **unread_field(not_read)})
        exit_unread(not_read)
        return
    out = console()
    if layout is None:
        out.print(_tables(view, f"keys of queue {queue!r}"))
        return
    out.print(cell(f"queue {queue!r}: {layout.n} partitions, layout record {view['layout_key']}"))
    out.print(cell(f"  {view['examples'][0]}"), soft_wrap=True)
    for part in view["partitions"]:
        title = f"keys of partition {part['queue']!r} of queue {queue!r}"
        out.print(_tables(part, title))
    exit_unread(not_read)


def answering_keys(
    client: redis.Redis, names: Sequence[str], max_keys: int
) -> tuple[list[dict[str, Any]], list[str]]:
    """queue_keys of each partition that answers, and 'partition <name>: <error>' of each
    whose node does not answer or refuses for now (not_answering), while another answers
    (none answering: the first error is raised, as run_answering). The other partitions of a
    node that did not answer are not asked again: each ask costs redis-py's retries."""
    parts: list[dict[str, Any]] = []
    failed: list[tuple[str, Exception]] = []
    lost: dict[str, Exception] = {}  # node -> its error
    for name in names:
        node = _node(client, name)
        try:
            if node in lost:
                raise lost[node]
            parts.append(queue_keys(client, name, max_keys))
        except Exception as exc:
            if not not_answering(exc):
                raise
            failed.append((name, exc))
            # A slot on the move is that partition's alone: the node's others still answer.
            if isinstance(exc, UNREACHABLE) and node is not None and not slot_move_text(exc):
                lost[node] = exc
    if failed and not parts:
        raise failed[0][1]
    return parts, [f"partition {n}: {slot_move_text(e) or e}" for n, e in failed]


def _node(client: redis.Redis, name: str) -> str | None:
    """The cluster node holding queue `name` (None: one server, or no node serves its slot)."""
    if not is_cluster(client):
        return None
    try:
        return str(client.get_node_from_key(QueueKeys(name).prefix).name)  # type: ignore[attr-defined]
    except UNREACHABLE:
        return None
